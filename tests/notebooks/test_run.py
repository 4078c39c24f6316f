"""`cellgate run` end to end, with jailed kernels in the embedded gateway.

    CELLGATE_BIN_DIR=build-run/bin /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        tests/notebooks/test_run.py

Covers: every example in notebooks/ (outputs, artifacts, the raises-exception tag, files beside
the notebook), parameters, --timeout, stopping at the first error and --allow-errors, malformed
notebooks, a batch of ten with --jobs and --results, that the input is never overwritten without
--inplace, and the progress line on a terminal. The behaviour is documented in docs/run.md.
"""

import csv
import hashlib
import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

from conftest import (CELLGATE, EXAMPLES, NOTEBOOKS, cellgate_run, clean_env, is_valid_png,
                      read_notebook, run_json, tagged, write_notebook)
from papermill_rules import papermill_cell


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def outputs_of(cell):
    return [o["output_type"] for o in cell["outputs"]]


def stdout_of(cell) -> str:
    return "".join(o["text"] for o in cell["outputs"]
                   if o["output_type"] == "stream" and o["name"] == "stdout")


# ---- the examples ------------------------------------------------------------------------------

def test_every_example_runs_jailed(tmp_path):
    before = {p: digest(p) for p in NOTEBOOKS.rglob("*") if p.is_file()}
    out, art = tmp_path / "out", tmp_path / "art"
    code, summary, err = run_json(NOTEBOOKS, "--jobs", "2", "--output-dir", out,
                                  "--artifacts", art, "--results", tmp_path / "results")
    assert code == 0, f"{json.dumps(summary, indent=1)}\n{err}"
    assert summary["counts"]["ok"] == len(EXAMPLES) >= 6
    by_name = {Path(r["path"]).name: r for r in summary["notebooks"]}
    assert set(by_name) == {p.name for p in EXAMPLES}
    for name, r in by_name.items():
        assert r["status"] == "ok" and r["executed"] == r["cells"] > 0, r
        assert r["output"] == str(out / name)
        nb = read_notebook(out / name)
        counts = [c["execution_count"] for c in nb.cells if c.cell_type == "code"]
        assert counts == list(range(1, len(counts) + 1)), (name, counts)
    # The inputs are untouched and nothing was written beside them.
    assert {p: digest(p) for p in NOTEBOOKS.rglob("*") if p.is_file()} == before

    # Data analysis: a table from data/sales.csv (copied into the work dir), a PNG chart.
    nb = read_notebook(out / "data_analysis.ipynb")
    assert "text/html" in nb.cells[1].outputs[0]["data"]
    assert "West" in stdout_of(nb.cells[2])
    assert nb.cells[4].outputs[0]["output_type"] == "display_data"
    assert by_name["data_analysis.ipynb"]["artifacts"] == 1
    png = art / "data_analysis" / "cell4-1.png"
    assert by_name["data_analysis.ipynb"]["artifact_files"] == [str(png)]
    assert is_valid_png(png.read_bytes())

    # Self-debugging: the KeyError stays in its cell (tagged raises-exception) and the fix ran.
    nb = read_notebook(out / "self_debugging.ipynb")
    error = nb.cells[2].outputs[-1]
    assert error["output_type"] == "error" and error["ename"] == "KeyError"
    assert "SPRING" in stdout_of(nb.cells[4])
    assert by_name["self_debugging.ipynb"]["errors"] == 0

    # Stateful: the last cell's asserts held.
    assert "state kept: 5 calls" in stdout_of(read_notebook(out / "stateful.ipynb").cells[-1])

    # Rich display: each kind of output in nbformat's shape, the update applied in place.
    nb = read_notebook(out / "rich_display.ipynb")
    mimes = [set(o["data"]) for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    for mime in ("text/html", "image/svg+xml", "text/latex", "text/markdown"):
        assert any(mime in m for m in mimes), mime
    assert nb.cells[-1].outputs[0]["data"]["text/markdown"] == "step 2 of 2: done"
    assert (art / "rich_display" / "cell4-1.svg").read_text().startswith("<svg")

    # Evaluation: the asserts passed.
    assert "evaluation passed" in stdout_of(read_notebook(out / "evaluation.ipynb").cells[-1])

    # Results files: JSON and CSV with one row per notebook.
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results["notebooks"]) == len(EXAMPLES)
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert sorted(Path(r["path"]).name for r in rows) == sorted(p.name for p in EXAMPLES)
    assert {r["status"] for r in rows} == {"ok"}


def test_single_notebook_prints_a_summary_and_writes_nothing(tmp_path):
    nb = write_notebook(tmp_path / "one.ipynb", ["print('hi')", "6 * 7"])
    before = sorted(os.listdir(tmp_path))
    proc = cellgate_run(nb)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok") and "one.ipynb" in proc.stdout and "2/2 cells" in proc.stdout
    assert "not saved" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == before


# ---- parameters ----------------------------------------------------------------------------------

def test_parameters_are_injected_after_the_tagged_cell(tmp_path):
    out = tmp_path / "out.ipynb"
    code, summary, err = run_json(NOTEBOOKS / "parameters.ipynb", "-o", out,
                                  "-p", "region", "South", "-p", "min_units", "20",
                                  "-p", "scale", "0.5")
    assert code == 0, err
    nb = read_notebook(out)
    assert "parameters" in nb.cells[1].metadata["tags"]
    injected = nb.cells[2]
    assert injected.metadata["tags"] == ["injected-parameters"]
    # papermill's cell: "# Parameters" and one line per parameter, strings in double quotes.
    assert injected.source == '# Parameters\nregion = "South"\nmin_units = 20\nscale = 0.5\n'
    assert "id" in injected  # nbformat 4.5 needs cell ids
    assert "region='South' min_units=20 scale=0.5" in stdout_of(nb.cells[3])


def test_parameters_are_typed_and_written_as_papermill_does(tmp_path):
    p = [("a", "3"), ("b", "2.5"), ("c", "True"), ("d", "None"), ("e", "hello world"),
         ("f", "'quoted'"), ("g", "007"), ("h", "1e16"), ("i", "nan"), ("j", "true"),
         ("k", 'say "h\u00e9"\n'), ("l", "[1, 2]"), ("m", " -1_000 "), ("n", "-inf")]
    r = [("o", "007"), ("c2", "True")]
    y = ['{"q": [1, "x", null, 1.5], "s": {"k": false}, "t": 1e3}',
         "u: 0755\nv: 2024-01-02\nw: yes\nx: 'it''s'\nz:\n  - a\n  - 1:30\na: 99\n"]
    names = [name for name, _ in p + r] + ["q", "s", "t", "u", "v", "w", "x", "z"]
    nb = write_notebook(tmp_path / "p.ipynb", [
        tagged(" = ".join(names) + " = 0", "parameters"),
        "print(repr((" + ", ".join(names) + ",)))",
    ])
    out = tmp_path / "out.ipynb"
    args = [a for name, value in p for a in ("-p", name, value)]
    args += [a for name, value in r for a in ("-r", name, value)]
    args += [a for text in y for a in ("-y", text)]
    proc = cellgate_run(nb, "-o", out, *args)
    assert proc.returncode == 0, proc.stderr
    cells = read_notebook(out).cells
    expected = papermill_cell(p, r, y)
    assert cells[1].source == expected
    # The kernel saw the values papermill's cell gives.
    namespace = {}
    exec(expected, namespace)  # noqa: S102 - the text just compared, papermill's literals
    want = repr(tuple(namespace[n] for n in names))
    assert stdout_of(cells[2]).strip() == want


def test_parameters_without_a_parameters_cell_go_first(tmp_path):
    nb = write_notebook(tmp_path / "p.ipynb", ["print(n * 2)"])
    out = tmp_path / "out.ipynb"
    proc = cellgate_run(nb, "-o", out, "-p", "n", "21")
    assert proc.returncode == 0, proc.stderr
    assert "no cell is tagged 'parameters'" in proc.stderr
    cells = read_notebook(out).cells
    assert cells[0].metadata["tags"] == ["injected-parameters"]
    assert stdout_of(cells[1]) == "42\n"


def test_a_bad_parameter_is_a_usage_error(tmp_path):
    nb = write_notebook(tmp_path / "p.ipynb", ["1"])
    for bad in (["-p", "1x", "2"], ["-p", "class", "3"], ["-r", "a b", "1"],
                ["-y", "[1, 2]"], ["-y", "a: *undefined"], ["-p", "lonely"]):
        proc = cellgate_run(nb, *bad)
        assert proc.returncode == 2 and bad[0] in proc.stderr.replace("--parameters", "-p"), (
            bad, proc.stderr)


# ---- errors and timeouts -------------------------------------------------------------------------

FAILING = ["x = 1", "d = {}\nd['k']", "print('after')"]


def test_stops_at_the_first_error(tmp_path):
    nb = write_notebook(tmp_path / "fails.ipynb", FAILING)
    out = tmp_path / "out.ipynb"
    proc = cellgate_run(nb, "-o", out)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("error")
    assert "cells[1] `d = {}`, line 2: KeyError: 'k'" in proc.stdout
    assert "KeyError" in proc.stderr  # the traceback
    cells = read_notebook(out).cells
    assert outputs_of(cells[1]) == ["error"] and cells[1].execution_count == 2
    assert cells[2].outputs == [] and cells[2].execution_count is None


def test_allow_errors_runs_every_cell(tmp_path):
    nb = write_notebook(tmp_path / "fails.ipynb", FAILING)
    out = tmp_path / "out.ipynb"
    code, summary, err = run_json(nb, "-o", out, "--allow-errors")
    assert code == 0, err
    r = summary["notebooks"][0]
    assert r["status"] == "ok" and r["errors"] == 1 and r["executed"] == 3
    cells = read_notebook(out).cells
    assert outputs_of(cells[1]) == ["error"] and stdout_of(cells[2]) == "after\n"


def test_timeout_interrupts_the_cell_and_fails_the_notebook(tmp_path):
    nb = write_notebook(tmp_path / "slow.ipynb", [
        "print('before')", "import time\ntime.sleep(120)", "print('never')"])
    out = tmp_path / "out.ipynb"
    started = time.monotonic()
    code, summary, err = run_json(nb, "-o", out, "--timeout", "2")
    assert time.monotonic() - started < 60
    assert code == 1, err
    r = summary["notebooks"][0]
    assert r["status"] == "timeout" and r["cell"] == 1, r
    assert "--timeout 2 s" in r["message"]
    cells = read_notebook(out).cells
    assert stdout_of(cells[0]) == "before\n"
    assert cells[2].outputs == [] and cells[2].execution_count is None
    # Human summary says so too.
    proc = cellgate_run(nb, "--timeout", "1")
    assert proc.returncode == 1 and proc.stdout.startswith("timeout")
    assert "cells[1] `import time`" in proc.stdout and "timeout" in proc.stdout


def test_with_allow_errors_a_timed_out_cell_is_an_error_and_the_run_goes_on(tmp_path):
    nb = write_notebook(tmp_path / "slow.ipynb", [
        "state = 'kept'", "import time\ntime.sleep(120)", "print('after', state)"])
    out = tmp_path / "out.ipynb"
    started = time.monotonic()
    code, summary, err = run_json(nb, "-o", out, "--timeout", "2", "--allow-errors")
    assert time.monotonic() - started < 60
    assert code == 0, err
    r = summary["notebooks"][0]
    assert r["status"] == "ok" and r["errors"] == 1 and r["executed"] == 3, r
    assert any("ran past --timeout 2 s" in w for w in r["warnings"]), r
    cells = read_notebook(out).cells
    assert [o["ename"] for o in cells[1].outputs if o["output_type"] == "error"] == [
        "KeyboardInterrupt"]
    assert stdout_of(cells[2]) == "after kept\n"  # the kernel's state was kept


# ---- malformed notebooks -------------------------------------------------------------------------

def test_malformed_notebooks_are_named_and_exit_2(tmp_path):
    cases = {
        "not_json.ipynb": ("{ this is not json", "not JSON: parse error at line 1"),
        "nbformat3.ipynb": (json.dumps({"nbformat": 3, "nbformat_minor": 0, "metadata": {},
                                        "worksheets": [{"cells": []}]}),
                            "nbformat 3 is not supported"),
        "no_source.ipynb": (json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                                        "cells": [
                                            {"cell_type": "code", "id": "a", "metadata": {},
                                             "source": "1", "outputs": [],
                                             "execution_count": None},
                                            {"cell_type": "code", "id": "b", "metadata": {},
                                             "outputs": [], "execution_count": None}]}),
                            "cells[1] (code): no 'source'"),
        "bad_type.ipynb": (json.dumps({"nbformat": 4, "nbformat_minor": 4, "metadata": {},
                                       "cells": [{"cell_type": "heading", "source": "x",
                                                  "metadata": {}}]}),
                           "cells[0]: 'cell_type' is \"heading\""),
        "no_cells.ipynb": (json.dumps({"nbformat": 4, "nbformat_minor": 4, "metadata": {}}),
                           "no 'cells' list"),
    }
    for name, (text, expected) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        started = time.monotonic()
        proc = cellgate_run(path, "-o", tmp_path / ("out-" + name))
        assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
        assert expected in proc.stderr, (name, proc.stderr)
        assert name in proc.stderr
        assert not (tmp_path / ("out-" + name)).exists()
        assert time.monotonic() - started < 10  # no kernel was started


def test_usage_errors_exit_2(tmp_path):
    nb = write_notebook(tmp_path / "a.ipynb", ["1"])
    write_notebook(tmp_path / "b.ipynb", ["2"])
    for args in ([tmp_path / "missing.ipynb"],
                 [tmp_path, "-o", tmp_path / "x.ipynb"],          # -o with two notebooks
                 [nb, "-o", tmp_path / "x.ipynb", "--inplace"],
                 [nb, "--kernel", "no-such-kernel"],
                 [nb, "--jobs", "0"]):
        proc = cellgate_run(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith("cellgate run: "), proc.stderr


# ---- a batch -------------------------------------------------------------------------------------

def test_a_batch_of_ten_with_two_failing(tmp_path):
    batch = tmp_path / "batch"
    for i in range(10):
        cells = [f"n = {i}", "print(n * n)"]
        if i == 3:
            cells[1] = "raise ValueError(f'bad input {n}')"
        if i == 7:
            cells[1] = "print(n / 0)"
        write_notebook(batch / f"nb{i:02d}.ipynb", cells)
    out, results = tmp_path / "out", tmp_path / "results"
    proc = cellgate_run(batch, "--jobs", "3", "--output-dir", out, "--results", results)
    assert proc.returncode == 1, proc.stderr
    assert "10 notebooks in" in proc.stdout and ": 8 ok, 2 error\n" in proc.stdout

    summary = json.loads(results.with_suffix(".json").read_text())
    assert summary["counts"]["ok"] == 8 and summary["counts"]["error"] == 2
    assert summary["exit_code"] == 1
    failed = {Path(r["path"]).name: r for r in summary["notebooks"] if r["status"] == "error"}
    assert set(failed) == {"nb03.ipynb", "nb07.ipynb"}
    assert failed["nb03.ipynb"]["cell"] == 1 and failed["nb03.ipynb"]["ename"] == "ValueError"
    assert failed["nb03.ipynb"]["evalue"] == "bad input 3"
    assert failed["nb07.ipynb"]["ename"] == "ZeroDivisionError"
    assert failed["nb07.ipynb"]["cell_source"] == "print(n / 0)"

    rows = list(csv.DictReader(results.with_suffix(".csv").open()))
    assert len(rows) == 10
    assert sorted(r["status"] for r in rows) == ["error"] * 2 + ["ok"] * 8
    bad = {Path(r["path"]).name: r for r in rows if r["status"] == "error"}
    assert bad["nb03.ipynb"]["cell"] == "1" and bad["nb03.ipynb"]["ename"] == "ValueError"
    assert bad["nb07.ipynb"]["cell"] == "1" and bad["nb07.ipynb"]["ename"] == "ZeroDivisionError"
    for r in rows:
        assert float(r["duration_s"]) > 0 and Path(r["output"]).is_file()
        assert r["artifacts"] == "0"
    assert stdout_of(read_notebook(out / "nb05.ipynb").cells[1]) == "25\n"


def test_a_batch_forks_its_kernels_from_a_zygote_and_one_notebook_starts_cold(tmp_path):
    # The zygote has pandas imported (docs/zygote.md); a cold ipykernel has not, until a cell
    # imports it. A batch waits for the zygote, so every kernel of it is forked from there.
    probe = "import sys\nprint('pandas' in sys.modules)"
    batch = tmp_path / "batch"
    for i in range(4):
        write_notebook(batch / f"nb{i}.ipynb", [probe])
    out = tmp_path / "out"
    proc = cellgate_run(batch, "--jobs", "2", "--output-dir", out)
    assert proc.returncode == 0, proc.stderr
    assert [stdout_of(read_notebook(out / f"nb{i}.ipynb").cells[0]) for i in range(4)] == \
        ["True\n"] * 4, proc.stderr
    single = write_notebook(tmp_path / "one.ipynb", [probe])
    proc = cellgate_run(single, "-o", tmp_path / "one-out.ipynb")
    assert proc.returncode == 0, proc.stderr
    assert stdout_of(read_notebook(tmp_path / "one-out.ipynb").cells[0]) == "False\n"


# ---- never overwrite the input -------------------------------------------------------------------

def test_the_input_is_never_overwritten_without_inplace(tmp_path):
    nb = write_notebook(tmp_path / "keep.ipynb", ["print('ran')"])
    original = nb.read_bytes()
    for args in (["-o", nb], ["-o", tmp_path / "." / "keep.ipynb"], ["--output-dir", tmp_path]):
        proc = cellgate_run(nb, *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "is the input notebook" in proc.stderr and "--inplace" in proc.stderr
        assert nb.read_bytes() == original
    proc = cellgate_run(nb, "--inplace")
    assert proc.returncode == 0, proc.stderr
    assert stdout_of(read_notebook(nb).cells[0]) == "ran\n"


# ---- the progress line ---------------------------------------------------------------------------

def test_progress_line_only_on_a_terminal(tmp_path):
    nb = write_notebook(tmp_path / "bar.ipynb", ["import time\ntime.sleep(0.5)", "1", "2"])
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(CELLGATE), "run", str(nb)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave, env=clean_env())
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    out = proc.communicate(timeout=60)[0].decode()
    os.close(master)
    assert proc.returncode == 0
    assert b"bar.ipynb [" in seen and b"cell 1/3" in seen, seen
    assert "cell 1/3" not in out  # stdout has the summary only
    # Not a terminal: no progress line.
    proc = cellgate_run(nb, stderr=subprocess.PIPE)
    assert "cell 1/3" not in proc.stderr
