"""Differential: every example notebook, and notebooks equivalent to nbclient's own test
notebooks (tests/notebooks/nbclient/: clear_output, display ids updated across cells, the
skip-execution tag, IPython's history in memory, an interrupted cell, a UsageError), run by
`cellgate run` (jailed kernels) and by Debian's nbclient (an unjailed ipykernel) give the same
notebook, cell by cell.

    CELLGATE_BIN_DIR=build-run/bin /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        tests/notebooks/test_differential.py

Compared: the notebook's metadata (nbclient writes the kernel's language_info and keeps the
rest; cellgate's metadata.papermill, on the notebook and each cell, is checked present and left
out); per code cell its id, metadata, execution count; the outputs' types in order; stream
names and text; mime keys; text/plain, text/html, text/markdown, text/latex and SVG values;
error names and values. Left out as volatile: dates, tracebacks (paths and colours differ),
image bytes (font rendering) and output metadata. Consecutive stream outputs of one stream are
joined first: nbformat treats them as one, and nbclient 0.7 keeps them apart. Images from both
sides must be valid PNGs. The summary's error name for a cell that fails matches nbclient's
CellExecutionError, also when only the execute_reply names it.
"""

import base64
import copy
import os

import nbclient
import nbformat
import pytest

from conftest import EXAMPLES, NOTEBOOKS, is_valid_png, read_notebook, run_json

HERE = os.path.dirname(os.path.abspath(__file__))
NBCLIENT_FILES = sorted(p for p in __import__("pathlib").Path(HERE, "nbclient").glob("*.ipynb"))
# For the nbclient notebooks: both sides let errors through and interrupt a cell past this.
CELL_TIMEOUT = 3

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


@pytest.fixture(scope="module")
def ours_nbclient_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("cellgate-nbclient-files")
    code, summary, err = run_json(*NBCLIENT_FILES, "--jobs", "2", "--output-dir", out,
                                  "--allow-errors", "--timeout", CELL_TIMEOUT)
    assert code == 0, f"{summary}\n{err}"
    return out


def run_nbclient(path, **options):
    nb = nbformat.read(str(path), as_version=4)
    # ipykernel's debugger otherwise warns about frozen modules on the kernel's stderr.
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    settings = {"kernel_name": "python3", "allow_errors": False, "timeout": NBCLIENT_TIMEOUT,
                "resources": {"metadata": {"path": str(path.parent)}}}
    settings.update(options)
    client = nbclient.NotebookClient(nb, **settings)
    client.execute()
    return nb


def without_papermill(metadata, what):
    """cellgate writes papermill's metadata.papermill (docs/run.md), which nbclient does not: it is
    there, and the rest is compared."""
    assert "papermill" in metadata and "duration" in metadata["papermill"], what
    return {k: v for k, v in metadata.items() if k != "papermill"}


def assert_same_notebook(mine, theirs):
    # nbclient writes metadata.language_info from the kernel_info_reply and keeps the rest.
    assert without_papermill(mine.metadata, "notebook metadata.papermill") == theirs.metadata, \
        "notebook metadata"
    assert len(mine.cells) == len(theirs.cells)
    for i, (a, b) in enumerate(zip(mine.cells, theirs.cells)):
        assert a.cell_type == b.cell_type
        a = copy.deepcopy(a)
        a.metadata = without_papermill(a.metadata, f"cells[{i}] metadata.papermill")
        if a.cell_type != "code":
            assert a == b, f"cells[{i}] changed"
            continue
        # nbclient records timestamps in metadata.execution: dates, left out.
        their_metadata = {k: v for k, v in b.metadata.items() if k != "execution"}
        assert a.get("id") == b.get("id") and a.metadata == their_metadata, f"cells[{i}]"
        assert a.execution_count == b.execution_count, f"cells[{i}] execution_count"
        assert normalized(a) == normalized(b), f"cells[{i}] outputs differ"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_same_outputs_as_nbclient(path, ours):
    theirs = run_nbclient(path)
    mine = read_notebook(ours / path.name)
    assert_same_notebook(mine, theirs)
    assert any(normalized(c) for c in mine.cells if c.cell_type == "code"), "nothing compared"
    mine_images, their_images = images(mine), images(theirs)
    assert len(mine_images) == len(their_images)
    for png in mine_images + their_images:
        assert is_valid_png(png)


@pytest.mark.parametrize("path", NBCLIENT_FILES, ids=[p.stem for p in NBCLIENT_FILES])
def test_nbclients_own_notebooks_give_what_nbclient_gives(path, ours_nbclient_files):
    # nbclient with allow_errors and interrupt_on_timeout: what `--allow-errors --timeout` is.
    theirs = run_nbclient(path, allow_errors=True, timeout=CELL_TIMEOUT,
                          interrupt_on_timeout=True)
    mine = read_notebook(ours_nbclient_files / path.name)
    assert_same_notebook(mine, theirs)


def test_an_error_only_the_reply_names_is_named_as_nbclient_names_it():
    path = next(p for p in NBCLIENT_FILES if p.stem == "Usage Error")
    with pytest.raises(nbclient.exceptions.CellExecutionError) as raised:
        run_nbclient(path)
    code, summary, err = run_json(path)
    assert code == 1, f"{summary}\n{err}"
    r = summary["notebooks"][0]
    assert r["status"] == "error" and r["cell"] == 1, r
    assert (r["ename"], r["evalue"]) == (raised.value.ename, raised.value.evalue)
    assert r["ename"] == "UsageError"
