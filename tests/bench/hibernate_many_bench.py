#!/usr/bin/env python3
"""Many hibernated kernels beside live ones (issue 26's benchmark; README, "Benchmarks"): the
gateway's RSS and the state dir's disk with --hibernated kernels checkpointed and --live kernels
running, against the same gateway with the live kernels only (the reference, measured in the
same run); the p50 of a hibernate while they pile up; and one hibernated kernel resumed among
them to its first reply.

Each hibernated kernel is a bare one (ipykernel, nothing imported): the figure is the per-kernel
cost of the records and images, not of user data. Two kernels are started and hibernated at a
time (2 cores). Bounded: every call has a timeout, and the gateway is stopped at the end.

Run: python3 tests/bench/hibernate_many_bench.py --bin-dir build/bin [--hibernated 1000]
     [--live 100]  (defaults 1000 and 100; --quick: 20 and 4)
Needs root and a CRIU (scripts/install-criu).
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import gateway_bench as gb  # noqa: E402

FLAGS = ("--no-zygote", "--checkpoint-without-landlock", "--pool-size", "0")
THREADS = 2


def call(server, method, path, body=None, timeout=300):
    status, raw = gb.http_request(server, method, path, body, timeout=timeout)
    return status, (json.loads(raw) if raw else None)


def rss_mib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def du_mib(path):
    total = 0
    for p in pathlib.Path(path).rglob("*"):
        try:
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
        except OSError:
            pass
    return total / 2**20


def in_parallel(count, fn):
    """fn(i) for i in range(count), THREADS at a time; the first error is raised."""
    errors, lock, next_i = [], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= count or errors:
                return
            try:
                fn(i)
            except Exception as e:  # noqa: BLE001  reported below
                errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default="build/bin")
    ap.add_argument("--hibernated", type=int, default=1000)
    ap.add_argument("--live", type=int, default=100)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.hibernated, args.live = 20, 4
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(args.bin_dir, tmp, args.hibernated + args.live + 8, FLAGS)
        try:
            in_parallel(args.live, lambda i: gb.start_kernel(server))
            base_rss = rss_mib(server.proc.pid)
            base_disk = du_mib(server.marker)
            print(f"{args.live} live kernels: gateway RSS {base_rss:.1f} MiB, state dir "
                  f"{base_disk:.1f} MiB (the reference)")

            hibernate_ms, ids, lock = [], [], threading.Lock()

            def one(i):
                kid = gb.start_kernel(server)
                start = time.monotonic()
                status, model = call(server, "POST", f"/api/kernels/{kid}/hibernate")
                ms = (time.monotonic() - start) * 1000
                if status != 200 or not model.get("hibernated"):
                    raise RuntimeError(f"hibernate {kid}: HTTP {status}: {model}\n"
                                       + server.log_tail())
                with lock:
                    hibernate_ms.append(ms)
                    ids.append(kid)
                    done = len(ids)
                if done % 100 == 0:
                    print(f"  {done} hibernated", flush=True)

            began = time.monotonic()
            in_parallel(args.hibernated, one)
            took = time.monotonic() - began
            rss = rss_mib(server.proc.pid)
            disk = du_mib(server.marker)
            status, listed = call(server, "GET", "/api/kernels")
            assert status == 200 and len(listed) == args.hibernated + args.live, len(listed)
            hib = sum(1 for k in listed if k.get("hibernated"))
            print(f"{hib} hibernated beside {args.live} live (made in {took:.0f} s):")
            print(f"  gateway RSS {rss:.1f} MiB: +{rss - base_rss:.1f} MiB, "
                  f"{(rss - base_rss) * 1024 / max(1, hib):.1f} KiB per hibernated kernel")
            print(f"  state dir {disk:.1f} MiB: +{disk - base_disk:.1f} MiB, "
                  f"{(disk - base_disk) / max(1, hib):.2f} MiB per hibernated kernel")
            print(f"  hibernate p50 {statistics.median(hibernate_ms):.0f} ms, "
                  f"p90 {sorted(hibernate_ms)[int(len(hibernate_ms) * 0.9)]:.0f} ms "
                  f"({THREADS} at a time)")
            start = time.monotonic()
            status, answer = call(server, "POST", f"/api/kernels/{ids[0]}/execute",
                                  {"code": "1 + 1", "timeout": 60})
            ms = (time.monotonic() - start) * 1000
            assert status == 200 and answer["status"] == "ok", answer
            print(f"  one of them resumed to its first reply: {ms:.0f} ms")
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)


if __name__ == "__main__":
    main()
