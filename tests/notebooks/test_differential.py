"""Differential: every example notebook run by `cellgate run` (jailed kernels) and by Debian's
nbclient (an unjailed ipykernel) gives the same outputs, cell by cell.

    CELLGATE_BIN_DIR=build-run/bin /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        tests/notebooks/test_differential.py

Compared per code cell: the execution count; the outputs' types in order; stream names and
text; mime keys; text/plain, text/html, text/markdown, text/latex and SVG values; error names
and values. Left out as volatile: ids, dates, tracebacks (paths and colours differ), image
bytes (font rendering) and output metadata. Consecutive stream outputs of one stream are
joined first: nbformat treats them as one, and nbclient 0.7 keeps them apart. Images from both
sides must be valid PNGs.
"""

import base64
import os

import nbclient
import nbformat
import pytest

from conftest import EXAMPLES, NOTEBOOKS, is_valid_png, read_notebook, run_json

COMPARED_TEXT = ("text/plain", "text/html", "text/markdown", "text/latex", "image/svg+xml")
IMAGES = ("image/png",)
NBCLIENT_TIMEOUT = 120  # seconds per cell


def text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def normalized(cell):
    """The comparable part of a code cell's outputs."""
    outputs = []
    for o in cell.get("outputs", []):
        kind = o["output_type"]
        if kind == "stream":
            if outputs and outputs[-1][0] == "stream" and outputs[-1][1] == o["name"]:
                outputs[-1] = ("stream", o["name"], outputs[-1][2] + text(o["text"]))
            else:
                outputs.append(("stream", o["name"], text(o["text"])))
        elif kind in ("display_data", "execute_result"):
            data = o["data"]
            values = tuple((m, text(data[m])) for m in sorted(data) if m in COMPARED_TEXT)
            outputs.append((kind, tuple(sorted(data)), values))
        elif kind == "error":
            outputs.append(("error", o["ename"], o["evalue"]))
        else:
            outputs.append((kind,))
    return outputs


def images(nb):
    return [base64.b64decode(text(o["data"][m]))
            for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if o["output_type"] in ("display_data", "execute_result")
            for m in IMAGES if m in o.get("data", {})]


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    out = tmp_path_factory.mktemp("cellgate")
    code, summary, err = run_json(NOTEBOOKS, "--jobs", "2", "--output-dir", out)
    assert code == 0, f"{summary}\n{err}"
    return out


def run_nbclient(path):
    nb = nbformat.read(str(path), as_version=4)
    # ipykernel's debugger otherwise warns about frozen modules on the kernel's stderr.
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    client = nbclient.NotebookClient(nb, kernel_name="python3", allow_errors=False,
                                     timeout=NBCLIENT_TIMEOUT,
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_same_outputs_as_nbclient(path, ours):
    theirs = run_nbclient(path)
    mine = read_notebook(ours / path.name)
    assert len(mine.cells) == len(theirs.cells)
    for i, (a, b) in enumerate(zip(mine.cells, theirs.cells)):
        assert a.cell_type == b.cell_type
        if a.cell_type != "code":
            assert a == b, f"cells[{i}] changed"
            continue
        # nbclient records timestamps in metadata.execution: dates, left out.
        their_metadata = {k: v for k, v in b.metadata.items() if k != "execution"}
        assert a.get("id") == b.get("id") and a.metadata == their_metadata, f"cells[{i}]"
        assert a.execution_count == b.execution_count, f"cells[{i}] execution_count"
        assert normalized(a) == normalized(b), f"cells[{i}] outputs differ"
    assert any(normalized(c) for c in mine.cells if c.cell_type == "code"), "nothing compared"
    mine_images, their_images = images(mine), images(theirs)
    assert len(mine_images) == len(their_images)
    for png in mine_images + their_images:
        assert is_valid_png(png)
