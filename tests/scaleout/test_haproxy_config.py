"""deploy/haproxy/cellgate-haproxy: its configs pass `haproxy -c`, and one runs for real.

Debian's HAProxy runs on 127.0.0.1 in front of three stand-in gateways (threads of this test,
each answering with its own node tag, as `cellgate serve --node-tag N` does in its
X-Cellgate-Node header) and their agent-check ports. No cellgate binary is needed: this checks
the router's rules, not the gateway. Every wait polls with a deadline.
"""

import http.client
import http.server
import json
import os
import shutil
import socket
import socketserver
import subprocess
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATOR = os.path.join(ROOT, "deploy", "haproxy", "cellgate-haproxy")
DEADLINE = 20.0  # seconds for HAProxy to start or to see a check change; ~1 s is usual


def haproxy_binary():
    path = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.access(path, os.X_OK):
        pytest.fail("no haproxy: install Debian's package (scripts/install-deps)")
    return path


def generate(*args, check=True):
    return subprocess.run(["/usr/bin/python3", GENERATOR, *args], capture_output=True,
                          text=True, check=check, timeout=60)


def poll(what, fn, deadline=DEADLINE):
    """fn() until it returns a true value; fails naming `what` after `deadline` seconds."""
    end = time.monotonic() + deadline
    last = None
    while time.monotonic() < end:
        last = fn()
        if last:
            return last
        time.sleep(0.05)
    pytest.fail(f"timed out after {deadline} s waiting for {what} (last: {last!r})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- stand-in gateways ----------------------------------------------------------------------

class Quiet(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # HAProxy's checks hang up without reading the answer


class StandIn:
    """One node: an HTTP port, an E2B port and an agent-check port, on 127.0.0.1."""

    def __init__(self, n):
        self.tag = f"{n:04x}"
        self.agent_line = "ready 50%\n"
        self.full = False  # answer creates with 503, as a node with no room does
        self.seen = []
        self.http = self._http_server("main")
        self.e2b = self._http_server("e2b")
        self.agent = self._agent_server()
        self.servers = [self.http, self.e2b, self.agent]
        for s in self.servers:
            threading.Thread(target=s.serve_forever, daemon=True).start()

    def address(self):
        return (f"127.0.0.1:{self.http.server_address[1]}:{self.agent.server_address[1]}"
                f":{self.e2b.server_address[1]}")

    def _http_server(self, port_name):
        node = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                creates = ("/api/kernels", "/api/sessions", "/sandboxes")
                if node.full and self.command == "POST" and self.path in creates:
                    status = 503
                else:
                    status = 200
                if self.headers.get("X-Forwarded-For"):  # a request, not one of HAProxy's checks
                    node.seen.append((port_name, self.command, self.path, status))
                body = json.dumps({"node": node.tag, "port": port_name, "path": self.path,
                                   "method": self.command}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Cellgate-Node", node.tag)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = do_PATCH = _answer

        server = Quiet(("127.0.0.1", 0), Handler)
        return server

    def _agent_server(self):
        node = self

        class Agent(socketserver.BaseRequestHandler):
            # HAProxy's agent-check protocol: one line, then close (cellgate --agent-port).
            def handle(self):
                self.request.sendall(node.agent_line.encode())

        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Agent)
        server.daemon_threads = True
        return server

    def stop_http(self):
        """Like a killed gateway: the main port stops answering."""
        self.http.shutdown()
        self.http.server_close()

    def close(self):
        for s in self.servers:
            try:
                s.shutdown()
                s.server_close()
            except OSError:
                pass


class Router:
    def __init__(self, tmp, nodes):
        self.nodes = nodes
        self.port = free_port()
        self.e2b_port = free_port()
        self.socket = os.path.join(tmp, "admin.sock")
        maps = os.path.join(tmp, "maps")
        # Four backends for three stand-ins: tag 0003 has a backend but no server yet.
        out = generate("--nodes", "4", "--servers", ",".join(n.address() for n in nodes),
                       "--bind", f"127.0.0.1:{self.port}", "--e2b-port", "49999",
                       "--e2b-bind", f"127.0.0.1:{self.e2b_port}",
                       "--stats-socket", self.socket, "--maps-dir", maps, "--write-maps", maps)
        self.cfg = os.path.join(tmp, "haproxy.cfg")
        with open(self.cfg, "w", encoding="utf-8") as f:
            f.write(out.stdout)
        check = subprocess.run([haproxy_binary(), "-c", "-f", self.cfg], capture_output=True,
                               text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        self.log = open(os.path.join(tmp, "haproxy.log"), "w+", encoding="utf-8")
        self.proc = subprocess.Popen([haproxy_binary(), "-db", "-f", self.cfg],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        try:
            poll("HAProxy's Runtime API", lambda: self.proc.poll() is None and self.stat())
        except BaseException:
            self.close()
            raise

    def admin(self, command):
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(5)
                s.connect(self.socket)
                s.sendall(command.encode() + b"\n")
                chunks = []
                while chunk := s.recv(65536):
                    chunks.append(chunk)
                return b"".join(chunks).decode()
        except OSError:
            return ""

    def stat_rows(self):
        """`show stat` as one dict per proxy and server (pxname, svname, status, wredis, …)."""
        text = self.admin("show stat")
        if not text.startswith("# "):
            return []
        lines = text[2:].splitlines()
        head = lines[0].split(",")
        return [dict(zip(head, line.split(","))) for line in lines[1:] if line]

    def stat(self):
        """{(backend, server): status}, e.g. ('be_place', 'n0'): 'DRAIN'."""
        return {(r["pxname"], r["svname"]): r["status"] for r in self.stat_rows()
                if r["svname"] not in ("FRONTEND", "BACKEND")}

    def request(self, method, path, *, port=None, headers=None, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", port or self.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            data = r.read()
            return r.status, r.getheader("X-Cellgate-Node"), data
        finally:
            conn.close()

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = [StandIn(n) for n in range(3)]
    nodes[0].agent_line = "drain\n"  # node 0 takes no new work but keeps serving its ids
    router = None
    try:
        router = Router(str(tmp_path_factory.mktemp("router")), nodes)
        want = {("be_place", "n0"): "DRAIN", ("be_place", "n1"): "UP",
                ("be_place", "n2"): "UP", ("be_n0", "n0"): "UP", ("be_n1", "n1"): "UP",
                ("be_n2", "n2"): "UP", ("be_e2b_place", "n0"): "DRAIN",
                ("be_e2b_place", "n1"): "UP", ("be_e2b_n2", "n2"): "UP"}
        # A drained server's status reads "DRAIN (agent)".
        poll("checks and agents seen by HAProxy",
             lambda: all(router.stat().get(k, "").split(" ")[0] == v for k, v in want.items()))
        yield router, nodes
    finally:
        if router is not None:
            router.close()
        for n in nodes:
            n.close()


def kid(tag, rest="abcd-1234-4abc-8def-0123456789ab"):
    """A kernel id minted by node `tag`: its first 4 hex digits, a per-boot epoch, random."""
    return f"{tag}{rest}"


# --- the generator alone ----------------------------------------------------------------------

@pytest.mark.parametrize("variant", [
    ["--server-template", "cellgate-{n}.cellgate.default.svc.cluster.local",
     "--resolvers-nameserver", "127.0.0.1:53"],
    ["--server-template", "cellgate-{n}.cellgate.default.svc.cluster.local", "--resolv-conf",
     "--e2b-port", "49999", "--health-bind", "0.0.0.0:8404"],
    ["--servers", "127.0.0.1:9000:9100,127.0.0.1:9001:9101:9201", "--e2b-port", "49999"],
])
def test_generated_configs_pass_haproxy_check(tmp_path, variant):
    maps = str(tmp_path / "maps")
    out = generate("--nodes", "256", *variant, "--stats-socket", str(tmp_path / "s"),
                   "--maps-dir", maps, "--write-maps", maps)
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(out.stdout)
    r = subprocess.run([haproxy_binary(), "-c", "-f", str(cfg)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    for n in (0, 255):
        assert f"backend be_n{n}\n" in out.stdout
    tags = (tmp_path / "maps" / "tags.map").read_text().splitlines()
    assert "0000 be_n0" in tags and "00ff be_n255" in tags
    assert (tmp_path / "maps" / "override.map").read_text() == ""


def test_haproxy_check_catches_a_broken_config(tmp_path):
    """`haproxy -c` is a real check: a config with a bad rule does not pass."""
    out = generate("--nodes", "2", "--servers", "127.0.0.1:9000", "--stats-socket",
                   str(tmp_path / "s"), "--maps-dir", str(tmp_path), "--write-maps",
                   str(tmp_path))
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(out.stdout.replace("balance leastconn", "balance leastconnections"))
    r = subprocess.run([haproxy_binary(), "-c", "-f", str(cfg)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0


@pytest.mark.parametrize("bad", [
    ["--nodes", "0", "--servers", "127.0.0.1:1"],
    ["--nodes", "2", "--server-template", "cellgate-x", "--resolv-conf"],
    ["--nodes", "2", "--server-template", "cellgate-{n}"],
    ["--nodes", "1", "--servers", "127.0.0.1:1,127.0.0.1:2"],
    ["--nodes", "1", "--servers", "127.0.0.1"],
])
def test_generator_refuses_bad_options(bad):
    r = generate(*bad, check=False)
    assert r.returncode == 2 and "error:" in r.stderr


# --- HAProxy running in front of stand-ins ----------------------------------------------------

def test_ids_reach_their_node(cluster):
    router, _ = cluster
    routes = [
        ("GET", f"/api/kernels/{kid('0001')}", "0001"),
        ("POST", f"/api/kernels/{kid('0001')}/execute", "0001"),
        ("GET", f"/api/kernels/{kid('0002')}/channels?session_id=x", "0002"),
        ("GET", f"/api/kernels/{kid('0002')}/files/a/b.txt", "0002"),
        ("GET", f"/api/sessions/{kid('0001')}", "0001"),
        ("DELETE", f"/api/snapshots/{kid('0002')}", "0002"),
        # A draining node still serves the ids it minted.
        ("GET", f"/api/kernels/{kid('0000')}", "0000"),
        # Upper case is the same id.
        ("GET", f"/api/kernels/{kid('0001').upper()}", "0001"),
    ]
    for method, path, tag in routes:
        status, node, _ = router.request(method, path)
        assert (status, node) == (200, tag), (method, path)


def test_unknown_tag_gets_haproxys_own_404(cluster):
    router, nodes = cluster
    before = sum(len(n.seen) for n in nodes)
    status, node, body = router.request("GET", f"/api/kernels/{kid('00ff')}")
    assert status == 404 and node is None
    assert json.loads(body)["reason"] == "unknown-node"
    status, _, body = router.request("GET", f"/api/kernels/not-a-{kid('0001')}")
    assert status == 404 and json.loads(body)["reason"] == "unknown-node"
    assert sum(len(n.seen) for n in nodes) == before  # no node was asked


def test_a_tag_with_a_backend_but_no_node_gets_503(cluster):
    router, _ = cluster
    status, node, _ = router.request("GET", f"/api/kernels/{kid('0003')}")
    assert (status, node) == (503, None)


def test_creates_avoid_a_draining_node(cluster):
    router, nodes = cluster
    landed = set()
    for path in ["/api/kernels", "/api/sessions", "/api/execute"] * 4:
        status, node, _ = router.request("POST", path, body=b"{}",
                                         headers={"Content-Type": "application/json"})
        assert status == 200
        landed.add(node)
    assert landed <= {"0001", "0002"} and landed, landed
    assert not [s for s in nodes[0].seen if s[1] == "POST"]
    assert all(router.request("GET", "/api")[:2] != (200, "0000") for _ in range(6))


def test_lists_and_api_go_to_placement(cluster):
    router, _ = cluster
    for path in ["/api", "/api/kernels", "/api/sessions", "/api/kernelspecs"]:
        status, node, _ = router.request("GET", path)
        assert status == 200 and node in ("0001", "0002"), path


def test_mcp_routes_on_its_session_header(cluster):
    router, _ = cluster
    status, node, _ = router.request("POST", "/mcp", body=b"{}",
                                     headers={"Mcp-Session-Id": kid("0002")})
    assert (status, node) == (200, "0002")
    status, node, _ = router.request("POST", "/mcp", body=b"{}")
    assert status == 200 and node in ("0001", "0002")


def test_e2b_routes_on_header_or_host(cluster):
    router, nodes = cluster
    port = router.e2b_port
    status, node, body = router.request("POST", "/execute", port=port, body=b"{}",
                                        headers={"E2b-Sandbox-Id": kid("0002")})
    assert (status, node) == (200, "0002") and json.loads(body)["port"] == "e2b"
    host = f"49999-{kid('0001')}.e2b.example"
    status, node, body = router.request("POST", "/contexts", port=port, body=b"{}",
                                        headers={"Host": host})
    assert (status, node) == (200, "0001") and json.loads(body)["port"] == "e2b"
    # Both: the header wins.
    status, node, _ = router.request("GET", "/health", port=port,
                                     headers={"Host": host, "E2b-Sandbox-Id": kid("0000")})
    assert (status, node) == (200, "0000")
    status, node, body = router.request("GET", "/x", port=port,
                                        headers={"E2b-Sandbox-Id": kid("00fe")})
    assert status == 404 and json.loads(body)["reason"] == "unknown-node"
    for _ in range(4):
        status, node, body = router.request("POST", "/sandboxes", port=port, body=b"{}")
        assert status == 200 and node in ("0001", "0002")
        assert json.loads(body)["port"] == "e2b"


def test_a_full_node_is_retried_elsewhere(cluster):
    router, nodes = cluster
    nodes[2].full = True
    try:
        for _ in range(8):
            status, node, _ = router.request("POST", "/api/kernels", body=b"{}")
            assert (status, node) == (200, "0001")
    finally:
        nodes[2].full = False
    # HAProxy counted the redispatches: the 503s were retried, not answered.
    place = [r for r in router.stat_rows() if (r["pxname"], r["svname"]) == ("be_place", "n2")]
    assert int(place[0]["wredis"]) > 0


def test_override_map_moves_one_id(cluster):
    router, _ = cluster
    moved, stays = kid("0001", "aaaa-1234-4abc-8def-0123456789ab"), kid("0001")
    assert router.admin(f"add map override.map {moved} be_n2").strip() == ""
    try:
        assert router.request("GET", f"/api/kernels/{moved}")[:2] == (200, "0002")
        assert router.request("GET", f"/api/kernels/{stays}")[:2] == (200, "0001")
    finally:
        router.admin(f"del map override.map {moved}")
    assert router.request("GET", f"/api/kernels/{moved}")[:2] == (200, "0001")


def test_a_killed_node_gets_503(cluster):
    """Last: it stops node 1's main port. Its ids answer 503 once its check fails."""
    router, nodes = cluster
    nodes[1].stop_http()
    poll("node 1 marked down", lambda: router.stat().get(("be_n1", "n1"), "").startswith("DOWN"))
    status, node, _ = router.request("GET", f"/api/kernels/{kid('0001')}")
    assert (status, node) == (503, None)
    status, node, _ = router.request("POST", "/api/kernels", body=b"{}")
    assert (status, node) == (200, "0002")
