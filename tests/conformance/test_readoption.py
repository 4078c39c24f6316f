"""A gateway crash loses nothing: `cellgate serve` killed with -9 (mid-cell, with a filled pool),
then a new `cellgate serve` on the same state dir lists every client kernel with its id, each
answers over the agent API and the WebSocket with its variables intact (the cell that ran through
the gap completed), the pooled kernels of the dead gateway are ended, and nothing is left of
kernels whose owner died (launcher killed too): no process, cgroup, mount, runtime dir or record.
A second gateway on a state dir in use is refused."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")


def execute(server, kid, code, timeout=60):
    status, body = gb.http_request(server, "POST", f"/api/kernels/{kid}/execute",
                                   {"code": code, "timeout": timeout}, timeout=timeout + 30)
    assert status == 200, (status, body[:500], server.log_tail())
    return json.loads(body)


def kernel_ids(server):
    status, body = gb.http_request(server, "GET", "/api/kernels")
    assert status == 200, body
    return {m["id"] for m in json.loads(body)}


def records(state):
    out = {}
    for path in pathlib.Path(state, "kernels").glob("*.json"):
        out[path.stem] = json.loads(path.read_text())
    return out


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper has ended
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def mounts_under(path):
    prefix = os.path.realpath(path) + "/"
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(prefix)]


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def crash(server):
    """kill -9, as an OOM kill or a power cut of the gateway alone would."""
    server.remember()
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()


def leftovers_gone(state, record):
    """What a kernel's record names is gone: launcher, kernel, cgroup, runtime dir, mount."""
    facts = record["process"]
    problems = []
    for key in ("launcher_pid", "kernel_pid"):
        if alive(facts[key]):
            problems.append(f"{key} {facts[key]} alive")
    problems += [f"cgroup {p}" for p in facts["cgroup_paths"] if os.path.isdir(p)]
    if os.path.isdir(facts["runtime_dir"]):
        problems.append(f"runtime dir {facts['runtime_dir']}")
    problems += [f"mount {m}" for m in mounts_under(state) if record["id"] in m]
    if pathlib.Path(state, "kernels", record["id"] + ".json").exists():
        problems.append("record")
    return problems


def test_kill_9_mid_cell_then_every_kernel_is_adopted():
    with tempfile.TemporaryDirectory() as tmp:
        # A pool of exactly two (--pool-max 2): the three starts below would raise a pool sized by
        # demand to three, and the test counts two pooled records.
        first = gb.start_cellgate(BIN_DIR, tmp, 8, ("--pool-size", "2", "--pool-max", "2"))
        second = None
        try:
            state = first.marker
            ids = [gb.start_kernel(first) for _ in range(3)]
            for i, kid in enumerate(ids):
                assert execute(first, kid, f"x = {41 + i}")["status"] == "ok"
            wait_until(lambda: sum(r.get("pooled", False) for r in records(state).values()) == 2,
                       60, "two pooled kernels recorded")
            pooled = [r for r in records(state).values() if r.get("pooled")]

            # A cell that runs through the gap: its effect must be there afterwards.
            def run_through_the_crash():
                try:
                    gb.http_request(first, "POST", f"/api/kernels/{ids[0]}/execute",
                                    {"code": "import time\ntime.sleep(3)\ny = 7", "timeout": 30},
                                    timeout=30)
                except OSError:
                    pass  # the gateway died under it, as intended

            mid_cell = threading.Thread(target=run_through_the_crash, daemon=True)
            mid_cell.start()
            time.sleep(1)
            crash(first)

            second = gb.start_cellgate(BIN_DIR, tmp, 8, ("--pool-size", "2"))
            assert kernel_ids(second) == set(ids), second.log_tail()
            for i, kid in enumerate(ids):
                answer = execute(second, kid, "print(x)")
                assert answer["status"] == "ok" and answer["stdout"] == f"{41 + i}\n", answer
            assert execute(second, ids[0], "print(y)")["stdout"] == "7\n"
            # Over the WebSocket too, as a Jupyter client that reconnects.
            client = gb.KernelClient(second, ids[1])
            try:
                assert client.run_stdout("print(x + 1)") == "43\n"
            finally:
                client.close()

            # The dead gateway's pooled kernels are ended, with everything they held.
            for r in pooled:
                wait_until(lambda r=r: not leftovers_gone(state, r), 20,
                           f"pooled kernel {r['id']} cleaned up: {leftovers_gone(state, r)}")
            assert "adopted 3 running kernel(s)" in pathlib.Path(second.log_path).read_text()
        finally:
            if second is not None:
                second.stop()
            first.stop()
            gb.unmount_leftovers(tmp)


def test_kernels_whose_launcher_died_leave_nothing_behind():
    with tempfile.TemporaryDirectory() as tmp:
        first = gb.start_cellgate(BIN_DIR, tmp, 8, ("--pool-size", "0"))
        second = None
        try:
            state = first.marker
            lost, kept = gb.start_kernel(first), gb.start_kernel(first)
            assert execute(first, kept, "x = 5")["status"] == "ok"
            lost_record = records(state)[lost]
            crash(first)
            # Its owner dies too: the launcher, by SIGKILL (no report, no cleanup of its own).
            os.kill(lost_record["process"]["launcher_pid"], signal.SIGKILL)
            wait_until(lambda: not alive(lost_record["process"]["launcher_pid"]), 10,
                       "the launcher ended")

            second = gb.start_cellgate(BIN_DIR, tmp, 8, ("--pool-size", "0"))
            assert kernel_ids(second) == {kept}, second.log_tail()
            assert execute(second, kept, "print(x)")["stdout"] == "5\n"
            wait_until(lambda: not leftovers_gone(state, lost_record), 20,
                       f"kernel {lost} cleaned up: {leftovers_gone(state, lost_record)}\n"
                       f"{second.log_tail()}")

            # A second gateway on the same state dir is refused, and changes nothing.
            third = subprocess.run(
                [os.path.join(BIN_DIR, "cellgate"), "serve", "--ip", "127.0.0.1", "--port", "0",
                 "--state-dir", state, "--pool-size", "0"],
                capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
            assert third.returncode != 0
            assert "in use by another cellgate" in third.stdout + third.stderr, third
            assert execute(second, kept, "print(x)")["stdout"] == "5\n"

            # A clean stop ends the adopted kernel like any other.
            kept_record = records(state)[kept]
            second.stop()
            assert not leftovers_gone(state, kept_record), leftovers_gone(state, kept_record)
            assert mounts_under(tmp) == []
        finally:
            if second is not None:
                second.stop()
            first.stop()
            gb.unmount_leftovers(tmp)


def test_sigusr2_hands_the_kernels_to_the_next_gateway():
    """An upgrade: the running gateway is told to go (SIGUSR2; SIGTERM with --keep-kernels) and
    exits at once, its client kernels still running; the next one adopts them."""
    with tempfile.TemporaryDirectory() as tmp:
        first = gb.start_cellgate(BIN_DIR, tmp, 8, ("--pool-size", "1"))
        second, kid = None, None
        try:
            state = first.marker
            kid = gb.start_kernel(first)
            assert execute(first, kid, "x = 'kept'")["status"] == "ok"
            wait_until(lambda: any(r.get("pooled") for r in records(state).values()), 60,
                       "a pooled kernel recorded")
            pooled = [r for r in records(state).values() if r.get("pooled")]
            first.remember()
            t0 = time.monotonic()
            first.proc.send_signal(signal.SIGUSR2)
            assert first.proc.wait(20) == 0
            print(f"\nhand-over: the gateway exited {time.monotonic() - t0:.2f} s after SIGUSR2")
            # Nothing of the client kernel was ended; the pooled one was.
            assert set(records(state)) == {kid}
            assert alive(records(state)[kid]["process"]["launcher_pid"])
            for r in pooled:
                assert not leftovers_gone(state, r), leftovers_gone(state, r)

            second = gb.start_cellgate(BIN_DIR, tmp, 8, ("--pool-size", "1", "--keep-kernels"))
            assert kernel_ids(second) == {kid}
            assert execute(second, kid, "print(x)")["stdout"] == "kept\n"
            # --keep-kernels: SIGTERM hands over too.
            second.remember()
            second.proc.send_signal(signal.SIGTERM)
            assert second.proc.wait(20) == 0
            assert set(records(state)) == {kid}
            assert alive(records(state)[kid]["process"]["launcher_pid"])
        finally:
            # A third gateway ends it all with a plain SIGTERM, and nothing is left.
            third = gb.start_cellgate(BIN_DIR, tmp, 8, ("--pool-size", "0"))
            kept = records(third.marker).get(kid)
            third.stop()
            if kept:
                assert not leftovers_gone(third.marker, kept), leftovers_gone(third.marker, kept)
            for s in (second, first):
                if s is not None:
                    s.stop()
            gb.unmount_leftovers(tmp)
