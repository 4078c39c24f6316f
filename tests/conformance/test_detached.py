"""Detached cells (issue 29): POST /api/kernels/{id}/execute with {"detach": true} answers 202
with an execution id at once; GET /api/kernels/{id}/executions/{eid}?after=N reads its events
from a cursor while it runs and after it ended, and a gateway started after a restart still
answers with what was recorded before it ("interrupted": the end never came to it).
"""

import json
import os
import signal
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")
DEADLINE = 120  # seconds for a short cell on a loaded machine

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")


def call(server, method, path, body=None):
    status, raw = gb.http_request(server, method, path, body, timeout=60)
    return status, (json.loads(raw) if raw else None)


def read_all(server, url, until):
    """Events by cursor until until(page) or the deadline; every event exactly once."""
    events, cursor, end = [], 0, time.monotonic() + DEADLINE
    while True:
        status, page = call(server, "GET", f"{url}?after={cursor}")
        assert status == 200, page
        assert page["next"] == cursor + len(page["events"]), page
        events += page["events"]
        cursor = page["next"]
        if until(page):
            return events, page
        assert time.monotonic() < end, page
        time.sleep(0.05)


def stdout_of(events):
    return "".join(e["text"] for e in events if e["type"] == "stream" and e["name"] == "stdout")


def test_a_detached_cell_is_read_from_a_cursor_and_outlives_its_gateway():
    with tempfile.TemporaryDirectory() as tmp:
        token = "t" + os.urandom(12).hex()
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--pool-size", "0"), token=token)
        try:
            kid = gb.start_kernel(server)
            status, started = call(server, "POST", f"/api/kernels/{kid}/execute", {
                "code": "import time\nfor i in range(5):\n    print(i, flush=True)\n"
                        "    time.sleep(0.1)\n'end'", "detach": True})
            assert status == 202, started
            eid = started["execution_id"]
            assert len(eid) == 32 and started["url"].endswith(f"/executions/{eid}"), started
            events, page = read_all(server, started["url"], lambda p: p["state"] == "done")
            assert stdout_of(events) == "0\n1\n2\n3\n4\n", events
            assert page["answer"]["status"] == "ok", page
            assert page["answer"]["result"] == {"text/plain": "'end'"}, page
            # Read again from the start: the same events; from the end: none.
            status, again = call(server, "GET", f"{started['url']}?after=0")
            assert again["events"] == events
            status, rest = call(server, "GET", f"{started['url']}?after={page['next']}")
            assert rest["events"] == [] and rest["state"] == "done"

            # Refusals: a bad cursor, an unknown id, another kernel's path, a bad flag.
            assert call(server, "GET", f"{started['url']}?after=x")[0] == 400
            assert call(server, "GET", f"/api/kernels/{kid}/executions/{'0' * 32}")[0] == 404
            other = gb.start_kernel(server)
            assert call(server, "GET", f"/api/kernels/{other}/executions/{eid}")[0] == 404
            assert call(server, "POST", f"/api/kernels/{kid}/execute",
                        {"code": "1", "detach": "yes"})[0] == 400

            # A long one, its gateway killed midway: the next gateway on the state dir answers
            # with the events recorded before, as "interrupted".
            status, long = call(server, "POST", f"/api/kernels/{kid}/execute", {
                "code": "import time\nprint('before', flush=True)\ntime.sleep(600)",
                "detach": True})
            assert status == 202
            read_all(server, long["url"], lambda p: "before" in stdout_of(p["events"]) or
                     p["state"] != "running")
            os.kill(server.proc.pid, signal.SIGKILL)
            server.proc.wait(timeout=30)
            server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--pool-size", "0"), token=token)
            status, page = call(server, "GET", f"{long['url']}?after=0")
            assert status == 200 and page["state"] == "interrupted", page
            assert stdout_of(page["events"]) == "before\n", page
            # The first one's record is there too, whole.
            status, page = call(server, "GET", f"{started['url']}?after=0")
            assert page["state"] == "done" and stdout_of(page["events"]) == "0\n1\n2\n3\n4\n"
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)
