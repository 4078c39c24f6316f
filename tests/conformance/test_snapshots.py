"""Snapshots and fork through `cellgate serve` (README, "Snapshots and fork"), for real with CRIU.

A kernel started cold sets x = 41, a numpy array and a work-dir file; a WebSocket client stays
connected through POST /api/kernels/{id}/snapshots (201, listed by GET /api/snapshots) and runs
its next cell on the same kernel. POST /api/kernels {"snapshot": id} starts a copy and
POST /api/kernels/{id}/fork {"count": 2} two more: each has the source's variables and file, and
is as apart from its source and siblings as two kernels started separately (red team): its own
uid (so per-uid limits are not shared), a pid namespace holding only its own processes, no path
to its source's work dir, no signal reaching its source, a change that stays its own. DELETE
removes a snapshot. Where checkpoints cannot work: skipped, unless scripts/install-criu's CRIU is
installed (as in CI), when a 501 fails. Needs root (the jail)."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")
INSTALLED_CRIU = "/opt/cellgate/criu/sbin/criu"  # scripts/install-criu
FLAGS = ("--no-zygote", "--checkpoint-without-landlock", "--pool-size", "0")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")


def call(server, method, path, body=None, timeout=180):
    status, raw = gb.http_request(server, method, path, body, timeout=timeout)
    return status, (json.loads(raw) if raw else None)


def execute(server, kid, code):
    status, answer = call(server, "POST", f"/api/kernels/{kid}/execute",
                          {"code": code, "timeout": 60}, timeout=120)
    assert status == 200 and answer["status"] == "ok", (status, answer, server.log_tail())
    return answer["stdout"]


FACTS = """import json, os
print(json.dumps({'uid': os.getuid(), 'pids': sorted(int(p) for p in os.listdir('/proc')
                                                    if p.isdigit()),
                  'x': x, 'sum': float(a.sum()), 'note': open('note.txt').read(),
                  'key': __import__('IPython').get_ipython().kernel.session.key.decode()}))
"""


# A copy's work dir is a new tmpfs, its files made in order: each gets the inode number its
# source's had unless the source made and removed files before it (as ipykernel's start-up may,
# by chance). So that the copy's history.sqlite surely has another number than the one its
# SQLite connections remember, the source's is rewritten as a new file after 64 removed ones,
# and its history opened on it.
NEW_INODE = """import os, shutil
from IPython.core.history import HistorySavingThread
for i in range(64):
    open(f'gap{i}', 'w').close()
    os.remove(f'gap{i}')
h = get_ipython().history_manager
h.save_thread.stop()
h.db.close()
shutil.copy(h.hist_file, str(h.hist_file) + '.new')
os.replace(str(h.hist_file) + '.new', h.hist_file)
h.init_db()
h.save_thread = HistorySavingThread(h)
h.save_thread.start()
"""

# The cells of this session written out now, through the main thread's connection, and read
# back; the saving thread still runs.
HISTORY = """h = get_ipython().history_manager
h.writeout_cache()
n = h.db.execute('SELECT count(*) FROM history WHERE session = ?', (h.session_number,)).fetchone()[0]
print('saved' if n > 0 else 'nothing saved', h.save_thread.is_alive())
"""


def test_snapshot_start_and_fork_make_separate_copies():
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 8, FLAGS)
        try:
            source = gb.start_kernel(server)
            execute(server, source, "import numpy as np, os\nx = 41\na = np.arange(1e5)\n"
                                    "open('note.txt', 'w').write('kept')")
            execute(server, source, NEW_INODE)
            src = json.loads(execute(server, source, FACTS))
            client = gb.KernelClient(server, source)
            try:
                status, snap = call(server, "POST", f"/api/kernels/{source}/snapshots")
                if status == 501:
                    assert not os.path.exists(INSTALLED_CRIU), snap
                    pytest.skip(f"checkpoints unavailable here: {snap['message']}")
                assert status == 201, (status, snap, server.log_tail())
                assert len(snap["id"]) == 32 and snap["kernel_id"] == source, snap
                # The WebSocket client stayed connected: its next cell runs on the kernel.
                assert client.run_stdout("x += 1\nprint(x)") == "42\n"
            finally:
                client.close()
            status, listed = call(server, "GET", "/api/snapshots")
            assert status == 200 and [s["id"] for s in listed] == [snap["id"]], listed

            status, copy = call(server, "POST", "/api/kernels", {"snapshot": snap["id"]})
            assert status == 201, (status, copy, server.log_tail())
            status, forks = call(server, "POST", f"/api/kernels/{source}/fork", {"count": 2})
            assert status == 201 and len(forks) == 2, (status, forks, server.log_tail())
            copies = [copy["id"]] + [f["id"] for f in forks]
            assert len(set(copies + [source])) == 4, copies

            uids = {src["uid"]}
            keys = {src["key"]}
            for i, kid in enumerate(copies):
                facts = json.loads(execute(server, kid, FACTS))
                # The snapshot was taken at x = 41; the forks after the cell made it 42.
                assert facts["x"] == (41 if i == 0 else 42), facts
                assert facts["sum"] == src["sum"] and facts["note"] == "kept", facts
                uids.add(facts["uid"])
                keys.add(facts["key"])
                assert len(facts["pids"]) <= 3, facts  # pid 1 and the kernel, in its own ns
                # Red team: the source's work dir is not reachable, nor any of its processes.
                # Red team: no signal reaches a process outside the copy's own (its threads
                # included), and neither the source's work dir nor a host pid is visible.
                probe = json.loads(execute(server, kid, f"""import json, os
own = {{int(t) for p in os.listdir('/proc') if p.isdigit()
        for t in os.listdir(f'/proc/{{p}}/task')}}
reached = []
for p in range(1, 4096):
    try:
        os.kill(p, 0)
        reached.append(p)
    except (ProcessLookupError, PermissionError):
        pass
print(json.dumps({{'outside': [p for p in reached if p not in own],
                   'work': os.path.exists({server.marker!r}),
                   'host_pid': os.path.exists('/proc/{os.getpid()}/status')}}))
"""))
                assert probe == {"outside": [], "work": False, "host_pid": False}, probe
                # IPython's history is written in the copy: its history.sqlite is a new file
                # (a new inode) at the source's path, which SQLite refused to write to as "a
                # readonly database" until the copy opened it again.
                assert execute(server, kid, HISTORY) == "saved True\n"
                execute(server, kid, "x = -1\nopen('note.txt', 'w').write('changed')")
            assert len(uids) == 4, uids  # per-uid limits (RLIMIT_NPROC, inotify) apart
            # Each copy signs with a connection key of its own, and the gateway talks to it so.
            assert len(keys) == 4 and all(len(k) == 64 for k in keys), keys
            # No copy's change reached the source.
            assert execute(server, source, "print(x, open('note.txt').read())") == "42 kept\n"

            # The CLI: `cellgate exec --url … --fork` and `--from-snapshot` run a cell in a new
            # copy, whose id they say.
            url = ["--url", f"http://127.0.0.1:{server.port}", "--token", server.token]
            for how, expect in ((["--fork", source], "42 kept\n"),
                                (["--from-snapshot", snap["id"]], "41 kept\n")):
                done = subprocess.run(
                    [os.path.join(BIN_DIR, "cellgate"), "exec", *url, *how,
                     "print(x, open('note.txt').read())"],
                    capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
                assert done.returncode == 0 and done.stdout == expect, (how, done)
                assert "cellgate exec: kernel " in done.stderr, done.stderr

            # Refusals: a fork of 17, a snapshot started as another kernelspec, an unknown id.
            status, answer = call(server, "POST", f"/api/kernels/{source}/fork", {"count": 17})
            assert status == 400, (status, answer)
            status, answer = call(server, "POST", "/api/kernels",
                                  {"snapshot": snap["id"], "name": "ir"})
            assert status == 400, (status, answer)
            status, _ = call(server, "DELETE", f"/api/snapshots/{snap['id']}")
            assert status == 204
            status, listed = call(server, "GET", "/api/snapshots")
            assert listed == [], listed
            status, answer = call(server, "POST", "/api/kernels", {"snapshot": snap["id"]})
            assert status == 404, (status, answer)
            assert json.loads(execute(server, copies[0], FACTS))["x"] == -1  # copies live on
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)
