"""Moving kernels between nodes: `cellgate drain --move` on two real gateways behind HAProxy.

Two gateways on 127.0.0.1 (--node-tag 0 and 1, --peers, the same --move-key-file, checkpoints
on) behind the router the generator configures. A kernel of node 0 with a variable, a work file
and a session is moved by `cellgate drain --move --router <Runtime API socket>`; then, through
the router, the same kernel id answers from node 1 with its variable and file, its session too,
and node 0 answers 503 kernel_moved for them. The receiving side is attacked directly: a forged
signature, a signed manifest for another node, an expired one, a replayed one, an archive that is
not the one the manifest signed, and a node without the key: each is refused and no kernel
starts. Needs root (the jail, CRIU), haproxy and the build. Every wait polls with a deadline.
"""

import hashlib
import hmac
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
sys.path.insert(0, os.path.dirname(__file__))
import gateway_bench as gb  # noqa: E402
import test_haproxy_config as hx  # noqa: E402
from test_cluster_loopback import BIN_DIR, Node, call, state  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail and CRIU need root")

KEY = "move-key-" + os.urandom(16).hex()


def checkpoints_here():
    return any(os.access(os.path.join(d, "criu"), os.X_OK)
               for d in os.environ.get("PATH", "").split(":") + ["/opt/cellgate/criu/sbin"])


@pytest.fixture(scope="module")
def pair():
    if not checkpoints_here():
        pytest.skip("no CRIU (scripts/install-criu)")
    with tempfile.TemporaryDirectory() as tmp:
        key_file = os.path.join(tmp, "move.key")
        with open(key_file, "w") as f:
            f.write(KEY + "\n")
        token = "t" + os.urandom(12).hex()
        ports = [(hx.free_port(), hx.free_port()) for _ in range(2)]
        extra = ("--move-key-file", key_file, "--checkpoint-without-landlock")
        nodes, router = [], None
        try:
            nodes = [Node(tmp, n, ports, token, extra=extra) for n in range(2)]
            router = hx.Router(tmp, nodes)
            hx.poll("both nodes up in the router",
                    lambda: all(state(router, f"be_n{n}", f"n{n}") == "UP" for n in range(2)))
            yield type("Pair", (), {"nodes": nodes, "router": router, "token": token,
                                    "tmp": tmp})
        finally:
            if router is not None:
                router.close()
            for node in nodes:
                node.server.stop()


def through(pair, method, path, body=None):
    headers = {"Authorization": f"token {pair.token}", "Content-Type": "application/json"}
    status, node, data = pair.router.request(method, path, headers=headers,
                                             body=None if body is None else json.dumps(body))
    try:
        return status, node, (json.loads(data) if data else None)
    except ValueError:
        return status, node, data


def drain_move(pair, *args):
    return subprocess.run([os.path.join(BIN_DIR, "cellgate"), "drain", "--url",
                           f"http://127.0.0.1:{pair.nodes[0].port}", "--token", pair.token,
                           "--move", *args],
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


def test_drain_move_keeps_the_kernel_its_id_and_its_session(pair):
    zero, one = pair.nodes
    status, kernel = call(zero.port, pair.token, "POST", "/api/kernels", {"name": "python3"})
    assert status == 201 and kernel["id"][:4] == "0000", kernel
    kid = kernel["id"]
    status, session = call(zero.port, pair.token, "POST", "/api/sessions",
                           {"path": "moved.ipynb", "type": "notebook", "name": "moved.ipynb",
                            "kernel": {"id": kid}})
    assert status == 201 and session["kernel"]["id"] == kid, session
    sid = session["id"]
    status, node, answer = through(pair, "POST", f"/api/kernels/{kid}/execute",
                                   {"code": "x = 41 + 1\nopen('kept.txt', 'w').write('kept')"})
    assert (status, node) == (200, "0000"), answer

    done = drain_move(pair, "--router", pair.router.socket)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert f"moved kernel {kid} to node 0001\n" in done.stdout, done.stdout
    assert done.stdout.endswith("draining, 0 kernels running\n"), done.stdout

    # The same id, through the router, is on node 1 with its variable and its work file.
    status, node, model = through(pair, "GET", f"/api/kernels/{kid}")
    assert (status, node, model["id"]) == (200, "0001", kid), model
    status, node, answer = through(pair, "POST", f"/api/kernels/{kid}/execute",
                                   {"code": "print(x, open('kept.txt').read())"})
    assert (status, node) == (200, "0001"), answer
    assert answer["stdout"] == "42 kept\n", answer
    # The WebSocket too.
    view = type("View", (), {"port": pair.router.port, "token": pair.token, "name": "router"})
    client = gb.KernelClient(view, kid)
    try:
        assert client.run_stdout("print(x * 2)") == "84\n"
    finally:
        client.close()
    status, node, moved_session = through(pair, "GET", f"/api/sessions/{sid}")
    assert (status, node) == (200, "0001"), moved_session
    assert moved_session["kernel"]["id"] == kid and moved_session["path"] == "moved.ipynb"

    # Node 0 itself says where they went, with 503 (not 404: the router was behind).
    for path in (f"/api/kernels/{kid}", f"/api/sessions/{sid}"):
        status, answer = call(zero.port, pair.token, "GET", path)
        assert status == 503 and answer["error"] == "kernel_moved", (path, answer)
        assert "node 0001" in answer["message"], answer
    status, local = call(zero.port, pair.token, "GET", "/api/kernels?scope=local")
    assert local == [], local
    # Node 0 can take kernels back later.
    assert call(zero.port, pair.token, "POST", "/api/node/drain", {"drain": False})[0] == 200


def test_a_failed_move_leaves_the_kernel_running_where_it_was(pair):
    zero, _ = pair.nodes
    assert call(zero.port, pair.token, "POST", "/api/node/drain", {"drain": False})[0] == 200
    status, kernel = call(zero.port, pair.token, "POST", "/api/kernels", {"name": "python3"})
    assert status == 201, kernel
    kid = kernel["id"]
    status, answer = call(zero.port, pair.token, "POST", f"/api/kernels/{kid}/execute",
                          {"code": "y = 'still here'"})
    assert status == 200, answer
    # No node 00ff: nothing moves, the kernel keeps its state and answers on node 0.
    status, answer = call(zero.port, pair.token, "POST", f"/api/kernels/{kid}/move",
                          {"to": "00ff"})
    assert status == 503 and answer["error"] == "no_node_for_move", answer
    status, answer = call(zero.port, pair.token, "POST", f"/api/kernels/{kid}/execute",
                          {"code": "print(y)"})
    assert status == 200 and answer["stdout"] == "still here\n", answer
    assert call(zero.port, pair.token, "DELETE", f"/api/kernels/{kid}")[0] == 204


def manifest(**over):
    m = {"v": 1, "kernel_id": "0000abcd-0000-4000-8000-" + os.urandom(6).hex(),
         "kernel_name": "python3", "key": "k" * 32, "env": {}, "sessions": [],
         "bytes": 10240, "sha256": "0" * 64, "from": "0000", "to": "0001",
         "nonce": os.urandom(16).hex(), "expires": int(time.time()) + 300}
    m.update(over)
    return m


def signed(m, key=KEY):
    # nlohmann's dump: keys sorted, no spaces, non-ASCII kept as UTF-8.
    text = json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return {"manifest": m, "signature": hmac.new(key.encode(), text.encode(),
                                                 hashlib.sha256).hexdigest()}


def kernels_on(pair, n):
    return call(pair.nodes[n].port, pair.token, "GET", "/api/kernels?scope=local")[1]


def test_the_receiving_node_refuses_what_the_cluster_did_not_sign(pair):
    one = pair.nodes[1]
    before = kernels_on(pair, 1)

    def imports(body):
        return call(one.port, pair.token, "POST", "/api/node/imports", body)

    status, answer = imports(signed(manifest(), key="not-the-cluster-key-at-all"))
    assert status == 403 and answer["error"] == "bad_move_signature", answer
    forged = signed(manifest())
    forged["manifest"]["kernel_name"] = "python3 "  # changed after signing
    status, answer = imports(forged)
    assert status == 403 and answer["error"] == "bad_move_signature", answer
    status, answer = imports(signed(manifest(to="0000")))
    assert status == 400 and answer["error"] == "move_not_for_us", answer
    status, answer = imports(signed(manifest(expires=int(time.time()) - 1)))
    assert status == 403 and answer["error"] == "move_expired", answer

    # Signed, but the archive that arrives is not the one the manifest names.
    body = b"\0" * 10240
    good = signed(manifest())
    status, answer = imports(good)
    assert status == 201, answer
    iid = answer["import"]
    status, answer = imports(good)  # the same manifest again
    assert status == 403 and answer["error"] == "move_replayed", answer
    conn = gb.http.client.HTTPConnection("127.0.0.1", one.port, timeout=30)
    conn.request("PUT", f"/api/node/imports/{iid}?offset=0", body=body,
                 headers={"Authorization": f"token {pair.token}",
                          "Content-Type": "application/octet-stream"})
    res = conn.getresponse()
    assert res.status == 200, res.read()
    res.read()
    conn.close()
    status, answer = call(one.port, pair.token, "POST", f"/api/node/imports/{iid}/restore", {})
    assert status == 403 and answer["error"] == "bad_move_archive", answer
    # The import is gone with its file; nothing started.
    status, answer = call(one.port, pair.token, "POST", f"/api/node/imports/{iid}/restore", {})
    assert status == 404, answer
    assert kernels_on(pair, 1) == before
    assert os.listdir(os.path.join(pair.tmp, "node1-state", "imports")) == []


def test_a_node_without_the_key_neither_sends_nor_takes(tmp_path):
    server = gb.start_cellgate(BIN_DIR, str(tmp_path), 2, ("--no-zygote", "--pool-size", "0"))
    try:
        status, answer = gb.http_request(server, "POST", "/api/node/imports", signed(manifest()))
        assert status == 409 and json.loads(answer)["error"] == "moves_unavailable", answer
        kid = gb.start_kernel(server)
        status, answer = gb.http_request(server, "POST", f"/api/kernels/{kid}/move", {})
        assert status == 409 and json.loads(answer)["error"] == "moves_unavailable", answer
    finally:
        server.stop()
