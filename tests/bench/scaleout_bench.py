#!/usr/bin/python3
"""What the router costs and what three nodes bring: real gateways in network namespaces behind
HAProxy (tests/scaleout/cluster), one run, figures and ratios printed (no pass/fail).

- a pool start (POST /api/kernels with the node's pool ready: the POST, and POST → WebSocket →
  first execute_reply) and a trivial cell's round trip over the WebSocket, p50, through the
  router vs straight to the node (the goal: the router within +1 ms);
- 100 starts at once through the router, spread over 3 nodes: wall time, per-node counts;
- cells/s of several clients at once with their kernels on 3 nodes vs all on 1 (through the
  router both times);
- GET /api/kernels through the router (merging 3 nodes) vs ?scope=local (one node's), p50;
- GET /api through the router vs straight, on a new connection each and kept alive, p50;
- the pool start and GET /api again with the generated config plus
  `tune.listener.multi-queue off` (a graceful reload, `cluster reload --global`).

    sudo tests/bench/scaleout_bench.py [--quick] [--bin-dir build/bin]

Needs root (namespaces, the jail) and haproxy. The cluster is always ended (`cluster down`).
"""

import argparse
import collections
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import gateway_bench as gb  # noqa: E402

CLUSTER = os.path.join(ROOT, "tests", "scaleout", "cluster")
NODES = 3


def ctl(*args, timeout=600):
    done = subprocess.run([CLUSTER, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise gb.InfraError(f"cluster {' '.join(args)}: {done.stderr}")
    return done.stdout


def view(name, host, port, token):
    """What gateway_bench's helpers take as a server."""
    return type("View", (), {"name": name, "host": host, "port": port, "token": token,
                             "kernel_name": "python3"})


def p50(xs):
    return statistics.median(xs) if xs else float("nan")


def pool_starts(client_view, node_view, runs, pool_size):
    """[(post ms, first reply ms)] of pool starts through client_view on node_view's node (the
    others drain meanwhile, so the router places there too), the pool full before each."""
    out = []
    for _ in range(runs):
        gb.wait_pool_ready(node_view, pool_size, timeout=120.0)
        t0 = time.perf_counter()
        kid = gb.start_kernel(client_view)
        t1 = time.perf_counter()
        kc = gb.KernelClient(client_view, kid)
        kc.run("1")
        t2 = time.perf_counter()
        kc.close()
        gb.delete_kernel(client_view, kid)
        if kid[:4] != node_view.tag:
            raise gb.InfraError(f"a start landed on {kid[:4]}, not {node_view.tag}")
        out.append(((t1 - t0) * 1e3, (t2 - t0) * 1e3))
    return out


def router_state(socket_path, backend, server):
    """HAProxy's status word for a server ("UP", "DRAIN", ...) from its Runtime API."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(socket_path)
            s.sendall(b"show stat\n")
            text = b"".join(iter(lambda: s.recv(65536), b"")).decode()
    except OSError:
        return ""
    lines = text[2:].splitlines() if text.startswith("# ") else []
    rows = [dict(zip(lines[0].split(","), x.split(","))) for x in lines[1:] if x] if lines else []
    for r in rows:
        if (r["pxname"], r["svname"]) == (backend, server):
            return r["status"].split(" ")[0]
    return ""


def drain(nodes, on, socket_path):
    """POST /api/node/drain {drain: on} to each node; waits for the router to see it."""
    for v in nodes:
        status, body = gb.http_request(v, "POST", "/api/node/drain", {"drain": on}, timeout=30)
        if status != 200:
            raise gb.InfraError(f"{v.name}: drain -> {status} {body[:200]!r}")
    want = "DRAIN" if on else "UP"
    deadline = time.monotonic() + 30
    while not all(router_state(socket_path, "be_place", f"n{int(v.tag, 16)}") == want
                  for v in nodes):
        if time.monotonic() > deadline:
            raise gb.InfraError(f"the router did not see {[v.name for v in nodes]} {want}")
        time.sleep(0.05)


def round_trips(views, kid, count, blocks):
    """{name: [µs]}: the same kernel's trivial-cell round trip over each view's WebSocket, in
    alternating blocks (so drift hits both alike)."""
    clients = {v.name: gb.KernelClient(v, kid) for v in views}
    try:
        for kc in clients.values():
            gb.measure_round_trip(kc, 0, 20)
        out = {name: [] for name in clients}
        for _ in range(blocks):
            for name, kc in clients.items():
                out[name] += gb.measure_round_trip(kc, max(1, count // blocks), 0)
        return out
    finally:
        for kc in clients.values():
            kc.close()


def burst(router, count, timeout):
    """count POST /api/kernels at once through the router: (wall s, {tag: n}, failures, ids)."""
    kids, failures = [None] * count, []
    lock = threading.Lock()

    def one(i):
        try:
            kids[i] = gb.start_kernel(router, timeout=timeout)
        except gb.InfraError as e:
            with lock:
                failures.append(str(e)[:200])

    t0, ends = gb.run_together(router, count, one, timeout + 30, strict=False)
    done = [e - t0 for e in ends if e is not None]
    made = [k for k in kids if k]
    wall = max(done) if done else float("nan")
    return wall, p50(done), collections.Counter(k[:4] for k in made), failures, made


def mem_available_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cells_rate(router, kids, cells):
    """Each kernel's client runs `cells` trivial cells, all clients at once: cells/s."""
    clients = [gb.KernelClient(router, kid) for kid in kids]
    try:
        for kc in clients:
            kc.run("1")
        t0, ends = gb.run_together(router, len(clients),
                                   lambda i: [clients[i].run("1") for _ in range(cells)],
                                   timeout=600)
        return len(clients) * cells / (max(ends) - t0)
    finally:
        for kc in clients:
            kc.close()


def get_latency(v, count, keepalive):
    """[ms] of GET /api: each on a new connection (as gateway_bench's clients do), or all on
    one kept-alive connection."""
    head = {"Authorization": f"token {v.token}"}
    out = []
    conn = None
    for _ in range(count):
        t0 = time.perf_counter()
        if conn is None:
            conn = http.client.HTTPConnection(v.host, v.port, timeout=30)
        conn.request("GET", "/api", headers=head)
        res = conn.getresponse()
        res.read()
        out.append((time.perf_counter() - t0) * 1e3)
        if res.status != 200:
            raise gb.InfraError(f"{v.name}: GET /api -> {res.status}")
        if not keepalive:
            conn.close()
            conn = None
    if conn is not None:
        conn.close()
    return out


def connection_costs(router, direct, count):
    """{(path, mode): p50 ms} of GET /api through the router and straight, new connections and
    one kept alive, interleaved."""
    out = collections.defaultdict(list)
    for _ in range(4):
        for v in (router, direct):
            for keep in (False, True):
                out[(v.name, keep)] += get_latency(v, max(1, count // 4), keep)
    return {k: p50(x) for k, x in out.items()}


def print_connection_costs(label, costs):
    for keep, what in ((False, "new connection"), (True, "kept alive")):
        r, d = costs[("router", keep)], costs[("direct", keep)]
        print(f"GET /api p50, {what + ',':16} {label}: router {r:6.2f} ms   direct {d:6.2f} ms"
              f"   router +{r - d:.2f} ms", flush=True)


def haproxy_timers(log_path, request, since):
    """p50 of HAProxy's own timers (httplog TR/Tw/Tc/Tr/Ta, ms) over its log lines for
    `request` after byte offset `since`: where the router's time goes."""
    rows = []
    with open(log_path, "rb") as f:
        f.seek(since)
        for line in f.read().decode(errors="replace").splitlines():
            words = line.split()
            if f'"{request} ' in line and len(words) > 4 and words[4].count("/") == 4:
                rows.append([int(x) for x in words[4].split("/")])
    if not rows:
        return None
    return {name: p50([r[i] for r in rows]) for i, name in enumerate(("TR", "Tw", "Tc", "Tr",
                                                                     "Ta"))}


def list_latency(v, path, count):
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        status, _ = gb.http_request(v, "GET", path, timeout=30)
        out.append((time.perf_counter() - t0) * 1e3)
        if status != 200:
            raise gb.InfraError(f"GET {path} -> {status}")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a small run that keeps this working")
    p.add_argument("--bin-dir", default=os.environ.get("CELLGATE_BIN_DIR",
                                                       os.path.join(ROOT, "build", "bin")))
    p.add_argument("--starts", type=int, help="pool starts per side (default 20; quick 5)")
    p.add_argument("--rtt", type=int, help="round trips per side (default 400; quick 20)")
    p.add_argument("--burst", type=int, help="starts at once (default 100; quick 10; 0: none)")
    p.add_argument("--clients", type=int, default=6, help="kernels running cells at once (6)")
    p.add_argument("--cells", type=int, help="cells per client (default 200; quick 20; 0: none)")
    p.add_argument("--max-kernels", type=int, default=40, help="per node (40)")
    p.add_argument("--pool-size", type=int, default=2, help="per node (2)")
    p.add_argument("--keep-logs", action="store_true",
                   help="copy the nodes' and routers' logs out before `cluster down` (always "
                        "when a start failed)")
    a = p.parse_args()
    q = a.quick
    starts = a.starts or (5 if q else 20)
    rtt = a.rtt or (20 if q else 400)
    burst_n = a.burst if a.burst is not None else (10 if q else 100)
    cells = a.cells if a.cells is not None else (20 if q else 200)
    if os.geteuid() != 0:
        print("scaleout_bench: needs root (network namespaces, the jail)", file=sys.stderr)
        return 2

    directory = os.path.join(tempfile.mkdtemp(prefix="cellgate-scaleout-bench-"), "cluster")
    failed_starts = []
    try:
        t0 = time.monotonic()
        info = json.loads(ctl("up", "--nodes", str(NODES), "--json", "--dir", directory,
                              "--bin-dir", os.path.abspath(a.bin_dir), "--pool-size",
                              str(a.pool_size), "--max-kernels", str(a.max_kernels)))
        print(f"cluster up: {NODES} nodes, pool {a.pool_size}, max {a.max_kernels} kernels each,"
              f" in {time.monotonic() - t0:.1f} s", flush=True)
        token = info["token"]
        port = int(info["url"].rsplit(":", 1)[1])
        router = view("router", "127.0.0.1", port, token)
        nodes = []
        for n in info["nodes"]:
            v = view(f"node {n['n']}", n["address"], 8888, token)
            v.tag = n["tag"]
            nodes.append(v)
        r = {}

        # Pool start on node 0 (1 and 2 drain meanwhile): through the router vs straight.
        direct0 = view("direct", nodes[0].host, 8888, token)
        sock = info["routers"][0]["socket"]
        drain(nodes[1:], True, sock)
        rlog = info["routers"][0]["log"]
        mark = os.path.getsize(rlog)
        via = pool_starts(router, nodes[0], starts, a.pool_size)
        timers = haproxy_timers(rlog, "POST /api/kernels", mark)
        straight = pool_starts(direct0, nodes[0], starts, a.pool_size)
        drain(nodes[1:], False, sock)
        r["start"] = {"router": via, "direct": straight}
        print(f"pool start, POST p50:        router {p50([x[0] for x in via]):7.2f} ms   "
              f"direct {p50([x[0] for x in straight]):7.2f} ms   (n={len(via)}/{len(straight)})")
        print(f"pool start, to reply p50:    router {p50([x[1] for x in via]):7.2f} ms   "
              f"direct {p50([x[1] for x in straight]):7.2f} ms", flush=True)
        print(f"  HAProxy's timers for those POSTs, p50 ms: {timers}")
        r["haproxy_post_timers"] = timers

        # What the router adds to a plain request, per new connection and kept alive.
        n_get = 40 if q else 400
        costs = connection_costs(router, direct0, n_get)
        r["get"] = costs
        print_connection_costs("generated config", costs)

        # Round trip on one kernel of node 0, over both paths.
        kid = gb.start_kernel(direct0)
        trips = round_trips([view("router", "127.0.0.1", port, token), direct0], kid, rtt, 4)
        gb.delete_kernel(direct0, kid)
        r["rtt"] = trips
        rr, rd = p50(trips["router"]), p50(trips["direct"])
        print(f"cell round trip p50:         router {rr / 1e3:7.3f} ms   direct {rd / 1e3:7.3f} ms"
              f"   router +{(rr - rd) / 1e3:.3f} ms (n={rtt})", flush=True)

        # Many starts at once, spread by the router (--burst 0: skipped).
        if burst_n > 0:
            mem0 = mem_available_mib()
            wall, mid, per_node, failures, made = burst(router, burst_n, 300)
            mem1 = mem_available_mib()
            failed_starts += failures
            r["burst"] = {"wall": wall, "p50": mid, "per_node": dict(per_node),
                          "failures": failures, "mem_mib": mem0 - mem1}
            print(f"{burst_n} starts at once:        {wall:.1f} s wall (p50 {mid:.1f} s), per "
                  f"node {dict(sorted(per_node.items()))}, {len(failures)} failed; MemAvailable "
                  f"{mem0 - mem1:.0f} MiB lower with them up", flush=True)
            for f in failures[:3]:
                print(f"  failed: {f}")
            gb.delete_all(router, made)

        # Cells/s: clients' kernels all on node 0, then spread over the 3 nodes (--cells 0:
        # skipped).
        spread = []
        if cells > 0:
            one = [gb.start_kernel(nodes[0]) for _ in range(a.clients)]
            rate1 = cells_rate(router, one, cells)
            gb.delete_all(router, one)
            spread = [gb.start_kernel(nodes[i % NODES]) for i in range(a.clients)]
            rate3 = cells_rate(router, spread, cells)
            r["cells"] = {"one": rate1, "three": rate3}
            print(f"cells/s, {a.clients} clients x {cells}:  1 node {rate1:7.0f}   3 nodes "
                  f"{rate3:7.0f}   ratio {rate3 / rate1:.2f}", flush=True)

        # Lists, with those kernels listed (2 per node; none with --cells 0).
        n_list = 20 if q else 200
        merged = list_latency(router, "/api/kernels", n_list)
        local = list_latency(router, "/api/kernels?scope=local", n_list)
        r["lists"] = {"merged": merged, "local": local}
        print(f"GET /api/kernels p50:        merged (3 nodes) {p50(merged):6.2f} ms   "
              f"?scope=local {p50(local):6.2f} ms   ratio {p50(merged) / p50(local):.2f}")
        gb.delete_all(router, spread)
        # A variant of the generated config: with `tune.listener.multi-queue off` the thread
        # that accepts a connection serves it, instead of handing it to another thread (a
        # wake-up that cost ~3 ms per new connection on this 2-vCPU VM).
        ctl("reload", "--dir", directory, "--global", "tune.listener.multi-queue off")
        drain(nodes[1:], True, sock)
        via_mq = pool_starts(router, nodes[0], starts, a.pool_size)
        drain(nodes[1:], False, sock)
        costs_mq = connection_costs(router, direct0, n_get)
        r["multi_queue_off"] = {"start_post_ms": p50([x[0] for x in via_mq]),
                                "get": {f"{k[0]}{'-keepalive' if k[1] else ''}": v
                                        for k, v in costs_mq.items()}}
        print(f"pool start, POST p50, multi-queue off: router {p50([x[0] for x in via_mq]):7.2f}"
              f" ms (generated config: router {p50([x[0] for x in via]):.2f} ms, direct "
              f"{p50([x[0] for x in straight]):.2f} ms)")
        print_connection_costs("multi-queue off", costs_mq)
        print("json: " + json.dumps({
            "get_ms": {f"{k[0]}{'-keepalive' if k[1] else ''}": v for k, v in r["get"].items()},
            "multi_queue_off": r["multi_queue_off"],
            "haproxy_post_timers": r["haproxy_post_timers"],
            "start_post_ms": {k: p50([x[0] for x in v]) for k, v in r["start"].items()},
            "start_reply_ms": {k: p50([x[1] for x in v]) for k, v in r["start"].items()},
            "rtt_us": {k: p50(v) for k, v in r["rtt"].items()}, "burst": r.get("burst"),
            "cells_per_s": r.get("cells"),
            "list_ms": {k: p50(v) for k, v in r["lists"].items()}}))
        return 0
    except gb.InfraError as e:
        print(f"scaleout_bench: {e}", file=sys.stderr)
        return 1
    finally:
        if failed_starts or a.keep_logs:
            # The nodes' and the router's logs outlive `cluster down` when a start failed.
            keep = tempfile.mkdtemp(prefix="cellgate-scaleout-logs-")
            for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
                src = os.path.join(directory, name)
                if name.endswith(".log"):
                    shutil.copy(src, keep)
                elif name.startswith("router-") and os.path.exists(src + "/haproxy.log"):
                    shutil.copy(src + "/haproxy.log", os.path.join(keep, f"{name}.log"))
            print(f"logs kept in {keep}", file=sys.stderr)
        ctl("down", "--dir", directory)
        try:
            os.rmdir(os.path.dirname(directory))
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
