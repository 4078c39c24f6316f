"""Debian's IRkernel (r-cran-irkernel's `ir` kernelspec) jailed behind `cellgate serve`.

    CELLGATE_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        tests/conformance/test_r_kernel.py

The kernelspec is Debian's own (/usr/share/jupyter/kernels/ir: `R --slave -e IRkernel::main()
--args {connection_file}`), started through the launcher like any other: same jail, cold (the
zygote serves python3 ipykernels only). Covered: the Jupyter API (REST + WebSocket, legacy JSON
frames): state across cells, an error, a cell longer than the heartbeat window (IRkernel answers
heartbeats only between requests), interrupting a `Sys.sleep` with the state kept; the agent
API: state, a plot arriving as a PNG artifact, an error's name and message, a busy loop stopped
by the timeout with the state kept; what R sees of the jail (uid, hostname, environment, no
network, no host files); the memory and pids limits; a pooled `ir` kernel.

One `cellgate serve` for the module. Kernels are jailed, so this needs root; it skips with a
reason otherwise, or when the `ir` kernelspec is not installed. Only loopback is used; servers
are stopped by their pid.
"""

import asyncio
import json
import os
import re
import shutil
import signal
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
IR_SPEC = Path("/usr/share/jupyter/kernels/ir/kernel.json")
if not IR_SPEC.exists():
    pytest.skip(f"no R kernelspec ({IR_SPEC}; Debian's r-cran-irkernel installs it)",
                allow_module_level=True)

from tornado.httpclient import HTTPRequest  # noqa: E402
from tornado.websocket import websocket_connect  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("CELLGATE_BIN_DIR") or REPO / "build" / "bin")
CELLGATE = BIN_DIR / "cellgate"

START_TIMEOUT = 60   # seconds for `cellgate serve` to answer
HTTP_TIMEOUT = 60    # one REST call (a cold jailed R start is inside POST /api/kernels)
EXEC_TIMEOUT = 30    # one cell
STOP_TIMEOUT = 20    # SIGTERM to exit

MEMORY = 256 << 20   # --memory: R with IRkernel loaded peaks near 100 MiB here
PIDS = 64            # --pids
CANARY = "CELLGATE_R_TEST_SECRET"  # in the gateway's environment; must not reach R
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---- the server --------------------------------------------------------------------------------

def tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class Server:
    def __init__(self, tmp: Path, *extra_args: str):
        self.tmp = tmp
        self.token = uuid.uuid4().hex
        self.out = tmp / "cellgate.out"
        self.err = tmp / "cellgate.err"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELLGATE_")}
        env[CANARY] = "canary-" + uuid.uuid4().hex
        # One more kernelspec directory, with an R kernelspec that cannot start.
        broken = tmp / "jupyter" / "kernels" / "r-broken"
        broken.mkdir(parents=True)
        (broken / "kernel.json").write_text(json.dumps({
            "argv": ["R", "--slave", "-e", "IRkernel::no_such_function()", "--args",
                     "{connection_file}"],
            "display_name": "R (broken)", "language": "R"}))
        env["JUPYTER_PATH"] = str(tmp / "jupyter")
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [str(CELLGATE), "serve", "--ip", "127.0.0.1", "--port", "0",
                 "--token", self.token, "--state-dir", str(tmp / "state"),
                 "--memory", str(MEMORY), "--pids", str(PIDS), "--execute-grace", "3",
                 *extra_args],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        self.port = None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and self.proc.poll() is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/",
                          self.out.read_text(errors="replace"))
            if m:
                self.port = int(m.group(1))
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"cellgate serve did not start:\n{self.diagnostics()}")

    def stop(self) -> None:
        """SIGTERM by pid, wait; SIGKILL only if it does not exit."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT)

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in (self.out, self.err))

    def diagnostics(self) -> str:
        return f"--- cellgate output ---\n{tail(self.out)}\n{tail(self.err)}"

    def request(self, method: str, path: str, body=None, timeout: float = HTTP_TIMEOUT):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                     method=method,
                                     headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                status = r.status
                ctype = r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            raw, status, ctype = e.read(), e.code, e.headers.get("Content-Type", "")
        return status, (json.loads(raw) if raw and "json" in ctype else raw)

    def start_kernel(self, name: str = "ir") -> dict:
        status, model = self.request("POST", "/api/kernels", {"name": name})
        assert status == 201, (status, model, self.diagnostics())
        return model

    def delete_kernel(self, kid: str) -> None:
        self.request("DELETE", f"/api/kernels/{kid}")

    def execute(self, kid: str, code: str, timeout: float = EXEC_TIMEOUT) -> dict:
        status, answer = self.request("POST", f"/api/kernels/{kid}/execute",
                                      {"code": code, "timeout": timeout},
                                      timeout=timeout + HTTP_TIMEOUT)
        assert status == 200, (status, answer, self.diagnostics())
        return answer


def shown(answer: dict) -> str:
    """The text/plain of the value a cell showed. IRkernel displays a cell's visible value as
    display_data (text/plain, text/html, text/markdown, text/latex), never as execute_result,
    so the agent API's `result` stays null for R."""
    texts = [o["data"]["text/plain"] for o in answer["outputs"]
             if o["output_type"] in ("execute_result", "display_data")
             and "text/plain" in o["data"]]
    assert texts, answer
    return texts[-1]


@pytest.fixture(scope="module")
def server():
    if not CELLGATE.exists():
        pytest.skip(f"{CELLGATE} is not built (cmake --build build --target cellgate "
                    "cellgate-kernel)")
    tmp = Path(tempfile.mkdtemp(prefix="cellgate-r-"))
    # The zygote is on (the default): `ir` must take the cold path past it, cleanly. No pool,
    # so every start below is a cold jailed R.
    s = Server(tmp, "--pool-size", "0")
    try:
        yield s
    finally:
        s.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def kernel(server):
    model = server.start_kernel()
    yield model["id"]
    server.delete_kernel(model["id"])


# ---- the WebSocket, legacy JSON frames -------------------------------------------------------

class Channels:
    def __init__(self, loop, conn):
        self.loop = loop
        self.conn = conn
        self.session = uuid.uuid4().hex
        self.queue: asyncio.Queue = asyncio.Queue()
        self.reader = loop.create_task(self._read())

    @classmethod
    def open(cls, server: Server, kid: str) -> "Channels":
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)  # tornado binds its futures to the current loop
        url = (f"ws://127.0.0.1:{server.port}/api/kernels/{kid}/channels"
               f"?session_id={uuid.uuid4()}")
        req = HTTPRequest(url, headers={"Authorization": f"token {server.token}"},
                          connect_timeout=10, request_timeout=EXEC_TIMEOUT)
        conn = loop.run_until_complete(websocket_connect(req))
        return cls(loop, conn)

    async def _read(self):
        while True:
            raw = await self.conn.read_message()
            if raw is None:
                await self.queue.put(None)
                return
            if isinstance(raw, bytes):  # legacy binary frame: the JSON part only
                start = int.from_bytes(raw[4:8], "big")
                end = int.from_bytes(raw[8:12], "big") if int.from_bytes(raw[:4], "big") > 1 \
                    else len(raw)
                raw = raw[start:end].decode()
            await self.queue.put(json.loads(raw))

    def send(self, channel: str, msg_type: str, content: dict) -> str:
        msg_id = uuid.uuid4().hex
        self.conn.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": msg_type, "username": "test",
                       "session": self.session, "version": "5.3",
                       "date": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")},
            "parent_header": {}, "metadata": {}, "content": content, "buffers": [],
            "channel": channel}))
        return msg_id

    def execute(self, code: str) -> str:
        return self.send("shell", "execute_request",
                         {"code": code, "silent": False, "store_history": True,
                          "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})

    async def _collect(self, msg_id: str, on_busy=None) -> dict:
        out = {"stdout": "", "results": [], "errors": [], "reply": None}
        idle = False
        while out["reply"] is None or not idle:
            msg = await self.queue.get()
            if msg is None:
                raise AssertionError("the WebSocket closed")
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if msg["channel"] == "iopub":
                if kind == "stream" and content["name"] == "stdout":
                    out["stdout"] += content["text"]
                elif kind in ("execute_result", "display_data"):
                    out["results"].append(content["data"])
                elif kind == "error":
                    out["errors"].append(content)
                elif kind == "status" and content["execution_state"] == "busy" and on_busy:
                    await on_busy()
                elif kind == "status" and content["execution_state"] == "idle":
                    idle = True
            elif msg["channel"] == "shell" and kind == "execute_reply":
                out["reply"] = content
        return out

    def run(self, code: str, timeout: float = EXEC_TIMEOUT, on_busy=None) -> dict:
        msg_id = self.execute(code)
        return self.loop.run_until_complete(
            asyncio.wait_for(self._collect(msg_id, on_busy), timeout))

    def close(self) -> None:
        self.conn.close()
        self.reader.cancel()
        self.loop.run_until_complete(asyncio.sleep(0.05))
        asyncio.set_event_loop(None)
        self.loop.close()


# ---- tests -----------------------------------------------------------------------------------

def test_ir_kernelspec_is_offered(server):
    status, specs = server.request("GET", "/api/kernelspecs")
    assert status == 200, specs
    ir = specs["kernelspecs"].get("ir")
    assert ir is not None, specs
    assert ir["spec"]["language"] == "R"
    assert ir["spec"]["argv"][0] == "R"


def test_a_kernel_that_exits_at_start_fails_the_start_at_once(server):
    started = time.monotonic()
    status, answer = server.request("POST", "/api/kernels", {"name": "r-broken"})
    took = time.monotonic() - started
    assert status == 500, (status, answer)
    assert "exited while starting" in answer["message"], answer
    assert "no_such_function" in answer["message"], answer  # R's own words, from the log
    # Not the whole start timeout (60 s): the launcher's report ends the wait.
    assert took < 10, f"the failed start took {took:.1f} s"


def test_jupyter_api_state_error_long_cell_and_interrupt(server, kernel):
    ch = Channels.open(server, kernel)
    try:
        first = ch.run("x <- 6 * 7\nx")
        assert first["reply"]["status"] == "ok", first
        assert first["results"][0]["text/plain"] == "[1] 42", first

        kept = ch.run("cat(x + 1, '\\n')")
        assert kept["stdout"] == "43 \n", kept

        err = ch.run('stop("no such thing")')
        assert err["reply"]["status"] == "error", err
        assert "no such thing" in err["errors"][0]["evalue"], err

        # IRkernel answers heartbeats only between requests: a cell longer than the gateway's
        # heartbeat window (6 × 500 ms) must not count as a death and lose the state.
        long = ch.run("Sys.sleep(4.5)\nx")
        assert long["reply"]["status"] == "ok", (long, server.diagnostics())
        assert long["results"][0]["text/plain"] == "[1] 42", long

        async def interrupt_soon():
            await asyncio.sleep(0.5)
            status, _ = await asyncio.get_running_loop().run_in_executor(
                None, server.request, "POST", f"/api/kernels/{kernel}/interrupt")
            assert status == 204

        started = time.monotonic()
        stopped = ch.run("y <- 1\nSys.sleep(60)", on_busy=interrupt_soon)
        assert time.monotonic() - started < 10, "the interrupt did not stop Sys.sleep"
        # IRkernel answers an interrupted cell with status "abort" (it has no error to show).
        assert stopped["reply"]["status"] in ("abort", "error"), stopped

        after = ch.run("cat(x + y, '\\n')")
        assert after["reply"]["status"] == "ok", after
        assert after["stdout"] == "43 \n", after
    finally:
        ch.close()
    status, model = server.request("GET", f"/api/kernels/{kernel}")
    assert status == 200 and model["execution_state"] == "idle", model


def test_agent_api_state_plot_error_and_timeout(server, kernel):
    a = server.execute(kernel, "a <- 10")
    assert a["status"] == "ok", a
    b = server.execute(kernel, "a * 2")
    assert b["status"] == "ok", b
    assert shown(b) == "[1] 20", b

    plot = server.execute(kernel, "plot(1:10)")
    assert plot["status"] == "ok", plot
    mimes = sorted({m for o in plot["outputs"] if o["output_type"] == "display_data"
                    for m in o["data"]})
    print(f"IRkernel's plot mime types: {mimes}")
    assert "image/png" in mimes, plot["outputs"]
    pngs = [x for x in plot["artifacts"] if x["mime_type"] == "image/png"]
    assert len(pngs) == 1, plot["artifacts"]
    status, body = server.request("GET", f"/api/artifacts/{pngs[0]['sha256']}")
    assert status == 200 and body.startswith(PNG_MAGIC), (status, body[:16])

    err = server.execute(kernel, 'stop("bad input: ", a)')
    assert err["status"] == "error", err
    # IRkernel names every R error "ERROR"; the message is R's own.
    assert err["error"]["ename"] == "ERROR", err["error"]
    assert "bad input: 10" in err["error"]["evalue"], err["error"]
    assert err["error"]["traceback"], err["error"]

    started = time.monotonic()
    busy = server.execute(kernel, "i <- 0\nrepeat { i <- i + 1 }", timeout=4)
    assert busy["status"] == "timeout", busy
    assert busy["state_lost"] is False, busy
    assert time.monotonic() - started < 4 + 3 + 2, "the busy loop outlived the interrupt"
    after = server.execute(kernel, "c(i > 0, a == 10)")
    assert after["status"] == "ok", after
    assert shown(after) == "[1] TRUE TRUE", after


def test_r_sees_the_jail(server, kernel):
    code = r"""
cat("user", Sys.info()[["effective_user"]], "\n")
cat("uid", system("id -u", intern = TRUE), "\n")
cat("host", Sys.info()[["nodename"]], "\n")
cat("home", Sys.getenv("HOME"), "\n")
cat("cwd", getwd(), "\n")
cat("lang", Sys.getenv("LANG"), l10n_info()[["UTF-8"]], "\n")
cat("r_home", R.home(), "\n")
cat("canary", Sys.getenv("CELLGATE_R_TEST_SECRET", "absent"), "\n")
cat("shadow", file.exists("/etc/shadow"), "\n")
cat("net", tryCatch({ close(socketConnection("127.0.0.1", 9, timeout = 2)); "open" },
                    error = function(e) "refused", warning = function(w) "refused"), "\n")
"""
    got = server.execute(kernel, code)
    assert got["status"] == "ok", got
    facts = dict(line.split(" ", 1) for line in got["stdout"].strip().splitlines())
    facts = {k: v.strip() for k, v in facts.items()}
    assert facts["user"] == "kernel", facts
    assert int(facts["uid"]) >= 1000000, facts
    assert facts["host"] == "jail", facts
    assert facts["home"] == "/home/kernel" and facts["cwd"] == "/home/kernel", facts
    assert facts["lang"] == "C.UTF-8 TRUE", facts
    assert facts["r_home"] == "/usr/lib/R", facts
    assert facts["canary"] == "absent", facts
    assert facts["shadow"] == "FALSE", facts
    assert facts["net"] == "refused", facts
    # R's housekeeping stays out of the cell's changed files (the fontconfig cache is shared
    # read-only, so nothing is written to ~/.cache).
    assert got["files"] == [], got["files"]


def test_pids_limit_holds(server, kernel):
    got = server.execute(kernel, """
n <- 0
r <- tryCatch({
  for (k in 1:200) { parallel::mcparallel(Sys.sleep(2)); n <- n + 1 }
  "all forked"
}, error = function(e) conditionMessage(e))
cat(n, r, "\\n")
""")
    assert got["status"] == "ok", got
    n, _, why = got["stdout"].strip().partition(" ")
    assert int(n) < PIDS, got["stdout"]
    assert "unable to fork" in why, got["stdout"]
    # The kernel lives on.
    assert shown(server.execute(kernel, "1 + 1")) == "[1] 2"


def test_memory_limit_holds(server, kernel):
    assert server.execute(kernel, "z <- 1")["status"] == "ok"
    # 48e6 doubles = 366 MiB, written element by element: past the 256 MiB limit.
    got = server.execute(kernel, "big <- runif(48e6)\nlength(big)")
    assert got["status"] == "dead", got
    assert got["state_lost"] is True, got
    # Restarted (--restart-limit): a fresh R without the old state.
    deadline = time.monotonic() + HTTP_TIMEOUT
    while True:
        status, model = server.request("GET", f"/api/kernels/{kernel}")
        if status == 200 and model["execution_state"] == "idle":
            break
        assert time.monotonic() < deadline, (status, model, server.diagnostics())
        time.sleep(0.2)
    fresh = server.execute(kernel, 'exists("z")')
    assert shown(fresh) == "[1] FALSE", fresh
    assert re.search(r"kernel \S+ died: oom", server.log()), server.diagnostics()


def test_pooled_ir_kernel():
    tmp = Path(tempfile.mkdtemp(prefix="cellgate-r-pool-"))
    s = Server(tmp, "--pool-size", "1", "--pool-kernel", "ir", "--no-zygote")
    try:
        deadline = time.monotonic() + HTTP_TIMEOUT
        while "kernel pool: kernel" not in s.log():
            assert time.monotonic() < deadline, s.diagnostics()
            time.sleep(0.1)
        kid = s.start_kernel()["id"]
        assert re.search(r"kernel pool: hit \(ir\)|kernel pool: kernel \S+ ready",
                         s.log()), s.diagnostics()
        got = s.execute(kid, "v <- 5\nv * 2")
        assert got["status"] == "ok", got
        assert shown(got) == "[1] 10", got
        # The pool ran nothing visible in it: this is the kernel's first counted cell.
        assert got["execution_count"] == 1, got
    finally:
        s.stop()
        shutil.rmtree(tmp, ignore_errors=True)
