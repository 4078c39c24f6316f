"""Debian's jupyter_kernel_test against a RESUMED kernel and a FORKED one (CRIU, issue 26).

The same suite as test_jailed_kernel.py (every jupyter_kernel_test check, the jail's own checks),
run on kernels that a checkpoint made:
- resumed: a jailed ipykernel checkpointed with `cellgate-kernel --checkpoint` (its processes
  gone) and brought back with `--restore`, as a hibernated kernel is;
- forked: a snapshot of a running kernel (`--checkpoint --leave-running`) restored under another
  uid, cgroup and connection dir, as a fork or a start from a snapshot is; its source runs on.
Each first checks that the state set before the checkpoint is there (`x`, a numpy array, a
work-dir file). Needs root (the jail) and CRIU (scripts/install-criu); skips with a reason
otherwise.

    CELLGATE_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q tests/conformance/test_checkpointed_kernel.py
"""

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient

import test_jailed_kernel as jailed  # the suite; a module attribute, so pytest collects it once

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launcher"))
import test_checkpoint as ckpt  # noqa: E402  the launcher's helpers (jail_files, Launcher, …)

INSTALLED_CRIU = "/opt/cellgate/criu/sbin/criu"  # scripts/install-criu
STATE = "x = 41\nimport numpy as np\na = np.arange(1e5)\nopen('/home/kernel/note.txt', 'w').write('kept')"
STATE_CHECK = "print(x, a.sum(), open('/home/kernel/note.txt').read())"
STATE_EXPECTED = "41 4999950000.0 kept\n"

if not os.path.exists(INSTALLED_CRIU) and shutil.which("criu") is None:
    pytest.skip("CRIU is not installed (scripts/install-criu)", allow_module_level=True)


def checkpoint(init_pid, images, common, leave_running):
    args = [str(jailed.LAUNCHER), "--checkpoint", str(init_pid), "--images", images]
    if leave_running:
        args.append("--leave-running")
    done = subprocess.run([*args, *common], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr


class CheckpointedKernel(jailed.JailedIPyKernelTests):
    """Sets up a kernel through the launcher, checkpoints it (how: make()) and connects
    jupyter_client's BlockingKernelClient to what the restore brought back."""

    leave_running = False  # True: a snapshot, restored as a copy under another uid

    @classmethod
    def setUpClass(cls):
        ckpt.LAUNCHER = str(jailed.LAUNCHER)
        if not os.access(jailed.LAUNCHER, os.X_OK):
            raise RuntimeError(f"{jailed.LAUNCHER} is not built (set CELLGATE_BIN_DIR)")
        cls._tmp = Path(tempfile.mkdtemp(prefix="cellgate-ckpt-conformance-"))
        os.chmod(cls._tmp, 0o711)
        cls._saved_env = {}
        cls.km = None
        cls.kc = None
        cls._launchers = []
        try:
            cls._make()
        except BaseException:
            cls._cleanup()
            raise

    @classmethod
    def _make(cls):
        key = uuid.uuid4().hex
        base_uid = 2_000_200_000 + (os.getpid() % 10_000) * 4 + (2 if cls.leave_running else 0)
        log = str(cls._tmp / "kernel.log")
        name = f"jkt-{os.getpid()}-{int(cls.leave_running)}"
        common, conn, _ = ckpt.jail_files(str(cls._tmp / "src"), name + "-0", base_uid, key)
        source = ckpt.Launcher([*common, "--", "/usr/bin/python3", "-m", "ipykernel_launcher",
                                "-f", conn], log)
        cls._launchers.append(source)
        init = ckpt.read_event(source.status, "started")["pid"]
        client, context = ckpt.connect(conn)
        assert ckpt.execute(client, STATE)[1] == "ok"
        ckpt.disconnect(client, context)
        images = str(cls._tmp / "images")
        checkpoint(init, images, common, cls.leave_running)
        if cls.leave_running:  # a copy, under its own uid, cgroup and dirs
            common, conn, _ = ckpt.jail_files(str(cls._tmp / "copy"), name + "-1", base_uid + 1,
                                              key)
        else:
            assert ckpt.read_event(source.status, "exited")
        restored = ckpt.Launcher(["--restore", images, *common], log)
        cls._launchers.append(restored)
        ckpt.read_event(restored.status, "started")
        cls.kc = BlockingKernelClient()
        cls.kc.load_connection_file(conn)
        cls.kc.start_channels()
        cls.kc.wait_for_ready(timeout=jailed.STARTUP_TIMEOUT)

    @classmethod
    def _cleanup(cls):
        try:
            if cls.kc is not None:
                cls.kc.stop_channels()
        finally:
            for launcher in reversed(cls._launchers):
                launcher.end()
            for sub in ("src", "copy"):
                subprocess.run(["umount", "-l", str(cls._tmp / sub / "work")],
                               stderr=subprocess.DEVNULL, check=False)
            shutil.rmtree(cls._tmp, ignore_errors=True)

    def test_state_from_before_the_checkpoint(self):
        self.assertEqual(self.stdout_of(STATE_CHECK), STATE_EXPECTED)


class ResumedKernelTests(CheckpointedKernel):
    leave_running = False


class ForkedKernelTests(CheckpointedKernel):
    leave_running = True

    def test_runs_under_its_own_uid(self):
        uid = int(self.stdout_of("import os; print(os.getuid())").strip())
        self.assertEqual(uid, 2_000_200_000 + (os.getpid() % 10_000) * 4 + 3)
