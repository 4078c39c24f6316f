"""`cellgate serve --seed NOTEBOOK` in the jupyter-websocket mode (Kernel Gateway's seed_uri): the
notebook's code cells run, in order, in every new kernel of its language before a client sees it
— a pooled kernel, a fresh one, and one restarted — without adding to its history; a seed cell
that fails fails the kernel's start with seed_failed, naming the cell; a notebook that cannot be
read stops serve. Real jailed kernels."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")


def write_notebook(path, cells, language="python"):
    path.write_text(json.dumps({
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "language": language,
                                    "display_name": "Python 3"},
                     "language_info": {"name": language}},
        "cells": [{"cell_type": kind, "metadata": {}, "source": source,
                   **({"outputs": [], "execution_count": None} if kind == "code" else {})}
                  for kind, source in cells]}))


def execute(server, kid, code):
    status, body = gb.http_request(server, "POST", f"/api/kernels/{kid}/execute",
                                   {"code": code, "timeout": 60}, timeout=120)
    assert status == 200, body
    return json.loads(body)


def test_every_new_kernel_is_seeded_pooled_fresh_and_restarted():
    with tempfile.TemporaryDirectory() as tmp:
        nb = pathlib.Path(tmp) / "seed.ipynb"
        write_notebook(nb, [("code", "seeded = 40"), ("markdown", "not code: seeded = 0"),
                            ("code", ["seeded += 2\n", "import os\n",
                                      "os.makedirs('from-seed', exist_ok=True)"])])
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--seed", str(nb), "--pool-size", "1"))
        try:
            pooled = gb.start_kernel(server)
            # A client env keeps a start off the pool: this one is started for the request.
            fresh = gb.start_kernel(server, env={"KERNEL_SEED_TEST": "1"})
            for kid in (pooled, fresh):
                answer = execute(server, kid, "seeded, os.path.isdir('from-seed')")
                assert answer["status"] == "ok", answer
                assert answer["result"]["text/plain"] == "(42, True)", answer
                # The seed's cells are not the client's history: its first cell is In[1].
                assert answer["execution_count"] == 1, answer
            execute(server, pooled, "seeded = -1")
            status, body = gb.http_request(server, "POST", f"/api/kernels/{pooled}/restart")
            assert status == 200, body
            answer = execute(server, pooled, "seeded")
            assert answer["result"]["text/plain"] == "42", answer  # seeded again, not -1
        finally:
            server.stop()


def test_a_failing_seed_cell_fails_the_start_and_an_unreadable_seed_stops_serve():
    with tempfile.TemporaryDirectory() as tmp:
        nb = pathlib.Path(tmp) / "bad-seed.ipynb"
        write_notebook(nb, [("code", "x = 1"), ("code", "raise ValueError('seed says no')")])
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--seed", str(nb), "--pool-size", "0"))
        try:
            status, body = gb.http_request(server, "POST", "/api/kernels",
                                           {"name": server.kernel_name}, timeout=120)
            assert status >= 400, body
            error = json.loads(body)
            assert error["error"] == "seed_failed", error
            assert "cell 2" in error["message"] and "seed says no" in error["message"], error
            status, body = gb.http_request(server, "GET", "/api/kernels")
            assert status == 200 and json.loads(body) == [], body  # nothing left running
        finally:
            server.stop()
        ran = subprocess.run(
            [str(pathlib.Path(BIN_DIR) / "cellgate"), "serve", "--ip", "127.0.0.1", "--port", "0",
             "--state-dir", str(pathlib.Path(tmp) / "state-missing"), "--pool-size", "0",
             "--seed", str(pathlib.Path(tmp) / "no-such.ipynb")],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert ran.returncode != 0
        assert "--seed" in ran.stdout + ran.stderr and "no-such.ipynb" in ran.stdout + ran.stderr
