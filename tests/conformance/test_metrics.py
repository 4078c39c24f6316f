"""GET /metrics: Prometheus text format behind the token (401 without it), and figures that move
with what happens: kernel starts and pool claims, cells by status with their latency histogram,
an OOM kill with its automatic restart, requests turned away by reason, open connections, and the
process's own memory, descriptors and threads."""
import os
import re
import socket
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")
SAMPLE = re.compile(r'^([a-z_]+)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-z_]+)="((?:[^"\\]|\\.)*)"(?:,|$)')

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")


def scrape(server):
    """{(name, label value or None): value}, checking every sample's family was declared. A sample
    with several labels is keyed by "k=v,k=v" (the families with one label by its value)."""
    status, body = gb.http_request(server, "GET", "/metrics")
    assert status == 200, body
    declared, samples = {}, {}
    for line in body.decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            declared[name] = kind
            continue
        if line.startswith("#") or not line:
            continue
        m = SAMPLE.match(line)
        assert m, f"not a Prometheus sample: {line!r}"
        name, value = m.group(1), float(m.group(4))
        label = None
        if m.group(3) is not None:
            pairs = LABEL.findall(m.group(3))
            assert pairs and "".join(f'{k}="{v}",' for k, v in pairs).rstrip(",") == m.group(3), line
            label = pairs[0][1] if len(pairs) == 1 else ",".join(f"{k}={v}" for k, v in pairs)
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in declared or family in declared, f"{name} has no # TYPE"
        samples[(name, label)] = value
    return samples


def execute(server, kid, code, timeout=30):
    import json
    status, body = gb.http_request(server, "POST", f"/api/kernels/{kid}/execute",
                                   {"code": code, "timeout": timeout}, timeout=timeout + 60)
    assert status == 200, body
    return json.loads(body)


def test_metrics_follow_what_happens():
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4,
                                   ("--pool-size", "1", "--memory", str(256 << 20)))
        try:
            # Behind the token.
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 401"), "no token must be 401"
            s.close()

            before = scrape(server)
            assert before[("cellgate_process_resident_memory_bytes", None)] > 1 << 20
            assert before[("cellgate_process_open_fds", None)] > 3
            assert before[("cellgate_process_threads", None)] > 1
            assert before[("cellgate_rejected_total", "unauthenticated")] >= 1

            # The pool fills once the zygote's preload is done (seconds on a busy machine): the
            # first start below is a claim only when it is ready.
            gb.wait_pool_ready(server, 1, timeout=120)
            kid = gb.start_kernel(server)
            assert execute(server, kid, "x = 1")["status"] == "ok"
            assert execute(server, kid, "1/0")["status"] == "error"
            assert execute(server, kid, "import time; time.sleep(5)", timeout=1)["status"] == "timeout"

            # A control route's big body: 413; a malformed request line: 400.
            status, _ = gb.http_request(server, "POST", "/api/kernels", {"name": "x" * (80 << 10)})
            assert status == 413
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"GARBAGE\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 400")
            s.close()

            # A memory bomb: killed by the 256 MiB limit, restarted.
            bomb = gb.start_kernel(server)
            answer = execute(server, bomb, "b = bytearray(1 << 30)", timeout=60)
            assert answer["status"] in ("dead", "error"), answer
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                after = scrape(server)
                if after.get(("cellgate_kernel_restarts_total", None), 0) >= 1:
                    break
                time.sleep(0.5)

            after = scrape(server)
            print("\n" + "\n".join(f"{k[0]}{{{k[1]}}} {v:g}" if k[1] else f"{k[0]} {v:g}"
                                   for k, v in sorted(after.items())
                                   if not k[0].endswith("_bucket")))
            assert after[("cellgate_kernel_starts_total", None)] == 2
            assert after[("cellgate_kernel_pool_claims_total", None)] >= 1
            assert after[("cellgate_kernel_oom_kills_total", None)] == 1
            assert after[("cellgate_kernel_deaths_total", "oom")] == 1
            assert after[("cellgate_kernel_restarts_total", None)] == 1
            for status in ("ok", "error", "timeout"):
                assert after[("cellgate_cells_total", status)] >= 1, status
            cells = sum(v for (n, _), v in after.items() if n == "cellgate_cells_total")
            assert after[("cellgate_cell_duration_seconds_count", None)] == cells
            assert after[("cellgate_cell_duration_seconds_sum", None)] >= 1.0  # the timeout
            assert after[("cellgate_rejected_total", "body_too_large")] >= 1
            assert after[("cellgate_rejected_total", "malformed_request")] >= 1
            assert after[("cellgate_kernels", "idle")] == 2
            assert after[("cellgate_connections_open", None)] >= 1
            assert after[("cellgate_connections_accepted_total", None)] > \
                before[("cellgate_connections_accepted_total", None)]
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)
