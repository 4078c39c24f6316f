"""JupyterLab's debugger on a jailed kernel: the Debug Adapter Protocol sequence of ipykernel's
own debugger tests (ipykernel/tests/test_debugger.py), sent through cellgate's WebSocket as
JupyterLab sends it: `debug_request` on the control channel, `debug_reply` back on it,
`debug_event` on iopub.

The kernel comes from a kernelspec with `metadata.cellgate.debugger` on a gateway started with
`--allow-debugger`: it runs in its own network namespace with only `lo`, up, and may open TCP and
UDP sockets there (debugpy listens on 127.0.0.1 inside the kernel). A kernel of the plain python3
kernelspec still refuses AF_INET, and JupyterLab is told which kernelspecs can debug
(`metadata.debugger` in /api/kernelspecs). A gateway without the switch refuses the kernelspec.
"""

import datetime
import json
import os
import sys
import tempfile
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")
DEBUG_SPEC = "python3-debugger"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")

# ipykernel's test cell: a breakpoint on line 2 stops in f with a=2, b=3.
CELL = """def f(a, b):
    c = a + b
    return c

print(f(2, 3))"""


def write_debug_kernelspec(tmp):
    """A kernelspec dir (on JUPYTER_PATH) for Debian's ipykernel that asks for the debugger."""
    spec_dir = os.path.join(tmp, "jupyter", "kernels", DEBUG_SPEC)
    os.makedirs(spec_dir)
    with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
        json.dump({"argv": ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f",
                            "{connection_file}"],
                   "display_name": "Python 3 (debugger)", "language": "python",
                   "metadata": {"debugger": True, "cellgate": {"debugger": True}}}, f)
    return os.path.join(tmp, "jupyter")


def start_gateway(tmp, allow):
    os.environ["JUPYTER_PATH"] = write_debug_kernelspec(tmp)
    args = ["--pool-size", "0"] + (["--allow-debugger"] if allow else [])
    return gb.start_cellgate(BIN_DIR, tmp, 4, args, label="allow" if allow else "deny")


def start_kernel(server, name):
    status, body = gb.http_request(server, "POST", "/api/kernels", {"name": name}, timeout=120)
    return status, json.loads(body) if body else {}


class Client:
    """A WebSocket client that keeps what arrives while it waits for something else."""

    def __init__(self, server, kid):
        self.ws = gb.KernelClient(server, kid, timeout=60.0)
        self.seen = []
        self.seq = 0

    def send(self, channel, msg_type, content):
        msg_id = uuid.uuid4().hex
        msg = {"header": {"msg_id": msg_id, "username": "t", "session": self.ws.session,
                          "msg_type": msg_type, "version": "5.3",
                          "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
               "parent_header": {}, "metadata": {}, "content": content, "channel": channel,
               "buffers": []}
        if self.ws.v1:
            self.ws.ws.send_frame(0x2, gb.encode_v1(msg))
        else:
            self.ws.ws.send_json(msg)
        return msg_id

    def wait(self, match):
        """The first message (already seen or next) for which match(msg) holds."""
        for i, msg in enumerate(self.seen):
            if match(msg):
                return self.seen.pop(i)
        while True:
            msg = self.ws.recv()
            if match(msg):
                return msg
            self.seen.append(msg)

    def debug(self, command, arguments=None):
        self.seq += 1
        msg_id = self.send("control", "debug_request",
                           {"type": "request", "seq": self.seq, "command": command,
                            "arguments": arguments or {}})
        reply = self.wait(lambda m: m["header"]["msg_type"] == "debug_reply"
                          and m["parent_header"].get("msg_id") == msg_id)
        assert reply.get("channel") == "control", reply
        content = reply["content"]
        assert content.get("command") == command, content
        assert content.get("success"), content
        return content

    def execute(self, code):
        return self.send("shell", "execute_request",
                         {"code": code, "silent": False, "store_history": True,
                          "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})

    def event(self, name):
        msg = self.wait(lambda m: m["header"]["msg_type"] == "debug_event"
                        and m["content"].get("event") == name)
        assert msg.get("channel") == "iopub", msg
        return msg["content"]

    def finish(self, msg_id):
        """A cell's execute_reply content and its stdout, once the reply and idle both came
        (iopub and shell are separate streams: output may follow the reply)."""
        mine = lambda m: m["parent_header"].get("msg_id") == msg_id  # noqa: E731
        reply = self.wait(lambda m: m["header"]["msg_type"] == "execute_reply" and mine(m))
        self.wait(lambda m: m["header"]["msg_type"] == "status" and mine(m)
                  and m["content"].get("execution_state") == "idle")
        out = "".join(m["content"]["text"] for m in self.seen
                      if m["header"]["msg_type"] == "stream" and mine(m))
        return reply["content"], out

    def run_stdout(self, code):
        return self.finish(self.execute(code))

    def close(self):
        self.ws.close()


def kernelspec_debugger(server, name):
    status, body = gb.http_request(server, "GET", "/api/kernelspecs")
    assert status == 200, body
    return json.loads(body)["kernelspecs"][name]["spec"]["metadata"].get("debugger")


def test_the_dap_sequence_stops_at_a_breakpoint_and_shows_variables():
    with tempfile.TemporaryDirectory() as tmp:
        server = start_gateway(tmp, allow=True)
        try:
            # What JupyterLab reads to offer its debugger: only where it can work.
            assert kernelspec_debugger(server, DEBUG_SPEC) is True
            assert kernelspec_debugger(server, "python3") is False
            status, model = start_kernel(server, DEBUG_SPEC)
            assert status == 201, model
            client = Client(server, model["id"])
            try:
                init = client.debug("initialize", {
                    "clientID": "test-client", "clientName": "testClient", "adapterID": "",
                    "pathFormat": "path", "linesStartAt1": True, "columnsStartAt1": True,
                    "supportsVariableType": True, "supportsVariablePaging": True,
                    "supportsRunInTerminalRequest": True, "locale": "en"})
                assert init["body"].get("supportsConfigurationDoneRequest"), init
                client.debug("attach")
                info = client.debug("debugInfo")
                assert info["body"]["isStarted"] is True, info
                source = client.debug("dumpCell", {"code": CELL})["body"]["sourcePath"]
                bps = client.debug("setBreakpoints", {"breakpoints": [{"line": 2}],
                                                      "source": {"path": source},
                                                      "sourceModified": False})
                assert len(bps["body"]["breakpoints"]) == 1, bps
                assert bps["body"]["breakpoints"][0]["verified"], bps
                info = client.debug("debugInfo")
                assert source in [b["source"] for b in info["body"]["breakpoints"]], info
                client.debug("configurationDone")

                cell = client.execute(CELL)
                stopped = client.event("stopped")
                assert stopped["body"]["reason"] == "breakpoint", stopped
                thread = stopped["body"]["threadId"]
                frames = client.debug("stackTrace", {"threadId": thread})["body"]["stackFrames"]
                assert frames[0]["name"] == "f" and frames[0]["line"] == 2, frames
                scopes = client.debug("scopes", {"frameId": frames[0]["id"]})["body"]["scopes"]
                local = next(s for s in scopes if s["name"] == "Locals")
                variables = client.debug("variables", {
                    "variablesReference": local["variablesReference"]})["body"]["variables"]
                values = {v["name"]: v["value"] for v in variables}
                assert values.get("a") == "2" and values.get("b") == "3", variables
                client.debug("continue", {"threadId": thread})

                reply, out = client.finish(cell)
                assert reply["status"] == "ok", reply
                assert out == "5\n", out
                client.debug("disconnect", {"restart": False, "terminateDebuggee": True})

                # What the jail opened: lo and nothing else, no route out.
                reply, out = client.run_stdout(
                    "import socket, errno\n"
                    "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev')"
                    ".readlines()[2:]))\n"
                    "s = socket.socket()\n"
                    "try:\n"
                    "    s.connect(('169.254.169.254', 80))\n"
                    "except OSError as e:\n"
                    "    print(errno.errorcode[e.errno])\n")
                assert reply["status"] == "ok", reply
                assert out == "['lo']\nENETUNREACH\n", out
            finally:
                client.close()

            # A kernel of the plain kernelspec, beside it, still has no AF_INET.
            status, model = start_kernel(server, "python3")
            assert status == 201, model
            plain = Client(server, model["id"])
            try:
                reply, out = plain.run_stdout(
                    "import socket\n"
                    "try:\n"
                    "    socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
                    "    print('OPEN')\n"
                    "except PermissionError:\n"
                    "    print('EPERM')\n")
                assert reply["status"] == "ok" and out == "EPERM\n", (reply, out)
            finally:
                plain.close()
        finally:
            server.stop()


def test_a_gateway_without_the_switch_refuses_the_kernelspec():
    with tempfile.TemporaryDirectory() as tmp:
        server = start_gateway(tmp, allow=False)
        try:
            assert kernelspec_debugger(server, DEBUG_SPEC) is False
            status, body = start_kernel(server, DEBUG_SPEC)
            assert status == 403, body
            assert "--allow-debugger" in body.get("message", ""), body
        finally:
            server.stop()


def test_the_broker_of_a_privilege_separated_gateway_gives_the_same_network():
    """serve --user: the root broker looks the kernelspec up itself and applies its own copy of
    --allow-debugger; the kernel gets lo, TCP on it, and the debugger answers."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # the unprivileged gateway reaches its state dir below it
        os.environ["JUPYTER_PATH"] = write_debug_kernelspec(tmp)
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ["--pool-size", "0", "--allow-debugger",
                                                      "--user", "64001:64002"], label="broker")
        try:
            status, model = start_kernel(server, DEBUG_SPEC)
            assert status == 201, model
            client = Client(server, model["id"])
            try:
                client.debug("initialize", {"clientID": "t", "adapterID": "",
                                            "pathFormat": "path", "linesStartAt1": True,
                                            "columnsStartAt1": True})
                client.debug("attach")
                reply, out = client.run_stdout(
                    "import socket\n"
                    "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev')"
                    ".readlines()[2:]))\n"
                    "s = socket.socket(); s.bind(('127.0.0.1', 0)); print('bound')\n")
                assert reply["status"] == "ok" and out == "['lo']\nbound\n", (reply, out)
            finally:
                client.close()
        finally:
            server.stop()


def test_a_kernel_with_its_debugger_attached_hibernates_and_stops_at_a_breakpoint_after():
    """Checkpoints of debugger kernels: debugpy's adapter and pydevd talk over TCP on the kernel's
    own loopback; CRIU dumps and restores those established connections with the netns (its
    --tcp-established). The resumed kernel keeps its variables, and the same debug session sets a
    breakpoint and stops at it."""
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["JUPYTER_PATH"] = write_debug_kernelspec(tmp)
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ["--pool-size", "0", "--allow-debugger",
                                                      "--no-zygote", "--checkpoint-without-landlock"],
                                   label="hibernate")
        try:
            status, model = start_kernel(server, DEBUG_SPEC)
            assert status == 201, model
            kid = model["id"]
            client = Client(server, kid)
            client.debug("initialize", {"clientID": "t", "adapterID": "", "pathFormat": "path",
                                        "linesStartAt1": True, "columnsStartAt1": True})
            client.debug("attach")
            reply, _ = client.run_stdout("kept = 41")
            assert reply["status"] == "ok", reply
            client.close()
            status, body = gb.http_request(server, "POST", f"/api/kernels/{kid}/hibernate",
                                           timeout=300)
            if status == 501:
                pytest.skip(f"checkpoints are unavailable here: {body}")
            assert status == 200 and json.loads(body)["hibernated"] is True, body

            client = Client(server, kid)  # its first message resumes the kernel
            try:
                reply, out = client.run_stdout("print(kept + 1)")
                assert reply["status"] == "ok" and out == "42\n", (reply, out)
                source = client.debug("dumpCell", {"code": CELL})["body"]["sourcePath"]
                bps = client.debug("setBreakpoints", {"breakpoints": [{"line": 2}],
                                                      "source": {"path": source},
                                                      "sourceModified": False})
                assert bps["body"]["breakpoints"][0]["verified"], bps
                client.debug("configurationDone")
                cell = client.execute(CELL)
                stopped = client.event("stopped")
                assert stopped["body"]["reason"] == "breakpoint", stopped
                client.debug("continue", {"threadId": stopped["body"]["threadId"]})
                reply, out = client.finish(cell)
                assert reply["status"] == "ok" and out == "5\n", (reply, out)
            finally:
                client.close()
        finally:
            server.stop()
