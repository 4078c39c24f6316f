"""systemd's service protocol without a systemd host (the guest in tests/vm runs the unit for
real): READY=1 with a STATUS= line once listening, WATCHDOG=1 pings, STOPPING=1 on SIGTERM, all on
a NOTIFY_SOCKET this test listens on; socket activation through systemd's own
systemd-socket-activate (the connection made before the gateway runs is answered, not refused);
a passed socket with a name that is not cellgate's stops it with exit status 2."""
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")
CELLGATE = str(pathlib.Path(BIN_DIR) / "cellgate")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")


def env_without_config(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CELLGATE_", "KG_", "NOTIFY_", "LISTEN_", "WATCHDOG_"))}
    env.update(extra)
    return env


def serve_args(tmp, *more):
    return [CELLGATE, "serve", "--state-dir", str(pathlib.Path(tmp) / "state"), "--token", "t",
            "--no-zygote", "--pool-size", "0", *more]


def receive(sock, deadline):
    sock.settimeout(max(0.05, deadline - time.monotonic()))
    return sock.recv(4096).decode()


def socket_activate(tmp, fdname, args):
    """systemd-socket-activate listening on a free loopback port with the gateway to exec on the
    first connection; returns (process, port) once it says it listens (its "Listening on" line)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    proc = subprocess.Popen(["systemd-socket-activate", "-l", f"127.0.0.1:{port}",
                             f"--fdname={fdname}", *args],
                            env=env_without_config(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    first = proc.stdout.readline()
    assert first.startswith(b"Listening on"), first
    return proc, port


def test_readiness_status_watchdog_and_stopping():
    with tempfile.TemporaryDirectory() as tmp:
        path = str(pathlib.Path(tmp) / "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        log = open(pathlib.Path(tmp) / "serve.log", "wb")
        proc = subprocess.Popen(serve_args(tmp, "--port", "0"),
                                env=env_without_config(NOTIFY_SOCKET=path, WATCHDOG_USEC="2000000"),
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            first = receive(sock, deadline)
            assert "READY=1" in first.splitlines(), first
            assert any(line.startswith("STATUS=0 kernels, 0 ready in the pool")
                       for line in first.splitlines()), first
            # It listens by then: the banner is already in the log.
            assert "listening on http://" in pathlib.Path(log.name).read_text()
            # Pings at half the watchdog interval (at most every 5 s): two within the deadline.
            pings = 0
            while pings < 2:
                message = receive(sock, deadline)
                pings += "WATCHDOG=1" in message.splitlines()
            proc.send_signal(signal.SIGTERM)
            stopping = False
            while not stopping:
                stopping = "STOPPING=1" in receive(sock, deadline).splitlines()
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None,
                    reason="systemd-socket-activate (package systemd) is missing")
def test_socket_activation_answers_the_connection_that_started_it():
    with tempfile.TemporaryDirectory() as tmp:
        # The gateway is exec'ed on the first connection; --port is deliberately another one:
        # the passed socket wins.
        proc, port = socket_activate(tmp, "http", serve_args(tmp, "--port", "1"))
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=120)
            conn.sendall(b"GET /api HTTP/1.1\r\nHost: x\r\nAuthorization: token t\r\n"
                         b"Connection: close\r\n\r\n")
            answer = b""
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
            assert b'"version"' in answer
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.communicate(timeout=60)


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None,
                    reason="systemd-socket-activate (package systemd) is missing")
def test_a_passed_socket_of_another_name_is_a_configuration_error():
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = socket_activate(tmp, "metrics", serve_args(tmp))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=30).close()
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 2, out
            assert b"'metrics' is not one of cellgate's" in out, out
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
