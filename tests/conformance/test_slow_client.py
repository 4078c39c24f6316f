"""A WebSocket client that stops reading is disconnected with a logged reason once its queue
passes --max-ws-queue-bytes; the gateway's memory stays bounded, the other client gets every
byte, and the kernel keeps working."""
import os
import pathlib
import sys
import tempfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR",
                         str(pathlib.Path(__file__).resolve().parents[2] / "build" / "bin"))
QUEUE_LIMIT = 8_000_000
CHUNKS = 192  # 192 x 256 KiB = 48 MiB, at most ~25 MB/s so a reading client keeps up


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")
def test_a_client_that_stops_reading_is_disconnected():
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--max-ws-queue-bytes", str(QUEUE_LIMIT)))
        try:
            kid = gb.start_kernel(server)
            slow = gb.KernelClient(server, kid)
            fast = gb.KernelClient(server, kid)
            rss_before = rss_kib(server.proc.pid)
            # The slow client asks for the flood and then never reads.
            msg_id = slow.execute(
                "import sys, time\n"
                f"for i in range({CHUNKS}):\n"
                "    sys.stdout.write(('x' * 1023 + '\\n') * 256); sys.stdout.flush()\n"
                "    time.sleep(0.01)\n")
            # The execute_reply goes to the slow client's session only; iopub goes to both, so
            # the fast client follows the cell through its iopub idle status.
            received = 0
            idle = False
            while not idle:
                msg = fast.recv()
                if msg["header"]["msg_type"] == "stream":
                    received += len(msg["content"]["text"])
                if msg.get("parent_header", {}).get("msg_id") == msg_id:
                    idle = (msg["header"]["msg_type"] == "status" and
                            msg["content"]["execution_state"] == "idle")
            assert received == CHUNKS * 256 * 1024, "the reading client must get every byte"
            rss_growth_mib = (rss_kib(server.proc.pid) - rss_before) / 1024
            assert rss_growth_mib < 24, f"the gateway grew {rss_growth_mib:.0f} MiB"

            log = pathlib.Path(server.log_path).read_text(errors="replace")
            assert "disconnecting it" in log and "fell" in log, log[-2000:]
            # The kernel and the other client are fine.
            fast.run("print('still here')")
            fast.close()

            # The slow client finds its connection closed with 1008 (policy) once it reads.
            slow.ws.sock.settimeout(30)
            with pytest.raises(gb.WSClosed) as closed:
                while True:
                    slow.ws.recv_message()
            assert "03f0" in str(closed.value), f"close code 1008 expected: {closed.value}"
            gb.delete_kernel(server, kid)
        finally:
            server.stop()
