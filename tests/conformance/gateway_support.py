"""What the conformance tests that start their own `cellgate serve` share: reading a process's
/proc status, and cleaning up after a gateway that crashed (its kernels stopped by pid, their
work-dir mounts undone), so nothing outlives a test."""

import os
import signal
import subprocess
import time
from pathlib import Path


def proc_status_kib(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def processes_of(tmp: Path) -> list:
    """Pids of the processes whose command line names `tmp` (our kernels' launchers)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if (str(tmp) + "/").encode() in cmd:
                pids.append(int(entry))
    return pids


def reap_leftovers(tmp: Path) -> list:
    """After the server stopped: its kernels should be gone. If it crashed they are not (and
    their work-dir mounts stay): stop them by pid and unmount, so nothing outlives the test.
    Returns what was found."""
    found = processes_of(tmp)
    for pid in found:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while processes_of(tmp) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in processes_of(tmp):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
              if line.split()[1].startswith(str(tmp) + "/")]
    for mount in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], check=False)
    return found + mounts
