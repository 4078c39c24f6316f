#!/usr/bin/python3
"""The kernel's own share of a cell and of a start, without the gateway in the way.

Sections (select with --only):

  rtt   a trivial cell's round trip measured on the kernel's own ZeroMQ sockets: execute_request
        `1` -> its execute_reply, --cells times after 20 warm-ups (us; median, p90). Two
        `cellgate serve` servers, both with the pool off: one forks kernels from the zygote (the
        tuned ipykernel of docs/zygote.md), one with --no-zygote (Debian's ipykernel as it is,
        jailed the same way). Each starts one kernel over the REST API; this script reads the
        kernel's connection (key and ipc paths) from the gateway's state record and talks to the
        kernel directly, beside the gateway's own connection (shell is a ROUTER, iopub a PUB).
        Needs root (the jail does).
  init  IPKernelApp.initialize() in a process that imported what the zygote preloads (numpy,
        pandas, matplotlib.pyplot, ipykernel; gc frozen), run in that process itself and in a
        fork of it: wall ms, CPU ms and minor page faults, median of --runs. What a fork costs
        the kernel's start: the copy-on-write faults. Unjailed, no root needed.
  pss   where a zygote kernel's memory goes: --kernels kernels forked from the zygote, each having
        run `import numpy, pandas, matplotlib.pyplot`; each kernel process's /proc/<pid>/smaps
        summed by kind of mapping (the malloc heap, other anonymous memory -- Python's arenas,
        thread stacks, ZeroMQ's buffers --, shared libraries and other files), PSS and private
        dirty, the mean over the kernels; and the other processes' PSS per kernel: the jail's
        reaper, the kernel's launcher, the zygote's share. Needs root.

Usage: /usr/bin/python3 tests/bench/kernel_bench.py [--only rtt,init,pss] [--cells N] [--runs N]
                                                     [--kernels N] [--bin-dir DIR] [--quick]
"""

import argparse
import hashlib
import hmac
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import uuid

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gateway_bench as gb  # noqa: E402  (its server start and stop, REST helpers)

SECTIONS = ("rtt", "init", "pss")


class DirectClient:
    """A shell DEALER and an iopub SUB on a running kernel's sockets."""

    def __init__(self, conn):
        import zmq
        self.zmq = zmq
        self.key = conn["key"].encode()
        self.session = uuid.uuid4().hex
        self.ctx = zmq.Context()

        def url(port_name):
            if conn.get("transport", "tcp") == "ipc":
                return f"ipc://{conn['ip']}-{conn[port_name]}"
            return f"tcp://{conn['ip']}:{conn[port_name]}"

        self.shell = self.ctx.socket(zmq.DEALER)
        self.shell.setsockopt(zmq.LINGER, 0)
        self.shell.setsockopt(zmq.RCVTIMEO, 30000)
        self.shell.connect(url("shell_port"))
        self.iopub = self.ctx.socket(zmq.SUB)
        self.iopub.setsockopt(zmq.LINGER, 0)
        self.iopub.setsockopt(zmq.RCVTIMEO, 30000)
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(url("iopub_port"))

    def close(self):
        self.shell.close()
        self.iopub.close()
        self.ctx.term()

    def send(self, code):
        header = {"msg_id": uuid.uuid4().hex, "session": self.session, "username": "bench",
                  "date": "2026-01-01T00:00:00Z", "msg_type": "execute_request", "version": "5.3"}
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                   "allow_stdin": False, "stop_on_error": False}
        parts = [json.dumps(x).encode() for x in (header, {}, {}, content)]
        sig = hmac.new(self.key, b"".join(parts), hashlib.sha256).hexdigest().encode()
        self.shell.send_multipart([b"<IDS|MSG>", sig] + parts)
        return header["msg_id"]

    def reply(self, msg_id):
        while True:
            frames = self.shell.recv_multipart()
            i = frames.index(b"<IDS|MSG>")
            if json.loads(frames[i + 3]).get("msg_id") == msg_id:
                return json.loads(frames[i + 5])

    def wait_idle(self, msg_id):
        while True:
            frames = self.iopub.recv_multipart()
            i = frames.index(b"<IDS|MSG>")
            header, parent = json.loads(frames[i + 2]), json.loads(frames[i + 3])
            if (header["msg_type"] == "status" and parent.get("msg_id") == msg_id
                    and json.loads(frames[i + 5]).get("execution_state") == "idle"):
                return

    def run(self, code):
        """The cell, to its execute_reply and its idle status."""
        msg_id = self.send(code)
        content = self.reply(msg_id)
        self.wait_idle(msg_id)
        if content.get("status") != "ok":
            raise gb.InfraError(f"cell {code!r} failed: {content}")

    def warm(self):
        """Until iopub's subscription is through (a SUB misses what is sent before it joins)."""
        import zmq
        for _ in range(100):
            msg_id = self.send("None")
            self.reply(msg_id)
            self.iopub.setsockopt(zmq.RCVTIMEO, 200)
            try:
                self.wait_idle(msg_id)
                return
            except zmq.Again:
                continue
            finally:
                self.iopub.setsockopt(zmq.RCVTIMEO, 30000)
        raise gb.InfraError("no idle status on iopub after 100 cells")


def round_trips(client, cells, warmup=20):
    """execute_request -> execute_reply (us), each cell's idle taken before the next is sent."""
    import time
    for _ in range(warmup):
        client.run("1")
    out = []
    for _ in range(cells):
        t = time.perf_counter()
        msg_id = client.send("1")
        client.reply(msg_id)
        out.append((time.perf_counter() - t) * 1e6)
        client.wait_idle(msg_id)
    return out


def measure_rtt(args, tmp):
    if os.geteuid() != 0:
        print("rtt: skipped (needs root: cellgate's kernels are jailed)")
        return None
    results = {}
    for label, extra in (("zygote", []), ("cold", ["--no-zygote"])):
        server = gb.start_cellgate(args.bin_dir, tmp, 4, ["--pool-size", "0", *extra],
                                   label=f"kernel-bench-{label}")
        try:
            if label == "zygote":  # a kernel started while the zygote imports is started cold
                gb.wait_log(server, gb.ZYGOTE_READY)
            kid = gb.start_kernel(server)
            record = json.loads((pathlib.Path(server.marker) / "kernels" / f"{kid}.json").read_text())
            client = DirectClient(record["connection"])
            try:
                client.warm()
                results[label] = round_trips(client, args.cells)
            finally:
                client.close()
            gb.delete_kernel(server, kid)
        finally:
            server.stop()
    z, c = (statistics.median(results[k]) for k in ("zygote", "cold"))
    print(f"\ntrivial-cell round trip on the kernel's own sockets, {args.cells} cells "
          "(execute_request -> execute_reply)")
    for label in ("zygote", "cold"):
        xs = sorted(results[label])
        print(f"  {label + ' kernel':<14} median {statistics.median(xs):7.0f} us   "
              f"p90 {xs[int(len(xs) * 0.9) - 1]:7.0f} us")
    print(f"  zygote / cold: {z / c:.2f} ({c / z:.2f}x faster)")
    return results


INIT_SCRIPT = r"""
import gc, importlib, json, os, resource, sys, time
for m in ("numpy", "pandas", "matplotlib", "matplotlib.pyplot", "ipykernel.kernelapp",
          "ipykernel.ipkernel", "ipykernel.zmqshell", "faulthandler", "IPython.core.completerlib"):
    importlib.import_module(m)
import matplotlib; matplotlib.use("Agg")
import matplotlib_inline.backend_inline
from matplotlib import font_manager; font_manager.fontManager.ttflist
gc.collect(); gc.freeze()
d = sys.argv[1]
conn = os.path.join(d, "conn.json")
json.dump({"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5,
           "ip": os.path.join(d, "k"), "key": "bench", "transport": "ipc",
           "signature_scheme": "hmac-sha256", "kernel_name": "python3"}, open(conn, "w"))

def initialize():
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    from ipykernel.kernelapp import IPKernelApp
    IPKernelApp.instance().initialize(["-f", conn, "--matplotlib=inline"])
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    # To a file: initialize() took over sys.stdout and fd 1 for the kernel's output.
    with open(os.path.join(d, "result.json"), "w") as f:
        json.dump({"ms": 1000 * (t1 - t0),
                   "cpu_ms": 1000 * (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime),
                   "minflt": r1.ru_minflt - r0.ru_minflt}, f)

if sys.argv[2] == "fork":
    pid = os.fork()
    if pid == 0:
        initialize()
        os._exit(0)
    os.waitpid(pid, 0)
else:
    initialize()
os._exit(0)  # the app's sockets and threads: no orderly teardown needed
"""


def measure_init(args, tmp):
    results = {}
    for mode in ("same", "fork"):
        runs = []
        for i in range(args.runs):
            d = tempfile.mkdtemp(prefix=f"init-{mode}-{i}-", dir=tmp)
            out = subprocess.run(["/usr/bin/python3", "-c", INIT_SCRIPT, d, mode], capture_output=True,
                                 text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": d})
            result = pathlib.Path(d) / "result.json"
            if out.returncode != 0 or not result.exists():
                raise gb.InfraError(f"init ({mode}) failed: {out.stderr[-2000:]}")
            runs.append(json.loads(result.read_text()))
        results[mode] = runs
    print(f"\nIPKernelApp.initialize() after the zygote's imports, median of {args.runs}")
    for mode, label in (("same", "in that process"), ("fork", "in a fork of it")):
        runs = results[mode]
        print(f"  {label:<16} {statistics.median(r['ms'] for r in runs):6.1f} ms wall   "
              f"{statistics.median(r['cpu_ms'] for r in runs):6.1f} ms CPU   "
              f"{statistics.median(r['minflt'] for r in runs):7.0f} minor faults")
    return results


def smaps_by_kind(pid):
    """{kind: [pss kB, private dirty kB]} of one process's mappings."""
    out = {}
    kind = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts[0].endswith(":") or not parts[0][:1].isupper():  # a mapping's first line
                name = parts[5] if len(parts) > 5 else ""
                if name == "[heap]":
                    kind = "malloc heap"
                elif name == "" or name.startswith("[stack") or name.startswith("[anon"):
                    kind = "other anonymous (arenas, stacks, buffers)"
                elif ".so" in os.path.basename(name) or os.path.basename(name).startswith("cellgate-"):
                    kind = "shared libraries and executables"
                else:
                    kind = "other (files, [vdso], ...)"
                out.setdefault(kind, [0, 0])
            elif parts[0] == "Pss:":
                out[kind][0] += int(parts[1])
            elif parts[0] == "Private_Dirty:":
                out[kind][1] += int(parts[1])
    return out


def measure_pss(args, tmp):
    if os.geteuid() != 0:
        print("pss: skipped (needs root: cellgate's kernels are jailed)")
        return None
    server = gb.start_cellgate(args.bin_dir, tmp, args.kernels + 4, ["--pool-size", "0"],
                               label="kernel-bench-pss")
    try:
        gb.wait_log(server, gb.ZYGOTE_READY)
        kids = [gb.start_kernel(server) for _ in range(args.kernels)]
        for kid in kids:
            kc = gb.KernelClient(server, kid)
            try:
                kc.run("import numpy, pandas, matplotlib.pyplot")
            finally:
                kc.close()
        table = gb.proc_table()
        tree = gb.descendants(server.proc.pid, table)
        reapers = {pid for pid, _ in tree if gb.cmdline(pid).startswith("cellgate-reaper")}
        kernels = [pid for pid, pp in tree if pp in reapers]
        if len(kernels) != args.kernels:
            raise gb.InfraError(f"found {len(kernels)} kernel processes under the gateway, not {args.kernels}")
        kinds = {}
        for pid in kernels:
            for kind, (pss, dirty) in smaps_by_kind(pid).items():
                k = kinds.setdefault(kind, [0, 0])
                k[0] += pss
                k[1] += dirty
        others = {"the jail's reaper": 0, "the kernel's launcher": 0, "the zygote's share": 0}
        for pid, pp in tree:
            if pid in kernels:
                continue
            kb = gb.pss_kib(pid) or 0
            if pid in reapers:
                others["the jail's reaper"] += kb
            elif pp == server.proc.pid and "cellgate-zygote" in gb.cmdline(pid).split()[0]:
                others["the zygote's share"] += kb
            elif pp == server.proc.pid:
                others["the kernel's launcher"] += kb
        n = args.kernels
        total = sum(v[0] for v in kinds.values()) + sum(others.values())
        print(f"\nPSS per zygote kernel, {n} kernels with numpy + pandas + matplotlib.pyplot imported "
              f"(MiB, mean): {total / n / 1024:.1f} in all")
        print(f"  {'the kernel process, by mapping':<44} {'PSS':>6} {'private dirty':>14}")
        for kind, (pss, dirty) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
            print(f"    {kind:<42} {pss / n / 1024:6.1f} {dirty / n / 1024:14.1f}")
        for name, kb in others.items():
            print(f"  {name:<44} {kb / n / 1024:6.1f}")
        for kid in kids:
            gb.delete_kernel(server, kid)
        return {"kinds": kinds, "others": others, "kernels": n}
    finally:
        server.stop()


def main():
    here = pathlib.Path(__file__).resolve()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help="sections, comma-separated (default all)")
    ap.add_argument("--cells", type=int, default=200, help="measured cells in rtt (default 200)")
    ap.add_argument("--runs", type=int, default=5, help="runs of each init mode (default 5)")
    ap.add_argument("--kernels", type=int, default=10, help="kernels in pss (default 10)")
    ap.add_argument("--bin-dir", default=str(here.parents[2] / "build" / "bin"))
    ap.add_argument("--quick", action="store_true", help="a few cells and runs: keeps the script working")
    args = ap.parse_args()
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)} (sections: {', '.join(SECTIONS)})")
    if args.quick:
        args.cells, args.runs, args.kernels = 20, 1, 2
    with tempfile.TemporaryDirectory(prefix="cellgate-kernel-bench-") as tmp:
        try:
            if "rtt" in sections:
                measure_rtt(args, tmp)
            if "init" in sections:
                measure_init(args, tmp)
            if "pss" in sections:
                measure_pss(args, tmp)
        except gb.InfraError as e:
            print(f"kernel_bench: {e}", file=sys.stderr)
            return 1
        finally:
            gb.unmount_leftovers(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
