"""A jailed ipykernel checkpointed with CRIU and restored, through cellgate-kernel.

cellgate-kernel launches Debian's ipykernel in its jail (exec mode); a client sets `x = 41` and a
numpy array; `cellgate-kernel --checkpoint` dumps the jail, whose processes are then gone;
`cellgate-kernel --restore` brings it back, and the variables, the array and the jail (its
uid, its seccomp filter) are as they were. Figures (dump, compression, restore, image size) are
printed. Needs root (the jail); CRIU comes from scripts/install-criu.

Run: CELLGATE_BIN=build/bin python3 -m pytest -q -s tests/launcher/test_checkpoint.py
"""

import json
import os
import queue
import select
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

import pytest
from jupyter_client import BlockingKernelClient

BIN = os.environ.get("CELLGATE_BIN", os.path.join(os.path.dirname(__file__), "../../build/bin"))
LAUNCHER = os.path.join(BIN, "cellgate-kernel")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")


def read_event(fd, kind, timeout=60.0):
    """The next status line of `kind` ("started", "exited") from the launcher's status fd."""
    deadline = time.monotonic() + timeout
    buf = b""
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            event = json.loads(line)
            if event.get("event") == kind:
                return event
            if event.get("event") == "exited":
                raise AssertionError(f"the launcher ended: {event}")
        left = deadline - time.monotonic()
        assert left > 0, f"no {kind} event within {timeout} s"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"the status pipe closed before a {kind} event"
            buf += chunk


class Launcher:
    """One cellgate-kernel process and the read end of its status pipe."""

    def __init__(self, args, log):
        read_end, write_end = os.pipe()
        self.status = read_end
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [LAUNCHER, "--status-fd", str(write_end), *args],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, pass_fds=(write_end,))
        os.close(write_end)

    def wait_exit(self, timeout=30):
        code = self.proc.wait(timeout=timeout)
        os.close(self.status)
        return code

    def end(self):
        """On a failure: SIGTERM, which the launcher passes on, so that it removes its cgroup."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.wait_exit()


def execute(client, code):
    """Runs `code`; answers the execute_result's text/plain (or None) and the reply's status."""
    msg_id = client.execute(code)
    result = None
    while True:
        msg = client.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "execute_result":
            result = msg["content"]["data"]["text/plain"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = client.get_shell_msg(timeout=30)
    return result, reply["content"]["status"]


def connect(conn_file):
    client = BlockingKernelClient()  # a context of its own (jupyter_client creates one)
    context = client.context
    client.load_connection_file(conn_file)
    client.start_channels(hb=False)
    # Ready once a kernel_info request's status messages reach us on iopub: the shell answers,
    # and our subscription is in place (ZeroMQ drops what a subscriber joins too late for).
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the kernel did not answer within 60 s"
        client.kernel_info()
        try:
            client.get_iopub_msg(timeout=1)
            break
        except queue.Empty:
            continue
    while True:  # drop the replies and status messages of the requests above
        try:
            client.get_shell_msg(timeout=0.2)
        except queue.Empty:
            break
    while True:
        try:
            client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            break
    return client, context


def disconnect(client, context):
    # CRIU cannot dump a unix stream socket whose other end is outside the jail: the client's
    # sockets must be closed, which term() waits for.
    client.stop_channels()
    context.term()


def processes_of_uid(uid):
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    found.append(int(name))
            except FileNotFoundError:
                pass
    return found


@pytest.fixture
def runtime():
    base = tempfile.mkdtemp(prefix="cellgate-ckpt-")
    os.chmod(base, 0o711)
    work = os.path.join(base, "work")
    conn = os.path.join(base, "conn")
    os.mkdir(work, 0o700)
    os.mkdir(conn, 0o700)
    yield base
    if os.environ.get("CELLGATE_KEEP"):
        return
    subprocess.run(["umount", "-l", work], stderr=subprocess.DEVNULL, check=False)
    shutil.rmtree(base, ignore_errors=True)


def test_kernel_state_survives_checkpoint_and_restore(runtime):
    assert os.access(LAUNCHER, os.X_OK), LAUNCHER
    uid = 2_000_000_000 + os.getpid() % 100_000
    name = f"ckpt-{os.getpid()}"
    conn_dir = os.path.join(runtime, "conn")
    conn_file = os.path.join(conn_dir, "connection.json")
    with open(conn_file, "w") as f:
        json.dump({"transport": "ipc", "ip": os.path.join(conn_dir, "k"), "shell_port": 1,
                   "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5,
                   "key": uuid.uuid4().hex, "signature_scheme": "hmac-sha256"}, f)
    spec_file = os.path.join(runtime, "jail.json")
    with open(spec_file, "w") as f:
        json.dump({"name": name, "uid": uid, "gid": uid,
                   "work_dir": os.path.join(runtime, "work"),
                   "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}}, f)
    log = os.path.join(runtime, "kernel.log")
    common = ["--status-file", os.path.join(runtime, "status"), "--spec", spec_file,
              "--connection-file", conn_file]

    first = Launcher([*common, "--", "/usr/bin/python3", "-m", "ipykernel_launcher", "-f",
                      conn_file], log)
    try:
        init = read_event(first.status, "started")["pid"]
        client, context = connect(conn_file)
        assert execute(client, "x = 41\nimport numpy as np\na = np.arange(1e6)")[1] == "ok"
        with open(os.path.join(runtime, "work", "note.txt"), "w") as f:
            f.write("kept")

        # A dump that fails (a client still connected: a unix stream half outside the jail)
        # says why and leaves the kernel running and answering.
        failed = subprocess.run([LAUNCHER, "--checkpoint", str(init), "--images",
                                 os.path.join(runtime, "images-failed"), *common],
                                capture_output=True, text=True, timeout=120)
        assert failed.returncode == 1
        assert "criu dump of the jail" in failed.stderr and "runs on" in failed.stderr, \
            failed.stderr
        assert execute(client, "x") == ("41", "ok")
        disconnect(client, context)

        images = os.path.join(runtime, "images")
        dumped = subprocess.run([LAUNCHER, "--checkpoint", str(init), "--images", images,
                                 *common], capture_output=True, text=True, timeout=120)
        assert dumped.returncode == 0, dumped.stderr
        figures = json.loads(dumped.stdout)
        # The jail's processes are gone: its launcher reports pid 1 killed, nothing runs as its uid.
        assert read_event(first.status, "exited")["signal"] == signal.SIGKILL
        assert first.wait_exit() == 128 + signal.SIGKILL
        assert processes_of_uid(uid) == []
        meta = os.stat(os.path.join(images, "criu"))
        assert meta.st_mode & 0o777 == 0o700
        for entry in os.scandir(os.path.join(images, "criu")):
            assert entry.stat().st_mode & 0o077 == 0, entry.name

        # A missing image is a setup error that says so; nothing is started.
        missing = Launcher(["--restore", os.path.join(runtime, "no-such-image"), *common], log)
        event = read_event(missing.status, "exited")
        assert event["reason"] == "setup_error" and "no-such-image" in event["message"], event
        assert missing.wait_exit() == 127

        start = time.monotonic()
        second = Launcher(["--restore", images, *common], log)
        restored = read_event(second.status, "started")
        restore_ms = (time.monotonic() - start) * 1000
        try:
            client, context = connect(conn_file)
            reply_ms = (time.monotonic() - start) * 1000
            assert execute(client, "x + 1") == ("42", "ok")
            assert execute(client, "a.sum()") == ("499999500000.0", "ok")
            assert execute(client, "open('/home/kernel/note.txt').read()") == ("'kept'", "ok")
            # Still jailed: the same uid, and the seccomp filter still refuses an inet socket.
            assert execute(client, "import os; os.getuid()") == (str(uid), "ok")
            assert execute(client, "import socket\ntry:\n    socket.socket(socket.AF_INET)\n"
                                   "    r = 'allowed'\nexcept PermissionError:\n    r = 'refused'\n"
                                   "r") == ("'refused'", "ok")
            client.shutdown()
            disconnect(client, context)
            exited = read_event(second.status, "exited")
            assert exited["reason"] == "ok", exited
            assert second.wait_exit() == 0
        finally:
            second.end()
        assert restored["pid"] != init
        with open(log) as f:
            restored_line = [l for l in f if "cellgate-kernel: restored" in l][-1].strip()
        print(f"\ncheckpoint figures: dump {figures['dump_ms']:.0f} ms, zstd "
              f"{figures['compress_ms']:.0f} ms, image {figures['raw_bytes'] / 2**20:.1f} MiB, "
              f"{figures['image_bytes'] / 2**20:.1f} MiB compressed; launcher start to started "
              f"{restore_ms:.0f} ms, to a connected client {reply_ms:.0f} ms ({restored_line})")
    finally:
        first.end()


def jail_files(base, name, uid, key):
    """A kernel's runtime dir as the gateway makes one: conn dir, connection file, spec."""
    os.makedirs(base, 0o711, exist_ok=True)
    work, conn_dir = os.path.join(base, "work"), os.path.join(base, "conn")
    os.mkdir(work, 0o700)
    os.mkdir(conn_dir, 0o700)
    conn_file = os.path.join(conn_dir, "connection.json")
    with open(conn_file, "w") as f:
        json.dump({"transport": "ipc", "ip": os.path.join(conn_dir, "k"), "shell_port": 1,
                   "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5,
                   "key": key, "signature_scheme": "hmac-sha256"}, f)
    spec_file = os.path.join(base, "jail.json")
    with open(spec_file, "w") as f:
        json.dump({"name": name, "uid": uid, "gid": uid, "work_dir": work,
                   "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}}, f)
    return ["--status-file", os.path.join(base, "status"), "--spec", spec_file,
            "--connection-file", conn_file], conn_file, work


def cgroup_of(pid):
    with open(f"/proc/{pid}/cgroup") as f:
        return f.read()


def test_a_snapshot_leaves_the_kernel_running_and_copies_start_under_their_own_identity(runtime):
    """--checkpoint --leave-running: the source runs on. Two copies restored from the image at
    once, each with its own uid, cgroup, work dir and connection dir: the source's variables, its
    work-dir file and its /tmp file (re-owned), and nothing shared: a copy's change stays its own,
    a copy sees no other kernel's processes, and every process of a copy is its uid's and in its
    cgroup."""
    key = uuid.uuid4().hex  # the copies' kernels hold their source's key in memory
    base_uid = 2_000_100_000 + (os.getpid() % 10_000) * 3
    src_common, src_conn, src_work = jail_files(os.path.join(runtime, "src"),
                                                f"snap-{os.getpid()}-0", base_uid, key)
    log = os.path.join(runtime, "kernel.log")
    source = Launcher([*src_common, "--", "/usr/bin/python3", "-m", "ipykernel_launcher", "-f",
                       src_conn], log)
    copies = []
    try:
        init = read_event(source.status, "started")["pid"]
        client, context = connect(src_conn)
        assert execute(client, "x = 41\nimport numpy as np\na = np.arange(1e6)\n"
                               "open('/tmp/t.txt', 'w').write('tmp')\n"
                               "open('/home/kernel/note.txt', 'w').write('kept')")[1] == "ok"
        disconnect(client, context)
        images = os.path.join(runtime, "snapshot")
        dumped = subprocess.run([LAUNCHER, "--checkpoint", str(init), "--images", images,
                                 "--leave-running", *src_common],
                                capture_output=True, text=True, timeout=120)
        assert dumped.returncode == 0, dumped.stderr
        # The source runs on and answers.
        client, context = connect(src_conn)
        assert execute(client, "x") == ("41", "ok")

        made = []
        for i in (1, 2):
            common, conn, work = jail_files(os.path.join(runtime, f"copy{i}"),
                                            f"snap-{os.getpid()}-{i}", base_uid + i, key)
            made.append((common, conn, work, base_uid + i, f"snap-{os.getpid()}-{i}"))
        for common, *_ in made:  # both restores run at once, from the one image
            copies.append(Launcher(["--restore", images, *common], log))
        for launcher, (common, conn, work, uid, name) in zip(copies, made):
            started = read_event(launcher.status, "started")
            copy, copy_context = connect(conn)
            assert execute(copy, "x + 1") == ("42", "ok")
            assert execute(copy, "a.sum()") == ("499999500000.0", "ok")
            assert execute(copy, "open('/home/kernel/note.txt').read()") == ("'kept'", "ok")
            assert execute(copy, "import os; os.getuid(), os.stat('/tmp/t.txt').st_uid, "
                                 "os.stat('/home/kernel/note.txt').st_uid") == \
                (f"({uid}, {uid}, {uid})", "ok")
            # Its pid namespace holds its own processes only (pid 1 and the kernel).
            pids, _ = execute(copy, "sorted(int(p) for p in os.listdir('/proc') if p.isdigit())")
            assert pids is not None and len(eval(pids)) <= 3, pids
            assert execute(copy, "x = 1000; x") == ("1000", "ok")
            disconnect(copy, copy_context)
            for pid in processes_of_uid(uid):
                assert name in cgroup_of(pid), (pid, cgroup_of(pid))
            assert name in cgroup_of(started["pid"])
            assert os.stat(os.path.join(work, "note.txt")).st_uid == uid
        # The copies' changes stayed theirs.
        assert execute(client, "x") == ("41", "ok")
        for pid in processes_of_uid(base_uid):
            assert f"snap-{os.getpid()}-0" in cgroup_of(pid)
        client.shutdown()
        disconnect(client, context)
        assert read_event(source.status, "exited")["reason"] == "ok"
    finally:
        for launcher in copies:
            launcher.end()
        source.end()
        for i in (1, 2):
            subprocess.run(["umount", "-l", os.path.join(runtime, f"copy{i}", "work")],
                           stderr=subprocess.DEVNULL, check=False)
        subprocess.run(["umount", "-l", os.path.join(runtime, "src", "work")],
                       stderr=subprocess.DEVNULL, check=False)
