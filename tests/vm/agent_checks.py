#!/usr/bin/python3
"""Containment checks through the agent API of a running `cellgate serve`.

Run by tests/vm/guest-suite inside the systemd guest (and usable against any gateway):

    agent_checks.py --port 8899 --token T --memory 268435456 --pids 64 --cpus 0.5 [--cgroup-root D]

The gateway must run with those --memory, --pids and --cpus. Checks, each printed PASS/FAIL:
state kept across cells; a matplotlib figure comes back as a PNG artifact; a memory bomb is
killed by the memory limit and counted as an OOM kill in /metrics while a neighbour kernel keeps
its variables; a fork bomb stops at pids.max and the kernel answers on; a busy loop is held to
the cpu quota (cpu_ms / wall_ms of the cell's metrics). With --cgroup-root (the gateway's
delegated cgroup), the kernels' cgroups are looked up below it and their limit files checked.
Exits 1 if any check failed.
"""
import argparse
import http.client
import json
import os
import sys
import time

failures = []


def check(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'}: {name}" + (f" ({detail})" if detail and not ok else ""),
          flush=True)
    if not ok:
        failures.append(name)
    return ok


class Gateway:
    def __init__(self, port, token):
        self.port = port
        self.token = token

    def request(self, method, path, body=None, timeout=120):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            headers = {"Authorization": f"token {self.token}"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def start_kernel(self):
        status, body = self.request("POST", "/api/kernels", {"name": "python3"}, timeout=300)
        if status != 201:
            raise RuntimeError(f"POST /api/kernels -> {status}: {body[:300]!r}")
        return json.loads(body)["id"]

    def execute(self, kid, code, timeout=120):
        status, body = self.request("POST", f"/api/kernels/{kid}/execute",
                                    {"code": code, "timeout": timeout}, timeout=timeout + 60)
        if status != 200:
            raise RuntimeError(f"execute -> {status}: {body[:300]!r}")
        return json.loads(body)

    def metrics(self):
        status, body = self.request("GET", "/metrics")
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        return f"<{e.strerror}>"


def kernel_cgroup(root, kid):
    """The kernel's cgroup dir below the gateway's delegated cgroup: <root>/cellgate/k-<id>."""
    return os.path.join(root, "cellgate", f"k-{kid}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--memory", type=int, required=True)
    ap.add_argument("--pids", type=int, required=True)
    ap.add_argument("--cpus", type=float, required=True)
    ap.add_argument("--cgroup-root", default="")
    args = ap.parse_args()
    gw = Gateway(args.port, args.token)

    t0 = time.monotonic()
    a = gw.start_kernel()
    print(f"kernel A {a} answered its start in {time.monotonic() - t0:.1f} s", flush=True)
    r = gw.execute(a, "x = 41")
    r = gw.execute(a, "x + 1")
    check("state persists across cells", r["status"] == "ok" and
          (r.get("result") or {}).get("text/plain") == "42", r)

    r = gw.execute(a, "import matplotlib.pyplot as plt\n"
                      "plt.plot([1, 2, 3], [1, 4, 9]); plt.title('squares'); plt.show()", 300)
    pngs = [o for o in r.get("outputs", []) if "image/png" in o.get("data", {})]
    check("a figure comes back as a PNG", r["status"] == "ok" and pngs and
          pngs[0]["data"]["image/png"].startswith("iVBORw0KGgo") and r.get("artifacts"),
          {k: r.get(k) for k in ("status", "stderr", "error", "artifacts")})

    if args.cgroup_root:
        cg = kernel_cgroup(args.cgroup_root, a)
        check("the kernel's cgroup is beside the gateway's leaf", os.path.isdir(cg), cg)
        check("memory.max is --memory", read(f"{cg}/memory.max") == str(args.memory),
              read(f"{cg}/memory.max"))
        check("memory.swap.max is 0", read(f"{cg}/memory.swap.max") == "0",
              read(f"{cg}/memory.swap.max"))
        check("pids.max is --pids", read(f"{cg}/pids.max") == str(args.pids), read(f"{cg}/pids.max"))
        quota = round(args.cpus * 100000)
        check("cpu.max is --cpus", read(f"{cg}/cpu.max") == f"{quota} 100000", read(f"{cg}/cpu.max"))

    # A memory bomb in its own kernel: killed by the limit, reported, the neighbour untouched.
    b = gw.start_kernel()
    before = gw.metrics().get("cellgate_kernel_oom_kills_total", 0)
    r = gw.execute(b, "b = b'x' * (4 * %d)" % args.memory, 120)
    check("a memory bomb ends its cell (dead or error)", r["status"] in ("dead", "error"),
          {k: r.get(k) for k in ("status", "message", "error")})
    deadline = time.monotonic() + 60
    after = before
    while time.monotonic() < deadline:
        after = gw.metrics().get("cellgate_kernel_oom_kills_total", 0)
        if after > before:
            break
        time.sleep(0.5)
    check("the memory bomb counts as an OOM kill (memory.events)", after == before + 1,
          f"{before} -> {after}")
    r = gw.execute(a, "x")
    check("the neighbour kernel keeps its variables",
          r["status"] == "ok" and (r.get("result") or {}).get("text/plain") == "41", r)

    # A fork bomb: stopped at pids.max; the kernel answers afterwards.
    r = gw.execute(a, "import os, time\nn = 0\nkids = []\ntry:\n"
                      "    while n < 10000:\n"
                      "        pid = os.fork()\n"
                      "        if pid == 0:\n"
                      "            time.sleep(60); os._exit(0)\n"
                      "        kids.append(pid); n += 1\n"
                      "except OSError as e:\n"
                      "    print('stopped', n, e.errno)\n"
                      "for k in kids:\n"
                      "    os.kill(k, 9); os.waitpid(k, 0)\n", 120)
    out = r.get("stdout", "")
    forks = int(out.split()[1]) if out.startswith("stopped") else -1
    check("a fork bomb stops at pids.max", r["status"] == "ok" and 0 < forks < args.pids,
          {k: r.get(k) for k in ("status", "stdout", "stderr", "error")})
    r = gw.execute(a, "x * 2")
    check("the kernel answers after the fork bomb",
          r["status"] == "ok" and (r.get("result") or {}).get("text/plain") == "82", r)

    # cpu.max: a 3 s busy loop gets about --cpus of a CPU.
    r = gw.execute(a, "import time\nt = time.time()\nwhile time.time() - t < 3:\n    pass", 60)
    m = r.get("metrics", {})
    share = m.get("cpu_ms", 0) / max(1, m.get("wall_ms", 1))
    print(f"busy loop: cpu_ms {m.get('cpu_ms')} over wall_ms {m.get('wall_ms')} = {share:.2f} "
          f"(--cpus {args.cpus})", flush=True)
    check("cpu.max holds a busy loop to the quota", r["status"] == "ok" and
          args.cpus * 0.5 < share < args.cpus * 1.25, m)
    if args.cgroup_root:
        stat = read(f"{kernel_cgroup(args.cgroup_root, a)}/cpu.stat")
        throttled = dict(line.split() for line in stat.splitlines() if " " in line)
        check("cpu.stat shows the kernel throttled", int(throttled.get("nr_throttled", 0)) > 0,
              stat)

    for kid in (a, b):
        gw.request("DELETE", f"/api/kernels/{kid}")
    if args.cgroup_root:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
                os.path.exists(kernel_cgroup(args.cgroup_root, k)) for k in (a, b)):
            time.sleep(0.5)
        check("deleted kernels' cgroups are removed",
              not any(os.path.exists(kernel_cgroup(args.cgroup_root, k)) for k in (a, b)))
    print(f"agent checks: {len(failures)} failed" + (f": {', '.join(failures)}" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
