#!/usr/bin/python3
"""Wall time for notebooks: `cellgate run` (jailed kernels, embedded gateway) versus Debian's
nbclient (unjailed ipykernel), same machine, one run each. Not a timed test.

    sudo CELLGATE_BIN_DIR=build/bin /usr/bin/python3 tests/notebooks/bench_run.py
    sudo CELLGATE_BIN_DIR=build/bin /usr/bin/python3 tests/notebooks/bench_run.py --batch 200

Without --batch: the six examples one after the other, a fresh kernel per notebook, from a fresh
process (process start and imports are counted on both sides); `cellgate run --jobs 3` too.
With --batch N: N small notebooks in a temp dir -- the examples (with their data/) copied round
robin for half of them, generated ones (arithmetic, a function, numpy, a pandas DataFrame, one in
five a matplotlib figure) for the rest --, run by `cellgate run` with --jobs 1 and --jobs J
(a batch forks its kernels from one zygote), by nbclient one after the other in one process,
and by J nbclient processes each taking every J-th notebook. Prints wall time, notebooks per
second and the throughput ratios; docs/run.md records them.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("CELLGATE_BIN_DIR") or REPO / "build" / "bin")
NOTEBOOKS = REPO / "notebooks" / "examples"
EXAMPLES = sorted(NOTEBOOKS.glob("*.ipynb"))

NBCLIENT = """
import os, sys, nbclient, nbformat
for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                            resources={"metadata": {"path": os.path.dirname(path)}}).execute()
"""


def timed(argv, env=None) -> float:
    started = time.monotonic()
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, env=env)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"{argv[0]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


def generated_cells(i: int) -> list:
    cells = [f"n = {i}\ntotal = sum(range(n + 10))\nprint(total)",
             "def f(x):\n    return x * x + n\n[f(k) for k in range(5)]",
             "import numpy as np\na = np.arange(100).reshape(10, 10)\nfloat(a.mean() + n)",
             "import pandas as pd\ndf = pd.DataFrame({'k': range(5), 'v': [n * j for j in range(5)]})\n"
             "df.describe()"]
    if i % 5 == 0:
        cells.append("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [n, n + 1, n + 4])\n"
                     "plt.show()")
    return cells


def write_generated(path: Path, i: int) -> None:
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}-{k}",
                     "metadata": {}, "outputs": [], "source": src}
                    for k, src in enumerate(generated_cells(i))],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                      "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))


def make_batch(directory: Path, count: int) -> list:
    shutil.copytree(NOTEBOOKS / "data", directory / "data")
    paths = []
    for i in range(count):
        path = directory / f"nb{i:04d}.ipynb"
        if i % 2 == 0:
            shutil.copyfile(EXAMPLES[(i // 2) % len(EXAMPLES)], path)
        else:
            write_generated(path, i)
        paths.append(path)
    return paths


def timed_parallel(argvs, env) -> float:
    started = time.monotonic()
    procs = [subprocess.Popen(a, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=env) for a in argvs]
    for p, a in zip(procs, argvs):
        _, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"{a[0]} failed ({p.returncode}):\n{err[-3000:]}")
    return time.monotonic() - started


def batch(count: int, jobs: int, env) -> None:
    with tempfile.TemporaryDirectory(prefix="cellgate-bench-batch-") as tmp:
        paths = make_batch(Path(tmp), count)
        names = list(map(str, paths))
        print(f"{count} notebooks ({count // 2 + count % 2} copies of the examples, {count // 2} "
              f"generated) on {os.cpu_count()} CPUs")
        cellgate = str(BIN_DIR / "cellgate")
        nbclient_env = dict(env, PYDEVD_DISABLE_FILE_VALIDATION="1")
        runs = [
            ("nbclient, one after the other",
             lambda: timed(["/usr/bin/python3", "-c", NBCLIENT, *names], nbclient_env)),
            ("cellgate run --jobs 1 (jailed)",
             lambda: timed([cellgate, "run", "--no-progress", "--jobs", "1", *names], env)),
            (f"cellgate run --jobs {jobs} (jailed)",
             lambda: timed([cellgate, "run", "--no-progress", "--jobs", str(jobs), *names], env)),
            (f"nbclient, {jobs} processes",
             lambda: timed_parallel([["/usr/bin/python3", "-c", NBCLIENT, *names[k::jobs]]
                                     for k in range(jobs)], nbclient_env)),
        ]
        seconds = {}
        for label, run in runs:
            seconds[label] = run()
            base = seconds[runs[0][0]]
            print(f"{label:36s} {seconds[label]:7.1f} s  {count / seconds[label]:6.2f} "
                  f"notebooks/s  {base / seconds[label]:5.1f}x nbclient one after the other",
                  flush=True)
        print(f"cellgate --jobs {jobs} vs nbclient in {jobs} processes: "
              f"{seconds[runs[3][0]] / seconds[runs[2][0]]:.1f}x", flush=True)


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("cellgate's jailed kernels need root")
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=0, help="N generated + copied notebooks")
    ap.add_argument("--jobs", type=int, default=4, help="parallelism of the batch runs")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELLGATE_")}
    if args.batch:
        batch(args.batch, args.jobs, env)
        return
    names = ", ".join(p.stem for p in EXAMPLES)
    print(f"{len(EXAMPLES)} notebooks ({names}), one after the other, on {os.cpu_count()} CPUs")
    cellgate = timed([str(BIN_DIR / "cellgate"), "run", "--no-progress", *map(str, EXAMPLES)],
                     env)
    nbclient_env = dict(env, PYDEVD_DISABLE_FILE_VALIDATION="1")
    nbclient = timed(["/usr/bin/python3", "-c", NBCLIENT, *map(str, EXAMPLES)], nbclient_env)
    parallel = timed([str(BIN_DIR / "cellgate"), "run", "--no-progress", "--jobs", "3",
                      *map(str, EXAMPLES)], env)
    print(f"cellgate run (jailed)          {cellgate:6.2f} s")
    print(f"nbclient (unjailed)            {nbclient:6.2f} s")
    print(f"ratio cellgate / nbclient      {cellgate / nbclient:6.2f}")
    print(f"cellgate run --jobs 3          {parallel:6.2f} s")


if __name__ == "__main__":
    main()
