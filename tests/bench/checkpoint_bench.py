#!/usr/bin/env python3
"""Checkpoint figures through `cellgate serve` (README, "Benchmarks"): hibernate, resume to the
first execute_reply, image size, a snapshot's pause, fork to the copy's first reply (one, and
several at once), each beside the reference measured in the same run: a cold kernel start to its
first reply on the same gateway.

The kernel: numpy and pandas imported and --arrays-mb of float arrays (100 by default; --quick:
10 MB, 2 runs, a fork of 4: it only keeps the script working). Targets from issue 26 are printed
beside the figures; a miss is printed, not failed (figures are not tests).

Run: python3 tests/bench/checkpoint_bench.py --bin-dir build/bin [--quick]
Needs root and a CRIU (scripts/install-criu)."""
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


def call(server, method, path, body=None, timeout=300):
    status, raw = gb.http_request(server, method, path, body, timeout=timeout)
    return status, (json.loads(raw) if raw else None)


def timed(fn):
    start = time.monotonic()
    out = fn()
    return (time.monotonic() - start) * 1000, out


def first_reply(server, kid):
    status, answer = call(server, "POST", f"/api/kernels/{kid}/execute",
                          {"code": "1", "timeout": 60})
    assert status == 200 and answer["status"] == "ok", (status, answer, server.log_tail())


def du(path):
    return sum(p.stat().st_size for p in pathlib.Path(path).rglob("*") if p.is_file())


def p50(values):
    return statistics.median(values)


def line(what, ms, target=None, ref=None):
    extra = f"  target <= {target} ms: {'met' if ms <= target else 'MISSED'}" if target else ""
    ratio = f"  ({ms / ref:.2f}x a cold start)" if ref else ""
    print(f"  {what:<44} p50 {ms:8.1f} ms{ratio}{extra}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default="build/bin")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--arrays-mb", type=int, default=None)
    args = ap.parse_args()
    runs = 2 if args.quick else 5
    arrays_mb = args.arrays_mb if args.arrays_mb is not None else (10 if args.quick else 100)
    fan = 4 if args.quick else 16
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(args.bin_dir, tmp, fan + 8, FLAGS)
        try:
            cold = []
            for _ in range(runs):
                ms, kid = timed(lambda: gb.start_kernel(server))
                ms2, _ = timed(lambda: first_reply(server, kid))
                cold.append(ms + ms2)
                gb.delete_kernel(server, kid)
            ref = p50(cold)

            kid = gb.start_kernel(server)
            setup = (f"import numpy as np, pandas as pd\n"
                     f"arrays = [np.random.rand(1 << 17) for _ in range({arrays_mb})]\n"
                     f"df = pd.DataFrame({{'a': np.arange(10)}})")
            status, answer = call(server, "POST", f"/api/kernels/{kid}/execute",
                                  {"code": setup, "timeout": 300})
            assert status == 200 and answer["status"] == "ok", answer
            status, answer = call(server, "POST", f"/api/kernels/{kid}/hibernate")
            if status == 501:
                print(f"checkpoints unavailable: {answer['message']}")
                return 0
            first_reply(server, kid)  # resumed: the measured runs start from a warm state
            hib, res, image = [], [], []
            for _ in range(runs):
                ms, (status, answer) = timed(
                    lambda: call(server, "POST", f"/api/kernels/{kid}/hibernate"))
                assert status == 200, answer
                hib.append(ms)
                image.append(du(pathlib.Path(server.marker, "kernels", kid, "hibernated")))
                ms, _ = timed(lambda: first_reply(server, kid))
                res.append(ms)
            snap, snaps = [], []
            for _ in range(runs):
                ms, (status, answer) = timed(
                    lambda: call(server, "POST", f"/api/kernels/{kid}/snapshots"))
                assert status == 201, answer
                snap.append(ms)
                snaps.append(answer["id"])
            for sid in snaps:
                call(server, "DELETE", f"/api/snapshots/{sid}")
            fork1 = []
            for _ in range(runs):
                def one():
                    status, copies = call(server, "POST", f"/api/kernels/{kid}/fork")
                    assert status == 201, copies
                    first_reply(server, copies[0]["id"])
                    return copies[0]["id"]
                ms, copy = timed(one)
                fork1.append(ms)
                gb.delete_kernel(server, copy)
            # `fan` copies at once, each then answering its first cell, in parallel.
            start = time.monotonic()
            status, copies = call(server, "POST", f"/api/kernels/{kid}/fork", {"count": fan})
            assert status == 201, copies
            threads = [threading.Thread(target=first_reply, args=(server, c["id"]))
                       for c in copies]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            fan_ms = (time.monotonic() - start) * 1000
            for c in copies:
                gb.delete_kernel(server, c["id"])

            print(f"checkpoint bench: a kernel with numpy, pandas and {arrays_mb} MB of arrays, "
                  f"{runs} runs; reference: a cold start to its first reply, p50 {ref:.0f} ms")
            line("hibernate (the POST)", p50(hib), 300, ref)
            print(f"  {'image on disk (zstd)':<44} p50 {p50(image) / 2**20:8.1f} MiB; "
                  f"RAM while hibernated: 0 (no process, no cgroup)")
            line("resume -> first execute_reply", p50(res), 150, ref)
            line("snapshot (the kernel's pause)", p50(snap), None, ref)
            line("fork of 1 -> the copy's first reply", p50(fork1), 300, ref)
            print(f"  {f'fork of {fan} at once -> every first reply':<44} "
                  f"{fan_ms:8.1f} ms ({fan_ms / fan:.0f} ms per copy)")
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
