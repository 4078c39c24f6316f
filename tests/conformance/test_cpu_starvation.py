"""A kernel starved of CPU by its own cell is busy, not dead; a hung one is still restarted; a
kernel sees the CPUs its quota gives it (issue 24, part 5).

Real jailed kernels through `cellgate serve`:
  * starved: a cell forks 64 CPU-spinning processes into a 0.05-CPU quota for 8 s, which leaves
    the kernel's heartbeat threads too little CPU to answer for seconds (before the gateway asked
    the kernel's cgroup, it restarted the kernel ~5 s into the cell: with 16 spinners in 0.2 CPU,
    or 64 in 0.2, the heartbeats were still answered on this 2-CPU host); the gateway must not
    restart the kernel, and a variable set before the cell is still there after it;
  * hung: a kernel stopped with SIGSTOP (it uses no CPU and answers nothing) is still declared
    dead and restarted, no sooner than the --heartbeat-timeout this test sets (2 s);
  * affinity: with a 1-CPU quota, os.sched_getaffinity(0) in the kernel has one CPU, and
    OMP_NUM_THREADS and the like say 1 (zygote-forked and cold-started kernels).

Tests wait for events (a log line, a record's pid) with deadlines, not fixed sleeps."""
import json
import os
import signal
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")
HEARTBEAT_TIMEOUT = 2  # seconds, for the gateway of the starved and hung tests

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")


def execute(server, kid, code, timeout=60):
    status, body = gb.http_request(server, "POST", f"/api/kernels/{kid}/execute",
                                   {"code": code, "timeout": timeout}, timeout=timeout + 60)
    assert status == 200, body
    return json.loads(body)


def kernel_pid(server, kid):
    """The host pid the gateway's record gives for the kernel: its jail's pid 1."""
    with open(os.path.join(str(server.marker), "kernels", f"{kid}.json")) as f:
        return json.load(f)["pid"]


def kernel_process(server, kid):
    """The kernel process itself (python), the one child of its jail's pid 1."""
    init = kernel_pid(server, kid)
    with open(f"/proc/{init}/task/{init}/children") as f:
        children = f.read().split()
    assert len(children) == 1, f"jail init {init} has children {children}"
    return int(children[0])


def log_text(server):
    with open(server.log_path, errors="replace") as f:
        return f.read()


def wait_for(what, condition, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture(scope="module")
def starved_gateway():
    # Through the environment, as an operator's unit file would set it.
    saved = os.environ.get("CELLGATE_HEARTBEAT_TIMEOUT")
    os.environ["CELLGATE_HEARTBEAT_TIMEOUT"] = str(HEARTBEAT_TIMEOUT)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--pool-size", "0", "--cpus", "0.05"))
        finally:
            if saved is None:
                os.environ.pop("CELLGATE_HEARTBEAT_TIMEOUT")
            else:
                os.environ["CELLGATE_HEARTBEAT_TIMEOUT"] = saved
        try:
            yield server
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)


# 64 processes spin until a deadline, then end; the cell waits for them. In a 0.05-CPU quota the
# kernel's own threads share 5 ms per 100 ms period with them.
SPIN = """
import os, time
end = time.monotonic() + {seconds}
pids = []
for _ in range(64):
    pid = os.fork()
    if pid == 0:
        while time.monotonic() < end:
            pass
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
print("spun", len(pids))
"""


def test_kernel_starved_by_its_own_cell_is_not_restarted(starved_gateway):
    server = starved_gateway
    kid = gb.start_kernel(server)
    pid = kernel_pid(server, kid)
    assert execute(server, kid, "x = 42")["status"] == "ok"
    started = time.monotonic()
    answer = execute(server, kid, SPIN.format(seconds=8), timeout=120)
    took = time.monotonic() - started
    log = log_text(server)
    print(f"\nthe spinning cell took {took:.1f} s; gateway log about it:")
    print("\n".join(l for l in log.splitlines() if kid in l))
    assert f"kernel {kid} died" not in log, "the starved kernel was declared dead"
    assert answer["status"] == "ok", answer
    assert answer["stdout"] == "spun 64\n", answer
    after = execute(server, kid, "print(x)")
    assert after["status"] == "ok" and after["stdout"] == "42\n", after
    assert kernel_pid(server, kid) == pid, "the kernel was restarted"


def test_hung_idle_kernel_is_still_declared_dead(starved_gateway):
    server = starved_gateway
    kid = gb.start_kernel(server)
    init = kernel_pid(server, kid)
    assert execute(server, kid, "x = 1")["status"] == "ok"
    pid = kernel_process(server, kid)
    died = f"kernel {kid} died: the kernel stopped answering heartbeats"
    os.kill(pid, signal.SIGSTOP)  # the kernel this test started: it uses no CPU from now on
    stopped_at = time.monotonic()
    try:
        line = wait_for("the stopped kernel declared dead",
                        lambda: next((l for l in log_text(server).splitlines() if died in l), None),
                        timeout=60)
        took = time.monotonic() - stopped_at
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    print(f"\ndeclared dead {took:.1f} s after SIGSTOP: {line}")
    assert took >= HEARTBEAT_TIMEOUT, "declared dead before the heartbeat timeout"
    assert "0 ms of CPU" in line, line  # the log says why: no CPU used
    # Restarted: a new process that answers.
    wait_for("the restarted kernel", lambda: kernel_pid(server, kid) != init, timeout=60)
    assert execute(server, kid, "print(1 + 1)")["stdout"] == "2\n"


@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "cold"])
def test_kernel_sees_the_cpus_of_its_quota(zygote):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this host gives the test one CPU: a 1-CPU quota narrows nothing")
    with tempfile.TemporaryDirectory() as tmp:
        args = ("--pool-size", "0", "--cpus", "1") + (() if zygote else ("--no-zygote",))
        server = gb.start_cellgate(BIN_DIR, tmp, 2, args)
        try:
            kid = gb.start_kernel(server)
            answer = execute(server, kid, "\n".join([
                "import os, subprocess",
                "print(len(os.sched_getaffinity(0)))",
                "print(os.environ['OMP_NUM_THREADS'], os.environ['OPENBLAS_NUM_THREADS'],",
                "      os.environ['LOKY_MAX_CPU_COUNT'])",
                # A child process inherits the mask.
                "print(subprocess.run(['python3', '-c', 'import os; "
                "print(len(os.sched_getaffinity(0)))'], capture_output=True, text=True).stdout,"
                " end='')",
            ]))
            assert answer["status"] == "ok", answer
            assert answer["stdout"] == "1\n1 1 1\n1\n", answer
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)
