#!/usr/bin/python3
"""Soak benchmark: one `cellgate serve` under normal work and hostile clients at once.

Starts one `cellgate serve` (loopback, --port 0, its own temp state dir, --max-kernels 16, a warm
pool of 1, --memory 384 MiB and --pids 64 per kernel, --max-ws-queue-bytes 32 MiB) and runs, for
--minutes (default 10; --quick: 30 s), every one of these at once, each in its own thread, each
paced and bounded:

  normal work (a failure here not caused by a hostile client is an infrastructure failure):
    agent      2 kernels, POST /api/kernels/{id}/execute in turn: a print, an error (ZeroDivision,
               expected status "error"), a matplotlib PNG (expected as an artifact), a 1 s sleep,
               a 1 MB print; each kernel keeps `keep = <its index>` set at the start;
    ws         1 kernel over the Jupyter WebSocket (legacy JSON format), cells and prints, its
               variable `keep` checked by each cell;
    oneshot    POST /api/execute with a file placed in the work dir (a fresh kernel per call);
    churn      POST /api/kernels, one agent cell, DELETE, in a loop;
    intr       1 kernel: an agent cell `time.sleep(30)` interrupted by POST .../interrupt
               (expected status "error", KeyboardInterrupt), now and then a POST .../restart
               (its variables are set again after one);
  hostile clients (whatever they get back is counted, never a failure):
    badhttp    raw sockets: bad request lines, an obs-folded header, a bare LF head, a huge header;
    noauth     requests with no token and with a wrong one (expected 401/403);
    idle       --idle-sockets (40) connections that never send a head, held, dropped and re-made;
    bigbody    16 MiB / 1 MiB bodies on control routes (POST /api/kernels, /api/sessions, the
               interrupt route; expected 413 or a close);
    badws      WebSocket connections to a normal kernel sending bad frames (unmasked, reserved
               opcode, an over-long control frame, invalid UTF-8, a lone continuation; expected a
               close);
    slowws     a WebSocket client that never reads while its kernel prints 100 x 1 MB (expected
               to be dropped past --max-ws-queue-bytes; its kernel answers afterwards);
    oom        a kernel that allocates until its cgroup's memory limit kills it (expected status
               "dead" with state_lost, the kernel restarted or dead, neighbours untouched);
    forkbomb   a kernel that forks sleepers until fork fails at pids.max (expected: stopped below
               --pids, the kernel answers afterwards).

Every --interval s (5 with --quick, else 15) it samples the gateway process: VmRSS, VmHWM, open
fds (/proc/<pid>/fd), threads (/proc/<pid>/task) and the processes under it, and prints a row
with the cells finished so far. At the end: min/max/last of each, the growth from the first sample
after warm-up (the first fifth of the run) to the last, a quiet comparison (fds and threads once
the normal kernels are up and before any worker starts, against the same after every worker has
stopped and its kernels are deleted), counts of cells and requests by outcome, and whether every
normal kernel still answers with its variables intact. Steady growth of fds or threads is printed
as a "LEAK?" line: a warning with --quick, exit status 1 otherwise. Exit status 2 on an
infrastructure failure: the gateway dies, a normal request fails, a normal kernel loses its
variables.

  soak_bench.py [--minutes M] [--quick] [--interval S] [--idle-sockets N] [--only WORKER[,WORKER]]
                [--bin-dir DIR] [--keep]

Everything started is stopped by pid (gateway_bench.Server.stop), mounts a crash left behind are
unmounted, the temp dir removed.
"""

import argparse
import collections
import http.client
import json
import os
import pathlib
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gateway_bench as gb  # noqa: E402  (the shared helpers: server, REST, WebSocket, /proc)

MIB = 1024 * 1024
KERNEL_MEMORY = 384 * MIB
KERNEL_PIDS = 64
WS_QUEUE = 32 * MIB
HTTP_TIMEOUT = 180  # generous: 2 shared cores, other work on the machine

PNG_CELL = ("import matplotlib.pyplot as plt\nfrom IPython.display import display\n"
            "fig = plt.figure(); plt.plot([1, 2, 3], [keep, 1, 4]); plt.title('soak')\n"
            "display(fig); plt.close(fig)")
MEMORY_BOMB = ("hog = []\nwhile True:\n    hog.append(b'x' * (32 << 20))")
FORK_BOMB = """import os, time
kids = []
err = None
while len(kids) < 10000:
    try:
        pid = os.fork()
    except OSError as e:
        err = e
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
n = len(kids)
for pid in kids:
    os.kill(pid, 9)
for pid in kids:
    os.waitpid(pid, 0)
print(n, type(err).__name__, getattr(err, 'errno', None))"""


class Soak:
    """Shared state of a run: the server, a stop flag, outcome counters and failures."""

    def __init__(self, server, deadline):
        self.server = server
        self.deadline = deadline
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts = collections.Counter()  # (worker, outcome) -> n
        self.failures = []  # infrastructure failures (exit 2)
        self.findings = []  # hostile-client outcomes worth a look (printed, not failed)
        self.normal = {}  # kernel id -> (label, {variable: expected repr})
        self.only = set()  # --only

    def count(self, worker, outcome):
        with self.lock:
            self.counts[(worker, outcome)] += 1

    def fail(self, worker, what):
        with self.lock:
            self.failures.append(f"{worker}: {what}")
        print(f"  FAIL {worker}: {what}", file=sys.stderr, flush=True)

    def note(self, worker, what):
        with self.lock:
            if len(self.findings) < 200 and what not in self.findings:
                self.findings.append(f"{worker}: {what}")

    def pause(self, seconds):
        """Sleeps (not past the end of the run); True once the run is over."""
        left = self.deadline - time.monotonic()
        return self.stop.wait(max(0.0, min(seconds, left))) or time.monotonic() >= self.deadline

    def request(self, method, path, body=None, timeout=HTTP_TIMEOUT):
        return gb.http_request(self.server, method, path, body, timeout=timeout)

    def execute(self, kid, code, timeout=60):
        status, body = self.request("POST", f"/api/kernels/{kid}/execute", {"code": code, "timeout": timeout},
                                    timeout=timeout + 120)
        if status != 200:
            raise gb.InfraError(f"POST /api/kernels/{kid}/execute -> HTTP {status}: {body[:300]!r}")
        return json.loads(body)


def worker(soak, name, fn):
    """Runs fn(soak) in a loop-owning thread; an unexpected exception of a normal worker is an
    infrastructure failure, of a hostile one a finding. None when --only leaves it out."""
    if soak.only and name not in soak.only:
        return None
    def run():
        try:
            fn(soak)
        except (gb.InfraError, OSError, http.client.HTTPException, ValueError, KeyError) as e:
            if soak.stop.is_set() or soak.server.proc.poll() is not None:
                return
            if name in NORMAL:
                soak.fail(name, repr(e)[:400])
            else:
                soak.count(name, "client error")
                soak.note(name, f"stopped on {e!r}"[:300])
    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t


# --------------------------------------------------------------------------------------------
# Normal work


def expect(soak, worker_name, answer, status, what):
    got = answer.get("status")
    if got == status:
        soak.count(worker_name, status)
        return True
    soak.count(worker_name, f"unexpected {got}")
    soak.fail(worker_name, f"{what}: status {got!r}, expected {status!r}: "
              f"{json.dumps({k: answer.get(k) for k in ('message', 'error', 'stderr')})[:300]}")
    return False


def run_agent(soak, kids):
    cells = [
        ("print", "print('hello', keep)", "ok", lambda a: a["stdout"].strip() == f"hello {a['_keep']}"),
        ("error", "1 / 0", "error", lambda a: a["error"]["ename"] == "ZeroDivisionError"),
        ("png", PNG_CELL, "ok", lambda a: "image/png" in json.dumps(a["artifacts"])
         and any("image/png" in (o.get("data") or {}) for o in a["outputs"])),
        ("sleep", "import time; time.sleep(1); keep", "ok",
         lambda a: a["result"]["text/plain"] == str(a["_keep"])),
        ("1MB print", "print('y' * 1000000)", "ok", lambda a: len(a["stdout"]) == 1000001),
    ]
    i = 0
    while not soak.pause(0.3):
        for idx, kid in enumerate(kids):
            label, code, status, check = cells[i % len(cells)]
            a = soak.execute(kid, code)
            a["_keep"] = idx
            if expect(soak, "agent", a, status, f"kernel {idx} cell {label}") and not check(a):
                soak.fail("agent", f"kernel {idx} cell {label}: wrong answer "
                          f"{json.dumps({k: a.get(k) for k in ('stdout', 'result', 'error', 'artifacts')})[:300]}")
        i += 1


def run_ws(soak, kid):
    kc = gb.KernelClient(soak.server, kid, timeout=HTTP_TIMEOUT)
    try:
        n = 0
        while not soak.pause(0.5):
            n += 1
            out = kc.run_stdout(f"print(keep + {n})")
            if out.strip() != str(100 + n):
                soak.fail("ws", f"cell {n}: stdout {out[:200]!r}, expected {100 + n}")
            else:
                soak.count("ws", "ok")
            if n % 10 == 0:
                out = kc.run_stdout("import sys\nfor i in range(1000): sys.stdout.write('z' * 1000 + '\\n')")
                soak.count("ws", "ok" if len(out) == 1001000 else "short")
                if len(out) != 1001000:
                    soak.fail("ws", f"1 MB of stdout over the WebSocket: {len(out)} bytes")
    finally:
        kc.close()


def run_oneshot(soak):
    while not soak.pause(2.0):
        status, body = soak.request("POST", "/api/execute", {
            "code": "print(open('in.txt').read().upper())", "files": {"in.txt": "soak"}, "timeout": 60})
        if status != 200:
            soak.fail("oneshot", f"POST /api/execute -> HTTP {status}: {body[:300]!r}")
            continue
        a = json.loads(body)
        if expect(soak, "oneshot", a, "ok", "one-shot run") and a["stdout"].strip() != "SOAK":
            soak.fail("oneshot", f"stdout {a['stdout'][:100]!r}")


def run_churn(soak):
    while not soak.pause(1.0):
        kid = gb.start_kernel(soak.server, timeout=HTTP_TIMEOUT)
        try:
            a = soak.execute(kid, "21 * 2")
            if expect(soak, "churn", a, "ok", "a new kernel's first cell") and a["result"]["text/plain"] != "42":
                soak.fail("churn", f"result {a['result']!r}")
        finally:
            gb.delete_kernel(soak.server, kid, timeout=HTTP_TIMEOUT)
        soak.count("churn", "deleted")


def run_intr(soak, kid):
    n = 0
    while not soak.pause(2.0):
        n += 1
        result = {}

        def sleeper():
            try:
                result["a"] = soak.execute(kid, "import time; time.sleep(30)")
            except Exception as e:  # reported below
                result["e"] = e
        t = threading.Thread(target=sleeper, daemon=True)
        t.start()
        time.sleep(1.5)
        status, body = soak.request("POST", f"/api/kernels/{kid}/interrupt")
        if status != 204:
            soak.fail("intr", f"POST .../interrupt -> HTTP {status}: {body[:200]!r}")
        t.join(HTTP_TIMEOUT)
        if "e" in result or "a" not in result:
            soak.fail("intr", f"the interrupted cell: {result.get('e')!r}")
            continue
        a = result["a"]
        if expect(soak, "intr", a, "error", "an interrupted sleep") and a["error"]["ename"] != "KeyboardInterrupt":
            soak.fail("intr", f"interrupted cell's error {a['error']['ename']!r}")
        a = soak.execute(kid, "keep")
        if expect(soak, "intr", a, "ok", "after an interrupt") and a["result"]["text/plain"] != "'intr'":
            soak.fail("intr", f"variables lost after an interrupt: {a['result']!r}")
        if n % 5 == 0:
            status, body = soak.request("POST", f"/api/kernels/{kid}/restart")
            if status != 200:
                soak.fail("intr", f"POST .../restart -> HTTP {status}: {body[:200]!r}")
                continue
            soak.count("intr", "restarted")
            a = soak.execute(kid, "keep = 'intr'")
            expect(soak, "intr", a, "ok", "setting variables after a restart")


# --------------------------------------------------------------------------------------------
# Hostile clients


def raw_exchange(port, data, wait=5.0, shut=True):
    """Sends raw bytes; the status line answered ('HTTP/1.1 400 ...'), 'closed' (EOF with no
    answer), 'reset' or 'no answer' (nothing within `wait` s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        try:
            try:
                s.sendall(data)
                if shut:
                    s.shutdown(socket.SHUT_WR)
            except OSError:  # closed while sending (e.g. a 413 before the body): read what came
                pass
            buf = b""
            while b"\r\n" not in buf:
                chunk = s.recv(4096)
                if not chunk:
                    return "closed" if not buf else buf.decode("latin-1")[:60]
                buf += chunk
            return buf.split(b"\r\n", 1)[0].decode("latin-1")
        except socket.timeout:
            return "no answer"
        except ConnectionResetError:
            return "reset"


def status_class(line):
    parts = line.split()
    return parts[1] if line.startswith("HTTP/") and len(parts) > 1 else line


def run_badhttp(soak):
    port = soak.server.port
    cases = [
        ("bad request line", b"GARBAGE\r\n\r\n"),
        ("bad version", b"GET /api HTTP/9.9\r\nHost: x\r\n\r\n"),
        ("obs-fold header", b"GET /api HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\n\r\n"),
        ("space before colon", b"GET /api HTTP/1.1\r\nHost : x\r\n\r\n"),
        ("binary junk", bytes(range(256)) * 4),
        ("huge header", b"GET /api HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"),
        ("bad content-length", b"POST /api/kernels HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"),
    ]
    i = 0
    while not soak.pause(0.2):
        label, data = cases[i % len(cases)]
        i += 1
        try:
            got = raw_exchange(port, data)
        except OSError as e:
            got = f"connect error {e.errno}"
        soak.count("badhttp", f"{label}: {status_class(got)}")


def run_noauth(soak):
    port = soak.server.port
    i = 0
    while not soak.pause(0.2):
        i += 1
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            headers = {} if i % 2 else {"Authorization": "token wrong-" + "x" * 20}
            path = ("/api/kernels", "/api/execute", "/api/sessions")[i % 3]
            method = "GET" if path != "/api/execute" else "POST"
            conn.request(method, path, body=b"{}" if method == "POST" else None, headers=headers)
            r = conn.getresponse()
            r.read()
            soak.count("noauth", f"{'no token' if i % 2 else 'wrong token'}: {r.status}")
            if r.status not in (401, 403):
                soak.note("noauth", f"{method} {path} without a valid token answered {r.status}")
        except (OSError, http.client.HTTPException) as e:
            soak.count("noauth", f"error {type(e).__name__}")
        finally:
            conn.close()


def run_idle(soak, count):
    while not soak.stop.is_set() and time.monotonic() < soak.deadline:
        socks = []
        for _ in range(count):
            try:
                socks.append(socket.create_connection(("127.0.0.1", soak.server.port), timeout=5))
            except OSError as e:
                soak.count("idle", f"connect error {e.errno}")
        with soak.lock:
            soak.counts[("idle", "opened")] += len(socks)
        held = time.monotonic()
        soak.pause(20.0)
        held = time.monotonic() - held
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
            s.close()
        with soak.lock:
            soak.counts[("idle", "closed by the gateway while held (<= 20 s)")] += closed
            soak.counts[("idle", "still open when let go")] += len(socks) - closed


def run_bigbody(soak):
    port = soak.server.port
    cases = [("POST /api/kernels 1 MiB", "/api/kernels", MIB), ("POST /api/sessions 1 MiB", "/api/sessions", MIB),
             ("POST /api/kernels 16 MiB", "/api/kernels", 16 * MIB)]
    i = 0
    while not soak.pause(1.0):
        label, path, size = cases[i % len(cases)]
        i += 1
        body = b'{"name": "python3", "pad": "' + b"p" * size + b'"}'
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: token {soak.server.token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        try:
            got = raw_exchange(port, head + body, wait=30)
        except OSError as e:
            got = f"error {e.errno}"
        soak.count("bigbody", f"{label}: {status_class(got)}")
        if got.startswith("HTTP/") and status_class(got).startswith("2"):
            soak.note("bigbody", f"{label} accepted: {got}")


def bad_ws_frames():
    def masked(b0, payload):
        mask = b"\x01\x02\x03\x04"
        n = len(payload)
        length = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n)
        return bytes([b0]) + length + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
    return [
        ("unmasked", b"\x81\x05hello"),
        ("reserved opcode", masked(0x83, b"abc")),
        ("long ping", masked(0x89, b"p" * 200)),
        ("invalid UTF-8", masked(0x81, b"\xff\xfe\xfd")),
        ("lone continuation", masked(0x80, b"abc")),
        ("RSV bits", masked(0xF1, b"abc")),
        ("not JSON", masked(0x81, b"{not json")),
    ]


def run_badws(soak, kid):
    frames = bad_ws_frames()
    i = 0
    while not soak.pause(0.5):
        label, frame = frames[i % len(frames)]
        i += 1
        ws = gb.WebSocket(soak.server.port, f"/api/kernels/{kid}/channels?session_id=soak-bad-{i}",
                          soak.server.token, timeout=5)
        try:
            ws.sock.sendall(frame)
            try:
                while True:
                    ws.recv_message()  # kernel status messages may arrive first
            except gb.WSClosed as e:
                soak.count("badws", f"{label}: closed ({str(e)[:40]})" if "close frame" in str(e)
                           else f"{label}: closed")
            except socket.timeout:
                soak.count("badws", f"{label}: still open after 5 s")
                if label != "not JSON":
                    soak.note("badws", f"{label}: the connection stayed open")
            except OSError:
                soak.count("badws", f"{label}: reset")
        finally:
            ws.sock.close()


def run_slowws(soak, kid):
    while not soak.pause(5.0):
        ws = gb.WebSocket(soak.server.port, f"/api/kernels/{kid}/channels?session_id=soak-slow",
                          soak.server.token, timeout=HTTP_TIMEOUT)
        ws.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        # The flood runs over the agent API (another client); this one never reads.
        a = soak.execute(kid, "import sys, time\nfor i in range(100):\n"
                              "    sys.stdout.write('s' * 1000000 + '\\n'); sys.stdout.flush(); time.sleep(0.01)",
                         timeout=120)
        soak.count("slowws", f"flood cell {a.get('status')}")
        # Now read: what the gateway still holds arrives, then EOF if it dropped us, or silence
        # (3 s) if it kept us.
        ws.sock.settimeout(3.0)
        dropped, got, until = False, 0, time.monotonic() + 30
        tail = b""
        try:
            while got < 512 * MIB and time.monotonic() < until:
                chunk = ws.sock.recv(1 << 20)
                if not chunk:
                    dropped = True
                    break
                got += len(chunk)
                # The gateway's close frame (1008, "client too slow: …") after what it held: the
                # TCP connection then waits for our close reply, which a raw reader never sends.
                tail = (tail + chunk)[-256:]
                if b"\x03\xf0client too slow" in tail:
                    dropped = True
                    break
        except socket.timeout:
            pass
        except OSError:
            dropped = True
        ws.sock.close()
        soak.count("slowws", (f"slow reader dropped (close 1008 or EOF after {got / MIB:.0f} MiB read late)" if dropped else
                              f"slow reader kept ({got / MIB:.0f} MiB read late, no EOF)"))
        a = soak.execute(kid, "keep")
        if a.get("status") != "ok" or a["result"]["text/plain"] != "'slow'":
            soak.note("slowws", f"the flooded kernel after the flood: {a.get('status')} {a.get('result')}")
            soak.count("slowws", "kernel lost its state")
        else:
            soak.count("slowws", "kernel answers")


def run_oom(soak):
    while not soak.pause(3.0):
        kid = gb.start_kernel(soak.server, timeout=HTTP_TIMEOUT)
        try:
            soak.execute(kid, "z = 1")
            a = soak.execute(kid, MEMORY_BOMB, timeout=120)
            soak.count("oom", f"bomb: {a.get('status')} state_lost={a.get('state_lost')}")
            if a.get("status") != "dead":
                soak.note("oom", f"memory bomb answered {a.get('status')}: {str(a.get('message'))[:150]}")
            state, until = None, time.monotonic() + 90
            while time.monotonic() < until:  # the automatic restart (or the kernel left dead)
                status, body = soak.request("GET", f"/api/kernels/{kid}")
                state = json.loads(body).get("execution_state") if status == 200 else f"HTTP {status}"
                if state not in ("restarting", "starting"):
                    break
                time.sleep(0.5)
            soak.count("oom", f"kernel after: {state}")
            if state in ("dead", "restarting", "starting") or str(state).startswith("HTTP"):
                continue
            a = soak.execute(kid, "z", timeout=60)
            soak.count("oom", "next cell: " + ("state kept" if a.get("status") == "ok" else
                                               f"{a.get('status')} {(a.get('error') or {}).get('ename', '')}"))
        finally:
            try:
                gb.delete_kernel(soak.server, kid, timeout=HTTP_TIMEOUT)
            except gb.InfraError as e:
                soak.note("oom", f"delete after the bomb: {e}"[:200])


def run_forkbomb(soak, kid):
    while not soak.pause(3.0):
        a = soak.execute(kid, FORK_BOMB, timeout=120)
        if a.get("status") != "ok":
            soak.count("forkbomb", f"bomb: {a.get('status')}")
            soak.note("forkbomb", f"fork bomb cell answered {a.get('status')}: {str(a.get('message'))[:150]}")
        else:
            n, ename, errno_ = a["stdout"].split()
            stopped = ename in ("BlockingIOError", "OSError") and int(n) < KERNEL_PIDS
            soak.count("forkbomb", "stopped at pids.max" if stopped else f"not stopped ({n} forks, {ename})")
            if not stopped:
                soak.note("forkbomb", f"{n} forks, then {ename} errno {errno_}")
        a = soak.execute(kid, "keep")
        soak.count("forkbomb", "kernel answers" if a.get("status") == "ok" else f"after: {a.get('status')}")


NORMAL = ("agent", "ws", "oneshot", "churn", "intr")
WORKERS = NORMAL + ("badhttp", "noauth", "idle", "bigbody", "badws", "slowws", "oom", "forkbomb")


# --------------------------------------------------------------------------------------------
# Sampling


def sample(server):
    pid = server.proc.pid
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None
    return {"rss": (gb.status_kib(pid) or 0) / 1024, "hwm": (gb.status_kib(pid, "VmHWM") or 0) / 1024,
            "fds": fds, "threads": threads, "procs": len(gb.descendants(pid))}


def cells_done(soak):
    with soak.lock:
        return sum(n for (w, _), n in soak.counts.items() if w in NORMAL)


def trend(values, floor=0):
    """'LEAK?' when the last third of the samples is wholly above the first third and the series
    never falls back to its start: steady growth, not load noise."""
    if len(values) < 6:
        return None
    k = len(values) // 3
    first, last = values[:k], values[-k:]
    if min(last) > max(first) + floor and min(values[k:]) >= values[0]:
        return f"grew from {first[0]:g} to {values[-1]:g} (first third max {max(first)}, last third min {min(last)})"
    return None


def main():
    here = pathlib.Path(__file__).resolve()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the run (default 10)")
    ap.add_argument("--quick", action="store_true", help="CI smoke: a 30 s run, a sample every 5 s")
    ap.add_argument("--interval", type=float, default=None, help="seconds between samples (5 quick, else 15)")
    ap.add_argument("--idle-sockets", type=int, default=40, help="idle connections held at once (default 40)")
    ap.add_argument("--bin-dir", default=str(here.parents[2] / "build" / "bin"),
                    help="directory holding cellgate and cellgate-kernel (default: <repo>/build/bin)")
    ap.add_argument("--only", default="", metavar="WORKER[,WORKER]",
                    help="run only these workers (to narrow down a failure): " + ", ".join(WORKERS))
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with the gateway's log")
    args = ap.parse_args()
    only = {w for w in args.only.split(",") if w}
    if only - set(WORKERS):
        ap.error(f"unknown workers {', '.join(sorted(only - set(WORKERS)))} (workers: {', '.join(WORKERS)})")
    duration = 30.0 if args.quick else args.minutes * 60
    interval = args.interval or (5.0 if args.quick else 15.0)
    tmp = tempfile.mkdtemp(prefix="cellgate-soak-")
    signal.signal(signal.SIGTERM, gb._interrupted)
    server = None
    soak = None
    try:
        server = gb.start_cellgate(args.bin_dir, tmp, 16, [
            "--pool-size", "1", "--memory", str(KERNEL_MEMORY), "--pids", str(KERNEL_PIDS),
            "--max-ws-queue-bytes", str(WS_QUEUE)], "soak")
        print(f"soak_bench: cellgate serve pid {server.proc.pid} on 127.0.0.1:{server.port}; "
              f"{duration:.0f} s, a sample every {interval:.0f} s; kernels --memory {KERNEL_MEMORY // MIB} MiB "
              f"--pids {KERNEL_PIDS}, --max-ws-queue-bytes {WS_QUEUE // MIB} MiB; load average "
              + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
        soak = Soak(server, float("inf"))
        soak.only = only
        # The normal kernels, their variables set before any load.
        agent_kids = [gb.start_kernel(server, timeout=HTTP_TIMEOUT) for _ in range(2)]
        ws_kid, intr_kid, slow_kid, fork_kid = (gb.start_kernel(server, timeout=HTTP_TIMEOUT) for _ in range(4))
        for idx, kid in enumerate(agent_kids):
            soak.normal[kid] = (f"agent {idx}", {"keep": str(idx)})
        soak.normal[ws_kid] = ("ws", {"keep": "100"})
        soak.normal[intr_kid] = ("intr", {"keep": "'intr'"})
        for kid, (label, vars_) in soak.normal.items():
            for name, value in vars_.items():
                soak.execute(kid, f"{name} = {value}")
        soak.execute(slow_kid, "keep = 'slow'")
        soak.execute(fork_kid, "keep = 'fork'")
        time.sleep(2)
        quiet_before = sample(server)

        start = time.monotonic()
        soak.deadline = start + duration
        threads = [
            worker(soak, "agent", lambda s: run_agent(s, agent_kids)),
            worker(soak, "ws", lambda s: run_ws(s, ws_kid)),
            worker(soak, "oneshot", run_oneshot),
            worker(soak, "churn", run_churn),
            worker(soak, "intr", lambda s: run_intr(s, intr_kid)),
            worker(soak, "badhttp", run_badhttp),
            worker(soak, "noauth", run_noauth),
            worker(soak, "idle", lambda s: run_idle(s, args.idle_sockets)),
            worker(soak, "bigbody", run_bigbody),
            worker(soak, "badws", lambda s: run_badws(s, ws_kid)),
            worker(soak, "slowws", lambda s: run_slowws(s, slow_kid)),
            worker(soak, "oom", run_oom),
            worker(soak, "forkbomb", lambda s: run_forkbomb(s, fork_kid)),
        ]
        threads = [t for t in threads if t is not None]
        samples = []
        hdr = f"{'t/s':>6} {'RSS/MiB':>8} {'HWM/MiB':>8} {'fds':>5} {'threads':>7} {'procs':>5} {'cells':>6}"
        print(hdr, flush=True)
        next_at = start
        while True:
            now = time.monotonic()
            if server.proc.poll() is not None:
                soak.fail("gateway", f"cellgate serve exited ({server.proc.returncode}) at t={now - start:.0f} s")
                break
            if now >= next_at:
                s = sample(server)
                if s:
                    s["t"] = now - start
                    samples.append(s)
                    print(f"{s['t']:6.0f} {s['rss']:8.1f} {s['hwm']:8.1f} {s['fds']:5d} {s['threads']:7d} "
                          f"{s['procs']:5d} {cells_done(soak):6d}", flush=True)
                next_at += interval
            if now >= soak.deadline:
                break
            time.sleep(min(0.5, max(0.05, next_at - now)))
        print("soak_bench: the run is over; waiting for the workers' last requests", flush=True)
        for t in threads:
            t.join(15)
        late = [t for t in threads if t.is_alive()]
        if late:  # where they wait: a request the gateway is slow to answer, worth a look
            frames = sys._current_frames()
            for t in late:
                stack = traceback.format_stack(frames.get(t.ident)) if t.ident in frames else []
                print(f"  {t.name} still busy 15 s after the end, in:\n" + "".join(stack[-4:]),
                      file=sys.stderr, flush=True)
                soak.note(t.name, "still busy 15 s after the end of the run")
        for t in late:
            t.join(HTTP_TIMEOUT + 60)
            if t.is_alive():
                soak.fail(t.name, "its last request did not end")
        soak.stop.set()
        alive = server.proc.poll() is None
        if not alive:
            soak.fail("gateway", f"cellgate serve exited ({server.proc.returncode})")

        # Normal kernels: alive with their variables.
        intact = {}
        if alive:
            for kid, (label, vars_) in soak.normal.items():
                try:
                    a = soak.execute(kid, "repr((" + ", ".join(vars_) + ",))", timeout=60)
                    want = "(" + ", ".join(vars_.values()) + ",)"
                    got = (a.get("result") or {}).get("text/plain", "")
                    intact[label] = a.get("status") == "ok" and got.strip("'\"") == want
                    if not intact[label]:
                        soak.fail("neighbours", f"{label}: {a.get('status')} {got!r}, expected {want!r}")
                except (gb.InfraError, OSError, http.client.HTTPException, ValueError) as e:
                    intact[label] = False
                    soak.fail("neighbours", f"{label}: {e!r}"[:300])
            for kid in (slow_kid, fork_kid):
                gb.delete_kernel(server, kid, timeout=HTTP_TIMEOUT)
            time.sleep(3)
            quiet_after = sample(server)
        else:
            quiet_after = None

        # Summary.
        print(f"\nsoak_bench: {len(samples)} samples over {duration:.0f} s")
        warm = [s for s in samples if s["t"] >= duration / 5] or samples
        leaks, warnings = [], []  # fds/threads (exit 1 without --quick); RSS (always a warning)
        print(f"  {'':8} {'min':>8} {'max':>8} {'last':>8}   growth after warm-up (t={warm[0]['t']:.0f} s -> last)")
        for key, unit in (("rss", "MiB"), ("hwm", "MiB"), ("fds", ""), ("threads", ""), ("procs", "")):
            vals = [s[key] for s in samples]
            fmt = (lambda v: f"{v:8.1f}") if unit else (lambda v: f"{v:8d}")
            print(f"  {key + (' ' + unit if unit else ''):8} {fmt(min(vals))} {fmt(max(vals))} {fmt(vals[-1])}   "
                  f"{warm[-1][key] - warm[0][key]:+.1f}")
            if key in ("fds", "threads", "rss"):
                t = trend([s[key] for s in warm], 4.0 if key == "rss" else 0)  # RSS: 4 MiB of noise
                if t:
                    (leaks if key != "rss" else warnings).append(f"{key} {t}")
        if quiet_before and quiet_after:
            print(f"  quiet (normal kernels only, no client): before the run fds {quiet_before['fds']} threads "
                  f"{quiet_before['threads']} procs {quiet_before['procs']} RSS {quiet_before['rss']:.1f} MiB; "
                  f"after fds {quiet_after['fds']} threads {quiet_after['threads']} procs {quiet_after['procs']} "
                  f"RSS {quiet_after['rss']:.1f} MiB")
            # After: the two hostile kernels deleted, the pool refilled. A few fds of slack for the
            # pool kernel's refill and the log/audit files.
            if quiet_after["fds"] > quiet_before["fds"] + 8:
                leaks.append(f"fds at rest {quiet_before['fds']} before the run, {quiet_after['fds']} after it")
            if quiet_after["threads"] > quiet_before["threads"] + 2:
                leaks.append(f"threads at rest {quiet_before['threads']} before, {quiet_after['threads']} after")
        print("\n  outcomes:")
        width = max((len(f"{w}: {o}") for w, o in soak.counts), default=10)
        for (w, o), n in sorted(soak.counts.items()):
            print(f"    {(w + ': ' + o).ljust(width)} {n:6d}")
        print("\n  normal kernels answer with their variables: "
              + (", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in intact.items()) or "not checked"))
        if soak.findings:
            print("\n  hostile-client findings (not failures):")
            for f in soak.findings:
                print(f"    {f}")
        try:
            log = pathlib.Path(server.log_path).read_text(errors="replace")
        except OSError:
            log = ""
        print(f"\n  gateway log: {len(log) / 1024:.0f} KiB, {log.count('[error]')} error lines; slow WebSocket "
              f"readers dropped {log.count('fell ')}, iopub connections cut (oversized messages?) "
              f"{log.count('maxmsgsize?')}, OOM kills {log.count('died: oom')}")
        for line in leaks + warnings:
            print(f"LEAK? {line}")
        print("load average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        if soak.failures:
            print(f"\nsoak_bench: infrastructure failure ({len(soak.failures)}):\n  " + "\n  ".join(soak.failures[:20])
                  + f"\n--- last lines of the gateway log ---\n{server.log_tail(15)}", file=sys.stderr)
            return 2
        if leaks and not args.quick:
            return 1
        return 0
    except gb.InfraError as e:
        print(f"\nsoak_bench: infrastructure failure: {e}", file=sys.stderr)
        if server:
            print(f"--- last lines of the gateway log ---\n{server.log_tail(15)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nsoak_bench: interrupted", file=sys.stderr)
        return 130
    finally:
        if soak:
            soak.stop.set()
        if server:
            server.stop(60)
        gb.unmount_leftovers(tmp)
        if args.keep:
            print(f"soak_bench: log kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
