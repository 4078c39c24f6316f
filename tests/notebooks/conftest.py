"""Shared helpers for the `cellgate run` tests: where the binary and the example notebooks are,
running the CLI with a bounded time, writing small notebooks, checking PNGs, and a `cellgate
serve` on a free loopback port for --url (stopped by its pid).

Kernels are jailed, so the tests need root; they skip with a reason otherwise.
"""

import json
import os
import re
import signal
import struct
import subprocess
import time
import uuid
import zlib
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

if os.geteuid() != 0:
    pytest.skip("cellgate's jailed kernels need root (namespaces, cgroups, mounts)",
                allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("CELLGATE_BIN_DIR") or REPO / "build" / "bin")
CELLGATE = BIN_DIR / "cellgate"
NOTEBOOKS = REPO / "notebooks" / "examples"
EXAMPLES = sorted(NOTEBOOKS.glob("*.ipynb"))

RUN_TIMEOUT = 240  # seconds for one `cellgate run` (a batch included)


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELLGATE_")}
    env.update(extra)
    return env


def cellgate_run(*args, timeout=RUN_TIMEOUT, stderr=subprocess.PIPE, cwd=None):
    """`cellgate run ARGS...`: the CompletedProcess (text stdout/stderr)."""
    return subprocess.run([str(CELLGATE), "run", "--no-progress", *map(str, args)],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                          text=True, timeout=timeout, env=clean_env(), cwd=cwd)


def run_json(*args, timeout=RUN_TIMEOUT):
    """`cellgate run --json ARGS...`: (exit code, parsed summary, stderr)."""
    proc = cellgate_run("--json", *args, timeout=timeout)
    try:
        summary = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"not JSON on stdout (exit {proc.returncode}):\n{proc.stdout}\n"
                             f"--- stderr ---\n{proc.stderr}") from None
    return proc.returncode, summary, proc.stderr


def write_notebook(path: Path, cells, tag=None, **metadata) -> Path:
    """A notebook of code cells (strings), markdown cells ("# md: ..."), or cell objects."""
    made = []
    for c in cells:
        if isinstance(c, str) and c.startswith("# md: "):
            made.append(new_markdown_cell(c[len("# md: "):]))
        elif isinstance(c, str):
            made.append(new_code_cell(c))
        else:
            made.append(c)
    nb = new_notebook(cells=made, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        **metadata})
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def tagged(source: str, *tags):
    cell = new_code_cell(source)
    cell.metadata["tags"] = list(tags)
    return cell


def read_notebook(path: Path):
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    return nb


def is_valid_png(data: bytes) -> bool:
    """PNG signature, IHDR first, every chunk's CRC right, IEND last."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return False
    pos, first, last = 8, True, None
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        crc = data[pos + 8 + length:pos + 12 + length]
        if len(body) != length or len(crc) != 4:
            return False
        if zlib.crc32(kind + body) != struct.unpack(">I", crc)[0]:
            return False
        if first and kind != b"IHDR":
            return False
        first, last = False, kind
        pos += 12 + length
    return last == b"IEND" and pos == len(data)


class Server:
    """`cellgate serve` on 127.0.0.1, a free port, a temp state dir; stopped by its pid."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.token = uuid.uuid4().hex
        self.out = tmp / "serve.out"
        self.err = tmp / "serve.err"
        self.proc = None
        self.url = None

    def start(self):
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            self.proc = subprocess.Popen(
                [str(CELLGATE), "serve", "--ip", "127.0.0.1", "--port", "0",
                 "--token", self.token, "--state-dir", str(self.tmp / "state")],
                stdin=subprocess.DEVNULL, stdout=o, stderr=e, env=clean_env())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.url is None:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)/",
                          self.out.read_text(errors="replace"))
            if m:
                self.url = m.group(1)
            elif self.proc.poll() is not None:
                break
            else:
                time.sleep(0.1)
        if self.url is None:
            self.stop()
            raise RuntimeError("cellgate serve did not start:\n" +
                               self.err.read_text(errors="replace")[-3000:])

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
