#!/usr/bin/python3
"""Side-by-side benchmark: cellgate serve vs. the reference Jupyter server.

Starts, one after the other on this machine, `cellgate serve` in several configurations and
Debian's jupyter_server 1.23 (with its ipykernel), and measures over the same REST + WebSocket API
(legacy JSON WebSocket format unless a section says v1 -- the `v1.kernel.websocket.jupyter.org`
binary subprotocol --, token in an `Authorization` header). Every section POSTs the kernelspec
--kernel-name (default `python3`: Debian's `/usr/bin/python3 -m ipykernel_launcher`), and both
servers must list it. cellgate's zygote serves only `python3 -m ipykernel_launcher`: any other
kernelspec (e.g. `xpython`, Debian's xeus-python) is started cold on every cellgate server, the
zygote's figures ("zygote", "pool miss") then being cold starts too, and the pool server pools that
kernelspec (--pool-kernel NAME). Sections (select with --only, drop with --skip / --skip-200):

  start   POST /api/kernels -> first execute_reply of `print(1)` on a pool miss (ms; n runs;
          median, min, max, and the median split into POST -> 201, WebSocket open, execute ->
          reply). A miss POSTs a client env ({"env": {"KERNEL_BENCH": "1"}}, which the pool never
          serves; jupyter_server ignores it). cellgate with the zygote and its pool off, cellgate
          --no-zygote with its pool off (a cold jailed kernel, for python3 `python3 -m
          ipykernel_launcher`), and the reference;
  pool    the same from cellgate's warm pool (--pool-size 2: POSTs without an env, waiting for
          the pool to refill between runs), then pool misses on that server (POSTs with the env
          while the pool is full), then a sequential client (2 x --pool-runs POSTs without an env
          in a row, each kernel deleted after its print(1), no wait for refills: the median, p90
          and how many the pool served; printed, not in the report);
  rtt     trivial-cell round trip: execute_request `1` -> its execute_reply on one kernel,
          200 times after 20 warm-ups (us; median, p90);
  stdout  10 MiB of stdout: stream bytes received until execute_reply + idle (MB/s, complete?),
          over the legacy format and over v1 (a kernel that floods iopub with small messages, as
          xpython does with one per write, loses some at ZeroMQ's high-water marks, its final idle
          status too: then 5 s of silence after the execute_reply end the wait, the time is taken
          to the last message, and the run is marked idle lost); the reference runs as configured
          by default (iopub_data_rate_limit 1 MB/s, which drops output; legacy only) and once more
          with its limits off (--ServerApp.limit_rate=False, iopub_data_rate_limit=1e10,
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
  burst   for each N of --bursts (default 20,100): N concurrent POST /api/kernels without an env,
          each client then opening its WebSocket and running `print(1)`, as in many: the time from
          the burst's release until the last client answered, and the median client's; the PSS of
          all processes under the server once all answered; then every kernel is deleted (10
          DELETEs at a time) before the next burst. Three servers: cellgate with the zygote and
          its pool off (--max-kernels at least the largest N + 4), cellgate with its pool on
          (--pool-size 2, the pool smaller than the burst; --max-kernels the largest N + 8, so the
          pool can refill during a burst; before each burst, GET /metrics until
          cellgate_pool_ready is 2), and the reference. On the pool server also when the pool was
          full again: the spdlog stamp (ms) of the last "kernel pool: kernel ... ready (2 ready,"
          log line, read once /metrics says 2 ready and the log holds as many ready lines as
          claims ("..., from the pool") since the burst began; given after the burst's release,
          after its last answer and after its kernels were deleted (negative: the pool was full
          before that). A client that fails (or has no answer within 600 s) is counted, with its
          reason, not raised: "all answered" then shows when the last of the others answered, with
          (answered/N), and no ratio; if the server no longer answers GET /api, its remaining
          bursts are skipped (burst runs last on each server; stopping it kills its kernels). The
          reference at 100 starts 100 cold ipykernels at once: on 2 cores ~30 s until they answer,
          ~5 GiB of PSS and ~1 min of DELETEs; and in most runs here one to three of them die:
          each ipykernel binds 5 TCP ports that jupyter_client picked and released, which other
          sockets can take first ("Address already in use"), and jupyter_client 7.4.9's restarter,
          although it logs "new random ports", reuses the cached ones until it gives up after 5
          restarts (the client's WebSocket is reset). In one run it also stopped answering
          altogether (hence the 600 s and the GET /api check);
  idle    cellgate only (zygote, pool off, --max-kernels the count + 50): --idle-kernels (500)
          kernels POSTed, 10 clients at a time, each answering one trivial cell; then idle for
          10 s; then whether every one still answers a cell, the gateway's VmRSS (and VmHWM), and
          the total PSS of the gateway and all its descendants, and of them per kernel. A POST or
          cell that fails is counted and reported with the gateway's warning and error log lines;
          the section goes on with the kernels that did start. The reference is not run at this
          size (500 cold ipykernels would need ~25 GiB at ~50 MiB of PSS each, and would meet its
          port races, see burst): compare with its per-kernel PSS at 20 in `pss` or 100 in `burst`.

The WebSocket client is hand-written over a raw socket so TCP_NODELAY and TCP_QUICKACK (re-armed
after every recv) can be set: Nagle and delayed ACKs must not hide the servers' own cost. Each
request's whole answer has a deadline (120 s; more for many kernels starting at once, imports,
sleeping cells and bursts), which the servers' WebSocket pings do not extend.

Prints figures, ratios and targets (pool start p50 <= 5 ms; pool-miss start p50 <= 40 ms; 20
concurrent kernels all answering >= 20x sooner than the reference (many), and each burst's N at
once all answered >= 20x sooner than the reference (burst, cellgate with its pool off, the pool's
ratio in the detail; N/A when the reference did not answer all N); 20 x 50 trivial cells at >= 3x
the reference's cells/s; <= 20 MiB PSS per kernel with the stack imported; 500 idle kernels alive
at once; round trip at most half the reference's; 10 MB of stdout complete, at >= 1.5x
jupyter_server's rate with its limits off (N/A when the reference lost output); <= 1 ms of gateway
CPU per 1 MiB PNG message; GET and DELETE /api/kernels/{id} (and POST /api/kernels, printed beside
its latency with no cells running) within 50 ms p99 while 64 cells sleep, all of which answer ok
after ~20 s), then a Markdown "README table" (figure, cellgate, reference, ratio, goal met /
missed) of the headline figures whose sections ran. A missed target is reported, not failed.
Exits non-zero only on an infrastructure failure (a server does not start or dies, a server does
not list the kernelspec, a request errors or times out). Every process started is stopped by its
pid (leftover descendants are killed by pid, and so are the processes a crashed server left
behind, found by its temp path in their command lines); the temp dir is removed.

  gateway_bench.py [--quick] [--only SECTION[,SECTION]] [--skip SECTION[,SECTION]] [--skip-200]
                   [--servers cellgate,pool,no-zygote,idle,reference,unlimited]
                   [--runs N] [--pool-runs N] [--kernels N] [--cells N] [--bursts N[,N]]
                   [--idle-kernels N] [--png-images N] [--busy-kernels N] [--gwcpu-cells N]
                   [--kernel-name NAME] [--bin-dir DIR] [--keep]

--quick (CI smoke, well under 3 minutes): 2 starts of each kind, 50 round trips, one 10 MiB run
per protocol, 3 kernels x 5 cells with the stack imported, one burst of 4, 5 idle kernels, one
run of 5 PNGs per protocol, 8 kernels sleeping 5 s with 5 samples of each request, 100 cells for
gwcpu.
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
SECTIONS = ("start", "pool", "rtt", "stdout", "many", "cells", "pss", "burst", "idle", "png", "busy",
            "gwcpu")
FLEET = ("many", "cells", "pss")
BURST_TIMEOUT = 600.0  # s a burst's client may take: 100 cold ipykernels at once on 2 cores

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
        self.kernel_name = "python3"  # the kernelspec start_kernel POSTs (--kernel-name)
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


def start_cellgate(bin_dir, tmp, max_kernels, extra_args=(), label="cellgate", port=0,
                   token=None):
    exe = pathlib.Path(bin_dir) / "cellgate"
    if not exe.is_file():
        raise InfraError(f"{exe} not found: build it (cmake --build build --target cellgate cellgate-kernel)"
                         " or pass --bin-dir")
    token = token or base64.b32encode(os.urandom(20)).decode().lower()[:TOKEN_LEN]
    state = pathlib.Path(tmp) / f"{label}-state"
    log_path = pathlib.Path(tmp) / f"{label}.log"
    # stdout and stderr both go through the pipe (the log lines go to stdout): the banner is read
    # from it, and everything is copied to the log file.
    proc = subprocess.Popen(
        [str(exe), "serve", "--ip", "127.0.0.1", "--port", str(port), "--token", token,
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
    # `server.host`: another address than loopback (a cluster node, tests/scaleout/cluster).
    conn = http.client.HTTPConnection(getattr(server, "host", "127.0.0.1"), server.port,
                                      timeout=timeout)
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
    """POST /api/kernels for the server's kernelspec, with a client env if given; the kernel id."""
    body = {"name": server.kernel_name}
    if env is not None:
        body["env"] = env
    try:
        status, body = http_request(server, "POST", "/api/kernels", body, timeout=timeout)
    except (OSError, http.client.HTTPException) as e:
        raise InfraError(f"{server.name}: POST /api/kernels failed: {e!r}") from e
    if status != 201:  # the whole answer: a failed start says why (the kernel's last log lines)
        raise InfraError(f"{server.name}: POST /api/kernels ({server.kernel_name}) -> HTTP {status}: "
                         f"{body[:1000].decode(errors='replace')}")
    return json.loads(body)["id"]


def kernelspec_argv(server, name):
    """The argv of kernelspec `name` as GET /api/kernelspecs lists it ([] if it has none);
    InfraError if the server does not list it."""
    try:
        status, body = http_request(server, "GET", "/api/kernelspecs", timeout=30)
        specs = json.loads(body).get("kernelspecs", {}) if status == 200 else None
    except (OSError, ValueError, http.client.HTTPException) as e:
        raise InfraError(f"{server.name}: GET /api/kernelspecs failed: {e!r}") from e
    if specs is None:
        raise InfraError(f"{server.name}: GET /api/kernelspecs -> HTTP {status}: {body[:300]!r}")
    if name not in specs:
        raise InfraError(f"{server.name}: no kernelspec {name!r} (it has {', '.join(sorted(specs))})")
    return (specs[name].get("spec") or {}).get("argv") or []


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
    """`protocol`: a Sec-WebSocket-Protocol to offer; `self.protocol` is the one the server chose.
    `timeout` bounds each recv; `deadline` (time.monotonic(), None: none) bounds all of them: the
    server's pings, answered inside recv_message, would otherwise keep a wait alive forever."""

    def __init__(self, port, path, token, timeout=60.0, protocol=None, host="127.0.0.1"):
        self.timeout = timeout
        self.deadline = None
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._quickack()
        self.buf = bytearray()
        self.pos = 0
        key = base64.b64encode(os.urandom(16)).decode()
        req = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
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
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline passed")
            self.sock.settimeout(min(self.timeout, left))
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
            self.timeout, self.deadline = 1.0, time.monotonic() + 1.0
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
                                server.token, timeout, protocol,
                                host=getattr(server, "host", "127.0.0.1"))
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
        self.ws.deadline = time.monotonic() + self.timeout  # its whole answer within the timeout
        return msg_id

    def recv(self):
        try:
            op, payload = self.ws.recv_message()
        except socket.timeout as e:
            raise InfraError(f"{self.server.name}: no answer within {self.timeout:.0f} s") from e
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
        elif ppid == gw and ("--zygote" in cmdline(pid).split()
                             or os.path.basename((cmdline(pid).split() or [""])[0]) == "cellgate-zygote"):
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


POOL_CLAIM = ", from the pool"  # cellgate's log line when a client start claims a pooled kernel


def pool_ready_now(server):
    """cellgate_pool_ready of GET /metrics: pooled kernels ready now (every pooled kernelspec)."""
    try:
        status, body = http_request(server, "GET", "/metrics", timeout=30)
    except (OSError, http.client.HTTPException) as e:
        raise InfraError(f"{server.name}: GET /metrics failed: {e!r}") from e
    if status == 200:
        for line in body.decode(errors="replace").splitlines():
            if line.startswith("cellgate_pool_ready "):
                return int(float(line.split()[1]))
    raise InfraError(f"{server.name}: GET /metrics -> HTTP {status}: no cellgate_pool_ready")


def wait_pool_ready(server, size, timeout=300.0):
    """Waits until GET /metrics reports `size` pooled kernels ready."""
    deadline = time.monotonic() + timeout
    while pool_ready_now(server) < size:
        proc = getattr(server, "proc", None)  # a cluster node's view has none
        if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
            tail = server.log_tail() if hasattr(server, "log_tail") else ""
            raise InfraError(f"{server.name}: the pool did not reach {size} ready kernels in {timeout:.0f} s:\n"
                             + tail)
        time.sleep(0.05)


def log_stamp(line):
    """The epoch time of a cellgate log line's spdlog stamp `[YYYY-mm-dd HH:MM:SS.mmm]` (local
    time, as spdlog prints it), or None."""
    if not line.startswith("[") or "]" not in line:
        return None
    try:
        return datetime.datetime.strptime(line[1:line.index("]")], "%Y-%m-%d %H:%M:%S.%f").timestamp()
    except ValueError:
        return None


def pool_full_since(server, size, since, timeout=300.0):
    """When the pool was last filled to `size`, as an epoch time, once it is full now: waits until
    GET /metrics says `size` ready and the log after byte offset `since` holds at least as many
    ready lines as claims (every claim replaced and logged), then takes the stamp of the last
    "(size ready," line. None if there is none: the pool was never drawn from since `since`."""
    deadline = time.monotonic() + timeout
    while True:
        text = pathlib.Path(server.log_path).read_bytes()[since:].decode(errors="replace")
        lines = text.splitlines()
        ready = [line for line in lines if POOL_READY in line and " ready (" in line]
        claims = sum(1 for line in lines if POOL_CLAIM in line)
        if len(ready) >= claims and pool_ready_now(server) >= size:
            break
        if time.monotonic() > deadline or server.proc.poll() is not None:
            raise InfraError(f"{server.name}: the pool did not refill to {size} in {timeout:.0f} s "
                             f"({len(ready)} ready lines for {claims} claims):\n" + server.log_tail())
        time.sleep(0.05)
    full = [line for line in ready if f"({size} ready," in line]
    if not full:
        return None
    stamp = log_stamp(full[-1])
    if stamp is None:
        raise InfraError(f"{server.name}: no [YYYY-mm-dd HH:MM:SS.mmm] stamp on the log line {full[-1]!r}")
    return stamp


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


IDLE_GRACE = 5.0  # s of silence after execute_reply before its idle status counts as lost


def measure_stdout(kc):
    """(bytes of stdout stream received, seconds until execute_reply + idle, rate-limit notice seen,
    idle seen). A kernel that floods iopub with small messages (xpython: one per write) loses some
    at ZeroMQ's high-water marks, its final idle status too: then IDLE_GRACE s without a message
    after the execute_reply end the wait, and the time is taken to the last message."""
    kc.run("pass")  # settle: the previous cell's iopub traffic is drained by waiting for a reply
    t0 = time.perf_counter()
    msg_id = kc.execute(STDOUT_CODE)
    got = 0
    replied = idle = notice = False
    last, overall = t0, kc.ws.deadline
    while not (replied and idle):
        if replied:
            kc.ws.deadline = min(overall, time.monotonic() + IDLE_GRACE)
        try:
            msg = kc.recv()
        except InfraError:
            if not replied:
                raise
            return got, last - t0, notice, False
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        last = time.perf_counter()
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
    return got, time.perf_counter() - t0, notice, True


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


def run_together(server, count, fn, timeout, strict=True):
    """Runs fn(i) for i < count in threads released at once; (t0, [end time of i]). An error, or a
    client not finished after `timeout` s, is an InfraError; with strict=False an unfinished client
    is left to its daemon thread and its end is None (fn then reports its own errors)."""
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
    if errors or (strict and any(e is None for e in ends)):
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


def measure_burst(server, sizes, r, cellgate, pool_size=0):
    """For each n of `sizes`: n concurrent POST /api/kernels, each client then opening its
    WebSocket and running print(1), within BURST_TIMEOUT s; all kernels deleted after each burst.
    A client that fails is counted with its reason, not raised: a server that cannot serve the
    burst is a result (the reference's ipykernels can die on a port another start took). If the
    server then stops answering, the remaining bursts are skipped and stop() cleans up. With
    `pool_size`, the pool is full before each burst; when it was full again is taken from the log."""
    r["burst"] = []
    for n in sizes:
        if pool_size:
            wait_pool_ready(server, pool_size)
        mark = log_size(server)
        kids, kcs, failed = [None] * n, [None] * n, {}

        def one(i):
            deadline = time.monotonic() + BURST_TIMEOUT
            try:
                kids[i] = start_kernel(server, timeout=BURST_TIMEOUT)
                kcs[i] = KernelClient(server, kids[i], timeout=max(1.0, deadline - time.monotonic()))
                kcs[i].run("print(1)")
            except InfraError as e:
                failed[i] = str(e)

        epoch = time.time() - time.perf_counter()  # + a perf_counter time: its epoch time (log stamps)
        try:
            t0, ends = run_together(server, n, one, BURST_TIMEOUT + 60, strict=False)
            for i in range(n):
                if ends[i] is None and i not in failed:
                    failed[i] = f"{server.name}: no answer within {BURST_TIMEOUT + 60:.0f} s"
            done = [ends[i] for i in range(n) if i not in failed]
            server.remember()
            pss = kernel_pss(server, n, cellgate)
        finally:
            for kc in kcs:
                if kc:
                    kc.close()
        b = {"n": n, "answered": len(done), "failures": [failed[i] for i in sorted(failed)],
             "all": max(done) - t0 if not failed else None, "last": max(done) - t0 if done else None,
             "median": statistics.median(e - t0 for e in done) if done else None,
             "pss_mib": pss["total"] / 1024, "delete_s": None, "stuck": None}
        r["burst"].append(b)
        line = (f"  burst of {n}: all answered after {b['all']:.2f} s (median {b['median']:.2f} s)" if not failed
                else f"  burst of {n}: {len(done)} of {n} answered; {len(failed)} failed, the first: "
                     f"{b['failures'][0][:300]}")
        if failed:
            try:
                http_request(server, "GET", "/api", timeout=30)
            except (OSError, http.client.HTTPException) as e:
                b["stuck"] = f"no answer to GET /api within 30 s after the burst ({e!r})"
                print(f"{line}\n  {server.name}: {b['stuck']}: no more bursts; its kernels are killed "
                      "when it is stopped", flush=True)
                break
        last = max(done) if done else t0
        delete_all(server, [k for k in kids if k])
        deleted = time.perf_counter()
        b["delete_s"] = deleted - last
        line += f", deleted in {b['delete_s']:.1f} s"
        if pool_size and not failed:
            full = pool_full_since(server, pool_size, mark)
            b["refill"] = None if full is None else {
                "start": full - (epoch + t0), "last": full - (epoch + last), "deleted": full - (epoch + deleted)}
            line += ("; the pool was never drawn from" if full is None else
                     f"; pool full again {b['refill']['last']:+.2f} s after the last answer, "
                     f"{b['refill']['deleted']:+.2f} s after the kernels were deleted")
        print(line, flush=True)


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

    def ready_retried(keep_ws):
        # The reference's kernels sometimes die at start when another socket took one of the ports
        # jupyter_client picked (see burst): its busy figure is about requests while cells sleep,
        # so a kernel lost that way is replaced (at most twice) and the loss printed.
        for attempt in range(3):
            try:
                return ready(keep_ws)
            except InfraError as e:
                if cellgate or attempt == 2:
                    raise
                print(f"  warning: {server.name}: a kernel for `busy` failed ({e}); starting another")

    def start_many(k, keep_ws=False):
        with concurrent.futures.ThreadPoolExecutor(10) as ex:
            return list(ex.map(lambda _: ready_retried(keep_ws), range(k)))

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
        problems = []  # what the gateway said when a kernel did not start or answer
        if failures or alive < n:
            problems = [line for line in server.log_tail(100000).splitlines()
                        if any(f"[{level}]" in line for level in ("warning", "error", "critical"))][-10:]
        r["idle"] = {"n": n, "started": len(kids), "failures": failures, "start_s": started, "fds": fds,
                     "answered": len(kids) - sum(1 for refused, _ in failures if not refused),
                     "listed": sum(1 for k in kids if k in listed),
                     "dead": sum(1 for k in kids if listed.get(k) == "dead"), "alive": alive,
                     "check_s": checked, "rss0": rss0, "rss_started": rss_started, "rss_idle": rss_idle,
                     "hwm": hwm, "total_pss": total, "gw_pss": gw_pss, "procs": len(procs),
                     "idle_wait": args.idle_wait, "log": problems}
        print(f"  after {args.idle_wait:.0f} s idle: {alive} of {n} answer a cell; gateway VmRSS "
              f"{rss_idle / 1024:.1f} MiB", flush=True)
        for line in problems:
            print(f"  {server.name} log: {line}", flush=True)
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
        # A sequential client: starts without an env one after another, not waiting for refills
        # (each kernel runs print(1) and is deleted). How many the pool served, from the log.
        wait_pool_ready(server, POOL_SIZE)
        mark = log_size(server)
        r["poolseq"] = measure_start(server, args.pool_runs * 2, env=None)
        text = pathlib.Path(server.log_path).read_bytes()[mark:].decode(errors="replace")
        hits = sum(POOL_CLAIM in line for line in text.splitlines())
        print(f"  sequential starts, no wait for refills: median {med(r['poolseq'], 'total'):.1f} ms, "
              f"p90 {p90([x['total'] for x in r['poolseq']]):.1f} ms; {hits} of {len(r['poolseq'])} "
              f"from the pool", flush=True)
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
    # Last: a burst the server cannot serve may leave it unable to serve anything else.
    if "burst" in measures or "burst:pool" in measures:
        measure_burst(server, args.bursts, r, cellgate, POOL_SIZE if "burst:pool" in measures else 0)


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
    argv = sorted({" ".join(a) for a in args.kernel_argv.values()})
    print(f"cellgate {cg_version} vs jupyter_server {versions.get(REF, '?')}, kernelspec {args.kernel_name} "
          f"({' / '.join(argv) or 'argv not listed'}"
          + ("" if zygote_serves(args) else "; not one the zygote serves: cellgate starts it cold")
          + f"), {os.cpu_count()} CPUs, load average "
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
        rate = statistics.median(b / MIB / t for b, t, _, _ in runs)
        complete = all(b == STDOUT_BYTES for b, _, _, _ in runs)
        lost = sum(1 for *_, idle in runs if not idle)
        return rate, (name, f"{rate:.1f}", f"{min(b for b, *_ in runs):,}", "yes" if complete else "NO",
                      "yes" if any(n for _, _, n, _ in runs) else "no",
                      f"LOST {lost}/{len(runs)}" if lost else "yes"), complete

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
        whole = {}  # the reference's runs delivered every byte: else its rate is not comparable
        if g(UNL, "stdout"):
            rates["u"], row, whole["u"] = stdout_row(f"{UNL}, legacy", g(UNL, "stdout"))
            rows.append(row)
        if v1_u:
            rates["uv1"], row, whole["uv1"] = stdout_row(v1_label(UNL, v1_u), v1_u["runs"])
            rows.append(row)

        def versus(ok, key):  # None (N/A) when the reference lost output
            return ok if whole[key] else None

        lost = "; the reference lost output: not comparable"
        if g(REF, "stdout"):
            rows.append(("ratio cellgate / default limits, legacy", f"{rc / rj:.2f}x" if rj else "n/a",
                         "", "", "", ""))
        if "u" in rates:
            rows.append(("ratio cellgate / limits off, legacy", ratio(rc, rates["u"]), "", "", "", ""))
            targets.append(("stdout >= 1.5x jupyter_server's rate (limits off), legacy",
                            versus(rc >= 1.5 * rates["u"], "u"),
                            f"{rc:.1f} vs {rates['u']:.1f} MiB/s: {ratio(rc, rates['u'])}"
                            + ("" if whole["u"] else lost)))
        # v1 against the reference's v1, or its legacy figure if it refused v1
        ref_v1 = rates.get("uv1") if v1_u and v1_u["protocol"] == V1 else rates.get("u")
        if v1_c and v1_c["protocol"] == V1 and ref_v1:
            against = "v1" if v1_u and v1_u["protocol"] == V1 else "legacy (it refused v1)"
            rows.append((f"ratio cellgate v1 / limits off, {against}", ratio(rates["cv1"], ref_v1),
                         "", "", "", ""))
            key = "uv1" if v1_u and v1_u["protocol"] == V1 else "u"
            targets.append((f"stdout >= 1.5x jupyter_server's rate (limits off), v1 vs its {against}",
                            versus(rates["cv1"] >= 1.5 * ref_v1, key),
                            f"{rates['cv1']:.1f} vs {ref_v1:.1f} MiB/s: {ratio(rates['cv1'], ref_v1)}"
                            + ("" if whole[key] else lost)))
        elif v1_c:
            rows.append(("cellgate refused v1: no v1 ratio", "", "", "", "", ""))
        table(f"3. {STDOUT_BYTES:,} bytes of stdout until execute_reply + idle "
              f"(MiB/s median of {len(g(CG, 'stdout'))}; least bytes received; idle: its idle status arrived, "
              f"else the time is to the last message, {IDLE_GRACE:.0f} s of silence after the reply ending "
              "the wait)",
              ["MiB/s", "bytes (min)", "complete", "rate notice", "idle"], rows)
        least = min(b for b, *_ in g(CG, "stdout") + (v1_c["runs"] if v1_c else []))
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
        if c_j and g(CG, "cells"):
            c = g(CG, "cells")
            targets.append((f"{c['n']} x {c['cells']} trivial cells at >= 3x the reference's cells/s",
                            c["rate"] >= 3 * c_j["rate"],
                            f"{c['rate'] / c_j['rate']:.2f}x: {c['rate']:.0f} vs {c_j['rate']:.0f} cells/s"))

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
            targets.append(("PSS <= 20 MiB per kernel with the stack imported (zygote)", p <= 20, f"{p:.1f} MiB"))

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
            rows.append((f"failures ({len(i['failures'])}), the first", i["failures"][0][1][:300]))
        table(f"7. {i['n']} idle kernels alive at once, cellgate only (zygote, pool off; no stack imported; "
              f"the reference is not run at this size: see 6 for it at {args.kernels})", [""], rows)
        for line in i["log"]:
            print(f"  gateway log: {line}")
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

    # 11. bursts
    bursts = {s: {b["n"]: b for b in g(s, "burst") or ()} for s in (CG, POOL, REF)}
    sizes = sorted(set().union(*bursts.values()))
    if sizes:
        def cell(server, n, key, fmt="{:.2f}"):
            b = bursts[server].get(n)
            if not b:
                return ""
            if b[key] is None and key == "all":  # clients failed: when the last of the others answered
                return f"{b['last']:.1f} ({b['answered']}/{n})" if b["last"] is not None else f"0/{n}"
            return fmt.format(b[key]) if b[key] is not None else "-"

        def ratio_to(server, n, key):
            b, j = bursts[server].get(n), bursts[REF].get(n)
            return ratio(j[key], b[key]) if b and j and b[key] is not None and j[key] is not None else ""

        rows, notes = [], []
        for n in sizes:
            rows += [(f"{n} at once: {label}", *(cell(s, n, key, fmt) for s in (CG, POOL, REF)),
                      ratio_to(CG, n, key), ratio_to(POOL, n, key))
                     for label, key, fmt in (("all answered", "all", "{:.2f}"),
                                             ("median client", "median", "{:.2f}"),
                                             ("PSS of all, MiB", "pss_mib", "{:.0f}"),
                                             ("DELETE of all", "delete_s", "{:.1f}"))]
            if n in bursts[POOL]:
                refill = bursts[POOL][n].get("refill", "n/a")
                for key, label in (("start", "the release"), ("last", "the last answer"),
                                   ("deleted", "the kernels were deleted")):
                    rows.append((f"{n} at once: pool full again, s after {label}", "",
                                 "n/a" if refill == "n/a" else f"{refill[key]:+.2f}" if refill else "never drawn",
                                 "", "", ""))
            for name in (CG, POOL, REF):
                b = bursts[name].get(n)
                if b and b["failures"]:
                    notes.append(f"  {name}, {n} at once: {b['answered']} of {n} answered; {len(b['failures'])} "
                                 f"failed, the first: {b['failures'][0][:300]}"
                                 + (f"; then {b['stuck']}" if b["stuck"] else ""))
        table(f"11. bursts: N concurrent POST /api/kernels (no env), each client then opens its WebSocket and "
              "runs print(1) (s from the burst's release; when clients failed, the last answer and "
              "(answered/N); PSS of every process under the server once all answered; DELETE = all its kernels "
              f"deleted, 10 at a time, s). pool off = {CG} (zygote), "
              f"pool {POOL_SIZE} = {POOL} (--pool-size {POOL_SIZE}, full before each burst; pool full again: "
              "the stamp of its last ready log line, negative = before that moment); ratio = reference / "
              "cellgate", ["pool off", f"pool {POOL_SIZE}", "reference", "ref/pool off", f"ref/pool {POOL_SIZE}"],
              rows)
        if notes:
            print("\n".join(notes))
        for n in sizes:
            j = bursts[REF].get(n)
            which = CG if n in bursts[CG] else POOL
            mine = bursts[which].get(n)
            if not (j and mine):
                continue
            label = "pool off" if which == CG else f"pool {POOL_SIZE}"
            name = f"{n} at once all answered >= 20x sooner than the reference"
            if mine["all"] is None:
                targets.append((name, False, f"{label}: only {mine['answered']} of {n} answered"))
                continue
            if j["all"] is None:  # no ratio: the reference never had all N answering
                targets.append((name, None, f"{label}: {mine['all']:.2f} s; the reference: only "
                                f"{j['answered']} of {n} answered"
                                + (f", the last after {j['last']:.2f} s" if j["last"] is not None else "")
                                + ("; then it stopped answering" if j["stuck"] else "")))
                continue
            x = j["all"] / mine["all"]
            detail = f"{label}: {x:.1f}x, {mine['all']:.2f} s vs {j['all']:.2f} s"
            pb = bursts[POOL].get(n)
            if which == CG and pb and pb["all"] is not None:
                detail += f"; pool {POOL_SIZE}: {j['all'] / pb['all']:.1f}x, {pb['all']:.2f} s"
            targets.append((name, x >= 20, detail))

    print("\ntargets:")
    for name, ok, detail in targets:  # ok None: not comparable (the reference failed)
        print(f"  {name}: {'N/A' if ok is None else 'PASS' if ok else 'MISS'} ({detail})")
    readme_table(results, args)


def zygote_serves(args):
    """Whether cellgate's zygote forks this run's kernels: it serves `python3 -m ipykernel_launcher`
    only (the kernelspec's argv as a cellgate server lists it)."""
    argv = next((a for name, a in args.kernel_argv.items() if name in (CG, POOL, COLD, IDLE)), None)
    if argv is None:
        return args.kernel_name == "python3"
    return os.path.basename(argv[0]).startswith("python3") and argv[1:3] == ["-m", "ipykernel_launcher"]


def readme_table(results, args):
    """The headline figures as a Markdown table for the README; a row whose section did not run is
    left out. ratio: higher means cellgate is better (as in the tables above)."""
    g = lambda server, key: results.get(server, {}).get(key)  # noqa: E731
    rows = []  # (figure, cellgate, reference, ratio, goal)

    def goal(text, ok):
        return f"{text}: {'met' if ok else 'missed'}"

    s_j = g(REF, "start")
    ref_start = f"{med(s_j, 'total'):.1f} ms" if s_j else "not run"
    if g(POOL, "pool"):
        hit = med(g(POOL, "pool"), "total")
        rows.append(("POST -> first reply from the warm pool, p50", f"{hit:.1f} ms",
                     f"{ref_start} (no pool: a start)" if s_j else ref_start,
                     ratio(med(s_j, "total"), hit) if s_j else "-", goal("<= 5 ms", hit <= 5)))
    miss = g(POOL, "poolmiss") or g(CG, "start")
    if miss:
        m = med(miss, "total")
        how = "zygote fork" if zygote_serves(args) else f"a cold {args.kernel_name} start: no zygote for it"
        rows.append((f"pool miss ({how}) p50", f"{m:.1f} ms", ref_start,
                     ratio(med(s_j, "total"), m) if s_j else "-", goal("<= 40 ms", m <= 40)))
    # {n: (cellgate, reference)}, each s until all answered, or "k of n answered" (some failed), or
    # None (not run): many first, then the bursts
    at_once = {}
    if g(CG, "many"):
        at_once[args.kernels] = (g(CG, "many")[0], (g(REF, "many") or (None,))[0])
    ref_bursts = {b["n"]: b for b in g(REF, "burst") or ()}

    def burst_all(b):
        if b is None:
            return None
        if b["all"] is not None:
            return b["all"]
        last = f", the last after {b['last']:.2f} s" if b["answered"] else ""
        return f"{b['answered']} of {b['n']} answered{last}"

    for b in g(CG, "burst") or ():
        at_once.setdefault(b["n"], (burst_all(b), burst_all(ref_bursts.get(b["n"]))))
    for n, (cg, ref) in sorted(at_once.items()):
        both = isinstance(cg, float) and isinstance(ref, float)
        rows.append((f"{n} kernels started at once, all answered",
                     f"{cg:.2f} s" if isinstance(cg, float) else cg,
                     f"{ref:.2f} s" if isinstance(ref, float) else ref or "not run",
                     ratio(ref, cg) if both else "-",
                     goal(">= 20x sooner", ref / cg >= 20) if both
                     else goal(">= 20x sooner", False) if isinstance(cg, str)
                     else ">= 20x sooner: n/a" + (" (the reference failed)" if ref else "")))
    c, c_j = g(CG, "cells"), g(REF, "cells")
    if c:
        rows.append((f"{c['n']} x {c['cells']} trivial cells, cells/s", f"{c['rate']:.0f}",
                     f"{c_j['rate']:.0f}" if c_j else "not run", ratio(c["rate"], c_j["rate"]) if c_j else "-",
                     goal(">= 3x", c["rate"] >= 3 * c_j["rate"]) if c_j else ">= 3x: n/a"))
    r_c, r_j = g(CG, "rtt"), g(REF, "rtt")
    if r_c:
        mc = statistics.median(r_c)
        mj = statistics.median(r_j) if r_j else None
        rows.append(("trivial-cell round trip, p50", f"{mc:.0f} us", f"{mj:.0f} us" if r_j else "not run",
                     ratio(mj, mc) if r_j else "-",
                     goal("<= 1/2 the reference's", mc <= 0.5 * mj) if r_j else "<= 1/2 the reference's: n/a"))
    p_c, p_j = g(CG, "pss"), g(REF, "pss")
    if p_c:
        pc = p_c["per_kernel"] / 1024
        rows.append(("PSS per kernel with numpy+pandas+pyplot imported", f"{pc:.1f} MiB",
                     f"{p_j['per_kernel'] / 1024:.1f} MiB" if p_j else "not run",
                     ratio(p_j["per_kernel"], p_c["per_kernel"]) if p_j else "-", goal("<= 20 MiB", pc <= 20)))
    i = g(IDLE, "idle")
    if i:
        rows.append(("idle kernels alive at once, gateway's RSS",
                     f"{i['alive']} of {i['n']}, VmRSS {i['rss_idle'] / 1024:.0f} MiB "
                     f"(VmHWM {i['hwm'] / 1024:.0f} MiB)", "not run", "-",
                     goal("500 alive", i["alive"] >= 500) if i["n"] >= 500
                     else f"500 alive: n/a (--idle-kernels {i['n']})"))
    if not rows:
        return
    print(f"\nREADME table (kernelspec {args.kernel_name}; cellgate = `cellgate serve` with its zygote, its "
          f"pool on (--pool-size {POOL_SIZE}) in the pool rows and off in the others; reference = "
          "jupyter_server; ratio = "
          "reference/cellgate for times and memory, cellgate/reference for cells/s: higher is better for "
          "cellgate):\n")
    print("| figure | cellgate | reference | ratio | goal |")
    print("|---|---:|---:|---:|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


# --------------------------------------------------------------------------------------------


def _interrupted(*_):
    raise KeyboardInterrupt


def _sizes(text):
    """--bursts: comma-separated positive counts."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--bursts wants counts like 20,100, not {text!r}") from None
    if any(n < 1 for n in out):
        raise argparse.ArgumentTypeError(f"--bursts: every count must be at least 1 ({text!r})")
    return out


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
    ap.add_argument("--bursts", metavar="N[,N]",
                    help="concurrent POSTs per burst in burst, one burst each (default 20,100; --quick: 4)")
    ap.add_argument("--idle-kernels", type=int, default=500, help="idle kernels at once in idle (default 500)")
    ap.add_argument("--png-images", type=int, default=20, help="~1 MiB PNGs shown by one cell in png (default 20)")
    ap.add_argument("--busy-kernels", type=int, default=64,
                    help="kernels running a sleeping cell at once in busy (default 64)")
    ap.add_argument("--gwcpu-cells", type=int, default=1000, help="trivial cells in gwcpu (default 1000)")
    ap.add_argument("--only", action="append", metavar="SECTION[,SECTION]",
                    help=f"run only these sections (repeatable): {', '.join(SECTIONS)}")
    ap.add_argument("--skip", action="append", metavar="SECTION[,SECTION]", help="skip these sections")
    ap.add_argument("--skip-200", action="store_true", help="skip the idle-kernels section (same as --skip idle)")
    ap.add_argument("--quick", action="store_true",
                    help="CI smoke: 2 starts of each kind, 50 round trips, one 10 MiB run per protocol, "
                         "3 kernels x 5 cells with the stack imported, a burst of 4, 5 idle kernels, 5 PNGs, "
                         "8 kernels sleeping 5 s, 100 cells for gwcpu")
    ap.add_argument("--servers", action="append", metavar="NAME[,NAME]",
                    help="run only these servers: cellgate, pool, no-zygote, idle, reference, "
                         "unlimited (default: all the sections need)")
    ap.add_argument("--kernel-name", default="python3", metavar="NAME",
                    help="the kernelspec every section starts, on every server (default python3; e.g. xpython)")
    ap.add_argument("--bin-dir", default=str(here.parents[2] / "build" / "bin"),
                    help="directory holding cellgate and cellgate-kernel (default: <repo>/build/bin)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with the servers' logs")
    args = ap.parse_args()
    try:
        only, skip = _sections(args.only), _sections(args.skip)
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    sections = set(only or SECTIONS) - set(skip)
    try:
        args.bursts = _sizes(args.bursts or ("4" if args.quick else "20,100"))
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    if not args.bursts:
        sections.discard("burst")
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
    pool_max = 64
    if "burst" in sections:  # every kernel of the largest burst; the pool server keeps room to refill
        fleet_max = max(fleet_max, max(args.bursts) + 4)
        pool_max = max(args.bursts) + 8
    if "busy" in sections:  # the sleeping kernels, one to GET, DELETE targets, POSTed kernels
        fleet_max = max(fleet_max, args.busy_kernels + 2 * args.busy_samples + 8)
    # (name, starter, its sections, cellgate?, zygote?) -- one server at a time: no competing for cores
    plan = [
        (CG, lambda: start_cellgate(bins, tmp, fleet_max, ["--pool-size", "0"], "cellgate"),
         ("start", "rtt", "stdout", "stdout:v1", "png", "gwcpu", *FLEET, "burst", "busy"), True, True),
        (POOL, lambda: start_cellgate(bins, tmp, pool_max, ["--pool-size", str(POOL_SIZE),
                                                            "--pool-kernel", args.kernel_name], "cellgate-pool"),
         ("pool", "burst:pool"), True, True),
        (COLD, lambda: start_cellgate(bins, tmp, fleet_max, ["--pool-size", "0", "--no-zygote"],
                                      "cellgate-no-zygote"), ("start", *FLEET), True, False),
        (IDLE, lambda: start_cellgate(bins, tmp, args.idle_kernels + 50, ["--pool-size", "0"], "cellgate-idle"),
         ("idle",), True, True),
        (REF, lambda: start_jupyter_server(tmp, "reference"),
         ("start", "rtt", "stdout", "png", "gwcpu", *FLEET, "burst", "busy"), False, False),
        # Every iopub limit off: limit_rate=False skips the checks, and the limits are raised too.
        (UNL, lambda: start_jupyter_server(tmp, "unlimited", [
            "--ServerApp.limit_rate=False", "--ServerApp.iopub_data_rate_limit=1e10",
            "--ServerApp.iopub_msg_rate_limit=1e10"]), ("stdout", "stdout:v1"), False, False),
    ]
    print(f"gateway_bench: sections {', '.join(s for s in SECTIONS if s in sections)}; kernelspec "
          f"{args.kernel_name}; load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    args.kernel_argv = {}  # {server name: the kernelspec's argv there}
    try:
        server_keys = {CG: "cellgate", POOL: "pool", COLD: "no-zygote", IDLE: "idle",
                       REF: "reference", UNL: "unlimited"}
        wanted = set(",".join(args.servers).split(",")) if args.servers else None
        for name, starter, own, is_cellgate, zygote in plan:
            measures = [m for m in own if m.split(":")[0] in sections]
            if not measures or (wanted is not None and server_keys[name] not in wanted):
                continue
            server = starter()
            servers.append(server)
            server.name = name
            server.kernel_name = args.kernel_name
            try:
                versions[name] = json.loads(http_request(server, "GET", "/api")[1]).get("version", "?")
            except (OSError, ValueError, http.client.HTTPException):
                versions[name] = "?"
            args.kernel_argv[name] = kernelspec_argv(server, args.kernel_name)
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
