#!/usr/bin/python3
"""Side-by-side benchmark: cellgate serve vs. the reference Jupyter server.

Starts, one after the other on this machine, `cellgate serve` and Debian's jupyter_server (with
its ipykernel and default `python3` kernelspec), and measures over the same REST + WebSocket API
(legacy JSON WebSocket format, token in an `Authorization` header):

  1. POST /api/kernels -> first execute_reply of `print(1)` (ms; n runs; median, min, max);
     cellgate twice: with its warm pool off (every start a pool miss: a cold jailed start), and
     claiming from a pool of 2 (--pool-size 2), waiting for the pool to refill between runs;
  2. trivial-cell round trip: execute_request `1` -> its execute_reply on one kernel,
     200 times after 20 warm-ups (us; median, p90);
  3. 10 MiB of stdout: stream bytes received until execute_reply + idle (MB/s, complete?);
     the reference runs as configured by default (iopub_data_rate_limit 1 MB/s, which drops
     output) and once more with --ServerApp.iopub_data_rate_limit=1e10;
  4. 20 kernels started at once (20 concurrent POSTs, each then runs `print(1)`): time until
     all answered.

The WebSocket client is hand-written over a raw socket so TCP_NODELAY and TCP_QUICKACK (re-armed
after every recv) can be set: Nagle and delayed ACKs must not hide the servers' own cost.

Prints figures and ratios; a missed target is reported, not failed. Exits non-zero only on an
infrastructure failure (a server does not start, a request errors or times out).

  gateway_bench.py [--runs N] [--pool-runs N] [--quick] [--bin-dir DIR] [--keep]
"""

import argparse
import base64
import ctypes
import datetime
import hashlib
import http.client
import json
import math
import os
import pathlib
import queue
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid

PYTHON = "/usr/bin/python3"
TOKEN_LEN = 32
STDOUT_CODE = 'import sys\nfor i in range(10240): sys.stdout.write("x" * 1023 + "\\n")'
STDOUT_BYTES = 10240 * 1024  # 10,485,760
MIB = 1024 * 1024
POOL_SIZE = 2  # cellgate serve's default --pool-size


class InfraError(Exception):
    """A server did not start, a request failed or timed out: the benchmark cannot go on."""


# --------------------------------------------------------------------------------------------
# Processes


def _pdeathsig():
    # Children get SIGTERM if this process dies (e.g. killed by a ctest timeout), so no server
    # outlives the benchmark. Runs in the child between fork and exec.
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process under test: base URL, token, and how to stop it."""

    def __init__(self, name, proc, port, token, log_path):
        self.name = name
        self.proc = proc
        self.port = port
        self.token = token
        self.log_path = log_path

    def log_tail(self, lines=30):
        try:
            text = pathlib.Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout=20.0):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"  {self.name}: no exit {timeout:.0f} s after SIGTERM; SIGKILL pid {self.proc.pid}",
                      file=sys.stderr)
                self.proc.kill()
                self.proc.wait()


def start_cellgate(bin_dir, tmp, max_kernels, extra_args=(), label="cellgate"):
    exe = pathlib.Path(bin_dir) / "cellgate"
    if not exe.is_file():
        raise InfraError(f"{exe} not found: build it (cmake --build build --target cellgate cellgate-kernel)"
                         " or pass --bin-dir")
    token = base64.b32encode(os.urandom(20)).decode().lower()[:TOKEN_LEN]
    state = pathlib.Path(tmp) / f"{label}-state"
    log_path = pathlib.Path(tmp) / f"{label}.log"
    # stdout and stderr both go through the pipe (the log lines go to stdout): the banner is read
    # from it, and everything is copied to the log file.
    proc = subprocess.Popen(
        [str(exe), "serve", "--ip", "127.0.0.1", "--port", "0", "--token", token,
         "--state-dir", str(state), "--max-kernels", str(max_kernels), *extra_args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=_pdeathsig)
    lines = queue.Queue()

    def drain():  # read the banner, then keep the pipe from filling
        banner = False
        with open(log_path, "wb") as log:
            for raw in proc.stdout:
                log.write(raw)
                log.flush()
                if not banner:
                    line = raw.decode(errors="replace")
                    banner = "listening on http://" in line
                    lines.put(line)
        lines.put(None)

    threading.Thread(target=drain, daemon=True).start()
    server = Server("cellgate", proc, None, token, log_path)
    deadline = time.monotonic() + 30
    while True:
        try:
            line = lines.get(timeout=max(0.05, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None:
            server.stop()
            raise InfraError("cellgate serve did not print 'listening on' within 30 s:\n" + server.log_tail())
        if "listening on http://" in line:
            hostport = line.split("http://", 1)[1].split("/", 1)[0]
            server.port = int(hostport.rsplit(":", 1)[1])
            break
    wait_http_ready(server, 30)
    return server


def start_jupyter_server(tmp, label, extra_args=()):
    base = pathlib.Path(tmp) / label
    root = base / "root"
    for d in ("config", "data", "runtime", "ipython", "root"):
        (base / d).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("JUPYTER", "PYTHON", "VIRTUAL_ENV", "PYENV")):
            del env[k]
    env.update(JUPYTER_CONFIG_DIR=str(base / "config"), JUPYTER_DATA_DIR=str(base / "data"),
               JUPYTER_RUNTIME_DIR=str(base / "runtime"), IPYTHONDIR=str(base / "ipython"),
               JUPYTER_PLATFORM_DIRS="0")
    token = base64.b32encode(os.urandom(20)).decode().lower()[:TOKEN_LEN]
    port = free_port()
    log_path = base / "jupyter_server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [PYTHON, "-m", "jupyter_server", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--ServerApp.token={token}",
         "--ServerApp.allow_root=True", f"--ServerApp.root_dir={root}", *extra_args],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=str(root),
        start_new_session=True, preexec_fn=_pdeathsig)
    log.close()
    server = Server("jupyter_server" + (f" ({label})" if label != "reference" else ""), proc, port, token,
                    log_path)
    wait_http_ready(server, 60)
    return server


def wait_http_ready(server, timeout):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise InfraError(f"{server.name} exited with {server.proc.returncode} while starting:\n"
                             + server.log_tail())
        try:
            status, body = http_request(server, "GET", "/api", timeout=2)
            if status == 200:
                return json.loads(body)
            last = f"HTTP {status}: {body[:200]!r}"
        except (OSError, http.client.HTTPException) as e:
            last = repr(e)
        time.sleep(0.1)
    server.stop()
    raise InfraError(f"{server.name} did not answer GET /api within {timeout} s ({last}):\n" + server.log_tail())


# --------------------------------------------------------------------------------------------
# REST


def http_request(server, method, path, body=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        headers = {"Authorization": f"token {server.token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def start_kernel(server, timeout=120):
    try:
        status, body = http_request(server, "POST", "/api/kernels", {"name": "python3"}, timeout=timeout)
    except (OSError, http.client.HTTPException) as e:
        raise InfraError(f"{server.name}: POST /api/kernels failed: {e!r}") from e
    if status != 201:
        raise InfraError(f"{server.name}: POST /api/kernels -> HTTP {status}: {body[:300]!r}")
    return json.loads(body)["id"]


def delete_kernel(server, kid, timeout=60):
    try:
        status, body = http_request(server, "DELETE", f"/api/kernels/{kid}", timeout=timeout)
    except (OSError, http.client.HTTPException) as e:
        raise InfraError(f"{server.name}: DELETE /api/kernels/{kid} failed: {e!r}") from e
    if status != 204:
        raise InfraError(f"{server.name}: DELETE /api/kernels/{kid} -> HTTP {status}: {body[:300]!r}")


# --------------------------------------------------------------------------------------------
# A minimal RFC 6455 client


class WSClosed(Exception):
    pass


class WebSocket:
    def __init__(self, port, path, token, timeout=60.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._quickack()
        self.buf = bytearray()
        self.pos = 0
        key = base64.b64encode(os.urandom(16)).decode()
        req = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
               f"Authorization: token {token}\r\n\r\n")
        self.sock.sendall(req.encode())
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        end = self.buf.index(b"\r\n\r\n") + 4
        head = bytes(self.buf[:end]).decode("latin-1")
        self.pos = end
        lines = head.split("\r\n")
        if not lines[0].startswith("HTTP/1.1 101"):
            raise InfraError(f"WebSocket handshake to {path} refused: {lines[0]!r}")
        fields = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                fields[k.strip().lower()] = v.strip()
        want = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode())
                                .digest()).decode()
        if fields.get("sec-websocket-accept") != want:
            raise InfraError(f"WebSocket handshake to {path}: bad Sec-WebSocket-Accept "
                             f"{fields.get('sec-websocket-accept')!r}")

    def _quickack(self):
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass

    def _fill(self):
        chunk = self.sock.recv(1 << 20)
        self._quickack()  # Linux clears TCP_QUICKACK; re-arm after every recv
        if not chunk:
            raise WSClosed("connection closed by the server")
        if self.pos and self.pos > len(self.buf) // 2:
            del self.buf[:self.pos]
            self.pos = 0
        self.buf += chunk

    def _need(self, n):
        while len(self.buf) - self.pos < n:
            self._fill()

    def _take(self, n):
        self._need(n)
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

    def send_frame(self, opcode, payload):
        n = len(payload)
        head = bytearray([0x80 | opcode])
        if n < 126:
            head.append(0x80 | n)
        elif n < 1 << 16:
            head.append(0x80 | 126)
            head += struct.pack("!H", n)
        else:
            head.append(0x80 | 127)
            head += struct.pack("!Q", n)
        mask = os.urandom(4)
        head += mask
        if n:
            m = (mask * (n // 4 + 1))[:n]
            masked = (int.from_bytes(payload, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big")
        else:
            masked = b""
        self.sock.sendall(bytes(head) + masked)

    def send_json(self, obj):
        self.send_frame(0x1, json.dumps(obj).encode())

    def recv_message(self):
        """The next text or binary message (opcode, payload); answers pings."""
        parts = []
        first_op = None
        while True:
            b0, b1 = self._take(2)
            fin, op = b0 & 0x80, b0 & 0x0F
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._take(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._take(8))[0]
            mask = self._take(4) if b1 & 0x80 else None
            payload = self._take(n)
            if mask:
                m = (mask * (n // 4 + 1))[:n]
                payload = (int.from_bytes(payload, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big")
            if op == 0x9:
                self.send_frame(0xA, payload)
                continue
            if op == 0xA:
                continue
            if op == 0x8:
                raise WSClosed(f"close frame from the server: {payload[:2].hex()} {payload[2:]!r}")
            if op in (0x1, 0x2):
                first_op = op
                parts = [payload]
            elif op == 0x0:
                parts.append(payload)
            else:
                raise WSClosed(f"unknown opcode {op}")
            if fin:
                return first_op, b"".join(parts)

    def close(self):
        try:
            self.send_frame(0x8, struct.pack("!H", 1000))
            self.sock.settimeout(1.0)
            while True:  # wait for the server's close (or EOF) so it sees a clean close
                self.recv_message()
        except (OSError, WSClosed, ValueError):
            pass
        finally:
            self.sock.close()


def decode_jupyter(op, payload):
    if op == 0x1:
        return json.loads(payload)
    # Legacy binary format: uint32 count, uint32 offsets, then the JSON message and buffers.
    nbufs = struct.unpack("!I", payload[:4])[0]
    offsets = struct.unpack(f"!{nbufs}I", payload[4:4 + 4 * nbufs])
    end = offsets[1] if nbufs > 1 else len(payload)
    return json.loads(payload[offsets[0]:end])


class KernelClient:
    """One WebSocket connection to /api/kernels/{id}/channels, one client session."""

    def __init__(self, server, kid, timeout=120.0):
        self.server = server
        self.session = uuid.uuid4().hex
        self.timeout = timeout
        try:
            self.ws = WebSocket(server.port, f"/api/kernels/{kid}/channels?session_id={self.session}",
                                server.token, timeout)
        except (OSError, WSClosed) as e:
            raise InfraError(f"{server.name}: WebSocket to kernel {kid} failed: {e!r}") from e

    def execute(self, code):
        msg_id = uuid.uuid4().hex
        self.ws.send_json({
            "header": {"msg_id": msg_id, "username": "bench", "session": self.session,
                       "msg_type": "execute_request", "version": "5.3",
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
            "parent_header": {}, "metadata": {},
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
            "channel": "shell", "buffers": []})
        return msg_id

    def recv(self):
        try:
            op, payload = self.ws.recv_message()
        except socket.timeout as e:
            raise InfraError(f"{self.server.name}: no message within {self.timeout:.0f} s") from e
        except (OSError, WSClosed) as e:
            raise InfraError(f"{self.server.name}: WebSocket failed: {e!r}") from e
        return decode_jupyter(op, payload)

    def wait_reply(self, msg_id):
        while True:
            msg = self.recv()
            if (msg.get("channel") == "shell" and msg["header"]["msg_type"] == "execute_reply"
                    and msg.get("parent_header", {}).get("msg_id") == msg_id):
                if msg["content"].get("status") != "ok":
                    raise InfraError(f"{self.server.name}: execute_reply status {msg['content'].get('status')}: "
                                     f"{json.dumps(msg['content'])[:300]}")
                return msg

    def run(self, code):
        return self.wait_reply(self.execute(code))

    def close(self):
        self.ws.close()


# --------------------------------------------------------------------------------------------
# Measures


def measure_start(server, runs):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        kid = start_kernel(server)
        kc = KernelClient(server, kid)
        kc.run("print(1)")
        times.append((time.perf_counter() - t0) * 1e3)
        kc.close()
        delete_kernel(server, kid)
    return times


POOL_READY = "kernel pool: kernel "  # cellgate's log line when a pooled kernel is ready


def wait_pool_full(server, size, since, timeout=120.0):
    """Waits for cellgate's log to report `size` ready pooled kernels after byte offset `since`."""
    want = f"({size} ready,"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = pathlib.Path(server.log_path).read_bytes()[since:].decode(errors="replace")
        except OSError:
            text = ""
        if any(POOL_READY in line and want in line for line in text.splitlines()):
            return
        time.sleep(0.02)
    raise InfraError(f"{server.name}: the pool did not reach {size} ready kernels in {timeout:.0f} s")


def log_size(server):
    try:
        return pathlib.Path(server.log_path).stat().st_size
    except OSError:
        return 0


def measure_pool_start(server, runs, size):
    """POST -> first execute_reply when a pooled kernel is claimed; the pool refills between runs."""
    wait_pool_full(server, size, 0)
    times = []
    for _ in range(runs):
        mark = log_size(server)
        t0 = time.perf_counter()
        kid = start_kernel(server)
        kc = KernelClient(server, kid)
        kc.run("print(1)")
        times.append((time.perf_counter() - t0) * 1e3)
        kc.close()
        delete_kernel(server, kid)
        wait_pool_full(server, size, mark)
    return times


def measure_round_trip(kc, count, warmup):
    for _ in range(warmup):
        kc.run("1")
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        kc.run("1")
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def measure_stdout(kc):
    """(bytes of stdout stream received, seconds until execute_reply + idle, rate-limit notice seen)."""
    kc.run("pass")  # settle: the previous cell's iopub traffic is drained by waiting for a reply
    t0 = time.perf_counter()
    msg_id = kc.execute(STDOUT_CODE)
    got = 0
    replied = idle = notice = False
    while not (replied and idle):
        msg = kc.recv()
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        mtype = msg["header"]["msg_type"]
        if msg.get("channel") == "iopub" and mtype == "stream":
            if msg["content"].get("name") == "stdout":
                got += len(msg["content"]["text"].encode())
            elif "rate exceeded" in msg["content"].get("text", ""):
                notice = True
        elif msg.get("channel") == "iopub" and mtype == "status":
            idle = msg["content"].get("execution_state") == "idle"
        elif msg.get("channel") == "shell" and mtype == "execute_reply":
            replied = True
    return got, time.perf_counter() - t0, notice


def measure_stdout_runs(server, runs):
    kid = start_kernel(server)
    kc = KernelClient(server, kid)
    try:
        kc.run("print(1)")
        return [measure_stdout(kc) for _ in range(runs)]
    finally:
        kc.close()
        delete_kernel(server, kid)


def measure_many(server, count):
    barrier = threading.Barrier(count + 1)
    kids = [None] * count
    done = [None] * count
    errors = []

    def one(i):
        try:
            barrier.wait()
            kids[i] = start_kernel(server, timeout=300)
            kc = KernelClient(server, kids[i], timeout=300)
            kc.run("print(1)")
            done[i] = time.perf_counter()
            kc.close()
        except Exception as e:  # reported below as an infrastructure failure
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(400)
    try:
        if errors or any(d is None for d in done):
            raise InfraError(f"{server.name}: {count} concurrent kernels: "
                             + (repr(errors[0]) if errors else "a client did not finish"))
        return max(done) - t0, statistics.median(d - t0 for d in done)
    finally:
        deleters = [threading.Thread(target=_delete_quiet, args=(server, k), daemon=True) for k in kids if k]
        for t in deleters:
            t.start()
        for t in deleters:
            t.join(120)


def _delete_quiet(server, kid):
    try:
        delete_kernel(server, kid)
    except InfraError as e:
        print(f"  warning: {e}", file=sys.stderr)


def run_server(server, args, results, measures=("start", "rtt", "stdout", "many")):
    print(f"\n--- {server.name} on port {server.port} ---", flush=True)
    r = results.setdefault(server.name, {})
    if "start" in measures:
        r["start"] = measure_start(server, args.runs)
        print(f"  start -> first reply: median {statistics.median(r['start']):.1f} ms", flush=True)
    if "pool" in measures:
        r["pool"] = measure_pool_start(server, args.pool_runs, POOL_SIZE)
        print(f"  start from the pool -> first reply: median {statistics.median(r['pool']):.1f} ms",
              flush=True)
    if "rtt" in measures:
        kid = start_kernel(server)
        kc = KernelClient(server, kid)
        try:
            kc.run("print(1)")
            r["rtt"] = measure_round_trip(kc, args.round_trips, args.warmup)
            print(f"  round trip: median {statistics.median(r['rtt']):.0f} us", flush=True)
        finally:
            kc.close()
            delete_kernel(server, kid)
    if "stdout" in measures:
        r["stdout"] = measure_stdout_runs(server, args.stdout_runs)
        best = max(r["stdout"], key=lambda x: x[0])
        print(f"  10 MiB stdout: {best[0]:,} bytes in {best[1]:.2f} s", flush=True)
    if "many" in measures and args.kernels:
        r["many"] = measure_many(server, args.kernels)
        print(f"  {args.kernels} kernels at once: all answered after {r['many'][0]:.2f} s", flush=True)


# --------------------------------------------------------------------------------------------
# Report


def p90(xs):
    s = sorted(xs)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def table(title, cols, rows):
    print(f"\n{title}")
    w0 = max(len(r[0]) for r in rows) + 2
    print(" " * w0 + "".join(f"{c:>14}" for c in cols))
    for name, *vals in rows:
        print(f"{name:<{w0}}" + "".join(f"{v:>14}" for v in vals))


def ratio(ref, mine):
    return f"{ref / mine:.2f}x" if mine > 0 else "n/a"


def report(results, args, versions):
    cg, ref, unl = "cellgate", "jupyter_server", "jupyter_server (unlimited)"
    c, j, u = results[cg], results[ref], results.get(unl, {})
    print("\n================================================================================")
    print(f"cellgate {versions.get(cg, '?')} vs jupyter_server {versions.get(ref, '?')} "
          f"(ipykernel, /usr/bin/python3), {os.cpu_count()} CPUs; ratio = reference/cellgate for times, "
          "cellgate/reference for throughput: higher means cellgate is faster")

    s_c, s_j = c["start"], j["start"]
    s_p = results.get("cellgate (pool)", {}).get("pool")
    rows = [(f"{cg} (pool miss)", *(f"{f(s_c):.1f}" for f in (statistics.median, min, max)))]
    if s_p:
        rows.append((f"{cg} (pool hit)", *(f"{f(s_p):.1f}" for f in (statistics.median, min, max))))
    rows += [(ref, *(f"{f(s_j):.1f}" for f in (statistics.median, min, max))),
             ("ratio (miss)", ratio(statistics.median(s_j), statistics.median(s_c)),
              ratio(min(s_j), min(s_c)), ratio(max(s_j), max(s_c)))]
    if s_p:
        rows.append(("ratio (hit)", ratio(statistics.median(s_j), statistics.median(s_p)),
                     ratio(min(s_j), min(s_p)), ratio(max(s_j), max(s_p))))
    table(f"1. POST /api/kernels -> first execute_reply of print(1) (ms, n={len(s_c)} misses"
          + (f", {len(s_p)} pool hits" if s_p else "") + ")", ["median", "min", "max"], rows)

    r_c, r_j = c["rtt"], j["rtt"]
    table(f"2. trivial cell round trip over the WebSocket (us, n={len(r_c)} after {args.warmup} warm-ups)",
          ["median", "p90"],
          [(cg, f"{statistics.median(r_c):.0f}", f"{p90(r_c):.0f}"),
           (ref, f"{statistics.median(r_j):.0f}", f"{p90(r_j):.0f}"),
           ("ratio", ratio(statistics.median(r_j), statistics.median(r_c)), ratio(p90(r_j), p90(r_c)))])

    def stdout_row(name, runs):
        rate = statistics.median(b / MIB / t for b, t, _ in runs)
        least = min(b for b, _, _ in runs)
        complete = all(b == STDOUT_BYTES for b, _, _ in runs)
        notice = any(n for _, _, n in runs)
        return rate, (name, f"{rate:.1f}", f"{least:,}", "yes" if complete else "NO",
                      "yes" if notice else "no"), complete

    rc, row_c, complete_c = stdout_row(cg, c["stdout"])
    rj, row_j, _ = stdout_row(ref, j["stdout"])
    rows = [row_c, row_j]
    if "stdout" in u:
        ru, row_u, _ = stdout_row(unl, u["stdout"])
        rows.append(row_u)
    rows.append(("ratio (cellgate/ref)", f"{rc / rj:.2f}x" if rj else "n/a", "", "", ""))
    if "stdout" in u:
        rows.append(("ratio (cellgate/unlimited)", f"{rc / ru:.2f}x" if ru else "n/a", "", "", ""))
    table(f"3. {STDOUT_BYTES:,} bytes of stdout until execute_reply + idle "
          f"(MiB/s median of {len(c['stdout'])}; least bytes received)",
          ["MiB/s", "bytes (min)", "complete", "rate notice"], rows)

    if "many" in c and "many" in j:
        m_c, m_j = c["many"], j["many"]
        table(f"4. {args.kernels} kernels started at once, each runs print(1) (s)",
              ["all answered", "median kernel"],
              [(cg, f"{m_c[0]:.2f}", f"{m_c[1]:.2f}"), (ref, f"{m_j[0]:.2f}", f"{m_j[1]:.2f}"),
               ("ratio", ratio(m_j[0], m_c[0]), ratio(m_j[1], m_c[1]))])
    else:
        print("\n4. concurrent kernels: skipped")

    rtt_ok = statistics.median(r_c) <= 0.5 * statistics.median(r_j)
    print("\ntargets:")
    if s_p:
        hit = statistics.median(s_p)
        print(f"  pool start p50 <= 5 ms: {'PASS' if hit <= 5 else 'MISS'} ({hit:.1f} ms)")
    miss = statistics.median(s_c)
    print(f"  pool-miss start p50 <= 40 ms: {'PASS' if miss <= 40 else 'MISS'} ({miss:.1f} ms)")
    print(f"  round trip at most half the reference's: {'PASS' if rtt_ok else 'MISS'} "
          f"({statistics.median(r_c):.0f} us vs {statistics.median(r_j):.0f} us)")
    print(f"  10 MB delivered completely: {'PASS' if complete_c else 'MISS'} "
          f"(least {min(b for b, _, _ in c['stdout']):,} of {STDOUT_BYTES:,} bytes)")


# --------------------------------------------------------------------------------------------


def _interrupted(*_):
    raise KeyboardInterrupt


def main():
    here = pathlib.Path(__file__).resolve()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="kernel starts per server (default 5)")
    ap.add_argument("--pool-runs", type=int, default=10,
                    help="starts claimed from cellgate's warm pool (default 10; 0: skip)")
    ap.add_argument("--quick", action="store_true",
                    help="CI smoke: 2 starts, 50 round trips, one 10 MiB run, no concurrent-kernel run")
    ap.add_argument("--bin-dir", default=str(here.parents[2] / "build" / "bin"),
                    help="directory holding cellgate and cellgate-kernel (default: <repo>/build/bin)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with the servers' logs")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.round_trips, args.warmup, args.stdout_runs, args.kernels = 2, 50, 10, 1, 0
        args.pool_runs = min(args.pool_runs, 2)
    else:
        args.round_trips, args.warmup, args.stdout_runs, args.kernels = 200, 20, 3, 20
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    tmp = tempfile.mkdtemp(prefix="cellgate-bench-")
    servers = []
    results, versions = {}, {}
    # SIGTERM to this script: clean up as for Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        plan = [
            # Pool off: every start is a cold jailed start, as before the pool existed.
            ("cellgate", lambda: start_cellgate(args.bin_dir, tmp, max(64, args.kernels),
                                                ["--pool-size", "0"]), None),
            ("jupyter_server", lambda: start_jupyter_server(tmp, "reference"), None),
            ("jupyter_server (unlimited)",
             lambda: start_jupyter_server(tmp, "unlimited", ["--ServerApp.iopub_data_rate_limit=1e10"]),
             ("stdout",)),
        ]
        if args.pool_runs > 0:
            plan.insert(1, ("cellgate (pool)",
                            lambda: start_cellgate(args.bin_dir, tmp, 64,
                                                   ["--pool-size", str(POOL_SIZE)], "cellgate-pool"),
                            ("pool",)))
        for name, starter, measures in plan:
            server = starter()  # one server at a time: they do not compete for the 2 cores
            servers.append(server)
            server.name = name
            try:
                versions[name] = json.loads(http_request(server, "GET", "/api")[1]).get("version", "?")
            except (OSError, ValueError, http.client.HTTPException):
                versions[name] = "?"
            try:
                if measures:
                    run_server(server, args, results, measures)
                else:
                    run_server(server, args, results)
            finally:
                server.stop()
        report(results, args, versions)
        return 0
    except InfraError as e:
        print(f"\ngateway_bench: infrastructure failure: {e}", file=sys.stderr)
        for s in servers:
            print(f"--- last lines of the {s.name} log ---\n{s.log_tail(15)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ngateway_bench: interrupted", file=sys.stderr)
        return 130
    finally:
        for s in servers:
            s.stop()
        if args.keep:
            print(f"gateway_bench: logs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
