"""Jupyter protocol conformance and isolation of JAILED ipykernels forked from the zygote.

The module starts its own zygote (`cellgate-kernel --zygote --socket <tmp>/z.sock --status-fd N`,
with a canary in its environment) and drives kernels whose kernelspec argv is the launcher with
`--zygote-socket`: jupyter_kernel_test's KernelTests (the attributes of test_jailed_kernel.py),
then separate random state per kernel, canaries (the zygote's and the launcher's) that no kernel
can read, kernels that outlive a SIGKILLed zygote, the cold fallback without one, variables,
matplotlib's inline PNG and interrupts.

    CELLGATE_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q -p no:cacheprovider \
        tests/conformance/test_zygote_kernel.py

Every kernel is checked to come from the zygote: `'pandas' in sys.modules` before any cell
imported it (the zygote preloads pandas; a cold ipykernel does not import it), and no "no zygote"
warning on the launcher's stderr. Needs root (the jail); skips with a reason otherwise. Processes
started here are stopped by their pid; temp dirs are removed.
"""

import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

if os.geteuid() != 0:
    pytest.skip("the jailed kernel and the zygote need root (namespaces, cgroups, mounts)",
                allow_module_level=True)

from jupyter_client import KernelManager  # noqa: E402
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402

import test_jailed_kernel as jailed  # noqa: E402  (its class is subclassed, not re-collected)

LAUNCHER = jailed.LAUNCHER
KERNEL_NAME = "cellgate-python3-zygote"
STARTUP_TIMEOUT = jailed.STARTUP_TIMEOUT
ZYGOTE_TIMEOUT = 60      # seconds for the zygote's preload on a loaded machine
CELL_TIMEOUT = 30
ZYGOTE_CANARY = "cellgate-zygote-canary-" + uuid.uuid4().hex[:12]
LAUNCHER_CANARY = "cellgate-launcher-canary-" + uuid.uuid4().hex[:12]
NO_ZYGOTE = "no zygote"  # the launcher's warning when it falls back to a cold start


# ---- the zygote --------------------------------------------------------------------------------

class Zygote:
    """`cellgate-kernel --zygote` in a temp dir of its own; stopped by its pid."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="cellgate-zygote-test-"))
        self.socket = self.dir / "z.sock"
        self.log = self.dir / "zygote.log"
        self.proc = None
        self.ready = None

    def start(self):
        r, w = os.pipe()
        try:
            env = {"PATH": "/usr/bin:/bin", "CELLGATE_ZYGOTE_CANARY": ZYGOTE_CANARY}
            # util-linux's setpriv execs the zygote with a parent-death signal (same pid): it
            # ends with this process even when that is killed before the fixtures' cleanup.
            pdeathsig = (["/usr/bin/setpriv", "--pdeathsig", "KILL", "--"]
                         if os.access("/usr/bin/setpriv", os.X_OK) else [])
            with open(self.log, "wb") as log:
                self.proc = subprocess.Popen(
                    pdeathsig + [str(LAUNCHER), "--zygote", "--socket", str(self.socket),
                                 "--status-fd", str(w)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(w,), env=env)
            os.close(w)
            w = -1
            line = b""
            deadline = time.monotonic() + ZYGOTE_TIMEOUT
            while b"\n" not in line:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([r], [], [], left)[0]:
                    raise RuntimeError(f"the zygote was not ready in {ZYGOTE_TIMEOUT} s:\n"
                                       + self.log_text())
                chunk = os.read(r, 4096)
                if not chunk:
                    raise RuntimeError("the zygote ended before it was ready:\n" + self.log_text())
                line += chunk
            self.ready = json.loads(line.split(b"\n")[0])
            if self.ready.get("event") != "ready":
                raise RuntimeError(f"the zygote did not start: {self.ready}\n" + self.log_text())
        except BaseException:
            self.stop()
            raise
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
        return self

    @property
    def pid(self):
        return self.proc.pid

    def kill(self):
        """SIGKILL, by pid, and reap."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_text(self):
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


ZYGOTE = None  # the module's zygote, set by the autouse fixture below


@pytest.fixture(scope="module", autouse=True)
def zygote():
    """One zygote for the module (module fixtures are set up before the unittest class's
    setUpClass, which reads ZYGOTE)."""
    global ZYGOTE
    if not os.access(LAUNCHER, os.X_OK):
        raise RuntimeError(f"{LAUNCHER} is not built (set CELLGATE_BIN_DIR)")
    ZYGOTE = Zygote().start()
    try:
        yield ZYGOTE
    finally:
        ZYGOTE.stop()
        ZYGOTE = None


# ---- kernels -----------------------------------------------------------------------------------

def write_kernelspec(kernels_dir: Path, socket: Path) -> None:
    spec_dir = kernels_dir / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [str(LAUNCHER), "--zygote-socket", str(socket),
                 "--connection-file", "{connection_file}", "--die-with-parent",
                 "--", "/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (cellgate jail, zygote)",
        "language": "python",
        "interrupt_mode": "signal",
        # The launcher's environment; the kernel must never see it.
        "env": {"CELLGATE_LAUNCHER_CANARY": LAUNCHER_CANARY},
        "metadata": {"debugger": False},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))


def start_manager(tmp: Path, socket: Path):
    """A started KernelManager (ipc, private dirs under `tmp`), its client, the launcher's stderr."""
    write_kernelspec(tmp / "kernels", socket)
    ipc_dir = tmp / "ipc"  # bound into the jail: nothing but this kernel's sockets in it
    ipc_dir.mkdir(mode=0o700)
    km = KernelManager(kernel_name=KERNEL_NAME, transport="ipc", ip=str(ipc_dir / "k"),
                       connection_file=str(tmp / "connection.json"),
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp / "kernels")]))
    stderr_path = tmp / "launcher.err"
    kc = None
    try:
        with open(stderr_path, "wb") as err:
            km.start_kernel(stderr=err)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=STARTUP_TIMEOUT)
    except BaseException:
        if kc is not None:
            kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)
        raise
    return km, kc, stderr_path


def preloaded_pandas(kc) -> bool:
    """'pandas' in sys.modules, asked without running a cell (no history, no import)."""
    msg_id = kc.execute("", silent=True, store_history=False,
                        user_expressions={"z": "'pandas' in __import__('sys').modules"})
    reply = kc.get_shell_msg(timeout=CELL_TIMEOUT)
    while reply["parent_header"].get("msg_id") != msg_id:  # e.g. a late kernel_info_reply
        reply = kc.get_shell_msg(timeout=CELL_TIMEOUT)
    value = reply["content"]["user_expressions"]["z"]
    assert value["status"] == "ok", value
    return value["data"]["text/plain"] == "True"


class Kernel:
    """A jailed ipykernel started through the launcher with --zygote-socket."""

    def __init__(self, socket: Path):
        self.tmp = Path(tempfile.mkdtemp(prefix="cellgate-zygote-kernel-"))
        try:
            self.km, self.kc, self.stderr_path = start_manager(self.tmp, socket)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def execute(self, code: str, timeout: float = CELL_TIMEOUT):
        """(reply content, iopub messages of this cell)."""
        msg_id = self.kc.execute(code)
        outputs = []
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            outputs.append(msg)
        while True:
            reply = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"], outputs

    def stdout(self, code: str, timeout: float = CELL_TIMEOUT) -> str:
        content, outputs = self.execute(code, timeout)
        assert content["status"] == "ok", content
        return "".join(m["content"]["text"] for m in outputs
                       if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")

    def stop(self):
        try:
            self.kc.stop_channels()
            if self.km.has_kernel:
                self.km.shutdown_kernel()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


def assert_from_zygote(k: Kernel):
    assert preloaded_pandas(k.kc), "pandas is not preloaded: the kernel did not come from the zygote"
    assert NO_ZYGOTE not in k.stderr(), k.stderr()


@pytest.fixture(scope="module")
def pair(zygote):
    """Two kernels from the module's zygote."""
    kernels = []
    try:
        kernels.append(Kernel(zygote.socket))
        kernels.append(Kernel(zygote.socket))
        yield kernels
    finally:
        for k in kernels:
            k.stop()


# ---- jupyter_kernel_test -----------------------------------------------------------------------

class ZygoteIPyKernelTests(jailed.JailedIPyKernelTests):
    """jupyter_kernel_test's KernelTests (and test_jailed_kernel's extra checks) on a zygote
    kernel."""

    kernel_name = KERNEL_NAME

    @classmethod
    def setUpClass(cls):
        cls._tmp = Path(tempfile.mkdtemp(prefix="cellgate-conformance-zygote-"))
        cls._saved_env = {}  # nothing of the process environment is changed here
        cls.km = None
        cls.kc = None
        try:
            cls.km, cls.kc, cls._stderr_path = start_manager(cls._tmp, ZYGOTE.socket)
            # Before any cell: a cold ipykernel has not imported pandas, the zygote has.
            cls._preloaded_pandas = preloaded_pandas(cls.kc)
        except BaseException:
            cls._cleanup()
            raise

    def test_kernel_came_from_the_zygote(self):
        self.assertTrue(self._preloaded_pandas, "pandas was not preloaded: started cold?")
        self.assertNotIn(NO_ZYGOTE, self._stderr_path.read_text(errors="replace"))


# ---- zygote kernels: separate, clean, independent of the zygote ---------------------------------

def test_zygote_kernels_have_separate_random_state(pair):
    a, b = pair
    for k in pair:
        assert_from_zygote(k)
    code = "import random, uuid, numpy\nprint(random.random(), numpy.random.rand(), uuid.uuid4())"
    ra = a.stdout(code).split()
    rb = b.stdout(code).split()
    assert len(ra) == 3 and len(rb) == 3, (ra, rb)
    assert ra[0] != rb[0], "random.random() repeats across zygote kernels"
    assert ra[1] != rb[1], "numpy.random.rand() repeats across zygote kernels"
    assert ra[2] != rb[2], "uuid.uuid4() repeats across zygote kernels"


CANARY_CELL = f"""
import ctypes, os
seen = {{'os.environ': '\\n'.join(f'{{k}}={{v}}' for k, v in os.environ.items())}}
try:
    seen['/proc/1/environ'] = open('/proc/1/environ', 'rb').read().decode(errors='replace')
except OSError as e:
    print('/proc/1/environ', type(e).__name__)
else:
    print('/proc/1/environ', 'empty' if not seen['/proc/1/environ'] else 'READABLE')
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/self/environ becomes readable
seen['/proc/self/environ'] = open('/proc/self/environ', 'rb').read().decode(errors='replace')
for where, text in seen.items():
    for canary in ({ZYGOTE_CANARY!r}, {LAUNCHER_CANARY!r}):
        if canary in text:
            print('LEAK', where, canary)
print('checked', len(seen))
"""


def test_no_kernel_sees_the_zygote_or_launcher_environment(pair, zygote):
    for k in pair:
        assert_from_zygote(k)
        out = k.stdout(CANARY_CELL)
        assert "LEAK" not in out, out
        # os.environ and /proc/self/environ, and /proc/1/environ when it could be read (empty)
        assert "checked 2" in out or "checked 3" in out, out
        assert "/proc/1/environ READABLE" not in out, out
    # The zygote re-exec'd itself with an empty environment: its own block holds no canary.
    environ = Path(f"/proc/{zygote.pid}/environ").read_bytes()
    assert ZYGOTE_CANARY.encode() not in environ
    assert environ == b"", environ


def test_variables_matplotlib_and_interrupt(pair):
    k = pair[0]
    assert_from_zygote(k)
    assert k.stdout("zz = 6 * 7") == ""
    assert k.stdout("print(zz)") == "42\n"

    content, outputs = k.execute(
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    assert content["status"] == "ok", content
    pngs = [m for m in outputs
            if m["msg_type"] == "display_data" and "image/png" in m["content"]["data"]]
    assert len(pngs) == 1, [m["msg_type"] for m in outputs]

    msg_id = k.kc.execute("import time\ntime.sleep(30)")
    # Wait until the cell runs (busy), then interrupt through the launcher.
    deadline = time.monotonic() + CELL_TIMEOUT
    while True:
        msg = k.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_input":
            break
    time.sleep(0.5)
    t0 = time.monotonic()
    k.km.interrupt_kernel()
    reply = k.kc.get_shell_msg(timeout=15)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = k.kc.get_shell_msg(timeout=15)
    assert reply["content"]["status"] == "error", reply["content"]
    assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
    assert time.monotonic() - t0 < 10
    assert k.km.is_alive()
    # After an error ipykernel aborts the execute requests that reach it before its abort window
    # closes (cold kernels too): retry an aborted cell.
    for _ in range(20):
        content, outputs = k.execute("print(zz + 1)")
        if content["status"] != "aborted":
            break
        time.sleep(0.1)
    assert content["status"] == "ok", content
    assert "".join(m["content"].get("text", "") for m in outputs
                   if m["msg_type"] == "stream") == "43\n"


def test_kernels_outlive_the_zygote_and_a_dead_socket_starts_cold():
    # A zygote of this test's own: it is killed.
    z = Zygote().start()
    kernels = []
    try:
        kernels.append(Kernel(z.socket))
        survivor = kernels[0]
        assert_from_zygote(survivor)
        assert survivor.stdout("kept = 'still here'") == ""

        z.kill()
        assert survivor.stdout("print(kept)") == "still here\n"
        assert survivor.stdout("import os; print(os.getuid() >= 1000000)") == "True\n"

        # The socket file is left behind, nobody answers it: the launcher starts cold.
        assert z.socket.exists()
        kernels.append(Kernel(z.socket))
        cold = kernels[1]
        assert NO_ZYGOTE in cold.stderr(), cold.stderr()
        assert not preloaded_pandas(cold.kc), "a cold kernel had pandas preloaded"
        assert cold.stdout("import os; print(os.getuid() >= 1000000)") == "True\n"
        assert cold.stdout("x = 1\nprint(x + 1)") == "2\n"
        assert survivor.stdout("print(kept)") == "still here\n"
    finally:
        for k in kernels:
            k.stop()
        z.stop()
