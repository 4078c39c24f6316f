"""Debian's jupyter_server 1.23 in front of cellgate (`--gateway-url`), driven through its REST API
and its WebSocket (legacy JSON frames with "channel"), as a browser behind jupyter_server would.

    CELLGATE_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q tests/conformance/test_jupyter_server_gateway.py

cellgate serve runs its kernels jailed, so this needs root; it skips with a reason otherwise.
What jupyter_server sends upstream is described in ../shared/reference/jupyter-gateway-api.md
(§3.8, §3.11, §5). jupyter_server 1.23 puts its whole environment into the POST /api/kernels
body for kernels started through a session: the canary below must not reach the kernel.
"""

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

if os.geteuid() != 0:
    pytest.skip("cellgate's jailed kernels need root (namespaces, cgroups, mounts)",
                allow_module_level=True)

from tornado.httpclient import HTTPRequest  # noqa: E402
from tornado.websocket import websocket_connect  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("CELLGATE_BIN_DIR") or REPO / "build" / "bin")
CELLGATE = BIN_DIR / "cellgate"
PYTHON = "/usr/bin/python3"  # Debian's: the one with jupyter_server 1.23

CANARY_NAME = "CELLGATE_TEST_SECRET"
CANARY_VALUE = "canary-" + uuid.uuid4().hex
PASSED_NAME = "KERNEL_CELLGATE_TEST_PROBE"  # KERNEL_* names are meant to pass (§3.8)
PASSED_VALUE = "probe-" + uuid.uuid4().hex

START_TIMEOUT = 60    # seconds for either server to answer
HTTP_TIMEOUT = 60     # one REST call (a jailed kernel start is inside it)
EXEC_TIMEOUT = 30     # one cell
STOP_TIMEOUT = 20     # SIGTERM to exit


# ---- processes -------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM by pid, wait; SIGKILL only if it does not exit."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT)


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def http(method: str, url: str, token: str, body=None, timeout: float = HTTP_TIMEOUT):
    """(status, parsed JSON or None). Never raises on an HTTP error status."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", f"token {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            status, raw = res.status, res.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, (json.loads(raw) if raw else None)
    except ValueError:
        return status, raw.decode(errors="replace")


class Stack:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.loop = asyncio.new_event_loop()
        self.gw_token = uuid.uuid4().hex
        self.js_token = uuid.uuid4().hex
        self.gw_proc = None
        self.js_proc = None

    # cellgate
    def start_gateway(self) -> None:
        out, err = self.tmp / "cellgate.out", self.tmp / "cellgate.err"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELLGATE_")}
        with open(out, "wb") as o, open(err, "wb") as e:
            self.gw_proc = subprocess.Popen(
                [str(CELLGATE), "serve", "--ip", "127.0.0.1", "--port", "0",
                 "--token", self.gw_token, "--state-dir", str(self.tmp / "state")],
                stdin=subprocess.DEVNULL, stdout=o, stderr=e, env=env)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", out.read_text(errors="replace"))
            if m:
                self.gw_url = f"http://127.0.0.1:{m.group(1)}"
                return
            if self.gw_proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"cellgate serve did not start:\n{tail(err)}")

    # jupyter_server
    def start_jupyter_server(self) -> None:
        port = free_port()
        self.js_url = f"http://127.0.0.1:{port}"
        self.js_ws = f"ws://127.0.0.1:{port}"
        root = self.tmp / "root"
        home = self.tmp / "home"
        for d in (root, home):
            d.mkdir()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("JUPYTER", "JPY_", "KERNEL_", "CELLGATE_", "PYTHON"))}
        env.update({
            "HOME": str(home),
            "JUPYTER_CONFIG_DIR": str(self.tmp / "jupyter-config"),
            "JUPYTER_DATA_DIR": str(self.tmp / "jupyter-data"),
            "JUPYTER_RUNTIME_DIR": str(self.tmp / "jupyter-runtime"),
            "JUPYTER_PLATFORM_DIRS": "0",
            "PYTHONNOUSERSITE": "1",
            CANARY_NAME: CANARY_VALUE,
            PASSED_NAME: PASSED_VALUE,
        })
        self.js_log = self.tmp / "jupyter_server.log"
        with open(self.js_log, "wb") as log:
            self.js_proc = subprocess.Popen(
                [PYTHON, "-m", "jupyter_server", "--no-browser",
                 "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                 "--ServerApp.port_retries=0", f"--ServerApp.token={self.js_token}",
                 f"--ServerApp.root_dir={root}", "--ServerApp.allow_root=True",
                 f"--gateway-url={self.gw_url}", f"--GatewayClient.auth_token={self.gw_token}",
                 "--GatewayClient.request_timeout=60"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                cwd=str(root))
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.js_proc.poll() is not None:
                break
            try:
                status, body = http("GET", self.js_url + "/api", self.js_token, timeout=2)
                if status == 200 and "version" in body:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"jupyter_server did not start:\n{tail(self.js_log)}")

    def close(self) -> None:
        for proc in (self.js_proc, self.gw_proc):  # jupyter_server first: it DELETEs its kernels
            if proc is not None:
                stop(proc)
        self.loop.close()

    # REST helpers
    def js(self, method, path, body=None):
        return http(method, self.js_url + path, self.js_token, body)

    def gw(self, method, path, body=None):
        return http(method, self.gw_url + path, self.gw_token, body)

    def run(self, coro, timeout=EXEC_TIMEOUT):
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    def connect(self, kernel_id: str) -> "Channels":
        return self.run(Channels.open(self, kernel_id))

    def diagnostics(self) -> str:
        return (f"--- jupyter_server log ---\n{tail(self.js_log)}\n"
                f"--- cellgate stderr ---\n{tail(self.tmp / 'cellgate.err')}")


@pytest.fixture(scope="module")
def stack():
    if not CELLGATE.exists():
        pytest.skip(f"{CELLGATE} is not built (cmake --build build --target cellgate cellgate-kernel)")
    tmp = Path(tempfile.mkdtemp(prefix="cellgate-js-"))
    s = Stack(tmp)
    try:
        s.start_gateway()
        s.start_jupyter_server()
        yield s
    finally:
        s.close()
        shutil.rmtree(tmp, ignore_errors=True)


# ---- the WebSocket, legacy JSON protocol (§5.3) ----------------------------------------------

class Channels:
    def __init__(self, stack, conn):
        self.stack = stack
        self.conn = conn
        self.session = uuid.uuid4().hex
        self.queue: asyncio.Queue = asyncio.Queue()
        self.reader = asyncio.ensure_future(self._read())

    @classmethod
    async def open(cls, stack, kernel_id):
        url = f"{stack.js_ws}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4()}"
        req = HTTPRequest(url, headers={"Authorization": f"token {stack.js_token}"},
                          connect_timeout=10, request_timeout=EXEC_TIMEOUT)
        ch = cls(stack, await websocket_connect(req))
        # jupyter_server 1.23 drops client frames sent before its upstream WS is up
        # (GatewayWebSocketClient.on_message waits on a future that _connect replaces), so
        # repeat kernel_info_request until it is answered, as JupyterLab's nudge does.
        for _ in range(20):
            msg_id = ch.send("shell", "kernel_info_request", {})
            try:
                await ch.wait_for(lambda m: m.get("channel") == "shell"
                                  and m["parent_header"].get("msg_id") == msg_id, timeout=2)
                return ch
            except asyncio.TimeoutError:
                continue
        raise AssertionError("no kernel_info_reply through jupyter_server")

    async def _read(self):
        while True:
            raw = await self.conn.read_message()
            if raw is None:
                await self.queue.put(None)
                return
            if isinstance(raw, bytes):  # legacy binary frame (§5.4): JSON part only
                n = int.from_bytes(raw[:4], "big")
                start = int.from_bytes(raw[4:8], "big")
                end = int.from_bytes(raw[8:12], "big") if n > 1 else len(raw)
                raw = raw[start:end].decode()
            await self.queue.put(json.loads(raw))

    def send(self, channel, msg_type, content, parent=None) -> str:
        msg_id = uuid.uuid4().hex
        self.conn.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": msg_type, "username": "test",
                       "session": self.session, "version": "5.3",
                       "date": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")},
            "parent_header": parent or {}, "metadata": {}, "content": content,
            "buffers": [], "channel": channel}))
        return msg_id

    async def recv(self, timeout):
        msg = await asyncio.wait_for(self.queue.get(), timeout)
        if msg is None:
            raise AssertionError("the WebSocket closed")
        assert isinstance(msg.get("channel"), str), msg  # §1.7
        return msg

    async def wait_for(self, pred, timeout):
        deadline = time.monotonic() + timeout
        while True:
            msg = await self.recv(max(0.01, deadline - time.monotonic()))
            if pred(msg):
                return msg

    def execute(self, code, *, allow_stdin=False, stop_on_error=True):
        # Cells that are meant to fail pass stop_on_error=False: with True, ipykernel 6.17 aborts
        # execute_requests that arrive before its "stop aborting" callback has run, which can be
        # after the error's execute_reply and idle status (a kernel race, not the gateway's).
        return self.send("shell", "execute_request",
                         {"code": code, "silent": False, "store_history": True,
                          "user_expressions": {}, "allow_stdin": allow_stdin,
                          "stop_on_error": stop_on_error})

    async def collect(self, msg_id, answer=None, timeout=EXEC_TIMEOUT):
        """Everything for one request until its execute_reply and iopub idle."""
        out = {"stdout": "", "stderr": "", "errors": [], "reply": None, "input_requests": []}
        idle = False
        deadline = time.monotonic() + timeout
        while out["reply"] is None or not idle:
            msg = await self.recv(max(0.01, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if msg["channel"] == "iopub":
                if kind == "stream":
                    out[content["name"]] += content["text"]
                elif kind == "error":
                    out["errors"].append(content)
                elif kind == "status" and content["execution_state"] == "idle":
                    idle = True
            elif msg["channel"] == "shell" and kind == "execute_reply":
                out["reply"] = content
            elif msg["channel"] == "stdin" and kind == "input_request":
                out["input_requests"].append(content)
                self.send("stdin", "input_reply", {"value": answer(content["prompt"])},
                          parent=msg["header"])
        return out

    def run_cell(self, code, **kw):
        answer = kw.pop("answer", None)
        msg_id = self.execute(code, **kw)
        return self.stack.run(self.collect(msg_id, answer), EXEC_TIMEOUT + 5)

    def close(self):
        self.conn.close()
        self.reader.cancel()
        try:
            self.stack.loop.run_until_complete(asyncio.sleep(0.05))
        except RuntimeError:
            pass


# ---- tests -----------------------------------------------------------------------------------

def test_kernelspecs_come_from_the_gateway(stack):
    status, specs = stack.js("GET", "/api/kernelspecs")
    assert status == 200, (status, specs)
    assert "python3" in specs["kernelspecs"], specs
    spec = specs["kernelspecs"]["python3"]["spec"]
    assert "cellgate" in spec["display_name"], spec
    assert spec["language"] == "python"
    status, one = stack.js("GET", "/api/kernelspecs/python3")
    assert status == 200 and "cellgate" in one["spec"]["display_name"], (status, one)


def test_kernel_lifecycle_through_jupyter_server(stack):
    # start
    status, model = stack.js("POST", "/api/kernels", {"name": "python3"})
    assert status == 201, (status, model, stack.diagnostics())
    kid = model["id"]
    assert re.fullmatch(r"\w+-\w+-\w+-\w+-\w+", kid), kid
    status, gw_model = stack.gw("GET", f"/api/kernels/{kid}")
    assert status == 200 and gw_model["id"] == kid, (status, gw_model)
    status, listed = stack.js("GET", "/api/kernels")
    assert status == 200 and kid in [k["id"] for k in listed], (status, listed)

    ch = stack.connect(kid)
    try:
        # execute, state kept between cells
        r = ch.run_cell("x = 41")
        assert r["reply"]["status"] == "ok", r
        r = ch.run_cell("print(x + 1)")
        assert r["reply"]["status"] == "ok" and r["stdout"] == "42\n", r

        # an error
        r = ch.run_cell("1 / 0", stop_on_error=False)
        assert r["reply"]["status"] == "error" and r["reply"]["ename"] == "ZeroDivisionError", r
        assert [e["ename"] for e in r["errors"]] == ["ZeroDivisionError"], r
        assert any("ZeroDivisionError" in line for line in r["errors"][0]["traceback"]), r

        # stdin: input_request on the stdin channel, answered with input_reply
        r = ch.run_cell('answer = input("who? ")\nprint("hello", answer)',
                        allow_stdin=True, answer=lambda prompt: "cellgate")
        assert [q["prompt"] for q in r["input_requests"]] == ["who? "], r
        assert r["reply"]["status"] == "ok" and r["stdout"].endswith("hello cellgate\n"), r

        # jupyter_server's own environment is not the kernel's (§3.8: the gateway filters env)
        r = ch.run_cell(f"import os; print(os.environ.get({CANARY_NAME!r}))")
        assert r["stdout"] == "None\n", r

        # interrupt a busy loop through jupyter_server
        msg_id = ch.execute("while True: pass", stop_on_error=False)
        stack.run(ch.wait_for(lambda m: m["channel"] == "iopub"
                              and m["parent_header"].get("msg_id") == msg_id
                              and m["msg_type"] == "execute_input", EXEC_TIMEOUT))
        time.sleep(0.5)
        status, body = stack.js("POST", f"/api/kernels/{kid}/interrupt", {})
        assert status == 204, (status, body)
        r = stack.run(ch.collect(msg_id), EXEC_TIMEOUT + 5)
        assert r["reply"]["status"] == "error", r
        assert [e["ename"] for e in r["errors"]] == ["KeyboardInterrupt"], r
        r = ch.run_cell("print(x)")
        assert r["stdout"] == "41\n", r  # the kernel survived the interrupt
    finally:
        ch.close()

    # restart: 200 with the model; the namespace is gone
    status, model = stack.js("POST", f"/api/kernels/{kid}/restart", {})
    assert status == 200 and model["id"] == kid, (status, model, stack.diagnostics())
    ch = stack.connect(kid)  # JupyterLab reconnects after a restart (§3.9)
    try:
        r = ch.run_cell("print(x)", stop_on_error=False)
        assert r["reply"]["status"] == "error", r
        assert [e["ename"] for e in r["errors"]] == ["NameError"], r
    finally:
        ch.close()

    # delete: 204, gone from jupyter_server and from the gateway
    status, body = stack.js("DELETE", f"/api/kernels/{kid}")
    assert status == 204, (status, body)
    status, listed = stack.gw("GET", "/api/kernels")
    assert status == 200 and kid not in [k["id"] for k in listed], (status, listed)
    status, body = stack.gw("GET", f"/api/kernels/{kid}")
    assert status == 404, (status, body)
    status, listed = stack.js("GET", "/api/kernels")
    assert status == 200 and kid not in [k["id"] for k in listed], (status, listed)


def test_session_kernel_gets_no_server_environment(stack):
    """POST /api/sessions: jupyter_server 1.23 sends {**os.environ} as the kernel env (§3.8)."""
    status, session = stack.js("POST", "/api/sessions",
                               {"path": "canary.ipynb", "name": "canary.ipynb",
                                "type": "notebook", "kernel": {"name": "python3"}})
    assert status == 201, (status, session, stack.diagnostics())
    kid = session["kernel"]["id"]
    try:
        status, gw_model = stack.gw("GET", f"/api/kernels/{kid}")
        assert status == 200, (status, gw_model)
        ch = stack.connect(kid)
        try:
            r = ch.run_cell(f"import os; print(os.environ.get({CANARY_NAME!r}))")
            assert r["stdout"] == "None\n", ("jupyter_server's environment reached the kernel", r)
            r = ch.run_cell("import os; print(os.environ.get('JPY_SESSION_NAME'), "
                            "os.environ.get('HOME') == " + repr(str(stack.tmp / "home")) + ")")
            assert r["stdout"] == "None False\n", r
            # KERNEL_* names are the documented channel and do pass
            r = ch.run_cell(f"import os; print(os.environ.get({PASSED_NAME!r}))")
            assert r["stdout"] == PASSED_VALUE + "\n", r
        finally:
            ch.close()
    finally:
        status, body = stack.js("DELETE", f"/api/sessions/{session['id']}")
        assert status == 204, (status, body)
    status, listed = stack.gw("GET", "/api/kernels")
    assert status == 200 and kid not in [k["id"] for k in listed], (status, listed)


def wait_for_zygote(stack, timeout=60.0) -> None:
    """Until cellgate's log says its zygote is ready: kernels started after that are forked."""
    deadline = time.monotonic() + timeout
    out = stack.tmp / "cellgate.out"
    while time.monotonic() < deadline:
        if "zygote: ready" in out.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise AssertionError(f"the zygote was not ready within {timeout} s:\n{stack.diagnostics()}")


def test_completion_after_a_notebooks_cells(stack):
    """Tab completion through jupyter_server in a kernel forked from the zygote, after the cells
    a notebook runs (state, an error, an inline plot, input()). jedi parses os.py for
    `os.pa` and keeps its parso cache under HOME: a zygote that imported parso with root's HOME
    gave its kernels /root/.cache (read-only in the jail), and every such completion answered
    status ok with no matches."""
    wait_for_zygote(stack)
    status, session = stack.js("POST", "/api/sessions",
                               {"path": "complete.ipynb", "name": "complete.ipynb",
                                "type": "notebook", "kernel": {"name": "python3"}})
    assert status == 201, (status, session, stack.diagnostics())
    kid = session["kernel"]["id"]
    try:
        ch = stack.connect(kid)
        try:
            r = ch.run_cell("import sys; print('pandas' in sys.modules)")
            assert r["stdout"] == "True\n", ("not a kernel from the zygote", r)
            assert ch.run_cell("x = 41")["reply"]["status"] == "ok"
            assert ch.run_cell("1 / 0", stop_on_error=False)["reply"]["status"] == "error"
            r = ch.run_cell("%matplotlib inline\nimport matplotlib.pyplot as plt\n"
                            "plt.plot([1, 2, 3]); plt.show()")
            assert r["reply"]["status"] == "ok", r
            r = ch.run_cell('name = input("? ")', allow_stdin=True, answer=lambda p: "ok")
            assert r["reply"]["status"] == "ok", r

            code = "import os\nos.pa"
            msg_id = ch.send("shell", "complete_request", {"code": code, "cursor_pos": len(code)})
            reply = stack.run(ch.wait_for(lambda m: m["channel"] == "shell"
                                          and m["parent_header"].get("msg_id") == msg_id,
                                          EXEC_TIMEOUT))
            content = reply["content"]
            assert reply["msg_type"] == "complete_reply" and content["status"] == "ok", reply
            assert {"pardir", "path", "pathsep"} <= set(content["matches"]), content
            assert content["cursor_start"] == len(code) - len("pa"), content
        finally:
            ch.close()
    finally:
        status, body = stack.js("DELETE", f"/api/sessions/{session['id']}")
        assert status == 204, (status, body)
