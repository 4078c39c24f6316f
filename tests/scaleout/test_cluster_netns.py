"""Three real `cellgate serve` nodes in network namespaces behind Debian's HAProxy.

tests/scaleout/cluster makes the cluster (a bridge, a namespace per node with its own address,
a gateway in each with --node-tag, --agent-port and --peers, the router from
deploy/haproxy/cellgate-haproxy on 127.0.0.1) and ends it. The tests check, with real kernels:
- every route family reaches the node that owns the id, as X-Cellgate-Node says: kernel REST,
  an agent cell, the channels WebSocket, a Jupyter session, a kernel-scoped artifact; and two
  router replicas (same config, no shared state) route alike;
- creates spread over the nodes and stay away from a draining one;
- jupyter_server's GatewayClient and `cellgate run --url` work through the router;
- GET /api/kernels through the router lists every node's kernels;
- a node cut off (its veth down) gets 503 for its ids and is named missing in the others'
  lists; back, its kernels answer with their variables intact;
- a node killed with SIGKILL gets 503; started again with an empty state dir (a new epoch), its
  old ids get 410 {"reason": "node-restarted"};
- a graceful router reload (-sf) keeps an open WebSocket working.
Needs root (namespaces, the jail), haproxy and the build. Every wait polls with a deadline.
"""

import base64
import http.client
import json
import os
import struct
import subprocess
import sys
import zlib

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, HERE)
import gateway_bench as gb  # noqa: E402
import test_haproxy_config as hx  # noqa: E402  poll()

CLUSTER = os.path.join(HERE, "cluster")
BIN_DIR = os.path.abspath(os.environ.get("CELLGATE_BIN_DIR", os.path.join(ROOT, "build", "bin")))
CUT_DEADLINE = 60.0  # s for the router to notice a node gone or back (checks: 1 s, fall 2)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="namespaces and the jail need root")


def ctl(*args, timeout=300):
    done = subprocess.run([CLUSTER, *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"cluster {' '.join(args)}: {done.stderr}"
    return done.stdout


class Cluster:
    def __init__(self, info):
        self.info = info
        self.dir = info["dir"]
        self.token = info["token"]
        self.port = int(info["url"].rsplit(":", 1)[1])
        self.nodes = info["nodes"]
        self.tags = [n["tag"] for n in self.nodes]
        self.view = type("View", (), {"port": self.port, "token": self.token, "name": "router"})

    def ctl(self, *args):
        return ctl(*args, "--dir", self.dir)

    def state(self):
        with open(os.path.join(self.dir, "cluster.json")) as f:
            return json.load(f)

    def stat(self, i=0):
        router = object.__new__(hx.Router)  # only its Runtime API helpers, on our socket
        router.socket = self.state()["routers"][i]["socket"]
        return router.stat()

    def server_state(self, backend, n):
        return self.stat().get((backend, f"n{n}"), "").split(" ")[0]

    def _call(self, host, port, method, path, body, headers, timeout):
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            head = {"Authorization": f"token {self.token}", **(headers or {})}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                head["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=head)
            res = conn.getresponse()
            raw = res.read()
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = raw  # HAProxy's own 503 page, an artifact's bytes
            return res.status, res.getheader("X-Cellgate-Node"), parsed, res
        finally:
            conn.close()

    def through(self, method, path, body=None, headers=None, timeout=60, router=0):
        """Through a router: (status, X-Cellgate-Node, parsed body, response)."""
        port = self.port if router == 0 else int(self.info["routers"][router]["port"])
        return self._call("127.0.0.1", port, method, path, body, headers, timeout)

    def status_within(self, path, timeout):
        """GET path's status through the router, or None if it takes over `timeout` s."""
        try:
            return self.through("GET", path, timeout=timeout)[0]
        except (TimeoutError, OSError):
            return None

    def direct(self, n, method, path, body=None, timeout=60):
        """Straight to node n, bypassing the router."""
        return self._call(self.nodes[n]["address"], 8888, method, path, body, None, timeout)

    def create(self, n=None):
        """A kernel through the router (n None) or on node n; its id."""
        if n is None:
            status, node, model, _ = self.through("POST", "/api/kernels", {"name": "python3"})
        else:
            status, node, model, _ = self.direct(n, "POST", "/api/kernels", {"name": "python3"})
        assert status == 201, (status, model)
        assert model["id"][:4] == node, (model["id"], node)
        return model["id"]

    def delete(self, kid):
        status, _, body, _ = self.through("DELETE", f"/api/kernels/{kid}")
        assert status == 204, (status, body)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("netns") / "cluster")
    try:
        out = ctl("up", "--nodes", "3", "--routers", "2", "--json", "--dir", directory,
                  "--bin-dir", BIN_DIR)
        yield Cluster(json.loads(out))
    finally:
        ctl("down", "--dir", directory)


@pytest.fixture(scope="module")
def per_node(cluster):
    """One kernel made on each node directly, holding x = its node's tag."""
    kids = []
    for n in range(3):
        kid = cluster.create(n)
        status, node, answer, _ = cluster.through("POST", f"/api/kernels/{kid}/execute",
                                                  {"code": f"x = {kid[:4]!r}"})
        assert (status, node) == (200, kid[:4]), (status, node, answer)
        kids.append(kid)
    return kids


def tiny_png():
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    raw = b"\x00\x00\xff\x00"  # one green pixel, filter byte first
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


# --- routing -----------------------------------------------------------------------------------

def test_kernel_rest_cells_and_websocket_land_on_their_node(cluster, per_node):
    for kid in per_node:
        status, node, model, _ = cluster.through("GET", f"/api/kernels/{kid}")
        assert (status, node, model["id"]) == (200, kid[:4], kid), (status, node, model)
        status, node, answer, _ = cluster.through("POST", f"/api/kernels/{kid}/execute",
                                                  {"code": "print(x)"})
        assert (status, node) == (200, kid[:4]), (status, node, answer)
        assert answer["stdout"] == f"{kid[:4]}\n", answer
        # The channels WebSocket through the router reaches the kernel that holds x.
        client = gb.KernelClient(cluster.view, kid)
        try:
            assert client.run_stdout("print(x)") == f"{kid[:4]}\n"
        finally:
            client.close()


def test_either_router_replica_routes_alike(cluster, per_node):
    """Two HAProxy replicas with the same generated config and no shared state: an id made
    through one is found through the other, on the same node."""
    for kid in per_node:
        for router in (0, 1):
            status, node, model, res = cluster.through("GET", f"/api/kernels/{kid}",
                                                       router=router)
            assert (status, node, model["id"]) == (200, kid[:4], kid), (router, status, node)
    kid = None
    try:
        status, node, model, _ = cluster.through("POST", "/api/kernels", {"name": "python3"},
                                                 router=1)
        assert status == 201 and model["id"][:4] == node, (status, node, model)
        kid = model["id"]
        status, node, answer, _ = cluster.through("POST", f"/api/kernels/{kid}/execute",
                                                  {"code": "print(1 + 1)"}, router=0)
        assert (status, node, answer["stdout"]) == (200, kid[:4], "2\n"), answer
    finally:
        if kid:
            cluster.delete(kid)


def test_sessions_land_on_their_node(cluster):
    made = []
    try:
        for i in range(3):
            status, node, model, _ = cluster.through(
                "POST", "/api/sessions", {"path": f"s{i}.ipynb", "type": "notebook",
                                          "name": f"s{i}.ipynb", "kernel": {"name": "python3"}})
            assert status == 201, (status, model)
            made.append(model)
            assert model["id"][:4] == node and model["kernel"]["id"][:4] == node, (node, model)
        for model in made:
            sid = model["id"]
            status, node, got, _ = cluster.through("GET", f"/api/sessions/{sid}")
            assert (status, node, got["id"]) == (200, sid[:4], sid), (status, node, got)
            assert got["kernel"]["id"] == model["kernel"]["id"], got
        # The merged list through the router names every session.
        status, _, listed, _ = cluster.through("GET", "/api/sessions")
        assert status == 200 and {m["id"] for m in made} <= {s["id"] for s in listed}, listed
    finally:
        for model in made:
            status, _, body, _ = cluster.through("DELETE", f"/api/sessions/{model['id']}")
            assert status == 204, (status, body)


def test_kernel_scoped_artifact_lands_on_its_node(cluster, per_node):
    png = tiny_png()
    show = ("from IPython.display import display\n"
            f"display({{'image/png': '{base64.b64encode(png).decode()}'}}, raw=True)")
    for kid in per_node:
        status, node, answer, _ = cluster.through("POST", f"/api/kernels/{kid}/execute",
                                                  {"code": show, "timeout": 60})
        assert (status, node) == (200, kid[:4]), (status, node, answer)
        status, node, listed, _ = cluster.through("GET", f"/api/kernels/{kid}/artifacts")
        assert (status, node) == (200, kid[:4]), (status, node, listed)
        shas = [a["sha256"] for a in listed["artifacts"] if a.get("sha256")]
        assert shas, listed
        status, node, body, res = cluster.through("GET",
                                                  f"/api/kernels/{kid}/artifacts/{shas[-1]}")
        assert (status, node) == (200, kid[:4]), (status, node, body)
        assert body == png and res.getheader("Content-Type") == "image/png"


# --- placement ---------------------------------------------------------------------------------

def test_creates_spread_over_the_nodes(cluster):
    made = []
    try:
        for _ in range(9):
            made.append(cluster.create())
        on = {kid[:4] for kid in made}
        assert len(on) >= 2, f"9 creates all on {on}"
    finally:
        for kid in made:
            cluster.delete(kid)


def test_creates_avoid_a_draining_node(cluster):
    made = []
    status, node, answer, _ = cluster.direct(0, "POST", "/api/node/drain", {"drain": True})
    try:
        assert (status, node) == (200, "0000") and answer["draining"] is True, answer
        hx.poll("node 0 DRAIN in the router",
                lambda: cluster.server_state("be_place", 0) == "DRAIN")
        for _ in range(6):
            made.append(cluster.create())
        assert "0000" not in {kid[:4] for kid in made}, made
    finally:
        cluster.direct(0, "POST", "/api/node/drain", {"drain": False})
        for kid in made:
            cluster.delete(kid)
    hx.poll("node 0 UP again in the router",
            lambda: cluster.server_state("be_place", 0) == "UP")


def test_nodes_hold_disjoint_kernel_uid_ranges(cluster):
    ranges = []
    for node in cluster.nodes:
        first, last = (int(x) for x in node["uids"].split("-"))
        ranges.append((first, last))
    ranges.sort()
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:])), ranges


def test_lists_merge_every_node(cluster, per_node):
    status, node, listed, _ = cluster.through("GET", "/api/kernels")
    assert status == 200 and node in cluster.tags
    assert set(per_node) <= {k["id"] for k in listed}, (per_node, listed)
    for n, kid in enumerate(per_node):
        status, _, local, _ = cluster.direct(n, "GET", "/api/kernels?scope=local")
        ids = {k["id"] for k in local}
        assert kid in ids and all(k[:4] == cluster.tags[n] for k in ids), (n, ids)


# --- clients -----------------------------------------------------------------------------------

def test_jupyter_server_gateway_client_through_the_router(cluster, tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tests", "conformance"))
    import test_jupyter_server_gateway as jsg  # jupyter_server's harness (Stack, Channels)

    stack = jsg.Stack(tmp_path)
    stack.gw_url = f"http://127.0.0.1:{cluster.port}"  # the router, not a gateway
    stack.gw_token = cluster.token
    try:
        stack.start_jupyter_server()
        status, model = stack.js("POST", "/api/kernels", {"name": "python3"})
        assert status == 201, (status, model, stack.diagnostics())
        kid = model["id"]
        assert kid[:4] in cluster.tags, kid
        channels = stack.connect(kid)
        try:
            out = channels.run_cell("print(6 * 7)")
            assert out["reply"]["status"] == "ok" and out["stdout"] == "42\n", out
        finally:
            channels.close()
        status, _ = stack.js("DELETE", f"/api/kernels/{kid}")
        assert status == 204
        assert cluster.through("GET", f"/api/kernels/{kid}")[0] == 404
    finally:
        stack.close()


def test_cellgate_run_through_the_router(cluster, tmp_path):
    out = tmp_path / "stateful.out.ipynb"
    with open(cluster.state()["routers"][0]["log"], "rb") as f:
        before = f.read().count(b"POST /api/kernels HTTP")
    done = subprocess.run(
        [os.path.join(BIN_DIR, "cellgate"), "run", "--url", f"http://127.0.0.1:{cluster.port}",
         "--token", cluster.token, "--no-progress", "-o", str(out),
         os.path.join(ROOT, "notebooks", "examples", "stateful.ipynb")],
        capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    cells = [c for c in json.loads(out.read_text())["cells"] if c["cell_type"] == "code"]
    assert cells and all(c["execution_count"] for c in cells)
    # It went through the router: HAProxy logged its create.
    with open(cluster.state()["routers"][0]["log"], "rb") as f:
        assert f.read().count(b"POST /api/kernels HTTP") > before


# --- failures ----------------------------------------------------------------------------------

def missing_peers(cluster, n):
    status, _, _, res = cluster.direct(n, "GET", "/api/kernels", timeout=30)
    assert status == 200
    return res.getheader("X-Cellgate-Missing-Peers") or ""


def test_a_node_cut_off_and_back(cluster, per_node):
    kid = per_node[2]
    cut = f"{cluster.nodes[2]['address']}:8888"
    cluster.ctl("link", "2", "down")
    try:
        # Each try bounded: until HAProxy's checks (inter 1 s, fall 2) mark the node DOWN, a
        # request waits on connects that time out (a node's backend: timeout connect 1 s, 1
        # retry), then gets the 503 itself; the checks follow.
        hx.poll("503 for the cut-off node's id",
                lambda: cluster.status_within(f"/api/kernels/{kid}", 3) == 503, CUT_DEADLINE)
        hx.poll("the cut-off node DOWN in the router",
                lambda: cluster.server_state("be_n2", 2) == "DOWN", CUT_DEADLINE)
        assert cut in missing_peers(cluster, 0)
        # The others still answer for their own.
        assert cluster.through("GET", f"/api/kernels/{per_node[0]}")[0] == 200
    finally:
        cluster.ctl("link", "2", "up")
    hx.poll("the node back in the router",
            lambda: cluster.status_within(f"/api/kernels/{kid}", 3) == 200, CUT_DEADLINE)
    status, node, answer, _ = cluster.through("POST", f"/api/kernels/{kid}/execute",
                                              {"code": "print(x)"})
    assert (status, node, answer["stdout"]) == (200, "0002", "0002\n"), answer
    assert cut not in missing_peers(cluster, 0)


def test_a_killed_node_then_a_new_epoch(cluster, per_node):
    # End node 1's kernels first: a SIGKILLed gateway does not end its kernels, and nothing on
    # the new epoch would adopt them. Its zygote and pool kernel do outlive it (as they would
    # on a host; a pod's end takes them along): `cluster kill` notes their pids, and `cluster
    # down` SIGKILLs them, unmounts their work dirs and removes their empty cgroups.
    status, _, local, _ = cluster.direct(1, "GET", "/api/kernels?scope=local")
    ones = [k["id"] for k in local]
    assert per_node[1] in ones
    for kid in ones:
        cluster.delete(kid)
    cluster.ctl("kill", "1")
    hx.poll("503 for the dead node's id",
            lambda: cluster.status_within(f"/api/kernels/{per_node[1]}", 3) == 503,
            CUT_DEADLINE)
    assert f"{cluster.nodes[1]['address']}:8888" in missing_peers(cluster, 0)
    cluster.ctl("start", "1", "--fresh")
    status, node, answer, _ = cluster.through("GET", f"/api/kernels/{per_node[1]}")
    assert (status, node) == (410, "0001"), (status, node, answer)
    assert answer["reason"] == "node-restarted", answer
    # The new epoch makes kernels again.
    kid = cluster.create(1)
    assert kid[:4] == "0001" and kid[4:8] != per_node[1][4:8], (kid, per_node[1])
    cluster.delete(kid)


def test_a_router_reload_keeps_an_open_websocket(cluster, per_node):
    kid = per_node[0]
    client = gb.KernelClient(cluster.view, kid)
    try:
        assert client.run_stdout("print(x)") == "0000\n"
        old = cluster.state()["routers"][0]["proc"]
        cluster.ctl("reload")
        new = cluster.state()["routers"][0]["proc"]
        assert new["pid"] != old["pid"]
        # New requests go to the new process; the open WebSocket stays on the old one.
        assert cluster.through("GET", f"/api/kernels/{kid}")[:2] == (200, "0000")
        assert client.run_stdout("x += '!'\nprint(x)") == "0000!\n"
    finally:
        client.close()
    # Its last connection closed, the old process ends by itself.
    hx.poll("the old HAProxy to finish", lambda: not os.path.exists(f"/proc/{old['pid']}")
            or open(f"/proc/{old['pid']}/stat").read().split(") ")[1][0] == "Z", 30)
