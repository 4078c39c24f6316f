"""No output lost across a gateway kill -9 (issue 29): the kernel's launcher spools its iopub
while no gateway runs, and each WebSocket session's last written iopub msg_id is recorded in the
state dir (state_dir/kernels/<id>/delivered, mmap'ed), so the next `cellgate serve` puts exactly
what a session missed into its offline buffer.

A cell prints 1,000 lines, waits for a file, prints 1,000 more, writes a marker file and waits
for a second file before it ends. The test drives it with those files, never with sleeps.

What holds for messages in flight at the kill: the record is written when a frame's write has
completed (every byte in the gateway's socket buffer, which the kernel still delivers after the
process dies: the client sends nothing, so no reset). A frame cut off mid-write is not recorded
and is replayed whole; the client's WebSocket discards the torn one. A frame written but not yet
recorded when the kill came (one at most: one write is in flight per connection) is replayed
again: at most one duplicate message, the same msg_id, at the seam. A client that leaves by a
WebSocket close handshake (reading until the server's close frame) has read everything recorded:
nothing is duplicated.

Not kept: replies on shell. The execute_reply of a cell sent through the killed gateway is
addressed by the kernel's ROUTER to that gateway's DEALER, which is gone, so it is dropped even
when the cell ends after the restart (a stable DEALER routing id per kernel would fix that; not
done). The cell's end is its iopub idle status, which is replayed or live like any output.
"""

import os
import pathlib
import re
import signal
import sys
import tempfile
import time
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402
from test_output_replay import connect  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")
HALF = 1000

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")

CELL = f"""import os, time
def wait(p):
    while not os.path.exists(p):
        time.sleep(0.01)
for i in range({HALF}):
    print(i, flush=True)
wait('go1')
for i in range({HALF}, {2 * HALF}):
    print(i, flush=True)
open('printed', 'w').close()
wait('go2')
"""


def wait_for(pred, timeout, what):
    """Polls an event the test cannot be told about (a file the kernel writes); the timeout is a
    generous bound on a hang, not a guess at how long it takes."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def kill_9(server):
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)


def work_dir(server, kid):
    return pathlib.Path(server.marker, "kernels", kid, "work")


def stdout_msgs(msgs, msg_id):
    return [m for m in msgs if m["parent_header"].get("msg_id") == msg_id and
            m["header"]["msg_type"] == "stream" and m["content"]["name"] == "stdout"]


def lines_of(msgs):
    return "".join(m["content"]["text"] for m in msgs).splitlines()


def stop_both(first, second):
    """Stops the restarted gateway, and the first one unless the test killed it."""
    if second:
        second.stop()
    if first.proc.poll() is None:
        first.stop()


def read_until_end(client, msg_id):
    """Messages of the cell until its idle status."""
    got = []
    while True:
        msg = client.recv()
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        got.append(msg)
        if msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return got


def run(tmp, leave_before_kill, flags=("--pool-size", "0"), before=None):
    first = gb.start_cellgate(BIN_DIR, tmp, 4, flags)
    second = None
    try:
        kid = gb.start_kernel(first)
        if before:
            before(first, kid)
        session = uuid.uuid4().hex
        client = connect(first, kid, session)
        msg_id = client.execute(CELL)
        before = []
        while len(lines_of(before)) < HALF // 2:
            before += stdout_msgs([client.recv()], msg_id)
        if leave_before_kill:
            # Cut off midway, by a close handshake: it reads what was sent up to the close.
            ws = client.ws
            try:
                ws.send_frame(0x8, b"\x03\xe8")
                while True:
                    op, payload = ws.recv_message()
                    if op in (0x1, 0x2):
                        msg = (gb.decode_v1(payload) if client.v1 and op == 0x2 else
                               gb.decode_jupyter(op, payload))
                        before += stdout_msgs([msg], msg_id)
            except (OSError, gb.WSClosed, ValueError):
                pass
            ws.sock.close()
        # The gateway dies while the kernel prints or waits for go1.
        kill_9(first)
        if not leave_before_kill:
            # Connected until the kill: it reads what the gateway wrote until the connection ends.
            try:
                while True:
                    before += stdout_msgs([client.recv()], msg_id)
            except (gb.InfraError, OSError, gb.WSClosed, ValueError):
                pass
            client.close()
        # Published while no gateway runs: the second half.
        (work_dir(first, kid) / "go1").write_text("go")
        wait_for(lambda: (work_dir(first, kid) / "printed").exists(), 120, "the second half")
        second = gb.start_cellgate(BIN_DIR, tmp, 4, flags)
        back = connect(second, kid, session)
        # Live output after the restart: the cell's end.
        (work_dir(second, kid) / "go2").write_text("go")
        after = read_until_end(back, msg_id)
        seam = stdout_msgs(after, msg_id)
        ids_before = [m["header"]["msg_id"] for m in before]
        ids_after = [m["header"]["msg_id"] for m in seam]
        dup = [i for i in ids_after if i in set(ids_before)]
        if leave_before_kill:
            assert dup == [], dup  # a clean close: exactly once
        else:
            # At most the one frame in flight at the kill, again, right at the seam.
            assert dup in ([], ids_before[-1:]) and ids_after[:len(dup)] == dup, dup
            seam = seam[len(dup):]
        lines = lines_of(before) + lines_of(seam)
        assert lines == [str(i) for i in range(2 * HALF)], (len(lines), lines[:3], lines[-3:])
        assert not any(m["header"]["msg_type"] == "stream" and "[cellgate]" in
                       m["content"].get("text", "") for m in after), "nothing was lost"
        assert after[-1]["header"]["msg_type"] == "status"  # idle, after every line
        assert back.run_stdout("print('after')") == "after\n"
        back.close()
    finally:
        stop_both(first, second)


def test_a_client_cut_off_then_the_gateway_killed_gets_every_line_once():
    with tempfile.TemporaryDirectory() as tmp:
        run(tmp, leave_before_kill=True)


def test_a_client_connected_at_the_kill_misses_no_line():
    with tempfile.TemporaryDirectory() as tmp:
        run(tmp, leave_before_kill=False)


# A checkpoint holds the launcher's spool for the dump (CRIU cannot dump the unix stream it
# reads iopub by) and lets it go on after: a kernel snapshotted, or hibernated and resumed,
# still keeps what it prints while no gateway runs.
CHECKPOINT_FLAGS = ("--no-zygote", "--checkpoint-without-landlock", "--pool-size", "0")
INSTALLED_CRIU = "/opt/cellgate/criu/sbin/criu"  # scripts/install-criu


def checkpoint_or_skip(server, path):
    import json
    status, raw = gb.http_request(server, "POST", path, None, timeout=180)
    answer = json.loads(raw) if raw else None
    if status == 501:
        assert not os.path.exists(INSTALLED_CRIU), answer
        pytest.skip(f"checkpoints unavailable here: {answer['message']}")
    assert status in (200, 201), (status, answer, server.log_tail())


def test_a_snapshotted_kernel_still_spools_while_no_gateway_runs():
    def snapshot(server, kid):
        checkpoint_or_skip(server, f"/api/kernels/{kid}/snapshots")

    with tempfile.TemporaryDirectory() as tmp:
        run(tmp, leave_before_kill=True, flags=CHECKPOINT_FLAGS, before=snapshot)


def test_a_resumed_kernel_spools_while_no_gateway_runs():
    def hibernate_and_resume(server, kid):
        checkpoint_or_skip(server, f"/api/kernels/{kid}/hibernate")
        client = gb.KernelClient(server, kid)  # its execute resumes the kernel
        try:
            assert client.run_stdout("print('resumed')") == "resumed\n"
        finally:
            client.close()

    with tempfile.TemporaryDirectory() as tmp:
        run(tmp, leave_before_kill=True, flags=CHECKPOINT_FLAGS, before=hibernate_and_resume)


def launcher_pid(server, kid):
    import json
    record = json.loads(pathlib.Path(server.marker, "kernels", kid + ".json").read_text())
    return record["process"]["launcher_pid"]


def test_more_than_the_spool_while_no_gateway_runs_is_bounded_and_told():
    """~24 MiB printed while no gateway runs: the launcher's RSS grows by about the 8 MiB budget,
    not by what was printed, and the client gets the newest part, in order, after a notice of
    how many messages were lost."""
    code = """import os, time
while not os.path.exists('go'):
    time.sleep(0.01)
line = 'x' * 8000
for i in range(3000):
    print(i, line, flush=True)
open('printed', 'w').close()
"""
    with tempfile.TemporaryDirectory() as tmp:
        first = gb.start_cellgate(BIN_DIR, tmp, 4, ("--pool-size", "0"))
        second = None
        try:
            kid = gb.start_kernel(first)
            session = uuid.uuid4().hex
            client = connect(first, kid, session)
            assert client.run_stdout("print('ready')") == "ready\n"  # a first recorded message
            msg_id = client.execute(code)
            client.close()
            pid = launcher_pid(first, kid)
            rss_before = gb.status_kib(pid)
            kill_9(first)
            (work_dir(first, kid) / "go").write_text("go")
            wait_for(lambda: (work_dir(first, kid) / "printed").exists(), 120, "the output")
            rss_after = gb.status_kib(pid)
            print(f"launcher RSS {rss_before} KiB -> {rss_after} KiB after ~24 MiB printed")
            assert rss_after - rss_before < 20 * 1024, (rss_before, rss_after)
            second = gb.start_cellgate(BIN_DIR, tmp, 4, ("--pool-size", "0"))
            back = connect(second, kid, session)
            got = read_until_end(back, msg_id)
            notices = [m for m in got if m["header"]["msg_type"] == "stream" and
                       "[cellgate]" in m["content"]["text"]]
            lines = [ln.split(" ", 1)[0] for ln in lines_of(stdout_msgs(got, msg_id))]
            kept = [int(x) for x in lines if x.isdigit()]
            # What arrived is the tail, in order: the oldest went first.
            assert kept and kept == list(range(kept[0], 3000)), (kept[:3], kept[-3:])
            assert kept[0] > 0, "more than the budget was printed: some must have gone"
            # Told what was lost, once, before what was kept (lost_notice).
            print(f"kept {len(kept)} lines; notices: {[m['content']['text'] for m in notices]}")
            assert len(notices) == 1, notices
            assert got.index(notices[0]) < got.index(stdout_msgs(got, msg_id)[0]), "notice first"
            assert re.search(r"\b\d+ output message\(s\) before this point were lost",
                             notices[0]["content"]["text"]), notices[0]["content"]
            assert notices[0]["metadata"]["cellgate"]["lost_messages"] > 0, notices[0]
            back.close()
        finally:
            stop_both(first, second)
