"""Hibernate and resume through `cellgate serve` (README, "Hibernate"), for real with CRIU.

A kernel started cold (--no-zygote) sets x = 41 and writes a file in its work dir; POST
/api/kernels/{id}/hibernate checkpoints it: its launcher, its processes and its cgroup are gone,
its image dir is 0700, and the model stays, idle with "hibernated": true. An agent-API cell then
resumes it transparently (x + 1 == 42, the file still there); a second hibernate is resumed by a
WebSocket execute; an MCP session's kernel is resumed by its next run_code. Refusals: an unknown id is 404, a busy kernel 409 (and it runs on), a kernel
forked from the zygote 409 naming --no-zygote. Where CRIU cannot work the route answers 501 and
the test skips with that reason, unless scripts/install-criu's CRIU is installed (as in CI): then a
501 is a failure, so a broken CRIU cannot turn these tests into skips. Needs root (the jail)."""
import http.client
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")
INSTALLED_CRIU = "/opt/cellgate/criu/sbin/criu"  # scripts/install-criu
# Checkpoints drop the kernel's Landlock layer (CRIU cannot save it): off unless accepted.
ACCEPT = "--checkpoint-without-landlock"


def unavailable(answer):
    """A 501: skip where no CRIU was installed; with scripts/install-criu's, fail."""
    assert not os.path.exists(INSTALLED_CRIU), (
        f"{INSTALLED_CRIU} is installed but the gateway says checkpoints cannot work: {answer}")
    pytest.skip(f"checkpoints unavailable here: {answer['message']}")


def call(server, method, path, body=None, timeout=120):
    status, raw = gb.http_request(server, method, path, body, timeout=timeout)
    return status, (json.loads(raw) if raw else None)


def execute(server, kid, code, timeout=60):
    status, answer = call(server, "POST", f"/api/kernels/{kid}/execute",
                          {"code": code, "timeout": timeout}, timeout=timeout + 30)
    assert status == 200, f"{status} {answer}\n{server.log_tail()}"
    return answer


def hibernate(server, kid):
    status, answer = call(server, "POST", f"/api/kernels/{kid}/hibernate")
    if status == 501:
        unavailable(answer)
    assert status == 200, f"{status} {answer}\n{server.log_tail()}"
    return answer


def record(server, kid):
    return json.loads(pathlib.Path(server.marker, "kernels", kid + ".json").read_text())


def alive(pid):
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def assert_hibernated(server, kid, facts):
    """The model says so; the launcher, the jail and its cgroup are gone; the image is private."""
    status, model = call(server, "GET", f"/api/kernels/{kid}")
    assert status == 200 and model["execution_state"] == "idle" and model["hibernated"] is True, \
        model
    status, models = call(server, "GET", "/api/kernels")
    assert [m for m in models if m["id"] == kid][0]["hibernated"] is True
    assert not alive(facts["kernel_pid"]), "the jail's pid 1 still runs"
    assert not alive(facts["launcher_pid"]), "the launcher still runs"
    for path in facts["cgroup_paths"]:
        assert not os.path.isdir(path), f"the cgroup {path} is still there"
    image = pathlib.Path(server.marker, "kernels", kid, "hibernated")
    assert image.stat().st_mode & 0o777 == 0o700, oct(image.stat().st_mode)


def test_hibernate_then_resume_by_a_cell_and_by_a_websocket():
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--no-zygote", ACCEPT))
        try:
            kid = gb.start_kernel(server)
            answer = execute(server, kid, "x = 41\nopen('note.txt', 'w').write('kept')")
            assert answer["status"] == "ok", answer
            facts = record(server, kid)["process"]

            model = hibernate(server, kid)
            assert model["id"] == kid and model["hibernated"] is True, model
            assert_hibernated(server, kid, facts)
            # Already hibernated: a conflict, and nothing changes.
            status, answer = call(server, "POST", f"/api/kernels/{kid}/hibernate")
            assert status == 409 and answer["error"] == "hibernated", answer

            # An agent cell resumes it transparently: variables and files as they were.
            answer = execute(server, kid, "print(x + 1, open('note.txt').read())")
            assert answer["status"] == "ok" and answer["stdout"] == "42 kept\n", answer
            status, model = call(server, "GET", f"/api/kernels/{kid}")
            assert "hibernated" not in model and model["execution_state"] == "idle", model
            assert not pathlib.Path(server.marker, "kernels", kid, "hibernated").exists()

            # Again, resumed this time by a WebSocket client's execute_request.
            facts = record(server, kid)["process"]
            hibernate(server, kid)
            assert_hibernated(server, kid, facts)
            client = gb.KernelClient(server, kid)
            try:
                assert client.run_stdout("x += 1\nprint(x)") == "42\n"
            finally:
                client.close()
            assert execute(server, kid, "print(x)")["stdout"] == "42\n"

            # A hibernated kernel shut down: its image goes with it.
            hibernate(server, kid)
            status, _ = call(server, "DELETE", f"/api/kernels/{kid}")
            assert status == 204
            assert not pathlib.Path(server.marker, "kernels", kid).exists()
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)


def test_hibernate_refusals():
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4, (ACCEPT,))  # the zygote on, as by default
        try:
            status, answer = call(server, "POST", "/api/kernels/no-such-kernel/hibernate")
            assert status == 404, answer

            # A kernel started before the zygote is ready starts cold: wait for its log line.
            deadline = time.monotonic() + 180
            while "zygote: ready" not in pathlib.Path(server.log_path).read_text(errors="replace"):
                assert time.monotonic() < deadline, "the zygote was not ready within 180 s"
                time.sleep(0.1)
            kid = gb.start_kernel(server)
            # A busy kernel: 409, and the cell runs to its end.
            started = threading.Event()
            result = {}

            def long_cell():
                started.set()
                # Busy until the test puts `go` in its work dir: no guess at how long is enough.
                result["answer"] = execute(
                    server, kid, "import os, time\nwhile not os.path.exists('go'):\n"
                    "    time.sleep(0.05)\nprint('done')", timeout=300)

            cell = threading.Thread(target=long_cell)
            cell.start()
            started.wait()
            deadline = time.monotonic() + 30
            while call(server, "GET", f"/api/kernels/{kid}")[1]["execution_state"] != "busy":
                assert time.monotonic() < deadline, "the cell did not make the kernel busy"
            status, answer = call(server, "POST", f"/api/kernels/{kid}/hibernate")
            if status == 501:
                gb.http_request(server, "PUT", f"/api/kernels/{kid}/files/go", "go")
                cell.join()
                unavailable(answer)
            assert status == 409 and answer["error"] == "kernel_busy", answer
            status, _ = gb.http_request(server, "PUT", f"/api/kernels/{kid}/files/go", "go")
            assert status in (200, 201), status
            cell.join()
            assert result["answer"]["stdout"] == "done\n", result

            # Forked from the zygote: refused before anything closes, naming the way out.
            status, answer = call(server, "POST", f"/api/kernels/{kid}/hibernate")
            assert status == 409 and answer["error"] == "not_hibernatable", answer
            assert "--no-zygote" in answer["message"], answer
            assert execute(server, kid, "print(1 + 1)")["stdout"] == "2\n"
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)


class Mcp:
    """A Streamable HTTP MCP client of the fewest words: initialize, then tools/call."""

    def __init__(self, server):
        self.server, self.session, self.ids = server, None, 0
        self.call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "test_hibernate", "version": "1"}})
        self.call("notifications/initialized", notification=True)

    def call(self, method, params=None, notification=False):
        msg = {"jsonrpc": "2.0", "method": method, **({"params": params} if params else {})}
        if not notification:
            self.ids += 1
            msg["id"] = self.ids
        headers = {"Authorization": f"Bearer {self.server.token}", "Accept": "application/json",
                   "Content-Type": "application/json"}
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
        try:
            conn.request("POST", "/mcp", body=json.dumps(msg).encode(), headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        if notification:
            assert resp.status == 202, (resp.status, raw)
            return None
        assert resp.status == 200, (resp.status, raw)
        if method == "initialize":
            self.session = resp.getheader("Mcp-Session-Id")
        answer = json.loads(raw)
        assert "result" in answer, answer
        return answer["result"]

    def run_code(self, code):
        result = self.call("tools/call", {"name": "run_code",
                                          "arguments": {"code": code, "timeout": 60}})
        return json.dumps(result)


def test_an_mcp_cell_resumes_its_sessions_hibernated_kernel():
    """MCP reaches the executor as the agent API does: its cell resumes the kernel too."""
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--no-zygote", ACCEPT))
        try:
            mcp = Mcp(server)
            assert "ok" in mcp.run_code("y = 5\nprint('ok')")
            status, models = call(server, "GET", "/api/kernels")
            assert status == 200 and len(models) == 1, models
            kid = models[0]["id"]
            facts = record(server, kid)["process"]
            hibernate(server, kid)
            assert_hibernated(server, kid, facts)
            out = mcp.run_code("print(y * 2)")
            assert "10" in out, out
            status, model = call(server, "GET", f"/api/kernels/{kid}")
            assert "hibernated" not in model, model
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)


def crash(server):
    """kill -9 of the gateway alone, as an OOM kill would."""
    server.remember()
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()


def model(server, kid):
    status, answer = call(server, "GET", f"/api/kernels/{kid}")
    assert status == 200, f"{status} {answer}\n{server.log_tail()}"
    return answer


def test_a_hibernated_kernel_outlives_its_gateway():
    """kill -9 of the gateway while a kernel is hibernated, then SIGTERM with --hibernate-on-stop:
    each next gateway on the state dir lists the kernels hibernated and resumes them on first use
    with their variables and files."""
    with tempfile.TemporaryDirectory() as tmp:
        flags = ("--no-zygote", ACCEPT, "--pool-size", "0", "--hibernate-on-stop")
        servers = [gb.start_cellgate(BIN_DIR, tmp, 4, flags)]
        try:
            first = servers[0]
            kid = gb.start_kernel(first)
            assert execute(first, kid, "x = 41\nopen('note.txt', 'w').write('kept')")["status"] == "ok"
            hibernate(first, kid)
            assert record(first, kid)["hibernated"] is True
            crash(first)

            second = gb.start_cellgate(BIN_DIR, tmp, 4, flags)
            servers.append(second)
            assert model(second, kid)["hibernated"] is True, second.log_tail()
            answer = execute(second, kid, "print(x + 1, open('note.txt').read())")
            assert answer["status"] == "ok" and answer["stdout"] == "42 kept\n", answer
            assert record(second, kid)["hibernated"] is False
            # --hibernate-on-stop: SIGTERM hibernates both kernels instead of ending them.
            other = gb.start_kernel(second)
            assert execute(second, other, "y = 'other'")["status"] == "ok"
            second.stop()
            assert second.proc.returncode == 0, second.log_tail()
            for k in (kid, other):
                assert record(second, k)["hibernated"] is True, k
                assert pathlib.Path(second.marker, "kernels", k, "hibernated").is_dir()

            third = gb.start_cellgate(BIN_DIR, tmp, 4, ("--no-zygote", ACCEPT, "--pool-size", "0"))
            servers.append(third)
            assert model(third, kid)["hibernated"] is True and model(third, other)["hibernated"]
            client = gb.KernelClient(third, other)  # a Jupyter client resumes it
            try:
                assert client.run_stdout("print(y)") == "other\n"
            finally:
                client.close()
            assert execute(third, kid, "print(x)")["stdout"] == "41\n"
            # Without --hibernate-on-stop a stop ends them: records and images go.
            third.stop()
            assert not list(pathlib.Path(third.marker, "kernels").glob("*.json"))
        finally:
            for s in servers:
                s.stop()
            gb.unmount_leftovers(tmp)


def test_hibernate_after_an_idle_time():
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--no-zygote", ACCEPT, "--pool-size", "0",
                                                     "--hibernate-after", "1"))
        try:
            kid = gb.start_kernel(server)
            assert execute(server, kid, "x = 5")["status"] == "ok"
            hibernate(server, kid)  # by hand first: skips where checkpoints cannot work
            assert execute(server, kid, "x += 1")["status"] == "ok"
            deadline = time.monotonic() + 120
            while not model(server, kid).get("hibernated"):
                assert time.monotonic() < deadline, "not hibernated 120 s after 1 s idle:\n" + \
                    server.log_tail()
                time.sleep(0.2)
            answer = execute(server, kid, "print(x)")
            assert answer["status"] == "ok" and answer["stdout"] == "6\n", answer
            assert "hibernated in" in pathlib.Path(server.log_path).read_text()
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)


def test_a_corrupt_image_fails_that_kernel_alone():
    """Images on disk are hostile input: a hibernated kernel whose image was overwritten fails to
    resume with a clear error and is dead; its neighbour, hibernated too, resumes intact."""
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--no-zygote", ACCEPT, "--pool-size", "0"))
        try:
            bad, good = gb.start_kernel(server), gb.start_kernel(server)
            assert execute(server, bad, "x = 1")["status"] == "ok"
            assert execute(server, good, "x = 2")["status"] == "ok"
            hibernate(server, bad)
            hibernate(server, good)
            images = sorted(pathlib.Path(server.marker, "kernels", bad, "hibernated").iterdir())
            assert images, "no image files"
            for path in images:
                if path.is_file():
                    size = path.stat().st_size
                    path.write_bytes(os.urandom(min(size, 4096)) + b"\0" * max(0, size - 4096))
            status, answer = call(server, "POST", f"/api/kernels/{bad}/execute",
                                  {"code": "print(x)", "timeout": 60}, timeout=120)
            text = json.dumps(answer)
            assert status >= 400 or answer.get("status") != "ok", answer
            assert "could not be resumed" in text, answer
            assert model(server, bad)["execution_state"] == "dead"
            answer = execute(server, good, "print(x)")
            assert answer["status"] == "ok" and answer["stdout"] == "2\n", answer
            # The dead one restarts afresh, as a restart of any dead kernel does.
            status, _ = call(server, "POST", f"/api/kernels/{bad}/restart")
            assert status == 200
            assert execute(server, bad, "print('fresh')")["stdout"] == "fresh\n"
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)


def test_the_disk_budget_refuses_with_507():
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--no-zygote", ACCEPT, "--pool-size", "0",
                                                     "--hibernate-disk-max", "1M"))
        try:
            kid = gb.start_kernel(server)
            assert execute(server, kid, "x = 3")["status"] == "ok"
            status, answer = call(server, "POST", f"/api/kernels/{kid}/hibernate")
            if status == 501:
                unavailable(answer)
            assert status == 507 and answer["error"] == "no_space", (status, answer)
            assert "--hibernate-disk-max" in answer["message"], answer
            assert "hibernated" not in model(server, kid)
            assert not pathlib.Path(server.marker, "kernels", kid, "hibernated").exists()
            assert execute(server, kid, "print(x)")["stdout"] == "3\n"
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)


LAYERS = """import json, os, socket
def refused(f):
    try:
        f()
        return False
    except OSError:
        return True
status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines()
              if ':\\t' in l)
print(json.dumps({'uid': os.getuid(), 'no_new_privs': status['NoNewPrivs'].strip(),
                  'seccomp': status['Seccomp'].strip(),
                  'inet_refused': refused(lambda: socket.socket(socket.AF_INET)),
                  'root_listing_refused': refused(lambda: os.listdir('/'))}))
"""


def layers(server, kid):
    answer = execute(server, kid, LAYERS)
    assert answer["status"] == "ok", answer
    return json.loads(answer["stdout"])


def test_without_the_landlock_opt_in_checkpoints_fail_closed():
    """CRIU saves no Landlock domain. Without --checkpoint-without-landlock a hibernate is a 501
    naming the flag and the kernel runs on; asking for hibernation at start stops the gateway."""
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--no-zygote", "--pool-size", "0"))
        try:
            kid = gb.start_kernel(server)
            assert execute(server, kid, "x = 7")["status"] == "ok"
            status, answer = call(server, "POST", f"/api/kernels/{kid}/hibernate")
            assert status == 501, (status, answer)
            if "Landlock" not in answer["message"]:
                unavailable(answer)  # no CRIU at all here: the other reason
            assert ACCEPT in answer["message"], answer
            assert "hibernated" not in model(server, kid)
            assert execute(server, kid, "print(x)")["stdout"] == "7\n"
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)
        for flags in (("--hibernate-after", "60"), ("--hibernate-on-stop",)):
            done = subprocess.run(
                [os.path.join(BIN_DIR, "cellgate"), "serve", "--ip", "127.0.0.1", "--port", "0",
                 "--token", "t" * 32, "--state-dir", os.path.join(tmp, "refused"), *flags],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
            assert done.returncode == 2, (flags, done.returncode, done.stdout, done.stderr)
            assert ACCEPT in done.stderr and "Landlock" in done.stderr, done.stderr


def test_a_resumed_kernel_keeps_every_layer_but_landlock():
    """What the opt-in accepts, exactly: after a resume the uid, no_new_privs, the seccomp filter
    (AF_INET refused) are as before; the Landlock layer (listing / refused) is gone. Should CRIU
    learn to save Landlock, the last assertion fails and jail/README's Checkpoints must change."""
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--no-zygote", ACCEPT, "--pool-size", "0"))
        try:
            kid = gb.start_kernel(server)
            before = layers(server, kid)
            assert before["root_listing_refused"] and before["inet_refused"], before
            assert before["no_new_privs"] == "1" and before["seccomp"] == "2", before
            hibernate(server, kid)
            after = layers(server, kid)
            assert after["root_listing_refused"] is False, after
            assert {k: v for k, v in after.items() if k != "root_listing_refused"} == \
                {k: v for k, v in before.items() if k != "root_listing_refused"}, (before, after)
            assert "without its Landlock layer" in pathlib.Path(server.log_path).read_text()
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)
