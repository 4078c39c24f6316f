"""usage_request on the control channel (jupyter-resource-usage's kernel panel), answered by the
gateway from the kernel's cgroup: Debian's ipykernel 6.17 does not answer it, and a jailed
kernel's psutil would see only its own pid namespace.

A WebSocket client asks, as the panel's server extension does through a gateway; the reply comes
to that client only, in ipykernel's shape (kernel_cpu, kernel_memory, host_cpu_percent,
cpu_count, host_virtual_memory) plus the jail's limits; the CPU a busy cell burns shows.
"""

import datetime
import os
import tempfile
import uuid

import pytest

import sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")
MEMORY = 768 * 2**20

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")


def ask_usage(client):
    msg_id = uuid.uuid4().hex
    msg = {"header": {"msg_id": msg_id, "username": "t", "session": client.session,
                      "msg_type": "usage_request", "version": "5.3",
                      "date": datetime.datetime.now(datetime.timezone.utc).isoformat()},
           "parent_header": {}, "metadata": {}, "content": {}, "channel": "control",
           "buffers": []}
    if client.v1:
        client.ws.send_frame(0x2, gb.encode_v1(msg))
    else:
        client.ws.send_json(msg)
    while True:
        reply = client.recv()
        if reply["header"]["msg_type"] == "usage_reply":
            assert reply.get("channel") == "control", reply
            assert reply["parent_header"]["msg_id"] == msg_id, reply
            return reply["content"]


def test_usage_request_is_answered_from_the_cgroup():
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--pool-size", "0", "--memory",
                                                      str(MEMORY), "--cpus", "1"))
        try:
            kid = gb.start_kernel(server)
            client = gb.KernelClient(server, kid)
            other = gb.KernelClient(server, kid)
            try:
                client.run("import numpy as np\nblock = np.ones(64 * 2**20, dtype=np.uint8)")
                first = ask_usage(client)
                for key in ("hostname", "kernel_cpu", "kernel_memory", "cpu_count",
                            "host_virtual_memory"):
                    assert key in first, first
                # The 64 MiB block is the kernel's (its cgroup's), within the jail's limit.
                assert 64 * 2**20 < first["kernel_memory"] < MEMORY, first
                assert first["kernel_memory_limit"] == MEMORY and first["kernel_cpu_limit"] == 1
                assert first["host_virtual_memory"]["total"] > first["kernel_memory"], first
                assert first["source"] == "cgroup", first
                # A busy cell's CPU shows in the next answer (% since the last ask).
                client.run("import time\nt = time.process_time()\n"
                           "while time.process_time() - t < 0.5:\n    pass")
                second = ask_usage(client)
                assert second["kernel_cpu"] > 5, second
                assert "host_cpu_percent" in second, second
                # The other client saw neither reply: a control reply is its asker's. Its own
                # cell's reply comes after anything sent to it before.
                msg_id = other.execute("1")
                seen = []
                while True:
                    msg = other.recv()
                    seen.append(msg["header"]["msg_type"])
                    if msg["header"]["msg_type"] == "execute_reply" and \
                            msg["parent_header"].get("msg_id") == msg_id:
                        break
                assert "usage_reply" not in seen, seen
            finally:
                client.close()
                other.close()
        finally:
            server.stop()
