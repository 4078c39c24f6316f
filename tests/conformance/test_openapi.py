"""The OpenAPI document (gateway/api/openapi.yaml) against a real `cellgate serve`: the gateway
serves exactly the checked-in file at /api/spec.yaml; every operation in it is exercised here and
every request made here is in it; without the token each operation under security answers 401
(and documents it), and with it each answers a valid request with its documented success status,
a documented content type and, for JSON, the fields its schema requires. ~15 s.

Needs root (the jail); skips with a reason otherwise."""
import base64
import http.client
import json
import time
import os
import socket
import struct
import sys
import tempfile
import zlib
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")
SPEC_FILE = Path(__file__).resolve().parents[2] / "gateway" / "api" / "openapi.yaml"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")


def tiny_png():
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    raw = b"\x00\xff\x00\x00"  # one red pixel, filter byte first
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def call(server, method, path, body=None, raw=None, headers=None, token=True, timeout=120):
    """(status, {lowercased header: value}, body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        h = dict(headers or {})
        if token:
            h["Authorization"] = f"token {server.token}"
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        conn.request(method.upper(), path, body=data, headers=h)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def resolve(doc, node):
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        node = doc
        for part in ref[2:].split("/"):
            node = node[part]
    return node


def operations(doc):
    """{operationId: (path, method, operation)}."""
    ops = {}
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                op = item[method]
                assert op["operationId"] not in ops, op["operationId"]
                ops[op["operationId"]] = (path, method, op)
    return ops


def check_schema(doc, schema, value, where):
    """The shape the document promises, one level at a time: type, required fields, items."""
    schema = resolve(doc, schema)
    if "allOf" in schema:
        for part in schema["allOf"]:
            check_schema(doc, part, value, where)
        return
    kind = schema.get("type")
    if kind == "object":
        assert isinstance(value, dict), f"{where}: not an object: {value!r}"[:300]
        for field in schema.get("required", []):
            assert field in value, f"{where}: no '{field}' in {sorted(value)}"
        for field, sub in schema.get("properties", {}).items():
            if field in value and value[field] is not None:
                check_schema(doc, sub, value[field], f"{where}.{field}")
    elif kind == "array":
        assert isinstance(value, list), f"{where}: not an array"
        for i, item in enumerate(value):
            check_schema(doc, schema.get("items", {}), item, f"{where}[{i}]")
    elif kind == "string":
        assert isinstance(value, str), f"{where}: not a string: {value!r}"
    elif kind == "integer":
        assert isinstance(value, int), f"{where}: not an integer: {value!r}"
    elif kind == "boolean":
        assert isinstance(value, bool), f"{where}: not a boolean: {value!r}"


def test_routes_answer_as_the_openapi_document_says():
    text = SPEC_FILE.read_text()
    doc = yaml.safe_load(text)
    assert str(doc["openapi"]).startswith("3."), doc["openapi"]
    ops = operations(doc)
    default_security = doc.get("security", [])

    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 8, ("--pool-size", "0", "--no-zygote",
                                                      "--checkpoint-without-landlock"))
        try:
            # The document served is the one checked in.
            status, headers, body = call(server, "GET", "/api/spec.yaml")
            assert status == 200 and body.decode() == text, (status, body[:200])

            # Without the token: 401 wherever the document says security applies (before any
            # route runs, so placeholders do for the path's parameters).
            for op_id, (path, method, op) in ops.items():
                concrete = path.replace("{", "").replace("}", "")  # e.g. /api/kernels/kernel_id
                status, _, body = call(server, method, concrete, token=False)
                if op.get("security", default_security):
                    assert status == 401, f"{op_id}: {status} without the token: {body[:200]!r}"
                    assert "401" in op["responses"], f"{op_id}: 401 not documented"
                else:
                    assert status != 401, f"{op_id} is open in the document, {status} here"

            # With it: the requests below, in an order that leaves what later ones need.
            state = {}
            png = tiny_png()

            def kernel():
                return state["kernel"]

            def spec_file():
                status, _, body = call(server, "GET", "/api/kernelspecs")
                specs = json.loads(body)["kernelspecs"]
                for name, spec in specs.items():
                    for url in spec["resources"].values():
                        return url  # /kernelspecs/{name}/{file}
                pytest.fail(f"no kernelspec has a resource file to fetch: {specs}")

            def detached():
                status, _, body = call(server, "POST", f"/api/kernels/{kernel()}/execute",
                                       body={"code": "print('detached')", "detach": True})
                assert status == 202, body
                started = json.loads(body)
                end = time.monotonic() + 120  # done before the next operation (a snapshot)
                while json.loads(call(server, "GET", started["url"])[2])["state"] != "done":
                    assert time.monotonic() < end, "the detached cell did not end"
                    time.sleep(0.05)
                return started["execution_id"]

            def artifact():
                status, _, body = call(server, "GET", f"/api/kernels/{kernel()}/artifacts")
                shas = [a["sha256"] for a in json.loads(body)["artifacts"] if a.get("sha256")]
                assert shas, body
                return shas[0]

            def remember(key, field):
                def note(answer):
                    state[key] = answer[field]
                return note

            ws_headers = {"Connection": "Upgrade", "Upgrade": "websocket",
                          "Sec-WebSocket-Version": "13",
                          "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
                          "Sec-WebSocket-Protocol": "v1.kernel.websocket.jupyter.org"}
            show_png = ("from IPython.display import display\n"
                        f"display({{'image/png': '{base64.b64encode(png).decode()}'}}, raw=True)")
            cases = [
                # operationId; its path and request keywords; what to note from the answer
                ("get_api_version", lambda: ("/api", {}), None),
                ("get_spec", lambda: ("/api/spec.yaml", {}), None),
                ("list_kernelspecs", lambda: ("/api/kernelspecs", {}), None),
                ("get_kernelspec", lambda: ("/api/kernelspecs/python3", {}), None),
                ("get_kernelspec_resource", lambda: (spec_file(), {}), None),
                ("start_kernel", lambda: ("/api/kernels", {"body": {"name": "python3"}}),
                 remember("kernel", "id")),
                ("list_kernels", lambda: ("/api/kernels", {}), None),
                ("get_kernel", lambda: (f"/api/kernels/{kernel()}", {}), None),
                ("kernel_channels",
                 lambda: (f"/api/kernels/{kernel()}/channels", {"headers": ws_headers}), None),
                ("execute_cell", lambda: (f"/api/kernels/{kernel()}/execute",
                                          {"body": {"code": show_png, "timeout": 60}}), None),
                ("list_artifacts", lambda: (f"/api/kernels/{kernel()}/artifacts", {}), None),
                ("read_execution", lambda: (
                    f"/api/kernels/{kernel()}/executions/{detached()}?after=0", {}), None),
                ("get_artifact", lambda: (f"/api/artifacts/{artifact()}", {}), None),
                ("get_kernel_artifact",
                 lambda: (f"/api/kernels/{kernel()}/artifacts/{artifact()}", {}), None),
                ("write_file", lambda: (f"/api/kernels/{kernel()}/files/sub/data.bin",
                                        {"raw": b"\x00\x01bytes"}), None),
                ("list_work_dir", lambda: (f"/api/kernels/{kernel()}/files", {}), None),
                ("read_file", lambda: (f"/api/kernels/{kernel()}/files/sub/data.bin", {}), None),
                ("delete_file", lambda: (f"/api/kernels/{kernel()}/files/sub/data.bin", {}), None),
                # A snapshot, a copy of it, a fork, the snapshot removed (CRIU; cold kernels).
                ("snapshot_kernel", lambda: (f"/api/kernels/{kernel()}/snapshots", {}),
                 remember("snapshot", "id")),
                ("list_snapshots", lambda: ("/api/snapshots", {}), None),
                ("fork_kernel", lambda: (f"/api/kernels/{kernel()}/fork",
                                         {"body": {"count": 1}}), None),
                ("delete_snapshot", lambda: (f"/api/snapshots/{state['snapshot']}", {}), None),
                # Hibernated (CRIU; kernels started cold), then resumed by the interrupt.
                ("hibernate_kernel", lambda: (f"/api/kernels/{kernel()}/hibernate", {}), None),
                ("interrupt_kernel", lambda: (f"/api/kernels/{kernel()}/interrupt", {}), None),
                ("restart_kernel", lambda: (f"/api/kernels/{kernel()}/restart", {}), None),
                ("execute_once", lambda: ("/api/execute", {"body": {
                    "code": "print(open('in.txt').read())", "files": {"in.txt": "hi"},
                    "timeout": 60}}), None),
                ("create_session", lambda: ("/api/sessions", {"body": {
                    "path": "openapi.ipynb", "type": "notebook", "name": "openapi.ipynb",
                    "kernel": {"id": kernel()}}}), remember("session", "id")),
                ("list_sessions", lambda: ("/api/sessions", {}), None),
                ("get_session", lambda: (f"/api/sessions/{state['session']}", {}), None),
                ("update_session", lambda: (f"/api/sessions/{state['session']}",
                                            {"body": {"name": "renamed.ipynb"}}), None),
                ("get_metrics", lambda: ("/metrics", {}), None),
                ("get_node", lambda: ("/api/node", {}), None),
                # {"drain": false}: the node keeps starting kernels (delete_kernel's below).
                ("drain_node", lambda: ("/api/node/drain", {"body": {"drain": False}}), None),
                ("delete_session", lambda: (f"/api/sessions/{state['session']}", {}), None),
                # The session's kernel went with it: a kernel of its own to delete.
                ("delete_kernel", lambda: (f"/api/kernels/{gb.start_kernel(server)}", {}), None),
            ]
            # Operations between two nodes (moves) are exercised by tests/scaleout/test_moves.py.
            cluster_ops = {i for i, (_, _, op) in ops.items() if op.get("x-cellgate-cluster")}
            assert sorted(c[0] for c in cases) == sorted(set(ops) - cluster_ops), \
                "the document and this test must name the same operations"

            for op_id, make, note in cases:
                path, method, op = ops[op_id]
                concrete, kwargs = make()
                status, headers, body = call(server, method, concrete, **kwargs)
                codes = sorted(int(c) for c in op["responses"] if int(c) < 300)
                assert status == codes[0], \
                    f"{op_id}: {method.upper()} {concrete} -> {status}, documented {codes}: " \
                    f"{body[:300]!r}"
                documented = resolve(doc, op["responses"][str(status)])
                content = documented.get("content")
                if not content:
                    continue
                media = headers.get("content-type", "").split(";")[0].strip()
                assert media in content, f"{op_id}: {media!r} is not among {sorted(content)}"
                if media == "application/json":
                    answer = json.loads(body)
                    check_schema(doc, content[media]["schema"], answer, op_id)
                    if note:
                        note(answer)
            # The cell displayed the PNG, which came back byte for byte.
            status, _, body = call(server, "GET", f"/api/artifacts/{artifact()}")
            assert body == png
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)
