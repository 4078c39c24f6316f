#!/usr/bin/python3
"""Side-by-side benchmark: cellgate serve vs. the reference Jupyter server.

Starts, one after the other on this machine, `cellgate serve` in several configurations and
Debian's jupyter_server 1.23 (with its ipykernel and default `python3` kernelspec), and measures
over the same REST + WebSocket API (legacy JSON WebSocket format unless a section says v1 -- the
`v1.kernel.websocket.jupyter.org` binary subprotocol --, token in an `Authorization` header).
Sections (select with --only, drop with --skip / --skip-200):

  start   POST /api/kernels -> first execute_reply of `print(1)` on a pool miss (ms; n runs;
          median, min, max, and the median split into POST -> 201, WebSocket open, execute ->
          reply). A miss POSTs a client env ({"env": {"KERNEL_BENCH": "1"}}, which the pool never
          serves; jupyter_server ignores it). cellgate with the zygote and its pool off, cellgate
          --no-zygote with its pool off (a cold jailed `python3 -m ipykernel_launcher`), and the
          reference;
  pool    the same from cellgate's warm pool (--pool-size 2: POSTs without an env, waiting for
          the pool to refill between runs), then pool misses on that server (POSTs with the env
          while the pool is full);
  rtt     trivial-cell round trip: execute_request `1` -> its execute_reply on one kernel,
          200 times after 20 warm-ups (us; median, p90);
  stdout  10 MiB of stdout: stream bytes received until execute_reply + idle (MB/s, complete?),
          over the legacy format and over v1; the reference runs as configured by default
          (iopub_data_rate_limit 1 MB/s, which drops output; legacy only) and once more with its
          limits off (--ServerApp.limit_rate=False, iopub_data_rate_limit=1e10,
          iopub_msg_rate_limit=1e10; legacy and v1), which the target compares with;
  png     --png-images (20) distinct ~1 MiB PNGs (512 x 512 RGBA of random pixels, zlib level 1,
          made in the kernel with zlib + struct by an earlier cell), shown by one cell with
          IPython.display.display(Image(...)) and received by one WebSocket client (legacy and v1):
          the server process's own CPU time (utime + stime of /proc/<pid>/stat; not its children)
          from sending the execute_request to the execute_reply + idle, divided by the images
          (ms per 1 MiB PNG message; also the sum of /proc/<pid>/task/*/schedstat, ns resolution,
          when no thread came or went); every PNG checked against the kernel's SHA-256. 3 runs;
  busy    --busy-kernels (64) agent cells `time.sleep(20)` at once, one kernel and one connection
          each (cellgate: POST /api/kernels/{id}/execute with timeout 60; the reference has no
          agent API: execute_requests over one WebSocket per kernel). Once GET /api/kernels lists
          every one busy (or after 5 s), three samplers, each one request every 100 ms, 20 times
          (none begun after sleep + 30 s): GET /api/kernels/{id} of an idle kernel, DELETE
          /api/kernels/{id} of idle kernels started before the cells, POST /api/kernels with a
          client env (a full kernel start: POST -> 201); the same 20 of each before the cells (no
          cells running) for the ratio. p50/p99 (ms, p99 = nearest rank: with 20 samples, the
          largest); whether every cell answered ok within sleep + 5 s (side by side, not queued)
          and whether all samples were taken before the first cell answered. cellgate --quick:
          8 kernels, sleep(5), 5 samples;
  gwcpu   the server's own CPU per trivial cell: one WebSocket client runs --gwcpu-cells (1000)
          cells `1` in a row on one kernel, after 20 warm-ups (legacy and v1); the server process's
          utime + stime (and schedstat, as in png) over them divided by the cells, in us: for
          cellgate the `cellgate serve` process (not its launchers, zygote or kernels), for the
          reference the jupyter_server process (not the ipykernel);
  many    20 kernels started at once (20 concurrent POSTs, each then runs `print(1)`): time
          until all answered;
  cells   on those 20 kernels, 20 x 50 trivial cells (each kernel runs 50 cells in a row, the 20
          kernels concurrently): wall time, cells/s, per-cell latency;
  pss     on those 20 kernels, `import numpy, pandas, matplotlib.pyplot` in each, then the PSS
          (/proc/<pid>/smaps_rollup) of every process belonging to the kernels, divided by 20.
          cellgate: every descendant of the gateway process (launchers, the zygote, each jail's
          reaper and kernel), so the zygote counts 1/20 per kernel; jupyter_server: every
          descendant of the server process (the ipykernel processes). The servers' own RSS too.
          many, cells and pss run on cellgate (zygote), cellgate --no-zygote and the reference;
  idle    cellgate only (--max-kernels 250, zygote, pool off): 200 kernels POSTed, 10 clients at a
          time, each answering one trivial cell; then idle for 10 s; then whether every one still
          answers a cell, the gateway's VmRSS (and VmHWM), and the total PSS of the gateway and
          all its descendants. The reference is not run at 200 (200 cold ipykernels would need
          ~20 GB and minutes): compare with its per-kernel PSS at 20 in `pss`.

The WebSocket client is hand-written over a raw socket so TCP_NODELAY and TCP_QUICKACK (re-armed
after every recv) can be set: Nagle and delayed ACKs must not hide the servers' own cost.

Prints figures, ratios and targets (pool start p50 <= 5 ms; pool-miss start p50 <= 40 ms; 20
concurrent kernels all answering >= 20x sooner than the reference; <= 25 MiB PSS per kernel with
the stack imported; 200 idle kernels alive at once; round trip at most half the reference's; 10 MB
of stdout complete, at >= 1.5x jupyter_server's rate with its limits off; <= 1 ms of gateway CPU
per 1 MiB PNG message; GET and DELETE /api/kernels/{id} (and POST /api/kernels, printed beside
its latency with no cells running) within 50 ms p99 while 64 cells sleep, all of which answer ok
after ~20 s). A missed target is reported, not failed. Exits non-zero only on an infrastructure
failure (a server does not start or dies, a request errors or times out). Every process started
is stopped by its pid (leftover descendants are killed by pid, and so are the processes a crashed
server left behind, found by its temp path in their command lines); the temp dir is removed.

  gateway_bench.py [--quick] [--only SECTION[,SECTION]] [--skip SECTION[,SECTION]] [--skip-200]
                   [--runs N] [--pool-runs N] [--kernels N] [--cells N] [--idle-kernels N]
                   [--png-images N] [--busy-kernels N] [--gwcpu-cells N] [--bin-dir DIR] [--keep]

--quick (CI smoke, well under 3 minutes): 2 starts of each kind, 50 round trips, one 10 MiB run
per protocol, 3 kernels x 5 cells with the stack imported, 5 idle kernels, one run of 5 PNGs per
protocol, 8 kernels sleeping 5 s with 5 samples of each request, 100 cells for gwcpu.
"""

import argparse
import base64
import concurrent.futures
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
STACK_CODE = "import numpy, pandas, matplotlib.pyplot"
MISS_ENV = {"KERNEL_BENCH": "1"}  # a client env: the pool never serves such a POST
MIB = 1024 * 1024
POOL_SIZE = 2  # cellgate serve's default --pool-size
V1 = "v1.kernel.websocket.jupyter.org"  # the binary WebSocket subprotocol
PROTOCOLS = (("legacy", None), ("v1", V1))
# A real PNG of incompressible pixels (512 x 512 RGBA of random bytes: 1 MiB + the filter bytes,
# zlib level 1), made in the kernel before the measured cell; prints the SHA-256 of each.
PNG_PREP = """import hashlib, json, os, struct, zlib
def _bench_png(w, h):
    raw = b"".join(b"\\x00" + os.urandom(4 * w) for _ in range(h))
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b""))
_bench_pngs = [_bench_png(512, 512) for _ in range({n})]
print(json.dumps([[len(p), hashlib.sha256(p).hexdigest()] for p in _bench_pngs]))
"""
PNG_SHOW = ("from IPython.display import Image, display\n"
            "for _bench_p in _bench_pngs: display(Image(data=_bench_p))\n"
            "del _bench_pngs, _bench_p")
CLK_TCK = os.sysconf("SC_CLK_TCK")
SECTIONS = ("start", "pool", "rtt", "stdout", "many", "cells", "pss", "idle", "png", "busy", "gwcpu")
FLEET = ("many", "cells", "pss")

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

    def __init__(self, name, proc, port, token, log_path, marker):
        self.name = name
        self.marker = str(marker)  # a path unique to this server, in the command lines under it
        self.proc = proc
        self.port = port
        self.token = token
        self.log_path = log_path
        self.seen = {}  # {pid: starttime} of processes seen under the server (remember())

    def log_tail(self, lines=30):
        try:
            text = pathlib.Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def remember(self):
        """Notes the processes now under the server: if it dies (a crash), they are reparented
        and no longer found under it, and stop() kills these by pid instead."""
        if self.proc.poll() is None:
            self.seen.update(snapshot_tree(self))

    def stop(self, timeout=20.0):
        """SIGTERM, then SIGKILL after `timeout` s; then SIGKILL by pid any process that was under
        the server and outlived it (if the server had already exited, those remember() saw)."""
        if self.proc.poll() is not None:
            self.seen.pop(self.proc.pid, None)
            seen, self.seen = self.seen, {}
            kill_leftovers(self.name, seen, grace=2.0)
            kill_orphans(self.name, self.marker)
            return
        snapshot = snapshot_tree(self)
        snapshot.pop(self.proc.pid, None)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"  {self.name}: no exit {timeout:.0f} s after SIGTERM; SIGKILL pid {self.proc.pid}",
                  file=sys.stderr)
            self.proc.kill()
            self.proc.wait()
        kill_leftovers(self.name, snapshot)
        kill_orphans(self.name, self.marker)


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
    server = Server("cellgate", proc, None, token, log_path, state)
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
                    log_path, base)
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


def start_kernel(server, timeout=120, env=None):
    """POST /api/kernels for python3, with a client env if given; the kernel id."""
    body = {"name": "python3"}
    if env is not None:
        body["env"] = env
    try:
        status, body = http_request(server, "POST", "/api/kernels", body, timeout=timeout)
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
    """`protocol`: a Sec-WebSocket-Protocol to offer; `self.protocol` is the one the server chose."""

    def __init__(self, port, path, token, timeout=60.0, protocol=None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._quickack()
        self.buf = bytearray()
        self.pos = 0
        key = base64.b64encode(os.urandom(16)).decode()
        req = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
               f"Authorization: token {token}\r\n"
               + (f"Sec-WebSocket-Protocol: {protocol}\r\n" if protocol else "") + "\r\n")
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
        self.protocol = fields.get("sec-websocket-protocol")
        if self.protocol is not None and self.protocol != protocol:
            raise InfraError(f"WebSocket handshake to {path}: the server chose subprotocol {self.protocol!r}, "
                             f"offered {protocol!r}")

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


def decode_v1(payload):
    """A v1.kernel.websocket.jupyter.org frame: uint64 LE count n, n uint64 LE offsets (the last
    is the frame's end), then channel, header, parent_header, metadata, content, buffers."""
    n = struct.unpack_from("<Q", payload, 0)[0]
    if n < 6 or 8 * (n + 1) > len(payload):
        raise InfraError(f"bad v1 frame: {n} offsets in {len(payload)} bytes")
    offs = struct.unpack_from(f"<{n}Q", payload, 8)
    if offs[-1] != len(payload) or any(a > b for a, b in zip(offs, offs[1:])):
        raise InfraError(f"bad v1 frame: offsets {offs[:8]} in {len(payload)} bytes")
    parts = [payload[offs[i]:offs[i + 1]] for i in range(n - 1)]
    return {"channel": parts[0].decode(), "header": json.loads(parts[1]), "parent_header": json.loads(parts[2]),
            "metadata": json.loads(parts[3]), "content": json.loads(parts[4]), "buffers": parts[5:]}


def encode_v1(msg):
    parts = [msg["channel"].encode()] + [json.dumps(msg[k]).encode()
                                         for k in ("header", "parent_header", "metadata", "content")]
    n = len(parts) + 1
    offs = [8 * (n + 1)]
    for part in parts:
        offs.append(offs[-1] + len(part))
    return struct.pack(f"<{n + 1}Q", n, *offs) + b"".join(parts)


class KernelClient:
    """One WebSocket connection to /api/kernels/{id}/channels, one client session."""

    def __init__(self, server, kid, timeout=120.0, protocol=None):
        self.server = server
        self.session = uuid.uuid4().hex
        self.timeout = timeout
        self.last_size = 0  # bytes of the last message received
        try:
            self.ws = WebSocket(server.port, f"/api/kernels/{kid}/channels?session_id={self.session}",
                                server.token, timeout, protocol)
        except (OSError, WSClosed) as e:
            raise InfraError(f"{server.name}: WebSocket to kernel {kid} failed: {e!r}") from e
        self.v1 = self.ws.protocol == V1

    def execute(self, code):
        msg_id = uuid.uuid4().hex
        msg = {
            "header": {"msg_id": msg_id, "username": "bench", "session": self.session,
                       "msg_type": "execute_request", "version": "5.3",
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
            "parent_header": {}, "metadata": {},
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
            "channel": "shell", "buffers": []}
        if self.v1:
            self.ws.send_frame(0x2, encode_v1(msg))
        else:
            self.ws.send_json(msg)
        return msg_id

    def recv(self):
        try:
            op, payload = self.ws.recv_message()
        except socket.timeout as e:
            raise InfraError(f"{self.server.name}: no message within {self.timeout:.0f} s") from e
        except (OSError, WSClosed) as e:
            raise InfraError(f"{self.server.name}: WebSocket failed: {e!r}") from e
        self.last_size = len(payload)
        if self.v1 and op == 0x2:
            return decode_v1(payload)
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

    def run_stdout(self, code):
        """Runs a cell; its stdout once execute_reply and idle have both arrived."""
        msg_id = self.execute(code)
        out, replied, idle = [], False, False
        while not (replied and idle):
            msg = self.recv()
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            mtype = msg["header"]["msg_type"]
            if mtype == "stream" and msg["content"].get("name") == "stdout":
                out.append(msg["content"]["text"])
            elif mtype == "status":
                idle = msg["content"].get("execution_state") == "idle"
            elif msg.get("channel") == "shell" and mtype == "execute_reply":
                if msg["content"].get("status") != "ok":
                    raise InfraError(f"{self.server.name}: execute_reply status {msg['content'].get('status')}: "
                                     f"{json.dumps(msg['content'])[:300]}")
                replied = True
        return "".join(out)

    def close(self):
        self.ws.close()


# --------------------------------------------------------------------------------------------
# Processes under a server: /proc


def proc_table():
    """{pid: (ppid, starttime)} of every process now."""
    table = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        table[int(d)] = (int(fields[1]), int(fields[19]))
    return table


def descendants(root, table=None):
    """[(pid, ppid)] of every descendant of root (not root itself), parents before children."""
    table = proc_table() if table is None else table
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        for c in sorted(children.get(p, ())):
            out.append((c, p))
            todo.append(c)
    return out


def proc_kib(path, field):
    """The value in kB of `field:` in a /proc file, or None if the process is gone."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def pss_kib(pid):
    return proc_kib(f"/proc/{pid}/smaps_rollup", "Pss")


def status_kib(pid, field="VmRSS"):
    return proc_kib(f"/proc/{pid}/status", field)


def cmdline(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def proc_cpu(pid):
    """CPU time of one process, its children not counted: (utime + stime of /proc/<pid>/stat in s,
    which the kernel keeps exactly but prints in 1/CLK_TCK s; the sum of /proc/<pid>/task/*/schedstat
    in ns, which misses threads that exited; {tid})."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError as e:
        raise InfraError(f"/proc/{pid}/stat: {e}") from e
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    ns, tids = 0, set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                ns += int(pathlib.Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
                tids.add(tid)
            except (OSError, ValueError, IndexError):
                pass
    except OSError:
        pass
    return ticks / CLK_TCK, ns, frozenset(tids)


def cpu_between(a, b):
    """{"stat": s, "sched": s or None (a thread came or went), "tick": s} between two proc_cpu()."""
    return {"stat": b[0] - a[0], "sched": (b[1] - a[1]) / 1e9 if a[2] == b[2] and a[2] else None,
            "tick": 1 / CLK_TCK}


def snapshot_tree(server):
    """{pid: starttime} of the server and its descendants, to kill leftovers by pid after a stop."""
    table = proc_table()
    root = server.proc.pid
    pids = [root] + [p for p, _ in descendants(root, table)]
    return {p: table[p][1] for p in pids if p in table}


def kill_leftovers(name, snapshot, grace=10.0):
    """SIGKILLs, by pid, processes of a snapshot still alive `grace` s after their server exited."""
    deadline = time.monotonic() + grace
    while True:
        table = proc_table()
        alive = [p for p, st in snapshot.items() if p in table and table[p][1] == st]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for p in alive:
        print(f"  {name}: pid {p} outlived its server: SIGKILL ({cmdline(p)[:100]})", file=sys.stderr)
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def kill_orphans(name, marker):
    """SIGKILLs, by pid, processes a server left behind that are no longer under it (it crashed and
    they were reparented): those with `marker` (its own temp path) in their command line (cellgate's
    launchers, zygote and zygote-forked kernels; jupyter_server's ipykernels), a `cellgate-reaper`
    parent of one, and their descendants."""
    table = proc_table()
    found = set()
    for pid in table:
        if pid != os.getpid() and marker in cmdline(pid):
            found.add(pid)
            ppid = table[pid][0]
            if ppid > 1 and cmdline(ppid).startswith("cellgate-reaper"):
                found.add(ppid)
    for pid in list(found):
        found.update(p for p, _ in descendants(pid, table))
    for pid in sorted(found):
        try:
            now = proc_table_entry(pid)
            if now and now[1] == table[pid][1]:  # the same process (start time), not a reused pid
                print(f"  {name}: pid {pid} left behind: SIGKILL ({cmdline(pid)[:100]})", file=sys.stderr)
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 5  # until they are gone (a jail's init goes after its processes)
    while found and time.monotonic() < deadline:
        found = {p for p in found if (proc_table_entry(p) or (0, None))[1] == table[p][1] and cmdline(p)}
        time.sleep(0.05)


def proc_table_entry(pid):
    """(ppid, starttime) of one process, or None."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[19])


def unmount_leftovers(tmp):
    """Unmounts what a crashed cellgate left mounted under the benchmark's temp dir (its kernels'
    work-dir tmpfs), deepest first, so the temp dir can be removed."""
    prefix = os.path.realpath(tmp) + "/"
    try:
        with open("/proc/self/mounts") as f:
            points = [line.split()[1] for line in f]
    except OSError:
        return
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        done = subprocess.run(["umount", point], capture_output=True, text=True)
        print(f"  {'unmounted' if done.returncode == 0 else 'could not unmount'} {point}, left by a "
              f"crashed server {done.stderr.strip()}", file=sys.stderr)


def kernel_pss(server, count, cellgate):
    """PSS per kernel (kB) of every process under the server, split by role, and the server's RSS."""
    gw = server.proc.pid
    parts = {}
    nprocs = 0
    for pid, ppid in descendants(gw):
        kb = pss_kib(pid)
        if kb is None:
            continue
        nprocs += 1
        if not cellgate:
            role = "kernel processes"
        elif ppid == gw and "--zygote" in cmdline(pid).split():
            role = "zygote"
        elif ppid == gw:
            role = "launchers"
        else:
            role = "jails (reaper + kernel)"
        parts[role] = parts.get(role, 0) + kb
    total = sum(parts.values())
    return {"per_kernel": total / count, "total": total, "parts": {k: v / count for k, v in parts.items()},
            "procs": nprocs, "server_rss": status_kib(gw), "server_pss": pss_kib(gw), "count": count}


# --------------------------------------------------------------------------------------------
# Measures


def measure_start(server, runs, env=MISS_ENV):
    """[{total, post, ws, exec} ms] of POST -> 201 -> WebSocket open -> execute_reply of print(1)."""
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        kid = start_kernel(server, env=env)
        t1 = time.perf_counter()
        kc = KernelClient(server, kid)
        t2 = time.perf_counter()
        kc.run("print(1)")
        t3 = time.perf_counter()
        out.append({"total": (t3 - t0) * 1e3, "post": (t1 - t0) * 1e3, "ws": (t2 - t1) * 1e3,
                    "exec": (t3 - t2) * 1e3})
        kc.close()
        delete_kernel(server, kid)
    return out


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


ZYGOTE_READY = "zygote: ready"  # cellgate's log line when the zygote has its preload imported


def wait_log(server, text, timeout=120.0):
    """Waits for a line with `text` in the server's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if text in pathlib.Path(server.log_path).read_bytes().decode(errors="replace"):
                return
        except OSError:
            pass
        if server.proc.poll() is not None:
            break
        time.sleep(0.02)
    raise InfraError(f"{server.name}: no {text!r} in its log within {timeout:.0f} s:\n" + server.log_tail())


def log_size(server):
    try:
        return pathlib.Path(server.log_path).stat().st_size
    except OSError:
        return 0


def measure_pool_start(server, runs, size):
    """POST -> first execute_reply when a pooled kernel is claimed; the pool refills between runs."""
    wait_pool_full(server, size, 0)
    out = []
    for _ in range(runs):
        mark = log_size(server)
        out += measure_start(server, 1, env=None)
        wait_pool_full(server, size, mark)
    return out


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


def measure_stdout_runs(server, runs, protocol=None):
    """{"protocol": the one the server chose (None: legacy), "runs": [measure_stdout()]}."""
    kid = start_kernel(server)
    kc = KernelClient(server, kid, protocol=protocol)
    try:
        kc.run("print(1)")
        server.remember()
        return {"protocol": kc.ws.protocol, "runs": [measure_stdout(kc) for _ in range(runs)]}
    finally:
        kc.close()
        delete_kernel(server, kid)


def measure_png(server, images, runs, protocol=None):
    """`images` distinct ~1 MiB PNGs displayed by one cell: the server process's CPU from the
    execute_request to execute_reply + idle, and whether each PNG arrived whole."""
    gw = server.proc.pid
    kid = start_kernel(server)
    kc = KernelClient(server, kid, protocol=protocol)
    out = []
    try:
        kc.run("print(1)")
        server.remember()
        for _ in range(runs):
            want = json.loads(kc.run_stdout(PNG_PREP.replace("{n}", str(images))))
            got, wire = [], []
            c0, t0 = proc_cpu(gw), time.perf_counter()
            msg_id = kc.execute(PNG_SHOW)
            replied = idle = False
            while not (replied and idle):
                msg = kc.recv()
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                mtype = msg["header"]["msg_type"]
                if mtype == "display_data":
                    got.append(msg["content"].get("data", {}).get("image/png", ""))
                    wire.append(kc.last_size)
                elif mtype == "status":
                    idle = msg["content"].get("execution_state") == "idle"
                elif msg.get("channel") == "shell" and mtype == "execute_reply":
                    if msg["content"].get("status") != "ok":
                        raise InfraError(f"{server.name}: PNG cell: {json.dumps(msg['content'])[:300]}")
                    replied = True
            wall, c1 = time.perf_counter() - t0, proc_cpu(gw)
            whole = 0
            for (size, digest), b64 in zip(want, got):
                try:
                    png = base64.b64decode(b64.strip(), validate=True)  # IPython ends it with a newline
                except ValueError:
                    continue
                whole += len(png) == size and hashlib.sha256(png).hexdigest() == digest
            out.append({"cpu": cpu_between(c0, c1), "wall": wall, "images": images, "received": len(got),
                        "whole": whole, "png_bytes": statistics.median(size for size, _ in want),
                        "wire_bytes": statistics.median(wire) if wire else 0})
        return {"protocol": kc.ws.protocol, "runs": out}
    finally:
        kc.close()
        delete_kernel(server, kid)


def measure_gwcpu(server, cells, warmup, protocol=None):
    """The server process's CPU over `cells` trivial cells in a row on one kernel and one client."""
    gw = server.proc.pid
    kid = start_kernel(server)
    kc = KernelClient(server, kid, protocol=protocol)
    try:
        kc.run("print(1)")
        server.remember()
        for _ in range(warmup):
            kc.run("1")
        c0, t0 = proc_cpu(gw), time.perf_counter()
        for _ in range(cells):
            kc.run("1")
        wall, c1 = time.perf_counter() - t0, proc_cpu(gw)
        return {"protocol": kc.ws.protocol, "cpu": cpu_between(c0, c1), "wall": wall, "cells": cells}
    finally:
        kc.close()
        delete_kernel(server, kid)


def run_together(server, count, fn, timeout):
    """Runs fn(i) for i < count in threads released at once; (t0, [end time of i])."""
    barrier = threading.Barrier(count + 1)
    ends = [None] * count
    errors = []

    def one(i):
        try:
            barrier.wait()
            fn(i)
            ends[i] = time.perf_counter()
        except Exception as e:  # reported below as an infrastructure failure
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    if errors or any(e is None for e in ends):
        raise InfraError(f"{server.name}: {count} concurrent clients: "
                         + (repr(errors[0]) if errors else "a client did not finish"))
    return t0, ends


def measure_fleet(server, args, sections, r, cellgate):
    """many, cells and pss on one set of args.kernels kernels started at once."""
    n = args.kernels
    kids, kcs = [None] * n, [None] * n

    def start(i):
        kids[i] = start_kernel(server, timeout=300)
        kcs[i] = KernelClient(server, kids[i], timeout=300)
        kcs[i].run("print(1)")

    try:
        t0, ends = run_together(server, n, start, 400)
        server.remember()
        if "many" in sections:
            r["many"] = (max(ends) - t0, statistics.median(e - t0 for e in ends))
            print(f"  {n} kernels at once: all answered after {r['many'][0]:.2f} s", flush=True)
        if "cells" in sections and args.cells > 0:
            lat = [[] for _ in range(n)]

            def cells(i):
                for _ in range(args.cells):
                    s = time.perf_counter()
                    kcs[i].run("1")
                    lat[i].append((time.perf_counter() - s) * 1e3)

            t0, ends = run_together(server, n, cells, 600)
            wall = max(ends) - t0
            flat = [x for xs in lat for x in xs]
            r["cells"] = {"wall": wall, "rate": n * args.cells / wall, "median": statistics.median(flat),
                          "p90": p90(flat), "n": n, "cells": args.cells}
            print(f"  {n} x {args.cells} cells: {r['cells']['rate']:.0f} cells/s", flush=True)
        if "pss" in sections:
            t0, ends = run_together(server, n, lambda i: kcs[i].run(STACK_CODE), 600)
            imported = max(ends) - t0
            time.sleep(1.0)  # let the import's transient allocations settle
            r["pss"] = kernel_pss(server, n, cellgate)
            r["pss"]["import_s"] = imported
            print(f"  PSS with the stack imported: {r['pss']['per_kernel'] / 1024:.1f} MiB per kernel "
                  f"({r['pss']['procs']} processes)", flush=True)
    finally:
        for kc in kcs:
            if kc:
                kc.close()
        delete_all(server, [k for k in kids if k])


def delete_all(server, kids, workers=10):
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        list(ex.map(lambda k: _delete_quiet(server, k), kids))


def _delete_quiet(server, kid):
    try:
        delete_kernel(server, kid, timeout=120)
    except InfraError as e:
        print(f"  warning: {e}", file=sys.stderr)


def sample_rest(server, get_kid, del_kids, gone, count, interval, budget):
    """Three samplers in their own threads, `count` requests each (none begun after `budget` s),
    one every `interval` s (or right after the previous one if it took longer): GET
    /api/kernels/{get_kid}, DELETE
    /api/kernels/{del_kids[i]} (added to `gone`), POST /api/kernels with a client env (a full
    kernel start, POST -> 201). ({kind: [ms]}, [POSTed kernel ids], (start, end) perf_counter)."""
    lat = {"get": [], "delete": [], "post": []}
    posted, errors = [], []

    def get(_):
        status, body = http_request(server, "GET", f"/api/kernels/{get_kid}", timeout=60)
        if status != 200:
            raise InfraError(f"{server.name}: GET /api/kernels/{get_kid} -> HTTP {status}: {body[:200]!r}")

    def delete(i):
        delete_kernel(server, del_kids[i])
        gone.add(del_kids[i])

    def post(_):
        posted.append(start_kernel(server, timeout=120, env=MISS_ENV))

    def loop(kind, op):
        try:
            due = stop = time.perf_counter()
            stop += budget
            for i in range(count):
                if time.perf_counter() > stop:
                    break
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                t0 = time.perf_counter()
                op(i)
                lat[kind].append((time.perf_counter() - t0) * 1e3)
                due += interval
        except (InfraError, OSError, http.client.HTTPException) as e:
            errors.append(e)

    threads = [threading.Thread(target=loop, args=kv, daemon=True)
               for kv in (("get", get), ("delete", delete), ("post", post))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # each request has its own timeout
    t1 = time.perf_counter()
    if errors:
        raise InfraError(f"{server.name}: REST sampler: {errors[0]!r}")
    return lat, posted, (t0, t1)


def wait_listed_busy(server, kids, timeout):
    """Seconds until GET /api/kernels lists every kernel of `kids` busy; None after `timeout` s."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        try:
            status, body = http_request(server, "GET", "/api/kernels", timeout=30)
            if status == 200:
                states = {k["id"]: k.get("execution_state") for k in json.loads(body)}
                if all(states.get(k) == "busy" for k in kids):
                    return time.perf_counter() - t0
        except (OSError, ValueError, http.client.HTTPException):
            pass
        time.sleep(0.05)
    return None


def measure_busy(server, args, r, cellgate):
    """args.busy_kernels cells sleeping at once; REST latencies before and while they run."""
    n, count, sleep_s = args.busy_kernels, args.busy_samples, args.busy_sleep
    code = f"import time; time.sleep({sleep_s})"
    kids, gone, kcs = [], set(), {}
    lock = threading.Lock()

    def ready(keep_ws):  # a kernel that has answered a cell (cellgate: through the agent API)
        kid = start_kernel(server, timeout=300)
        with lock:
            kids.append(kid)
        if cellgate:
            status, body = http_request(server, "POST", f"/api/kernels/{kid}/execute",
                                        {"code": "1", "timeout": 60}, timeout=120)
            if status != 200 or json.loads(body).get("status") != "ok":
                raise InfraError(f"{server.name}: agent cell `1` on {kid}: HTTP {status}: {body[:200]!r}")
            return kid
        kc = KernelClient(server, kid, timeout=sleep_s + 120)
        kc.run("1")
        if keep_ws:
            with lock:
                kcs[kid] = kc
        else:
            kc.close()
        return kid

    def start_many(k, keep_ws=False):
        with concurrent.futures.ThreadPoolExecutor(10) as ex:
            return list(ex.map(lambda _: ready(keep_ws), range(k)))

    try:
        get_kid = start_many(1)[0]
        idle_lat, posted, _ = sample_rest(server, get_kid, start_many(count), gone, count, 0.1, 60)
        kids += posted
        delete_all(server, posted)
        gone.update(posted)
        # The reference has no agent API: its cells go over one WebSocket per kernel, opened now.
        busy_kids = start_many(n, keep_ws=not cellgate)
        targets = start_many(count)
        server.remember()
        answers = [None] * n
        barrier = threading.Barrier(n + 1)

        def cell(i):
            kid = busy_kids[i]
            try:
                barrier.wait()
                if cellgate:
                    status, body = http_request(server, "POST", f"/api/kernels/{kid}/execute",
                                                {"code": code, "timeout": 60}, timeout=sleep_s + 120)
                    st = json.loads(body).get("status") if status == 200 else f"HTTP {status}"
                else:
                    kcs[kid].run(code)  # InfraError unless status ok
                    st = "ok"
            except (InfraError, OSError, ValueError, http.client.HTTPException,
                    threading.BrokenBarrierError) as e:
                st = f"error: {e!r}"[:200]
            answers[i] = (st, time.perf_counter())

        threads = [threading.Thread(target=cell, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        barrier.wait()
        fired = time.perf_counter()
        listed = wait_listed_busy(server, busy_kids, min(5.0, sleep_s / 4))
        busy_lat, posted, (w0, w1) = sample_rest(server, get_kid, targets, gone, count, 0.1, sleep_s + 30)
        kids += posted
        deadline = time.monotonic() + sleep_s + 150
        for t in threads:
            t.join(max(0.1, deadline - time.monotonic()))
        done = [a for a in answers if a]
        first = min((t for _, t in done), default=None)
        r["busy"] = {"n": n, "sleep": sleep_s, "samples": count, "idle": idle_lat, "busy": busy_lat,
                     "ok": sum(1 for st, _ in done if st == "ok"), "answered": len(done),
                     # answered ok within sleep + 5 s of sending: the cells ran side by side
                     "in_time": sum(1 for st, t in done if st == "ok" and t - fired <= sleep_s + 5),
                     "other": sorted({st for st, _ in done if st != "ok"})[:3],
                     "answer_min": first - fired if done else None,
                     "answer_max": max(t for _, t in done) - fired if done else None,
                     "listed_busy": listed, "window": (w0 - fired, w1 - fired),
                     "in_window": first is not None and w1 <= first}
        b = r["busy"]
        print(f"  {n} cells sleeping {sleep_s} s: {b['ok']} ok; meanwhile p99 GET "
              f"{pct(busy_lat['get'], 0.99):.1f} ms, DELETE {pct(busy_lat['delete'], 0.99):.1f} ms, "
              f"POST {pct(busy_lat['post'], 0.99):.1f} ms (no cells: {pct(idle_lat['post'], 0.99):.1f} ms)",
              flush=True)
    finally:
        for kc in kcs.values():
            kc.close()
        delete_all(server, [k for k in kids if k not in gone])


def measure_idle(server, args, r):
    """args.idle_kernels kernels alive at once: start, idle, check, the gateway's memory."""
    n, workers = args.idle_kernels, 10
    gw = server.proc.pid
    kids, failures = [], []  # failures: (POST refused?, error)
    lock = threading.Lock()

    def one(_):
        try:
            kid = start_kernel(server, timeout=300)
        except InfraError as e:
            with lock:
                failures.append((True, str(e)))
            return
        with lock:
            kids.append(kid)
        try:
            kc = KernelClient(server, kid, timeout=300)
            try:
                kc.run("1")
            finally:
                kc.close()
        except InfraError as e:
            with lock:
                failures.append((False, str(e)))

    def check(kid):
        try:
            kc = KernelClient(server, kid, timeout=60)
            try:
                kc.run("1")
            finally:
                kc.close()
            return True
        except InfraError:
            return False

    rss0 = status_kib(gw)
    try:
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(workers) as ex:
            list(ex.map(one, range(n)))
        started = time.perf_counter() - t0
        rss_started = status_kib(gw)
        server.remember()
        print(f"  {len(kids)} of {n} kernels started and answered in {started:.1f} s"
              + (f"; {len(failures)} failures, first: {failures[0][1]}" if failures else ""), flush=True)
        time.sleep(args.idle_wait)
        listed = {}
        try:
            status, body = http_request(server, "GET", "/api/kernels", timeout=60)
            if status == 200:
                listed = {k["id"]: k.get("execution_state") for k in json.loads(body)}
        except (OSError, ValueError, http.client.HTTPException):
            pass
        rss_idle, hwm = status_kib(gw), status_kib(gw, "VmHWM")
        if None in (rss0, rss_started, rss_idle, hwm):
            raise InfraError(f"{server.name}: no /proc/{gw}/status: the gateway is gone")
        try:
            fds = len(os.listdir(f"/proc/{gw}/fd"))
        except OSError:
            fds = None
        table = proc_table()
        procs = descendants(gw, table)
        gw_pss = pss_kib(gw) or 0
        total = gw_pss + sum(pss_kib(p) or 0 for p, _ in procs)
        t1 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(workers) as ex:
            alive = sum(ex.map(check, kids))
        checked = time.perf_counter() - t1
        r["idle"] = {"n": n, "started": len(kids), "failures": failures, "start_s": started, "fds": fds,
                     "answered": len(kids) - sum(1 for refused, _ in failures if not refused),
                     "listed": sum(1 for k in kids if k in listed),
                     "dead": sum(1 for k in kids if listed.get(k) == "dead"), "alive": alive,
                     "check_s": checked, "rss0": rss0, "rss_started": rss_started, "rss_idle": rss_idle,
                     "hwm": hwm, "total_pss": total, "gw_pss": gw_pss, "procs": len(procs),
                     "idle_wait": args.idle_wait}
        print(f"  after {args.idle_wait:.0f} s idle: {alive} of {n} answer a cell; gateway VmRSS "
              f"{rss_idle / 1024:.1f} MiB", flush=True)
    finally:
        delete_all(server, kids)


def run_server(server, args, results, measures, cellgate, zygote):
    print(f"\n--- {server.name} on port {server.port} ---", flush=True)
    r = results.setdefault(server.name, {})
    if zygote:  # measure kernels forked from the zygote, not ones started while it imports
        wait_log(server, ZYGOTE_READY)
    server.remember()
    if "start" in measures:
        r["start"] = measure_start(server, args.runs)
        print(f"  start -> first reply: median {med(r['start'], 'total'):.1f} ms", flush=True)
    if "pool" in measures:
        r["pool"] = measure_pool_start(server, args.pool_runs, POOL_SIZE)
        print(f"  start from the pool -> first reply: median {med(r['pool'], 'total'):.1f} ms", flush=True)
        wait_pool_full(server, POOL_SIZE, 0)
        r["poolmiss"] = measure_start(server, args.pool_runs)
        print(f"  pool miss (env) -> first reply: median {med(r['poolmiss'], 'total'):.1f} ms", flush=True)
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
        r["stdout"] = measure_stdout_runs(server, args.stdout_runs)["runs"]
        best = max(r["stdout"], key=lambda x: x[0])
        print(f"  10 MiB stdout: {best[0]:,} bytes in {best[1]:.2f} s", flush=True)
    if "stdout:v1" in measures:
        r["stdout:v1"] = measure_stdout_runs(server, args.stdout_runs, V1)
        best = max(r["stdout:v1"]["runs"], key=lambda x: x[0])
        print(f"  10 MiB stdout, subprotocol {r['stdout:v1']['protocol'] or 'refused: legacy'}: "
              f"{best[0]:,} bytes in {best[1]:.2f} s", flush=True)
    if "png" in measures:
        r["png"] = {}
        for pname, proto in PROTOCOLS:
            r["png"][pname] = m = measure_png(server, args.png_images, args.png_runs, proto)
            cpu = sum(x["cpu"]["stat"] for x in m["runs"]) / sum(x["images"] for x in m["runs"])
            print(f"  {args.png_images} PNGs ({pname}, got {m['protocol'] or 'legacy'}): "
                  f"{cpu * 1e3:.2f} ms server CPU per image; "
                  f"{min(x['whole'] for x in m['runs'])} of {args.png_images} whole", flush=True)
    if "gwcpu" in measures:
        r["gwcpu"] = {}
        for pname, proto in PROTOCOLS:
            r["gwcpu"][pname] = m = measure_gwcpu(server, args.gwcpu_cells, args.warmup, proto)
            print(f"  {args.gwcpu_cells} trivial cells ({pname}, got {m['protocol'] or 'legacy'}): "
                  f"{m['cpu']['stat'] / m['cells'] * 1e6:.0f} us server CPU per cell", flush=True)
    fleet = [m for m in FLEET if m in measures]
    if fleet and args.kernels > 0:
        measure_fleet(server, args, fleet, r, cellgate)
    if "idle" in measures and args.idle_kernels > 0:
        measure_idle(server, args, r)
    if "busy" in measures:
        measure_busy(server, args, r, cellgate)


# --------------------------------------------------------------------------------------------
# Report


def p90(xs):
    return pct(xs, 0.9)


def pct(xs, q):
    """Nearest-rank percentile."""
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def med(runs, key):
    return statistics.median(x[key] for x in runs)


def table(title, cols, rows):
    print(f"\n{title}")
    w0 = max(len(r[0]) for r in rows) + 2
    print(" " * w0 + "".join(f"{c:>14}" for c in cols))
    for name, *vals in rows:
        print(f"{name:<{w0}}" + "".join(f"{v:>14}" for v in vals))


def ratio(ref, mine):
    return f"{ref / mine:.2f}x" if mine > 0 else "n/a"


CG, POOL, COLD, IDLE = "cellgate", "cellgate (pool)", "cellgate --no-zygote", "cellgate (idle)"
REF, UNL = "jupyter_server", "jupyter_server (limits off)"


def report(results, args, versions):
    g = lambda server, key: results.get(server, {}).get(key)  # noqa: E731
    print("\n================================================================================")
    cg_version = next((versions[k] for k in (CG, POOL, COLD, IDLE) if k in versions), "?")
    print(f"cellgate {cg_version} vs jupyter_server {versions.get(REF, '?')} "
          f"(ipykernel, /usr/bin/python3), {os.cpu_count()} CPUs, load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg())
          + "; ratio = reference/cellgate for times, cellgate/reference for throughput: "
          "higher means cellgate is better")
    targets = []

    # 1. start
    rows_src = [(f"{CG} pool hit", g(POOL, "pool")), (f"{CG} zygote, pool miss (env)", g(POOL, "poolmiss")),
                (f"{CG} zygote, pool off", g(CG, "start")), (f"{COLD}, pool off", g(COLD, "start")),
                (REF, g(REF, "start"))]
    rows_src = [(n, v) for n, v in rows_src if v]
    if rows_src:
        rows = [(n, *(f"{f(x['total'] for x in v):.1f}" for f in (statistics.median, min, max)),
                 *(f"{med(v, k):.1f}" for k in ("post", "ws", "exec")), str(len(v))) for n, v in rows_src]
        s_j = g(REF, "start")
        if s_j:
            for n, v in rows_src[:-1]:
                rows.append((f"ratio vs {n}", ratio(med(s_j, "total"), med(v, "total")),
                             ratio(min(x["total"] for x in s_j), min(x["total"] for x in v)),
                             ratio(max(x["total"] for x in s_j), max(x["total"] for x in v)), "", "", "", ""))
        table("1. POST /api/kernels -> first execute_reply of print(1) (ms; POST = POST -> 201, "
              "ws = WebSocket open, exec = execute -> reply, medians)",
              ["median", "min", "max", "POST", "ws", "exec", "n"], rows)
    if g(POOL, "pool"):
        hit = med(g(POOL, "pool"), "total")
        targets.append(("pool start p50 <= 5 ms", hit <= 5, f"{hit:.1f} ms"))
    miss = g(POOL, "poolmiss") or g(CG, "start")
    if miss:
        m = med(miss, "total")
        targets.append(("pool-miss start p50 <= 40 ms", m <= 40,
                        f"{m:.1f} ms, zygote, {'pool full, env' if g(POOL, 'poolmiss') else 'pool off'}"))

    # 2. round trip
    r_c, r_j = g(CG, "rtt"), g(REF, "rtt")
    if r_c and r_j:
        table(f"2. trivial cell round trip over the WebSocket (us, n={len(r_c)} after {args.warmup} warm-ups)",
              ["median", "p90"],
              [(CG, f"{statistics.median(r_c):.0f}", f"{p90(r_c):.0f}"),
               (REF, f"{statistics.median(r_j):.0f}", f"{p90(r_j):.0f}"),
               ("ratio", ratio(statistics.median(r_j), statistics.median(r_c)), ratio(p90(r_j), p90(r_c)))])
        targets.append(("round trip at most half the reference's",
                        statistics.median(r_c) <= 0.5 * statistics.median(r_j),
                        f"{statistics.median(r_c):.0f} us vs {statistics.median(r_j):.0f} us"))

    # 3. stdout
    def stdout_row(name, runs):
        rate = statistics.median(b / MIB / t for b, t, _ in runs)
        complete = all(b == STDOUT_BYTES for b, _, _ in runs)
        return rate, (name, f"{rate:.1f}", f"{min(b for b, _, _ in runs):,}", "yes" if complete else "NO",
                      "yes" if any(n for _, _, n in runs) else "no"), complete

    def v1_label(name, got):
        return f"{name}, v1" if got["protocol"] == V1 else f"{name}, v1 refused: legacy"

    if g(CG, "stdout") and (g(REF, "stdout") or g(UNL, "stdout")):
        rc, row_c, complete_c = stdout_row(f"{CG}, legacy", g(CG, "stdout"))
        rows, rates = [row_c], {}
        v1_c, v1_u = g(CG, "stdout:v1"), g(UNL, "stdout:v1")
        if v1_c:
            rates["cv1"], row, ok = stdout_row(v1_label(CG, v1_c), v1_c["runs"])
            rows.append(row)
            complete_c = complete_c and ok
        if g(REF, "stdout"):
            rj, row_j, _ = stdout_row(f"{REF}, default limits, legacy", g(REF, "stdout"))
            rows.append(row_j)
        if g(UNL, "stdout"):
            rates["u"], row, _ = stdout_row(f"{UNL}, legacy", g(UNL, "stdout"))
            rows.append(row)
        if v1_u:
            rates["uv1"], row, _ = stdout_row(v1_label(UNL, v1_u), v1_u["runs"])
            rows.append(row)
        if g(REF, "stdout"):
            rows.append(("ratio cellgate / default limits, legacy", f"{rc / rj:.2f}x" if rj else "n/a",
                         "", "", ""))
        if "u" in rates:
            rows.append(("ratio cellgate / limits off, legacy", ratio(rc, rates["u"]), "", "", ""))
            targets.append(("stdout >= 1.5x jupyter_server's rate (limits off), legacy", rc >= 1.5 * rates["u"],
                            f"{rc:.1f} vs {rates['u']:.1f} MiB/s: {ratio(rc, rates['u'])}"))
        # v1 against the reference's v1, or its legacy figure if it refused v1
        ref_v1 = rates.get("uv1") if v1_u and v1_u["protocol"] == V1 else rates.get("u")
        if v1_c and v1_c["protocol"] == V1 and ref_v1:
            against = "v1" if v1_u and v1_u["protocol"] == V1 else "legacy (it refused v1)"
            rows.append((f"ratio cellgate v1 / limits off, {against}", ratio(rates["cv1"], ref_v1), "", "", ""))
            targets.append((f"stdout >= 1.5x jupyter_server's rate (limits off), v1 vs its {against}",
                            rates["cv1"] >= 1.5 * ref_v1,
                            f"{rates['cv1']:.1f} vs {ref_v1:.1f} MiB/s: {ratio(rates['cv1'], ref_v1)}"))
        elif v1_c:
            rows.append(("cellgate refused v1: no v1 ratio", "", "", "", ""))
        table(f"3. {STDOUT_BYTES:,} bytes of stdout until execute_reply + idle "
              f"(MiB/s median of {len(g(CG, 'stdout'))}; least bytes received)",
              ["MiB/s", "bytes (min)", "complete", "rate notice"], rows)
        least = min(b for b, _, _ in g(CG, "stdout") + (v1_c["runs"] if v1_c else []))
        targets.append(("10 MB delivered completely", complete_c, f"least {least:,} of {STDOUT_BYTES:,} bytes"))

    fleet_servers = [(f"{CG} (zygote)", CG), (COLD, COLD), (REF, REF)]

    # 4. many
    got = [(n, g(s, "many")) for n, s in fleet_servers if g(s, "many")]
    if got:
        rows = [(n, f"{m[0]:.2f}", f"{m[1]:.2f}") for n, m in got]
        m_j = g(REF, "many")
        if m_j:
            rows += [(f"ratio vs {n}", ratio(m_j[0], m[0]), ratio(m_j[1], m[1])) for n, m in got[:-1]]
        table(f"4. {args.kernels} kernels started at once, each runs print(1) (s)",
              ["all answered", "median kernel"], rows)
        if m_j and g(CG, "many"):
            x = m_j[0] / g(CG, "many")[0]
            targets.append((f"{args.kernels} concurrent kernels answer >= 20x sooner than the reference",
                            x >= 20, f"{x:.1f}x: {g(CG, 'many')[0]:.2f} s vs {m_j[0]:.2f} s"))

    # 5. cells
    got = [(n, g(s, "cells")) for n, s in fleet_servers if g(s, "cells")]
    if got:
        c0 = got[0][1]
        rows = [(n, f"{c['wall']:.2f}", f"{c['rate']:.0f}", f"{c['median']:.2f}", f"{c['p90']:.2f}")
                for n, c in got]
        c_j = g(REF, "cells")
        if c_j:
            rows += [(f"ratio vs {n}", ratio(c_j["wall"], c["wall"]), f"{c['rate'] / c_j['rate']:.2f}x",
                      ratio(c_j["median"], c["median"]), ratio(c_j["p90"], c["p90"])) for n, c in got[:-1]]
        table(f"5. {c0['n']} kernels x {c0['cells']} trivial cells, the kernels concurrently "
              "(wall s, cells/s, per-cell ms)", ["wall", "cells/s", "cell median", "cell p90"], rows)

    # 6. PSS
    got = [(n, g(s, "pss")) for n, s in fleet_servers if g(s, "pss")]
    if got:
        roles = ["zygote", "launchers", "jails (reaper + kernel)", "kernel processes"]
        rows = []
        for n, p in got:
            split = ", ".join(f"{k} {p['parts'][k] / 1024:.1f}" for k in roles if k in p["parts"])
            rows.append((n, f"{p['per_kernel'] / 1024:.1f}", f"{p['total'] / 1024:.0f}", str(p["procs"]),
                         f"{p['server_rss'] / 1024:.1f}" if p["server_rss"] else "?",
                         f"{p['import_s']:.2f}"))
            rows.append((f"  per kernel: {split}", "", "", "", "", ""))
        p_j = g(REF, "pss")
        if p_j:
            rows += [(f"ratio vs {n}", ratio(p_j["per_kernel"], p["per_kernel"]), "", "", "", "")
                     for n, p in got[:-1]]
        table(f"6. PSS per kernel after `{STACK_CODE}` in each of {got[0][1]['count']} kernels (MiB; "
              "all processes under the server but the server itself; server RSS = VmRSS of the "
              "server process; import = until all imported, s)",
              ["MiB/kernel", "total MiB", "processes", "server RSS", "import s"], rows)
        if g(CG, "pss"):
            p = g(CG, "pss")["per_kernel"] / 1024
            targets.append(("PSS <= 25 MiB per kernel with the stack imported (zygote)", p <= 25, f"{p:.1f} MiB"))

    # 7. idle
    i = g(IDLE, "idle")
    if i:
        rows = [("kernels started (201)", f"{i['started']} of {i['n']}"),
                ("of which answered a cell", f"{i['answered']}"),
                ("time to start them (10 clients at a time)", f"{i['start_s']:.1f} s"),
                (f"listed by GET /api/kernels after {i['idle_wait']:.0f} s idle",
                 f"{i['listed']} ({i['dead']} dead)"),
                ("still answering a cell after the idle wait", f"{i['alive']} of {i['n']} ({i['check_s']:.1f} s)"),
                ("gateway VmRSS, no kernels", f"{i['rss0'] / 1024:.1f} MiB"),
                ("gateway VmRSS, all started", f"{i['rss_started'] / 1024:.1f} MiB"),
                ("gateway VmRSS, after the idle wait", f"{i['rss_idle'] / 1024:.1f} MiB"),
                ("gateway VmHWM", f"{i['hwm'] / 1024:.1f} MiB"),
                ("gateway PSS", f"{i['gw_pss'] / 1024:.1f} MiB"),
                ("total PSS, gateway + all descendants", f"{i['total_pss'] / 1024:.0f} MiB"),
                ("  of which per kernel (without the gateway)",
                 f"{(i['total_pss'] - i['gw_pss']) / 1024 / max(1, i['started']):.1f} MiB"),
                ("gateway open fds, after the idle wait", str(i["fds"])),
                ("processes under the gateway", str(i["procs"]))]
        if i["failures"]:
            rows.append(("first failure", i["failures"][0][1][:120]))
        table(f"7. {i['n']} idle kernels alive at once, cellgate only (zygote, pool off; no stack imported; "
              f"the reference is not run at this size: see 6 for it at {args.kernels})", [""], rows)
        targets.append((f"{i['n']} idle kernels alive at once", i["alive"] == i["n"],
                        f"{i['alive']} of {i['n']} answered after {i['idle_wait']:.0f} s idle"))

    # 8. PNG
    def per_unit(runs, unit):
        """Server CPU per unit (s) over all runs: (utime + stime, schedstat or None)."""
        units = sum(x[unit] for x in runs)
        sched = [x["cpu"]["sched"] for x in runs]
        return (sum(x["cpu"]["stat"] for x in runs) / units,
                sum(sched) / units if all(v is not None for v in sched) else None)

    def ms(v, scale=1e3, digits=2):
        return f"{v * scale:.{digits}f}" if v is not None else "n/a"

    def proto_label(name, pname, got):
        return f"{name}, {pname}" + ("" if got["protocol"] == dict(PROTOCOLS)[pname] else " (refused: legacy)")

    png = [(n, p, g(s, "png")[p]) for n, s in ((CG, CG), (REF, REF)) if g(s, "png") for p, _ in PROTOCOLS]
    if png:
        rows, cpu = [], {}
        for n, p, m in png:
            runs = m["runs"]
            cpu[(n, p)] = per_unit(runs, "images")
            mib = sum(x["images"] * x["png_bytes"] for x in runs) / MIB / sum(x["wall"] for x in runs)
            rows.append((proto_label(n, p, m),
                         ms(cpu[(n, p)][0]), ms(cpu[(n, p)][1]), f"{mib:.1f}",
                         f"{min(x['whole'] for x in runs)} of {runs[0]['images']}",
                         f"{statistics.median(x['png_bytes'] for x in runs) / 1024:.0f}",
                         f"{statistics.median(x['wire_bytes'] for x in runs) / 1024:.0f}"))
        for p, _ in PROTOCOLS:
            c, j = cpu.get((CG, p)), cpu.get((REF, p))
            if c and j:
                rows.append((f"ratio, {p}", ratio(j[0], c[0]),
                             ratio(j[1], c[1]) if c[1] and j[1] else "n/a", "", "", "", ""))
        first = png[0][2]["runs"]
        table(f"8. {first[0]['images']} distinct ~1 MiB PNGs displayed by one cell, received over the WebSocket, "
              f"{len(first)} run(s): the server process's own CPU from execute_request to execute_reply + idle, "
              f"per PNG message (ms; stat = utime + stime in 1/{CLK_TCK} s ticks, summed over the runs; "
              "sched = schedstat ns of its threads); MiB/s of PNG; PNGs whole (SHA-256); sizes in KiB",
              ["ms/msg stat", "ms/msg sched", "MiB/s", "whole", "PNG KiB", "message KiB"], rows)
        for n, p, m in png:
            if n == CG:
                v, whole = cpu[(n, p)][0], all(x["whole"] == x["images"] for x in m["runs"])
                targets.append((f"gateway CPU per 1 MiB PNG message <= 1 ms, {p}", v <= 1e-3 and whole,
                                f"{v * 1e3:.2f} ms (schedstat {ms(cpu[(n, p)][1])} ms)"
                                + ("" if whole else "; PNGs NOT all received whole")))

    # 9. gateway CPU per trivial cell
    gw = [(n, p, g(s, "gwcpu")[p]) for n, s in ((CG, CG), (REF, REF)) if g(s, "gwcpu") for p, _ in PROTOCOLS]
    if gw:
        rows, cpu = [], {}
        for n, p, m in gw:
            cpu[(n, p)] = per_unit([m], "cells")
            rows.append((proto_label(n, p, m),
                         ms(cpu[(n, p)][0], 1e6, 0), ms(cpu[(n, p)][1], 1e6, 0),
                         f"{m['wall'] / m['cells'] * 1e6:.0f}", f"{m['cpu']['stat'] * 1e3:.0f}"))
        for p, _ in PROTOCOLS:
            c, j = cpu.get((CG, p)), cpu.get((REF, p))
            if c and j:
                rows.append((f"ratio, {p}", ratio(j[0], c[0]), ratio(j[1], c[1]) if c[1] and j[1] else "n/a",
                             "", ""))
        table(f"9. the server process's own CPU per trivial cell: {gw[0][2]['cells']} cells `1` in a row on one "
              "kernel and one WebSocket (us per cell; stat = utime + stime, sched = schedstat of its threads; "
              "cellgate serve only, not its launchers or kernels; jupyter_server only, not the ipykernel)",
              ["us/cell stat", "us/cell sched", "us/cell wall", "stat total ms"], rows)

    # 10. busy
    busy = [(n, g(s, "busy")) for n, s in ((CG, CG), (REF, REF)) if g(s, "busy")]
    if busy:
        rows, notes = [], []
        kinds = (("get", "GET /api/kernels/{id}"), ("delete", "DELETE /api/kernels/{id}"),
                 ("post", "POST /api/kernels (a start)"))
        for n, b in busy:
            for k, label in kinds:
                i99, b99 = pct(b["idle"][k], 0.99), pct(b["busy"][k], 0.99)
                rows.append((f"{n}: {label}", f"{pct(b['idle'][k], 0.5):.1f}", f"{i99:.1f}",
                             f"{pct(b['busy'][k], 0.5):.1f}", f"{b99:.1f}", ratio(b99, i99)))
            listed = f"all listed busy after {b['listed_busy']:.2f} s" if b["listed_busy"] is not None else \
                "NOT all listed busy before sampling"
            span = (f"answered {b['answer_min']:.1f}-{b['answer_max']:.1f} s after sending"
                    if b["answer_min"] is not None else "none answered")
            notes.append(f"  {n}: {b['ok']} of {b['n']} cells ok ({span}; {b['in_time']} within "
                         f"{b['sleep'] + 5} s); {listed}; samples taken "
                         f"{b['window'][0]:.1f}-{b['window'][1]:.1f} s after sending, "
                         + ("all before the first answer" if b["in_window"] else "NOT all before the first answer")
                         + "; samples (idle/busy): " + ", ".join(f"{k} {len(b['idle'][k])}/{len(b['busy'][k])}"
                                                                 for k, _ in kinds)
                         + (f"; others: {'; '.join(b['other'])}" if b["other"] else ""))
        if len(busy) == 2:
            c, j = busy[0][1], busy[1][1]
            for k, label in kinds:
                rows.append((f"ratio while busy, {label}", "", "",
                             ratio(pct(j["busy"][k], 0.5), pct(c["busy"][k], 0.5)),
                             ratio(pct(j["busy"][k], 0.99), pct(c["busy"][k], 0.99)), ""))
        b0 = busy[0][1]
        table(f"10. REST latency (ms, {b0['samples']} of each, one every 100 ms) with no cells running and while "
              f"{b0['n']} cells `time.sleep({b0['sleep']})` run on {b0['n']} kernels at once (cellgate: agent "
              "POST /api/kernels/{id}/execute; jupyter_server: execute_request over a WebSocket each); "
              "p99 = nearest rank", ["idle p50", "idle p99", "busy p50", "busy p99", "p99 busy/idle"], rows)
        print("\n".join(notes))
        c = g(CG, "busy")
        if c:
            targets.append((f"all {c['n']} sleeping cells answer status ok after ~{c['sleep']} s "
                            f"(within {c['sleep'] + 5} s)", c["in_time"] == c["n"],
                            f"{c['ok']} of {c['n']} ok, {c['in_time']} within {c['sleep'] + 5} s"
                            + (f"; answered {c['answer_min']:.1f}-{c['answer_max']:.1f} s after sending"
                               if c["answer_min"] is not None else "")))
            outside = "" if c["in_window"] else "; NOT all sampled while every cell ran"
            for k, label in kinds[:2]:
                v = pct(c["busy"][k], 0.99)
                targets.append((f"{label.split(' ')[0]} /api/kernels/{{id}} within 50 ms p99 while the cells run",
                                v <= 50 and c["in_window"], f"{v:.1f} ms{outside}"))
            v, v0 = pct(c["busy"]["post"], 0.99), pct(c["idle"]["post"], 0.99)
            targets.append(("POST /api/kernels within 50 ms p99 while the cells run", v <= 50 and c["in_window"],
                            f"{v:.1f} ms, against {v0:.1f} ms with no cells running (a kernel start by itself): "
                            f"{v / v0:.2f}x{outside}"))

    print("\ntargets:")
    for name, ok, detail in targets:
        print(f"  {name}: {'PASS' if ok else 'MISS'} ({detail})")


# --------------------------------------------------------------------------------------------


def _interrupted(*_):
    raise KeyboardInterrupt


def _sections(values):
    out = []
    for v in values or ():
        for s in v.split(","):
            s = s.strip()
            if s and s not in SECTIONS:
                raise argparse.ArgumentTypeError(f"unknown section {s!r} (sections: {', '.join(SECTIONS)})")
            if s:
                out.append(s)
    return out


def main():
    here = pathlib.Path(__file__).resolve()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="pool-miss kernel starts per server (default 5)")
    ap.add_argument("--pool-runs", type=int, default=10,
                    help="starts claimed from cellgate's warm pool, and misses on it (default 10)")
    ap.add_argument("--kernels", type=int, default=20,
                    help="kernels started at once for many, cells and pss (default 20)")
    ap.add_argument("--cells", type=int, default=50, help="trivial cells per kernel in cells (default 50)")
    ap.add_argument("--idle-kernels", type=int, default=200, help="idle kernels at once in idle (default 200)")
    ap.add_argument("--png-images", type=int, default=20, help="~1 MiB PNGs shown by one cell in png (default 20)")
    ap.add_argument("--busy-kernels", type=int, default=64,
                    help="kernels running a sleeping cell at once in busy (default 64)")
    ap.add_argument("--gwcpu-cells", type=int, default=1000, help="trivial cells in gwcpu (default 1000)")
    ap.add_argument("--only", action="append", metavar="SECTION[,SECTION]",
                    help=f"run only these sections (repeatable): {', '.join(SECTIONS)}")
    ap.add_argument("--skip", action="append", metavar="SECTION[,SECTION]", help="skip these sections")
    ap.add_argument("--skip-200", action="store_true", help="skip the idle-kernels section")
    ap.add_argument("--quick", action="store_true",
                    help="CI smoke: 2 starts of each kind, 50 round trips, one 10 MiB run per protocol, "
                         "3 kernels x 5 cells with the stack imported, 5 idle kernels, 5 PNGs, 8 kernels "
                         "sleeping 5 s, 100 cells for gwcpu")
    ap.add_argument("--bin-dir", default=str(here.parents[2] / "build" / "bin"),
                    help="directory holding cellgate and cellgate-kernel (default: <repo>/build/bin)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with the servers' logs")
    args = ap.parse_args()
    try:
        only, skip = _sections(args.only), _sections(args.skip)
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    sections = set(only or SECTIONS) - set(skip)
    if args.skip_200:
        sections.discard("idle")
    args.idle_wait = 10.0
    if args.quick:
        args.runs, args.round_trips, args.warmup, args.stdout_runs = 2, 50, 10, 1
        args.pool_runs = min(args.pool_runs, 2)
        args.kernels, args.cells, args.idle_kernels, args.idle_wait = 3, 5, 5, 2.0
        args.png_images, args.png_runs = min(args.png_images, 5), 1
        args.busy_kernels, args.busy_sleep, args.busy_samples = min(args.busy_kernels, 8), 5, 5
        args.gwcpu_cells = min(args.gwcpu_cells, 100)
    else:
        args.round_trips, args.warmup, args.stdout_runs = 200, 20, 3
        args.png_runs, args.busy_sleep, args.busy_samples = 3, 20, 20
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.pool_runs < 1:
        sections.discard("pool")
    if args.kernels < 1:
        sections -= set(FLEET)
    if args.idle_kernels < 1:
        sections.discard("idle")
    if args.png_images < 1:
        sections.discard("png")
    if args.busy_kernels < 1:
        sections.discard("busy")
    if args.gwcpu_cells < 1:
        sections.discard("gwcpu")

    tmp = tempfile.mkdtemp(prefix="cellgate-bench-")
    servers, died = [], []
    results, versions = {}, {}
    # SIGTERM to this script: clean up as for Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupted)
    bins = args.bin_dir
    fleet_max = max(64, args.kernels + 4)
    if "busy" in sections:  # the sleeping kernels, one to GET, DELETE targets, POSTed kernels
        fleet_max = max(fleet_max, args.busy_kernels + 2 * args.busy_samples + 8)
    # (name, starter, its sections, cellgate?, zygote?) -- one server at a time: no competing for cores
    plan = [
        (CG, lambda: start_cellgate(bins, tmp, fleet_max, ["--pool-size", "0"], "cellgate"),
         ("start", "rtt", "stdout", "stdout:v1", "png", "gwcpu", *FLEET, "busy"), True, True),
        (POOL, lambda: start_cellgate(bins, tmp, 64, ["--pool-size", str(POOL_SIZE)], "cellgate-pool"),
         ("pool",), True, True),
        (COLD, lambda: start_cellgate(bins, tmp, fleet_max, ["--pool-size", "0", "--no-zygote"],
                                      "cellgate-no-zygote"), ("start", *FLEET), True, False),
        (IDLE, lambda: start_cellgate(bins, tmp, args.idle_kernels + 50, ["--pool-size", "0"], "cellgate-idle"),
         ("idle",), True, True),
        (REF, lambda: start_jupyter_server(tmp, "reference"),
         ("start", "rtt", "stdout", "png", "gwcpu", *FLEET, "busy"), False, False),
        # Every iopub limit off: limit_rate=False skips the checks, and the limits are raised too.
        (UNL, lambda: start_jupyter_server(tmp, "unlimited", [
            "--ServerApp.limit_rate=False", "--ServerApp.iopub_data_rate_limit=1e10",
            "--ServerApp.iopub_msg_rate_limit=1e10"]), ("stdout", "stdout:v1"), False, False),
    ]
    print(f"gateway_bench: sections {', '.join(s for s in SECTIONS if s in sections)}; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    try:
        for name, starter, own, is_cellgate, zygote in plan:
            measures = [m for m in own if m.split(":")[0] in sections]
            if not measures:
                continue
            server = starter()
            servers.append(server)
            server.name = name
            try:
                versions[name] = json.loads(http_request(server, "GET", "/api")[1]).get("version", "?")
            except (OSError, ValueError, http.client.HTTPException):
                versions[name] = "?"
            try:
                run_server(server, args, results, measures, is_cellgate, zygote)
            finally:
                code = server.proc.poll()  # a crash a section survived (its checks count it a miss)
                if code is not None:
                    died.append(f"{name} exited during the run "
                                + (f"(signal {-code})" if code < 0 else f"(status {code})"))
                server.stop(60)
        report(results, args, versions)
        print("load average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        if died:
            print("\ngateway_bench: infrastructure failure: " + "; ".join(died)
                  + ": the figures of its sections are not to be trusted", file=sys.stderr)
            return 2
        return 0
    except InfraError as e:
        print(f"\ngateway_bench: infrastructure failure: {e}", file=sys.stderr)
        for s in servers:
            code = s.proc.poll()
            died = ("" if code is None else f" (it exited: signal {-code})" if code < 0
                    else f" (it exited with {code})")
            print(f"--- last lines of the {s.name} log{died} ---\n{s.log_tail(15)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ngateway_bench: interrupted", file=sys.stderr)
        return 130
    finally:
        for s in servers:
            s.stop()
        unmount_leftovers(tmp)
        if args.keep:
            print(f"gateway_bench: logs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
