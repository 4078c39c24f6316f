#!/usr/bin/python3
"""Captures raw Jupyter wire messages from a real ipykernel, for the codec's unit tests.

Run by hand with Debian's Python (it has ipykernel, jupyter_client and pyzmq):

    /usr/bin/python3 tests/tools/capture_fixtures.py [OUTPUT_DIR]

It starts an ipykernel with a known HMAC key, talks to it over its own pyzmq sockets (a DEALER on
shell, a SUB on iopub), and writes one JSON file per captured message to OUTPUT_DIR (default:
tests/fixtures/ipykernel next to this script):

    {"key": "...", "signature_scheme": "hmac-sha256", "channel": "shell" | "iopub",
     "msg_type": "...", "frames_b64": ["...", ...]}

frames_b64 holds the multipart frames exactly as they came off the wire, base64-encoded byte for
byte (iopub's topic frame included). Each request is sent with a fixed msg_id,
"cellgate-fixture-<name>", so a test can check a reply's parent_header without extra fields.
The kernel is shut down before the script exits, also on failure.
"""

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import time

import zmq
from jupyter_client.manager import KernelManager

KEY = "0b7d5a6e-3c1f-4e8a-9b2d-6f4e1c7a9d30"
SCHEME = "hmac-sha256"
DELIMITER = b"<IDS|MSG>"
TIMEOUT_S = 60.0

# Cells executed in the kernel, by request name. Each produces the messages listed in CAPTURES.
CELLS = {
    "stream": "print('hello from cellgate')",
    "execute_result": "1 + 2",
    "display_data": (
        "import matplotlib\n"
        "matplotlib.use('module://matplotlib_inline.backend_inline')\n"
        "import matplotlib.pyplot as plt\n"
        "fig = plt.figure(figsize=(1, 1), dpi=20)\n"
        "plt.plot([1, 2])\n"
        "plt.show()"
    ),
    "error": "1/0",
    "comm_open": (
        "from ipykernel.comm import Comm\n"
        "comm = Comm(target_name='cellgate.test', data={'answer': 42},"
        " buffers=[b'\\x00\\x01\\x02\\xff', b'second buffer'])"
    ),
}

# (fixture file name, request name, channel, msg_type, predicate on the parsed content)
CAPTURES = [
    ("kernel_info_reply", "kernel_info", "shell", "kernel_info_reply", None),
    ("status_busy", "stream", "iopub", "status", lambda c: c.get("execution_state") == "busy"),
    ("stream", "stream", "iopub", "stream", lambda c: c.get("name") == "stdout"),
    ("execute_reply", "stream", "shell", "execute_reply", None),
    ("execute_result", "execute_result", "iopub", "execute_result", None),
    ("display_data", "display_data", "iopub", "display_data",
     lambda c: "image/png" in c.get("data", {})),
    ("execute_reply_error", "error", "shell", "execute_reply", None),
    ("error", "error", "iopub", "error", None),
    ("comm_open", "comm_open", "iopub", "comm_open", None),
]


def split_frames(frames):
    """Returns (identities, [signature, header, parent, metadata, content], buffers)."""
    i = frames.index(DELIMITER)
    return frames[:i], frames[i + 1:i + 6], frames[i + 6:]


def check_signature(frames):
    _, parts, _ = split_frames(frames)
    mac = hmac.new(KEY.encode(), digestmod=hashlib.sha256)
    for part in parts[1:]:
        mac.update(part)
    if not hmac.compare_digest(mac.hexdigest().encode(), parts[0]):
        raise RuntimeError("captured message has a bad signature")


def parse(frames):
    _, parts, _ = split_frames(frames)
    return json.loads(parts[1]), json.loads(parts[2]), json.loads(parts[4])


class Capturer:
    def __init__(self, km):
        self.km = km
        self.session = km.session
        self.ctx = zmq.Context()
        info = km.get_connection_info()
        self.shell = self.ctx.socket(zmq.DEALER)
        self.shell.linger = 0
        self.shell.connect(f"tcp://{info['ip']}:{info['shell_port']}")
        self.iopub = self.ctx.socket(zmq.SUB)
        self.iopub.linger = 0
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(f"tcp://{info['ip']}:{info['iopub_port']}")
        self.poller = zmq.Poller()
        self.poller.register(self.shell, zmq.POLLIN)
        self.poller.register(self.iopub, zmq.POLLIN)
        # request name -> list of (channel, frames)
        self.received = {}

    def close(self):
        self.shell.close(0)
        self.iopub.close(0)
        self.ctx.term()

    def send(self, name, msg_type, content):
        msg = self.session.msg(msg_type, content)
        msg["header"]["msg_id"] = f"cellgate-fixture-{name}"
        msg["msg_id"] = msg["header"]["msg_id"]
        self.session.send(self.shell, msg)
        self.received.setdefault(name, [])

    def pump(self, timeout_ms):
        """Receives whatever arrives within timeout_ms; files frames under their request."""
        for sock, _ in self.poller.poll(timeout_ms):
            frames = sock.recv_multipart(copy=True)
            check_signature(frames)
            _, parent, _ = parse(frames)
            msg_id = parent.get("msg_id", "")
            prefix = "cellgate-fixture-"
            if msg_id.startswith(prefix) and msg_id[len(prefix):] in self.received:
                channel = "shell" if sock is self.shell else "iopub"
                self.received[msg_id[len(prefix):]].append((channel, frames))

    def done(self, name):
        """True once the shell reply and the iopub idle status for a request have arrived."""
        got_reply = got_idle = False
        for channel, frames in self.received.get(name, []):
            header, _, content = parse(frames)
            if channel == "shell":
                got_reply = True
            elif header["msg_type"] == "status" and content["execution_state"] == "idle":
                got_idle = True
        return got_reply and got_idle

    def wait(self, name):
        deadline = time.monotonic() + TIMEOUT_S
        while not self.done(name):
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for the replies to '{name}'")
            self.pump(100)

    def warm_up(self):
        """Sends kernel_info_request until iopub is subscribed (its status messages arrive)."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            self.received.pop("kernel_info", None)
            self.send("kernel_info", "kernel_info_request", {})
            until = time.monotonic() + 2.0
            while time.monotonic() < until and not self.done("kernel_info"):
                self.pump(100)
            if self.done("kernel_info"):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the kernel did not answer kernel_info_request")


def main():
    out_dir = os.path.normpath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "ipykernel"))
    os.makedirs(out_dir, exist_ok=True)

    km = KernelManager(kernel_name="python3")
    km.session.key = KEY.encode()
    km.session.signature_scheme = SCHEME
    argv = km.kernel_spec.argv
    if argv[0] not in (sys.executable, "python", "python3"):
        print(f"warning: kernel argv is {argv}", file=sys.stderr)
    env = dict(os.environ, MPLBACKEND="module://matplotlib_inline.backend_inline",
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    km.start_kernel(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    capturer = None
    try:
        capturer = Capturer(km)
        capturer.warm_up()
        for name, code in CELLS.items():
            capturer.send(name, "execute_request",
                          {"code": code, "silent": False, "store_history": True,
                           "user_expressions": {}, "allow_stdin": False, "stop_on_error": False})
            capturer.wait(name)

        for fixture, request, channel, msg_type, predicate in CAPTURES:
            for got_channel, frames in capturer.received[request]:
                header, _, content = parse(frames)
                if got_channel != channel or header["msg_type"] != msg_type:
                    continue
                if predicate is not None and not predicate(content):
                    continue
                record = {
                    "key": KEY,
                    "signature_scheme": SCHEME,
                    "channel": channel,
                    "msg_type": msg_type,
                    "frames_b64": [base64.b64encode(f).decode("ascii") for f in frames],
                }
                path = os.path.join(out_dir, fixture + ".json")
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(record, f, indent=1)
                    f.write("\n")
                print(f"{path}: {len(frames)} frames, {sum(map(len, frames))} bytes")
                break
            else:
                raise RuntimeError(f"no {channel} {msg_type} captured for '{request}'")
    finally:
        if capturer is not None:
            capturer.close()
        km.shutdown_kernel(now=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
