#!/usr/bin/python3
"""Wall time for the example notebooks: `cellgate run` (jailed kernels, embedded gateway) versus
Debian's nbclient (unjailed ipykernel), same machine, one run each. Not a timed test.

    sudo CELLGATE_BIN_DIR=build/bin /usr/bin/python3 tests/notebooks/bench_run.py

Both run the notebooks one after the other, a fresh kernel per notebook, from a fresh process
(process start and imports are counted on both sides). `cellgate run --jobs 3` is shown too.
Prints the figures and the ratio; docs/run.md records them.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("CELLGATE_BIN_DIR") or REPO / "build" / "bin")
NOTEBOOKS = REPO / "notebooks" / "examples"
EXAMPLES = sorted(NOTEBOOKS.glob("*.ipynb"))

NBCLIENT = """
import sys, nbclient, nbformat
for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                            resources={"metadata": {"path": %r}}).execute()
""" % str(NOTEBOOKS)


def timed(argv, env=None) -> float:
    started = time.monotonic()
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, env=env)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"{argv[0]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("cellgate's jailed kernels need root")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELLGATE_")}
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
