"""No output lost while a client is away (jupyter_server's buffered offline messages, bounded).

A WebSocket client runs a cell that prints 1,000 lines, waits for a file, then prints 1,000
more. The client reads the first half, leaves (closes its WebSocket), and a file written through
the files API lets the cell go on while nobody is connected. A new connection with the same
session_id gets the second half first, in order, then the cell's idle status and its
execute_reply: every line exactly once. A connection with another session_id gets none of it.

Also: a client connected when its kernel is deleted sees the kernel's iopub shutdown_reply.
"""

import datetime
import os
import sys
import tempfile
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")
HALF = 1000

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")

CELL = f"""import os, time
for i in range({HALF}):
    print(i, flush=True)
while not os.path.exists('go'):
    time.sleep(0.01)
for i in range({HALF}, {2 * HALF}):
    print(i, flush=True)
"""


def connect(server, kid, session):
    """A gateway_bench KernelClient on a WebSocket with this session_id."""
    client = gb.KernelClient.__new__(gb.KernelClient)
    client.server, client.session, client.timeout, client.last_size = server, session, 120.0, 0
    client.ws = gb.WebSocket(server.port, f"/api/kernels/{kid}/channels?session_id={session}",
                             server.token, 120.0)
    client.v1 = client.ws.protocol == gb.V1
    return client


def text_of(msgs):
    """The stdout text of these messages (a print may arrive as "7" then "\\n")."""
    return "".join(m["content"]["text"] for m in msgs
                   if m["header"]["msg_type"] == "stream" and m["content"]["name"] == "stdout")


def test_a_client_back_with_its_session_gets_what_it_missed():
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--pool-size", "0"))
        try:
            kid = gb.start_kernel(server)
            session = uuid.uuid4().hex
            first = connect(server, kid, session)
            msg_id = first.execute(CELL)
            got = ""
            while not got.endswith(f"\n{HALF - 1}\n"):
                msg = first.recv()
                if msg["parent_header"].get("msg_id") == msg_id:
                    got += text_of([msg])
            first.close()
            # Another client, another session: it must not get the first one's missed output.
            stranger = connect(server, kid, uuid.uuid4().hex)
            status, _ = gb.http_request(server, "PUT", f"/api/kernels/{kid}/files/go", "go")
            assert status == 201
            # The cell goes on; the stranger sees it live (iopub is everyone's), then leaves.
            seen = []
            while True:
                msg = stranger.recv()
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                seen.append(msg)
                if msg["header"]["msg_type"] == "status" and \
                        msg["content"]["execution_state"] == "idle":
                    break
            assert text_of(seen).endswith(f"\n{2 * HALF - 1}\n")
            assert not any(m["header"]["msg_type"] == "execute_reply" for m in seen)
            stranger.close()

            back = connect(server, kid, session)
            replayed, replied, idle = [], False, False
            while not (replied and idle):
                msg = back.recv()
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                replayed.append(msg)
                replied = replied or msg["header"]["msg_type"] == "execute_reply"
                idle = idle or (msg["header"]["msg_type"] == "status" and
                                msg["content"]["execution_state"] == "idle")
            lines = (got + text_of(replayed)).splitlines()
            assert lines == [str(i) for i in range(2 * HALF)], (len(lines), lines[:3], lines[-3:])
            reply = [m for m in replayed if m["header"]["msg_type"] == "execute_reply"]
            assert len(reply) == 1 and reply[0]["content"]["status"] == "ok", reply
            # What was replayed is gone: it runs on as an ordinary connection.
            assert back.run_stdout("print('after')") == "after\n"
            back.close()
        finally:
            server.stop()


def test_a_deleted_kernels_clients_see_its_shutdown_reply_on_iopub():
    """DELETE /api/kernels/{id} asks the kernel to shut down while its clients still listen:
    ipykernel's iopub shutdown_reply reaches a connected WebSocket before the socket closes, as
    with jupyter_server (which forwards iopub until the kernel is gone)."""
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--pool-size", "0"))
        try:
            kid = gb.start_kernel(server)
            client = connect(server, kid, uuid.uuid4().hex)
            assert client.run_stdout("print('attached')") == "attached\n"  # listening now
            status, body = gb.http_request(server, "DELETE", f"/api/kernels/{kid}")
            assert status == 204, body
            seen = []
            client.timeout = 30.0
            try:
                while True:
                    msg = client.recv()
                    seen.append((msg.get("channel"), msg["header"]["msg_type"]))
            except gb.InfraError:
                pass  # the gateway closes the socket once the kernel is gone
            assert ("iopub", "shutdown_reply") in seen, seen
            client.close()
        finally:
            server.stop()
