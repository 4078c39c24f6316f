"""`cellgate run --url` against a `cellgate serve` started here (loopback, a free port, a temp
state dir; stopped by its pid): the files beside the notebook go in through the files API, the
outputs and artifacts come back, errors and a wrong token give the documented exit codes, and
every kernel the run started is deleted.

    CELLGATE_BIN_DIR=build-run/bin /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        tests/notebooks/test_remote.py
"""

import json
import urllib.request

import pytest

from conftest import NOTEBOOKS, Server, cellgate_run, is_valid_png, read_notebook, run_json, \
    write_notebook


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve"))
    s.start()
    yield s
    s.stop()


def kernels(server):
    req = urllib.request.Request(server.url + "/api/kernels",
                                 headers={"Authorization": f"token {server.token}"})
    with urllib.request.urlopen(req, timeout=30) as res:
        return json.loads(res.read())


def test_runs_on_a_remote_gateway(server, tmp_path):
    out, art = tmp_path / "out", tmp_path / "art"
    code, summary, err = run_json(
        "--url", server.url, "--token", server.token, "--jobs", "2",
        "--output-dir", out, "--artifacts", art,
        NOTEBOOKS / "data_analysis.ipynb", NOTEBOOKS / "self_debugging.ipynb")
    assert code == 0, f"{summary}\n{err}"
    assert [r["status"] for r in summary["notebooks"]] == ["ok", "ok"]
    nb = read_notebook(out / "data_analysis.ipynb")  # read data/sales.csv, sent with PUT
    assert "West" in nb.cells[2].outputs[0]["text"]
    assert is_valid_png((art / "data_analysis" / "cell4-1.png").read_bytes())
    assert kernels(server) == []


def test_remote_errors_timeouts_and_parameters(server, tmp_path):
    nb = write_notebook(tmp_path / "fails.ipynb", ["x = 1", "x / 0", "print('after')"])
    proc = cellgate_run("--url", server.url, "--token", server.token, nb)
    assert proc.returncode == 1, proc.stderr
    assert "cells[1] `x / 0`" in proc.stdout and "ZeroDivisionError" in proc.stdout

    slow = write_notebook(tmp_path / "slow.ipynb", ["import time\ntime.sleep(60)"])
    code, summary, err = run_json("--url", server.url, "--token", server.token,
                                  "--timeout", "1", slow)
    assert code == 1 and summary["notebooks"][0]["status"] == "timeout", err

    out = tmp_path / "p.ipynb"
    proc = cellgate_run("--url", server.url, "--token", server.token, "-p", "region", "East",
                        NOTEBOOKS / "parameters.ipynb", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "region='East'" in read_notebook(out).cells[3].outputs[0]["text"]
    assert kernels(server) == []


def test_a_wrong_token_or_no_gateway_is_a_usage_error(server, tmp_path):
    nb = write_notebook(tmp_path / "a.ipynb", ["1"])
    proc = cellgate_run("--url", server.url, "--token", "wrong", nb)
    assert proc.returncode == 2, proc.stderr
    assert "answered 403: the token is not valid" in proc.stderr, proc.stderr
    proc = cellgate_run("--url", "http://127.0.0.1:9", nb)
    assert proc.returncode == 2, proc.stderr
    assert "cannot use the gateway at http://127.0.0.1:9" in proc.stderr, proc.stderr


def test_remote_outputs_follow_nbclient_across_cells(server, tmp_path):
    # The events arrive as NDJSON: display ids updated across cells and clear_output(wait=True)
    # come out as nbclient makes them.
    from test_differential import NBCLIENT_FILES, assert_same_notebook, run_nbclient
    paths = [p for p in NBCLIENT_FILES if p.stem in ("update-display-id", "Clear Output")]
    code, summary, err = run_json("--url", server.url, "--token", server.token, *paths,
                                  "--output-dir", tmp_path)
    assert code == 0, f"{summary}\n{err}"
    for path in paths:
        mine = read_notebook(tmp_path / path.name)
        theirs = run_nbclient(path)
        # Over REST only the kernelspec's language is known of language_info.
        assert mine.metadata.language_info == {"name": theirs.metadata.language_info.name}
        mine.metadata.language_info = theirs.metadata.language_info
        assert_same_notebook(mine, theirs)
    assert kernels(server) == []
