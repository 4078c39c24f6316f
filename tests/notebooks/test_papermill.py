"""`cellgate run` as papermill users type it, with jailed kernels in the embedded gateway.

    CELLGATE_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        tests/notebooks/test_papermill.py

Covers papermill's `INPUT OUTPUT` positionals (and the usage error when OUTPUT is an existing
notebook that no run wrote), `-` for stdin and stdout, -f, --cwd, --prepare-only, --log-output,
--execution-timeout, metadata.papermill for the run and per cell, and the output saved as each
cell runs. docs/run.md, "papermill's command line".
"""

import json
import re
import signal
import subprocess
import time
from pathlib import Path

from conftest import CELLGATE, cellgate_run, clean_env, read_notebook, tagged, write_notebook

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}$")  # datetime.utcnow().isoformat()


def stdout_of(cell) -> str:
    return "".join(o["text"] for o in cell["outputs"]
                   if o["output_type"] == "stream" and o["name"] == "stdout")


def params_notebook(path: Path) -> Path:
    return write_notebook(path, [
        tagged("a = 0\nb = None\nnested = None", "parameters"),
        "print(f'a={a!r} b={b!r} nested={nested!r}')",
        "# md: a markdown cell",
        "print(open('data.txt').read().strip())",
    ])


def test_input_output_positionals_file_parameters_cwd_and_metadata(tmp_path):
    nb = params_notebook(tmp_path / "in.ipynb")
    data = tmp_path / "elsewhere"
    data.mkdir()
    (data / "data.txt").write_text("from --cwd\n")
    params = tmp_path / "params.yaml"
    params.write_text("b: from-file\nnested:\n  k: [1, 2.5]\na: 7\n")
    out = tmp_path / "out" / "out.ipynb"
    proc = cellgate_run(nb, out, "-f", params, "-p", "a", "1", "--cwd", data,
                        "--execution-timeout", "60")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok") and f"-> {out}" in proc.stdout, proc.stdout
    cells = read_notebook(out).cells
    # -f first, then -p (papermill's order); the notebook's directory has no data.txt: --cwd's.
    assert stdout_of(cells[2]) == "a=1 b='from-file' nested={'k': [1, 2.5]}\n"
    assert stdout_of(cells[4]) == "from --cwd\n"

    meta = read_notebook(out).metadata["papermill"]
    assert meta["parameters"] == {"b": "from-file", "nested": {"k": [1, 2.5]}, "a": 1}
    assert meta["input_path"] == str(nb) and meta["output_path"] == str(out)
    assert ISO.match(meta["start_time"]) and ISO.match(meta["end_time"])
    assert meta["start_time"] <= meta["end_time"] and meta["duration"] > 0
    assert meta["exception"] is None
    for cell in cells:
        m = cell.metadata["papermill"]
        assert m["status"] == "completed" and m["exception"] is False, (cell.source, m)
        assert ISO.match(m["start_time"]) and m["duration"] >= 0

    # OUTPUT now exists and is an executed notebook: a re-run writes over it, as papermill's
    # does. --prepare-only injects and writes without running.
    proc = cellgate_run(nb, out, "-p", "a", "2", "--prepare-only")
    assert proc.returncode == 0, proc.stderr
    prepared = read_notebook(out)
    assert prepared.cells[1].source == "# Parameters\na = 2\n"
    assert all(c.outputs == [] and c.execution_count is None
               for c in prepared.cells if c.cell_type == "code")
    assert prepared.metadata["papermill"]["parameters"] == {"a": 2}
    assert "papermill" not in prepared.cells[0].metadata

    # An existing notebook no run wrote is not taken for OUTPUT: the usage error names the fixes.
    other = write_notebook(tmp_path / "other.ipynb", ["1"])
    before = other.read_bytes()
    proc = cellgate_run(nb, other)
    assert proc.returncode == 2, proc.stderr
    assert "-o " + str(other) in proc.stderr and "--output-dir" in proc.stderr, proc.stderr
    assert other.read_bytes() == before
    # Papermill's -f with a missing file is a usage error too.
    proc = cellgate_run(nb, tmp_path / "x.ipynb", "-f", tmp_path / "missing.yaml")
    assert proc.returncode == 2 and "-f " in proc.stderr, proc.stderr


def test_stdin_to_stdout_with_log_output(tmp_path):
    nb = params_notebook(tmp_path / "in.ipynb")
    (tmp_path / "data.txt").write_text("beside\n")  # not copied: stdin has no directory
    proc = subprocess.run(
        [str(CELLGATE), "run", "--no-progress", "-", "-", "-p", "a", "3", "--log-output"],
        input=nb.read_text(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        timeout=240, env=clean_env())
    assert proc.returncode == 1, proc.stderr  # the data.txt cell fails: nothing was copied
    out = json.loads(proc.stdout)  # stdout holds the notebook alone
    assert out["metadata"]["papermill"]["input_path"] == "-"
    assert out["metadata"]["papermill"]["exception"] is True
    assert stdout_of(out["cells"][2]) == "a=3 b=None nested=None\n"
    statuses = [c["metadata"]["papermill"]["status"] for c in out["cells"]]
    assert statuses == ["completed", "completed", "completed", "completed", "failed"]
    # The cell's output was logged to stderr, before the summary (which is on stderr too).
    logged = proc.stderr.find("a=3 b=None nested=None")
    summary = proc.stderr.find("error   -")
    assert 0 <= logged < summary, proc.stderr
    assert "FileNotFoundError" in proc.stderr


def test_the_output_is_saved_as_each_cell_runs(tmp_path):
    nb = write_notebook(tmp_path / "slow.ipynb", [
        "print('first')", "import time\ntime.sleep(120)", "print('never')"])
    out = tmp_path / "out.ipynb"
    proc = subprocess.Popen(
        [str(CELLGATE), "run", "--no-progress", nb, out, "--execution-timeout", "100"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=clean_env())
    try:
        # Wait for the save made as the second cell started: the first is there, done.
        deadline, seen = time.monotonic() + 120, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                seen = json.loads(out.read_text())
            except (OSError, ValueError):  # not written yet (a save is a rename: never partial)
                seen = None
            if seen and seen["cells"][1]["metadata"]["papermill"]["status"] == "running":
                break
            time.sleep(0.05)
        assert seen is not None, proc.stderr.read() if proc.poll() is not None else "no output"
        cells = seen["cells"]
        assert [c["metadata"]["papermill"]["status"] for c in cells] == [
            "completed", "running", "pending"]
        assert stdout_of(cells[0]) == "first\n"
        assert seen["metadata"]["papermill"]["end_time"] is None
        # Ctrl-C ends it: the last save marks the interrupted cell failed.
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    cells = read_notebook(out).cells
    assert [c.metadata["papermill"]["status"] for c in cells] == [
        "completed", "failed", "pending"]
    assert read_notebook(out).metadata["papermill"]["exception"] is True


def test_execution_timeout_is_timeout(tmp_path):
    nb = write_notebook(tmp_path / "slow.ipynb", ["import time\ntime.sleep(120)"])
    proc = cellgate_run(nb, tmp_path / "out.ipynb", "--execution-timeout", "1")
    assert proc.returncode == 1 and proc.stdout.startswith("timeout"), proc.stderr
    assert "--timeout 1 s" in proc.stdout
