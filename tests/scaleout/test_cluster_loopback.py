"""Two real `cellgate serve` nodes behind Debian's HAProxy, configured by the generator.

Each gateway runs with its own --node-tag, --agent-port, state dir and port on 127.0.0.1, and
--peers naming both; HAProxy's config comes from deploy/haproxy/cellgate-haproxy --servers. It
checks, with real kernels and real answers:
- ids carry their node: every id a create returns begins with the tag of the node that answers
  (X-Cellgate-Node), and every later request for it (REST, an agent cell, the WebSocket) lands
  there through the router;
- GET /api/kernels answers the same from either node (each merges its peers' lists);
- a draining node (POST /api/node/drain) says "drain" on its agent port, refuses starts with
  503, and the router sends creates elsewhere;
- a node killed with SIGKILL: its ids get 503 from the router, the other node's list names it
  missing; started again (a new epoch: an empty state dir, as a new pod) its old ids get 410
  {"reason": "node-restarted"}.
Needs root (the jail) and haproxy (scripts/install-deps). Every wait polls with a deadline.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import socket

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
sys.path.insert(0, os.path.dirname(__file__))
import gateway_bench as gb  # noqa: E402
import test_haproxy_config as hx  # noqa: E402  the router harness (generator, HAProxy, polls)

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")
FLAGS = ("--no-zygote", "--pool-size", "0")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")


def agent_says(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        return s.makefile().readline()


class Node:
    """One real gateway; address() is what the generator's --servers takes."""

    def __init__(self, tmp, n, peers, token, state=None, extra=()):
        self.n, self.tag = n, f"{n:04x}"
        self.extra = tuple(extra)
        self.port, self.agent = peers[n]
        self.tmp, self.token, self.peers = tmp, token, peers
        self.state_label = state or f"node{n}"
        self.start()

    def start(self):
        peer_list = ",".join(f"127.0.0.1:{p}" for p, _ in self.peers)
        self.server = gb.start_cellgate(
            BIN_DIR, self.tmp, 8,
            (*FLAGS, "--node-tag", str(self.n), "--agent-port", str(self.agent),
             "--peers", peer_list, *self.extra),
            label=self.state_label, port=self.port, token=self.token)

    def address(self):
        return f"127.0.0.1:{self.port}:{self.agent}"


def drain_cli(node, token, *args):
    return subprocess.run([os.path.join(BIN_DIR, "cellgate"), "drain", "--url",
                           f"http://127.0.0.1:{node.port}", "--token", token, *args],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def state(router, backend, server):
    """HAProxy's status word for a server ("UP", "DOWN", "DRAIN": "DRAIN (agent)" is DRAIN)."""
    return router.stat().get((backend, server), "").split(" ")[0]


def call(port, token, method, path, body=None):
    view = type("View", (), {"port": port, "token": token})
    status, raw = gb.http_request(view, method, path, body, timeout=120)
    return status, (json.loads(raw) if raw else None)


def test_two_nodes_behind_the_router():
    with tempfile.TemporaryDirectory() as tmp:
        token = "t" + os.urandom(12).hex()
        ports = [(hx.free_port(), hx.free_port()) for _ in range(2)]
        nodes = []
        router = None
        try:
            nodes = [Node(tmp, n, ports, token) for n in range(2)]
            router = hx.Router(tmp, nodes)
            hx.poll("both nodes ready for creates",
                    lambda: all(state(router, "be_place", f"n{n}") == "UP" for n in range(2)))
            assert agent_says(nodes[0].agent).startswith("ready ")

            def through(method, path, body=None):
                headers = {"Authorization": f"token {token}",
                           "Content-Type": "application/json"}
                status, node, data = router.request(
                    method, path, headers=headers,
                    body=None if body is None else json.dumps(body))
                try:
                    return status, node, (json.loads(data) if data else None)
                except ValueError:
                    return status, node, data  # HAProxy's own 503 page

            # Creates spread by the router; each id names the node that made it.
            made = []
            for _ in range(4):
                status, node, model = through("POST", "/api/kernels", {"name": "python3"})
                assert status == 201, (status, model)
                assert model["id"][:4] == node, (model["id"], node)
                made.append(model["id"])
            for kid in made:
                status, node, model = through("GET", f"/api/kernels/{kid}")
                assert (status, node, model["id"]) == (200, kid[:4], kid)
                status, node, answer = through("POST", f"/api/kernels/{kid}/execute",
                                               {"code": f"x = {kid[:4]!r}\nprint(x)"})
                assert status == 200 and node == kid[:4], (status, node, answer)
                assert answer["stdout"] == f"{kid[:4]}\n", answer
            # The WebSocket, through the router, reaches the kernel that holds x.
            view = type("View", (), {"port": router.port, "token": token, "name": "router"})
            client = gb.KernelClient(view, made[0])
            try:
                assert client.run_stdout("print(x)") == f"{made[0][:4]}\n"
            finally:
                client.close()

            # Lists answer the same from either node, merged.
            for n in range(2):
                status, listed = call(nodes[n].port, token, "GET", "/api/kernels")
                assert status == 200 and {k["id"] for k in listed} == set(made), listed
                status, local = call(nodes[n].port, token, "GET", "/api/kernels?scope=local")
                assert {k["id"] for k in local} == {k for k in made if k[:4] == nodes[n].tag}

            # Drain node 0 (`cellgate drain`): its agent says so, starts there are refused,
            # creates go to node 1.
            zero = [k for k in made if k[:4] == "0000"]
            done = drain_cli(nodes[0], token)
            assert done.returncode == 0, done
            assert done.stdout == f"draining, {len(zero)} kernel{'s' * (len(zero) != 1)} " \
                                  "running\n", done.stdout
            assert agent_says(nodes[0].agent) == "drain\n"
            status, answer = call(nodes[0].port, token, "POST", "/api/kernels",
                                  {"name": "python3"})
            assert status == 503 and answer["error"] == "node_draining", answer
            hx.poll("node 0 drained in the router",
                    lambda: state(router, "be_place", "n0") == "DRAIN")
            for _ in range(2):
                status, node, model = through("POST", "/api/kernels", {"name": "python3"})
                assert status == 201 and node == "0001" and model["id"][:4] == "0001", model
                made.append(model["id"])
            # Its own kernels still answer.
            for kid in zero:
                assert through("GET", f"/api/kernels/{kid}")[0] == 200
            if zero:  # --wait gives up while kernels run: exit 124
                assert drain_cli(nodes[0], token, "--wait", "0.5").returncode == 124
            assert drain_cli(nodes[0], token, "--undo").stdout.startswith("not draining, ")
            assert agent_says(nodes[0].agent).startswith("ready ")

            # Node 1 ends its kernels, then dies with SIGKILL: its ids get the router's 503,
            # and node 0's list names it missing.
            ones = [k for k in made if k[:4] == "0001"]
            for kid in ones:
                assert through("DELETE", f"/api/kernels/{kid}")[0] == 204
            os.kill(nodes[1].server.proc.pid, signal.SIGKILL)
            nodes[1].server.proc.wait(timeout=30)
            hx.poll("a 503 for the dead node's id",
                    lambda: through("GET", f"/api/kernels/{ones[0]}")[0] == 503)
            view0 = type("View", (), {"port": nodes[0].port, "token": token})
            conn = gb.http.client.HTTPConnection("127.0.0.1", nodes[0].port, timeout=30)
            conn.request("GET", "/api/kernels", headers={"Authorization": f"token {token}"})
            res = conn.getresponse()
            listed = json.loads(res.read())
            conn.close()
            assert f"127.0.0.1:{nodes[1].port}" in (res.getheader("X-Cellgate-Missing-Peers")
                                                   or ""), res.getheaders()
            assert {k["id"] for k in listed} == set(zero), listed
            del view0

            # Back with an empty state dir (a new pod): a new epoch, and the old ids are gone.
            nodes[1].state_label = "node1-again"
            nodes[1].start()
            hx.poll("node 1 back in the router",
                    lambda: state(router, "be_n1", "n1") == "UP")
            status, node, answer = through("GET", f"/api/kernels/{ones[0]}")
            assert (status, node) == (410, "0001"), (status, node, answer)
            assert answer["reason"] == "node-restarted", answer
            status, node, answer = through("GET", "/api/kernels/0001ffff-0000-4000-8000-"
                                                  "000000000000")
            assert status in (404, 410)
        finally:
            if router is not None:
                router.close()
            for node in nodes:
                node.server.stop()
