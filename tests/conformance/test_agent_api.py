"""End to end: cellgate's agent HTTP API against `cellgate serve` with jailed ipykernels.

    CELLGATE_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        tests/conformance/test_agent_api.py

Covers POST /api/kernels/{id}/execute (one JSON answer, NDJSON and SSE streams, keepalives,
timeouts with and without a kernel restart, a client that leaves, 1 GiB of output), artifacts,
the one-shot POST /api/execute, the files API and its path checks, the audit log, and bad input.
The answer's shape is documented in gateway/include/cellgate/server/execute.hpp.

One `cellgate serve` for the module (its flags below), one kernel per test. Kernels are jailed,
so this needs root; it skips with a reason otherwise. Only loopback is used; the server is
stopped by its pid.
"""

import base64
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from gateway_support import proc_status_kib, processes_of, reap_leftovers

if os.geteuid() != 0:
    pytest.skip("cellgate's jailed kernels need root (namespaces, cgroups, mounts)",
                allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("CELLGATE_BIN_DIR") or REPO / "build" / "bin")
CELLGATE = BIN_DIR / "cellgate"

START_TIMEOUT = 60   # seconds for `cellgate serve` to answer
HTTP_TIMEOUT = 90    # one plain REST call (a jailed kernel start is inside POST /api/kernels)
STOP_TIMEOUT = 20    # SIGTERM to exit

# The module's server flags.
GRACE = 2                   # --execute-grace
KEEPALIVE = 1               # --execute-keepalive
STREAM_BYTES = 1 << 20      # --execute-stream-bytes
MAX_FILE_BYTES = 64 << 10   # --max-file-bytes
CUSTOM_SECRET_RE = "CUSTOMSECRET[0-9]+"  # --audit-redact

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---- the server --------------------------------------------------------------------------------

def tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class Server:
    def __init__(self, tmp: Path, extra_args=()):
        self.tmp = tmp
        self.extra_args = list(extra_args)
        self.token = uuid.uuid4().hex
        self.state = tmp / "state"
        self.audit_log = self.state / "audit.log"  # the default: <state-dir>/audit.log
        self.out = tmp / "cellgate.out"
        self.err = tmp / "cellgate.err"
        self.proc = None
        self.port = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELLGATE_")}
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            self.proc = subprocess.Popen(
                [str(CELLGATE), "serve", "--ip", "127.0.0.1", "--port", "0",
                 "--token", self.token, "--state-dir", str(self.state),
                 "--execute-grace", str(GRACE),
                 "--execute-keepalive", str(KEEPALIVE),
                 "--execute-stream-bytes", str(STREAM_BYTES),
                 "--max-file-bytes", str(MAX_FILE_BYTES),
                 "--audit-redact", CUSTOM_SECRET_RE, *self.extra_args],
                stdin=subprocess.DEVNULL, stdout=o, stderr=e, env=env)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/",
                          self.out.read_text(errors="replace") + self.err.read_text(errors="replace"))
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        if self.port is None:
            self.stop()
            raise RuntimeError(f"cellgate serve did not start:\n{self.diagnostics()}")
        while time.monotonic() < deadline:
            try:
                if self.request("GET", "/api", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"cellgate serve did not answer GET /api:\n{self.diagnostics()}")

    def stop(self) -> None:
        """SIGTERM by pid, wait; SIGKILL only if it does not exit."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)

    def diagnostics(self) -> str:
        return f"--- stdout ---\n{tail(self.out)}\n--- stderr ---\n{tail(self.err)}"

    # -- HTTP
    def connect(self, timeout: float = HTTP_TIMEOUT) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def headers(self, extra=None, token=True) -> dict:
        h = {}
        if token:
            h["Authorization"] = f"token {self.token}"
        h.update(extra or {})
        return h

    def request(self, method, path, body=None, headers=None, token=True,
                timeout: float = HTTP_TIMEOUT):
        """(status, headers, body bytes). `path` is sent as given (no normalization)."""
        conn = self.connect(timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
                headers = {"Content-Type": "application/json", **(headers or {})}
            conn.request(method, path, body=body, headers=self.headers(headers, token))
            res = conn.getresponse()
            return res.status, {k.lower(): v for k, v in res.getheaders()}, res.read()
        finally:
            conn.close()

    def json(self, method, path, body=None, headers=None, token=True,
             timeout: float = HTTP_TIMEOUT):
        """(status, parsed JSON body or None)."""
        status, _, raw = self.request(method, path, body, headers, token, timeout)
        try:
            return status, (json.loads(raw) if raw else None)
        except ValueError:
            return status, raw.decode(errors="replace")

    def execute(self, kid, code, timeout=30, **extra):
        """The JSON answer of POST /api/kernels/{kid}/execute; asserts 200."""
        try:
            status, answer = self.json("POST", f"/api/kernels/{kid}/execute",
                                       {"code": code, "timeout": timeout, **extra},
                                       timeout=timeout + GRACE + 60)
        except TimeoutError:  # seen once on a loaded machine: say what the gateway was doing
            raise AssertionError(f"execute (timeout {timeout}) got no answer within "
                                 f"{timeout + GRACE + 60} s\n{self.diagnostics()}") from None
        assert status == 200, f"execute answered {status}: {answer}\n{self.diagnostics()}"
        return answer

    def start_kernel(self) -> str:
        try:
            status, model = self.json("POST", "/api/kernels", {"name": "python3"})
        except TimeoutError:
            raise AssertionError(f"POST /api/kernels timed out\n{self.diagnostics()}") from None
        assert status in (200, 201), f"kernel start answered {status}: {model}\n{self.diagnostics()}"
        return model["id"]

    def kernel_ids(self) -> set:
        status, models = self.json("GET", "/api/kernels")
        assert status == 200, models
        return {m["id"] for m in models}

    def delete_kernel(self, kid) -> None:
        self.request("DELETE", f"/api/kernels/{kid}")


def started_server(prefix: str, extra_args=()):
    if not CELLGATE.exists():
        pytest.skip(f"{CELLGATE} is not built (cmake --build build --target cellgate cellgate-kernel)")
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    s = Server(tmp, extra_args)
    try:
        s.start()
        yield s
    finally:
        s.stop()
        leftovers = reap_leftovers(tmp)
        if leftovers:
            print(f"\nleft behind by the gateway (now stopped and removed): {leftovers}")
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def server():
    yield from started_server("cellgate-agent-")


def assert_alive(server) -> None:
    if server.proc.poll() is not None or "terminate called" in server.err.read_text(errors="replace"):
        pytest.fail(f"the gateway died (exit {server.proc.poll()}):\n{server.diagnostics()}")


@pytest.fixture
def kernel(server):
    assert_alive(server)
    kid = server.start_kernel()
    try:
        yield kid
    finally:
        if server.proc.poll() is None:
            server.delete_kernel(kid)


def text_plain(answer):
    return (answer.get("result") or {}).get("text/plain")


def stream_execute(server, kid, code, accept, timeout=30):
    """POST execute with `accept`; returns (content type, [(arrival seconds, raw line bytes)])."""
    conn = server.connect(timeout + GRACE + 60)
    try:
        body = json.dumps({"code": code, "timeout": timeout}).encode()
        conn.request("POST", f"/api/kernels/{kid}/execute", body=body,
                     headers=server.headers({"Content-Type": "application/json",
                                             "Accept": accept}))
        t0 = time.monotonic()
        res = conn.getresponse()
        assert res.status == 200, res.read()
        lines = []
        while True:
            line = res.readline()  # http.client undoes the chunked encoding
            if not line:
                break
            lines.append((time.monotonic() - t0, line))
        return res.getheader("Content-Type", ""), lines
    finally:
        conn.close()


# ---- 1. streaming --------------------------------------------------------------------------

COUNT_CELL = "import time\nfor i in range(3):\n print(i, flush=True); time.sleep(1)"


def test_ndjson_stream_arrives_as_it_happens(server, kernel):
    ctype, lines = stream_execute(server, kernel, COUNT_CELL, "application/x-ndjson")
    assert ctype.startswith("application/x-ndjson"), ctype
    events = []
    for at, raw in lines:
        assert raw.endswith(b"\n"), raw
        events.append((at, json.loads(raw)))  # every line is one JSON object
    assert all(isinstance(e, dict) and "type" in e for _, e in events), events
    types = [e["type"] for _, e in events]
    assert types[-1] == "end" and types.count("end") == 1, types
    end_at, end = events[-1]
    assert end["answer"]["status"] == "ok", end
    streams = [(at, e) for at, e in events if e["type"] == "stream"]
    assert "".join(e["text"] for _, e in streams if e["name"] == "stdout") == "0\n1\n2\n"
    assert end["answer"]["stdout"] == "0\n1\n2\n"
    first_at = streams[0][0]
    # The cell sleeps 3 s after its first print: that print must not wait for the end.
    assert end_at - first_at >= 1.5, f"first stream event at {first_at:.2f} s, end at {end_at:.2f} s"


def test_ndjson_keepalives_while_a_cell_is_silent(server, kernel):
    _, lines = stream_execute(server, kernel, "import time\ntime.sleep(4)", "application/x-ndjson")
    events = [json.loads(raw) for _, raw in lines]
    keepalives = [e for e in events if e["type"] == "keepalive"]
    assert len(keepalives) >= 2, f"--execute-keepalive {KEEPALIVE}, a 4 s cell: {events}"
    assert events[-1]["type"] == "end" and events[-1]["answer"]["status"] == "ok", events[-1]


def test_sse_stream(server, kernel):
    ctype, lines = stream_execute(server, kernel, COUNT_CELL, "text/event-stream")
    assert ctype.startswith("text/event-stream"), ctype
    text = b"".join(raw for _, raw in lines).decode()
    assert text.endswith("\n\n"), text[-200:]
    events = []
    for block in text.split("\n\n")[:-1]:
        fields = {}
        for line in block.split("\n"):
            name, sep, value = line.partition(": ")
            assert sep and name in ("event", "data"), f"not an SSE field: {line!r}"
            assert name not in fields, block
            fields[name] = value
        assert set(fields) == {"event", "data"}, block
        data = json.loads(fields["data"])
        assert data["type"] == fields["event"], block
        events.append(data)
    assert events[-1]["type"] == "end", events
    assert [e["type"] for e in events].count("end") == 1
    assert events[-1]["answer"]["status"] == "ok"
    assert events[-1]["answer"]["stdout"] == "0\n1\n2\n"
    assert "".join(e["text"] for e in events if e["type"] == "stream") == "0\n1\n2\n"


# ---- 2. artifacts and changed files ----------------------------------------------------------

def test_matplotlib_png_artifact_and_written_file(server, kernel):
    # ipykernel's default backend is matplotlib_inline: plt.show() displays an image/png.
    answer = server.execute(kernel, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\n"
                                    "plt.show()", timeout=120)
    assert answer["status"] == "ok", answer
    pngs = [a for a in answer["artifacts"] if a.get("mime_type") == "image/png"]
    assert len(pngs) == 1, answer["artifacts"]
    rec = pngs[0]
    assert rec["kind"] == "display" and rec["kernel_id"] == kernel, rec
    assert rec["execution_count"] == answer["execution_count"], rec
    assert re.fullmatch(r"[0-9a-f]{64}", rec["sha256"]) and rec["created"], rec

    status, headers, body = server.request("GET", f"/api/artifacts/{rec['sha256']}")
    assert status == 200, body[:300]
    assert headers["content-type"].split(";")[0] == "image/png", headers
    assert body.startswith(PNG_MAGIC), body[:16]
    assert hashlib.sha256(body).hexdigest() == rec["sha256"]
    assert len(body) == rec["size"], (len(body), rec)

    status, listing = server.json("GET", f"/api/kernels/{kernel}/artifacts")
    assert status == 200 and listing["kernel_id"] == kernel, listing
    assert rec["sha256"] in [a.get("sha256") for a in listing["artifacts"]], listing

    answer = server.execute(kernel, "open('out.csv', 'w').write('a,b\\n')")
    assert answer["status"] == "ok", answer
    assert {"path": "out.csv", "change": "created", "type": "file", "size": 4} in answer["files"], \
        answer["files"]
    status, listing = server.json("GET", f"/api/kernels/{kernel}/artifacts")
    assert any(a["kind"] == "file" and a.get("path") == "out.csv" for a in listing["artifacts"]), \
        listing

    # Bad and unknown digests.
    assert server.request("GET", "/api/artifacts/not-a-sha")[0] == 400
    assert server.request("GET", "/api/artifacts/" + "A" * 64)[0] == 400
    assert server.request("GET", "/api/artifacts/" + "0" * 64)[0] == 404


def test_chart_and_data_beside_the_png(server, kernel):
    # The kernel's display formatters (gateway/kernels/python/cellgate_display.py): a figure's
    # numbers next to its PNG, a DataFrame's columns next to its HTML.
    answer = server.execute(kernel, (
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\n"
        "ax.bar(['north', 'south', 'east'], [12, 7.5, 3], label='sales')\n"
        "ax.set_title('Sales by region')\n"
        "ax.set_xlabel('Region')\n"
        "ax.set_ylabel('Revenue (kEUR)')\n"
        "plt.show()"), timeout=120)
    assert answer["status"] == "ok", answer
    assert len(answer["charts"]) == 1, answer["charts"]
    chart = answer["charts"][0]
    assert chart["type"] == "bar" and chart["title"] == "Sales by region", chart
    assert (chart["x_label"], chart["y_label"], chart["y_unit"]) == \
        ("Region", "Revenue (kEUR)", "kEUR"), chart
    assert [(e["label"], e["value"], e["group"]) for e in chart["elements"]] == \
        [("north", 12, "sales"), ("south", 7.5, "sales"), ("east", 3, "sales")], chart
    png = [a for a in answer["artifacts"] if a.get("mime_type") == "image/png"]
    assert len(png) == 1 and png[0]["chart"] == chart, answer["artifacts"]
    bundle = [o for o in answer["outputs"] if o["output_type"] == "display_data"][0]["data"]
    assert bundle["application/vnd.cellgate.chart+json"] == chart, sorted(bundle)

    answer = server.execute(kernel, "import pandas as pd\n"
                                    "pd.DataFrame({'city': ['Oslo', 'Rome'], 'temp': [3.5, None]})")
    assert answer["status"] == "ok", answer
    assert answer["data"] == [{"city": ["Oslo", "Rome"], "temp": [3.5, None]}], answer["data"]
    assert answer["result"]["application/vnd.cellgate.data+json"] == answer["data"][0]
    assert "text/html" in answer["result"], sorted(answer["result"])

    # Nothing of it in the user's namespace, and matplotlib's own behaviour is unchanged.
    answer = server.execute(kernel, "sorted(k for k in dir() if 'cellgate' in k.lower())")
    assert text_plain(answer) == "[]", answer
    answer = server.execute(kernel, "print(1)")
    assert answer["charts"] == [] and answer["data"] == [], answer


# ---- 3. timeouts ---------------------------------------------------------------------------

def test_timeout_interrupts_and_keeps_state(server, kernel):
    assert server.execute(kernel, "x = 42")["status"] == "ok"
    t0 = time.monotonic()
    answer = server.execute(kernel, "while True: pass", timeout=2)
    took = time.monotonic() - t0
    assert answer["status"] == "timeout", answer
    assert answer["state_lost"] is False, answer
    assert took < 2 + GRACE + 3, f"took {took:.1f} s"
    after = server.execute(kernel, "x")
    assert after["status"] == "ok" and text_plain(after) == "42", after


@pytest.fixture
def own_server():
    """A server of its own, for a test that restarts kernels (a crash stays in that test)."""
    yield from started_server("cellgate-agent-restart-")


def test_timeout_restarts_a_kernel_that_ignores_the_interrupt(own_server):
    server = own_server
    kid = server.start_kernel()
    assert server.execute(kid, "x = 42")["status"] == "ok"
    t0 = time.monotonic()
    answer = server.execute(kid, "import signal, time\n"
                                 "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                 "time.sleep(1000)", timeout=2)
    took = time.monotonic() - t0
    assert answer["status"] == "timeout", answer
    assert answer["state_lost"] is True, answer
    assert took < 2 + GRACE + 15, f"took {took:.1f} s"
    after = server.execute(kid, "x", timeout=60)
    assert after["status"] == "error" and after["error"]["ename"] == "NameError", after
    assert server.execute(kid, "1+1")["result"]["text/plain"] == "2"
    # The gateway keeps working after the restart: delete, another kernel, a few seconds.
    assert server.request("DELETE", f"/api/kernels/{kid}")[0] == 204
    other = server.start_kernel()
    assert server.execute(other, "1+1")["result"]["text/plain"] == "2"
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and server.proc.poll() is None:
        time.sleep(0.2)
    assert_alive(server)
    assert server.request("DELETE", f"/api/kernels/{other}", timeout=20)[0] == 204


# ---- 4. a client that leaves ---------------------------------------------------------------

def test_client_disconnect_stops_the_cell(server, kernel):
    body = json.dumps({"code": "import time; time.sleep(120)", "timeout": 300}).encode()
    head = (f"POST /api/kernels/{kernel}/execute HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{server.port}\r\n"
            f"Authorization: token {server.token}\r\n"
            "Content-Type: application/json\r\n"
            "Accept: application/x-ndjson\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    try:
        sock.sendall(head + body)
        first = sock.recv(4096)
        assert first.startswith(b"HTTP/1.1 200"), first
        time.sleep(1)  # the cell is running now
    finally:
        sock.close()
    t0 = time.monotonic()
    answer = server.execute(kernel, "1+1", timeout=60)
    took = time.monotonic() - t0
    assert answer["status"] == "ok" and text_plain(answer) == "2", answer
    assert took < 10, f"the next call waited {took:.1f} s for the abandoned cell"


# ---- 5. a flood of output ------------------------------------------------------------------

# 1 GiB of stdout, flushed after every 1 MiB write. Unflushed, ipykernel 6.17 batches the writes
# into one iopub message per flush interval: measured unjailed, the whole 1 GiB went out as one
# message (39 s); jailed under the default --memory 1 GiB the kernel dies at once (status "dead"
# after 4 s), and with --memory 4 GiB it had not finished after 400 s (--cpus 1). Flushed, it is
# 1024 messages of 1 MiB, ~11 s here, which is what a cell printing without end looks like.
FLOOD_MIB = 1024
FLOOD_TIMEOUT = 240


def test_a_gigabyte_of_output_is_capped(server, kernel):
    pid = server.proc.pid
    rss0 = proc_status_kib(pid, "VmRSS")
    hwm0 = proc_status_kib(pid, "VmHWM")
    peak = [rss0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            try:
                peak[0] = max(peak[0], proc_status_kib(pid, "VmRSS"))
            except OSError:
                return
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    try:
        answer = server.execute(kernel, "import sys\nchunk = 'x' * (1 << 20)\n"
                                        f"for _ in range({FLOOD_MIB}):\n"
                                        "    sys.stdout.write(chunk); sys.stdout.flush()",
                                timeout=FLOOD_TIMEOUT)
    finally:
        done.set()
        sampler.join(5)
    took = time.monotonic() - t0
    hwm1 = proc_status_kib(pid, "VmHWM")
    total = FLOOD_MIB << 20
    print(f"\n{FLOOD_MIB} MiB of stdout: {took:.1f} s; gateway VmRSS {rss0 // 1024} MiB before, "
          f"peak sampled {peak[0] // 1024} MiB; VmHWM {hwm0 // 1024} -> {hwm1 // 1024} MiB; "
          f"dropped_bytes {answer.get('truncated', {}).get('dropped_bytes')}")
    assert answer["status"] == "ok", {k: v for k, v in answer.items() if k != "stdout"}
    assert answer["truncated"]["stdout"] is True, answer["truncated"]
    assert len(answer["stdout"]) == STREAM_BYTES, len(answer["stdout"])
    # What the gateway counts is what reached it: a kernel's iopub PUB socket drops messages
    # silently past its high-water mark when a loaded machine reads slower than the kernel
    # writes (seen once on a busy run: 32 MiB of 1 GiB never arrived). Never more than was sent.
    dropped = answer["truncated"]["dropped_bytes"]
    assert total // 2 <= dropped <= total - STREAM_BYTES, answer["truncated"]
    assert any("stdout" in str(n) for n in answer["notices"]), answer["notices"]
    growth_mib = (max(peak[0], hwm1) - rss0) / 1024
    assert growth_mib < 300, f"the gateway grew {growth_mib:.0f} MiB for a 1 MiB cap"
    assert server.execute(kernel, "1+1")["status"] == "ok"


# ---- 6. metrics ----------------------------------------------------------------------------

def test_metrics_count_cpu_and_memory(server, kernel):
    answer = server.execute(kernel, "sum(i*i for i in range(30_000_000))", timeout=120)
    assert answer["status"] == "ok", answer
    m = answer["metrics"]
    print(f"\nmetrics: {m}")
    assert m["wall_ms"] > 0, m
    assert isinstance(m["cpu_ms"], (int, float)) and m["cpu_ms"] > 100, m
    assert isinstance(m["memory_peak_bytes"], int) and m["memory_peak_bytes"] > 0, m
    assert isinstance(m["memory_current_bytes"], int) and m["memory_current_bytes"] > 0, m


# ---- 7. one-shot ---------------------------------------------------------------------------

def test_one_shot_execute_with_files(server):
    before = server.kernel_ids()
    payload = bytes(range(256))
    status, answer = server.json("POST", "/api/execute", {
        "code": "print(open('data/in.txt').read())\n"
                "import os\nprint(os.getcwd(), len(open('bin/b.dat', 'rb').read()))",
        "timeout": 60,
        "files": {"data/in.txt": "hello",
                  "bin/b.dat": {"content": base64.b64encode(payload).decode(),
                                "encoding": "base64"}}},
        timeout=180)
    assert status == 200, answer
    assert answer["status"] == "ok", answer
    assert answer["stdout"] == "hello\n/home/kernel 256\n", answer
    kid = answer["kernel_id"]
    assert kid and kid not in before
    assert kid not in server.kernel_ids(), "the one-shot kernel must be gone"
    # A path that escapes is refused before any kernel starts.
    status, err = server.json("POST", "/api/execute",
                              {"code": "1", "files": {"../x": "no"}})
    assert status == 400, err


# ---- 8. files ------------------------------------------------------------------------------

def files_url(kid, rel=""):
    return f"/api/kernels/{kid}/files" + (f"/{rel}" if rel else "")


def test_files_round_trip(server, kernel):
    content = b"hello files\n\x00\xff"
    status, _, raw = server.request("PUT", files_url(kernel, "sub/dir/a.bin"), body=content)
    assert status == 201, raw
    info = json.loads(raw)
    assert info["path"] == "sub/dir/a.bin" and info["type"] == "file" and info["size"] == len(content), info

    status, _, got = server.request("GET", files_url(kernel, "sub/dir/a.bin"))
    assert status == 200 and got == content

    status, listing = server.json("GET", files_url(kernel, "sub"))
    assert status == 200 and listing["path"] == "sub" and listing["truncated"] is False, listing
    assert [(e["name"], e["path"], e["type"]) for e in listing["entries"]] == \
        [("dir", "sub/dir", "directory")], listing
    status, root = server.json("GET", files_url(kernel))
    assert status == 200 and "sub" in [e["name"] for e in root["entries"]], root
    for e in root["entries"]:
        assert set(e) >= {"name", "path", "type", "size", "mtime"}, e

    # The kernel sees what was put, as its own user.
    answer = server.execute(kernel, "import os\nprint(open('sub/dir/a.bin','rb').read() == "
                                    f"{content!r}, os.stat('sub/dir/a.bin').st_uid == os.getuid())")
    assert answer["stdout"] == "True True\n", answer

    # Replace, then delete.
    assert server.request("PUT", files_url(kernel, "sub/dir/a.bin"), body=b"v2")[0] == 201
    assert server.request("GET", files_url(kernel, "sub/dir/a.bin"))[2] == b"v2"
    status, err = server.json("DELETE", files_url(kernel, "sub"))
    assert status == 409, err
    assert server.request("DELETE", files_url(kernel, "sub/dir/a.bin"))[0] == 204
    assert server.request("GET", files_url(kernel, "sub/dir/a.bin"))[0] == 404
    assert server.request("DELETE", files_url(kernel, "sub/dir"))[0] == 204
    assert server.request("GET", files_url(kernel, "missing.txt"))[0] == 404
    assert server.request("DELETE", files_url(kernel, "missing.txt"))[0] == 404
    assert server.request("GET", files_url(str(uuid.uuid4()), "a"))[0] == 404


def test_files_symlinks_do_not_escape(server, kernel):
    hostname = Path("/etc/hostname")
    before = (hostname.read_bytes(), hostname.stat().st_mtime_ns) if hostname.exists() else None
    assert not Path("/etc/x").exists()
    answer = server.execute(kernel, "import os\nos.symlink('/etc', 'esc')\n"
                                    "os.symlink('../../..', 'up')\nos.makedirs('d', exist_ok=True)\n"
                                    "os.symlink('/etc/passwd', 'd/pw')")
    assert answer["status"] == "ok", answer

    def refused(method, rel, body=None):
        status, _, raw = server.request(method, files_url(kernel, rel), body=body)
        assert status == 403, f"{method} {rel}: {status} {raw[:300]!r}"
        assert b"root:" not in raw, raw[:300]
        assert json.loads(raw).get("error") == "path_escape", raw

    refused("GET", "esc/passwd")
    refused("GET", "esc")
    refused("GET", "up/etc/passwd")
    refused("GET", "d/pw")
    refused("PUT", "esc/x", b"planted")
    refused("PUT", "up/etc/x", b"planted")
    refused("DELETE", "esc/hostname")
    refused("DELETE", "up/etc/hostname")
    assert not Path("/etc/x").exists(), "PUT through a symlink wrote outside the work dir"
    if before is not None:
        assert (hostname.read_bytes(), hostname.stat().st_mtime_ns) == before
    # The listing shows the links as links, without following them.
    status, root = server.json("GET", files_url(kernel))
    types = {e["name"]: e["type"] for e in root["entries"]}
    assert types.get("esc") == "symlink" and types.get("up") == "symlink", root
    # Deleting the link removes the link only.
    assert server.request("DELETE", files_url(kernel, "esc"))[0] == 204
    assert Path("/etc/passwd").exists()


RAW_ESCAPES = [
    "a/../../etc/passwd",
    "../../../../../../etc/passwd",
    "%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "a/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    "..%2f..%2f..%2f..%2fetc%2fpasswd",
    "%2fetc%2fpasswd",
    "a%2f..%2f..%2fx",
]


@pytest.mark.parametrize("rel", RAW_ESCAPES)
def test_files_dotdot_paths_are_refused(server, kernel, rel):
    for method in ("GET", "PUT", "DELETE"):
        status, _, raw = server.request(method, f"/api/kernels/{kernel}/files/{rel}",
                                        body=b"planted" if method == "PUT" else None)
        assert 400 <= status < 500, f"{method} {rel}: {status} {raw[:200]!r}"
        assert b"root:" not in raw, raw[:300]
    assert not Path("/etc/x").exists()
    # Paths that never reach the files route (the HTTP layer answers for them) are fine as 404;
    # those that do must be bad_path.
    status, _, raw = server.request("GET", f"/api/kernels/{kernel}/files/{rel}")
    if status != 404:
        assert status == 400 and json.loads(raw).get("error") == "bad_path", raw


def test_files_fifo_and_size_cap(server, kernel):
    answer = server.execute(kernel, "import os\nos.mkfifo('pipe')\n"
                                    f"open('big.bin', 'wb').write(b'x' * {MAX_FILE_BYTES + 1})")
    assert answer["status"] == "ok", answer
    t0 = time.monotonic()
    status, _, raw = server.request("GET", files_url(kernel, "pipe"), timeout=20)
    assert 400 <= status < 500, (status, raw)
    assert time.monotonic() - t0 < 5, "reading a FIFO must not block"
    # A write never opens the target: it renames a fresh file over the name, so the FIFO is
    # replaced by a regular file, without blocking.
    t0 = time.monotonic()
    assert server.request("PUT", files_url(kernel, "pipe"), body=b"x", timeout=20)[0] == 201
    assert time.monotonic() - t0 < 5, "writing over a FIFO must not block"
    assert server.request("GET", files_url(kernel, "pipe"))[2] == b"x"

    status, err = server.json("GET", files_url(kernel, "big.bin"))
    assert status == 413, err
    status, err = server.json("PUT", files_url(kernel, "toobig.bin"), body=b"y" * (MAX_FILE_BYTES + 1))
    assert status == 413, err
    assert server.request("GET", files_url(kernel, "toobig.bin"))[0] == 404
    status, _, _ = server.request("PUT", files_url(kernel, "justright.bin"), body=b"y" * MAX_FILE_BYTES)
    assert status == 201


# ---- 9. audit log --------------------------------------------------------------------------

def read_audit(server):
    assert server.audit_log.exists(), f"no audit log at {server.audit_log}"
    return server.audit_log.read_text()


def test_audit_log_records_hashes_not_secrets(server, kernel):
    cells = [
        ("api_key = \"sk-abcdefghijklmnopqrstuvwxyz123456\"\nlen(api_key)", "ok"),
        ("raise ValueError(\"password=hunter2\")", "error"),
        ("print('fine')", "ok"),
    ]
    ua = "agent-test/1.0 CUSTOMSECRET424242 api_key=sk-zyxwvutsrqponmlkjihgfedcba654321"
    for code, want in cells:
        status, answer = server.json("POST", f"/api/kernels/{kernel}/execute",
                                     {"code": code, "timeout": 30}, headers={"User-Agent": ua})
        assert status == 200 and answer["status"] == want, answer
    text = read_audit(server)
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    mine = [r for r in lines if r.get("kernel") == kernel]
    assert len(mine) == len(cells), mine
    for (code, want), rec in zip(cells, mine):
        assert rec["code_sha256"] == hashlib.sha256(code.encode()).hexdigest(), rec
        assert rec["code_bytes"] == len(code.encode()), rec
        assert rec["status"] == want, rec
        for key in ("time", "client", "limits", "duration_ms", "cpu_ms", "memory_peak_bytes",
                    "output_bytes", "artifacts", "files_changed"):
            assert key in rec, (key, rec)
    assert mine[1].get("error", "ValueError") == "ValueError", mine[1]
    for secret in ("sk-abcdefghijklmnopqrstuvwxyz123456", "hunter2", "CUSTOMSECRET424242",
                   "sk-zyxwvutsrqponmlkjihgfedcba654321", "len(api_key)", "print('fine')"):
        assert secret not in text, f"{secret!r} is in the audit log"
    assert "agent-test/1.0" in mine[0]["client"], mine[0]
    mode = server.audit_log.stat().st_mode & 0o777
    assert mode & 0o077 == 0, oct(mode)


# ---- 11. what the kernels inherit ---------------------------------------------------------

def descendants(pid: int) -> list:
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            out += [child] + descendants(child)
    return out


def socket_links(pid: int) -> dict:
    links = {}
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:"):
                links[int(fd)] = link
    except OSError:
        pass
    return links


def test_kernel_processes_hold_no_gateway_sockets(server, kernel):
    """The launcher and the kernel must not inherit the gateway's listening socket or its client
    connections: a kernel that outlives the gateway would keep the port and the clients' calls
    open, and nothing in the jail needs them."""
    gateway = set(socket_links(server.proc.pid).values())
    launchers = [p for p in processes_of(server.tmp) if p != server.proc.pid]
    assert launchers, "no launcher process found for the kernel"
    leaked = {}
    for pid in sorted(set(launchers + [d for p in launchers for d in descendants(p)])):
        shared = {fd: link for fd, link in socket_links(pid).items() if link in gateway}
        if shared:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            leaked[pid] = (cmd, shared)
    assert not leaked, f"gateway sockets inherited by kernel processes: {leaked}"


# ---- 10. bad input -------------------------------------------------------------------------

def test_bad_input(server, kernel):
    def expect(status_want, method, path, body=None, headers=None, token=True):
        status, _, raw = server.request(method, path, body=body, headers=headers, token=token)
        assert status == status_want, f"{method} {path}: {status} {raw[:300]!r}"
        if status_want != 204:
            err = json.loads(raw)
            assert isinstance(err.get("reason"), str) and isinstance(err.get("message"), str), err
        return raw

    exe = f"/api/kernels/{kernel}/execute"
    ctype = {"Content-Type": "application/json"}
    expect(400, "POST", exe, b"{not json", ctype)
    expect(400, "POST", exe, b"[1, 2]", ctype)
    expect(400, "POST", exe, b"{}", ctype)                       # no code
    expect(400, "POST", exe, b'{"code": 1}', ctype)
    expect(400, "POST", exe, b'{"code": "1", "timeout": -1}', ctype)
    expect(400, "POST", exe, b'{"code": "1", "timeout": "x"}', ctype)
    expect(400, "POST", "/api/execute", b"{not json", ctype)
    expect(404, "POST", f"/api/kernels/{uuid.uuid4()}/execute", b'{"code": "1"}', ctype)
    expect(404, "GET", f"/api/kernels/{uuid.uuid4()}/artifacts")
    expect(401, "POST", exe, b'{"code": "1"}', ctype, token=False)
    expect(401, "POST", "/api/execute", b'{"code": "1"}', ctype, token=False)
    expect(401, "GET", f"/api/kernels/{kernel}/files", token=False)
    expect(401, "GET", "/api/artifacts/" + "0" * 64, token=False)
    expect(403, "POST", exe, b'{"code": "1"}', {**ctype, "Authorization": "token wrong"},
           token=False)
    expect(405, "GET", "/api/execute")
    # The kernel is fine after all that.
    assert server.execute(kernel, "1+1")["result"]["text/plain"] == "2"
