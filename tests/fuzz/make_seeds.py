#!/usr/bin/python3
"""Writes the seed corpora of tests/fuzz/corpus/ from real sources: messages serialized and signed
by jupyter_client's Session (the reference implementation), the ipykernel captures in
tests/fixtures/ipykernel, WebSocket frames in both formats (legacy binary by jupyter_server's own
serialize_binary_message), HTTP requests as clients send them, the example notebooks, a JailSpec
as the gateway writes one, and agent / E2B request bodies as docs/agent-api.md and the E2B SDK
send them. Run it again after changing a format: python3 tests/fuzz/make_seeds.py"""
import base64
import glob
import json
import os
import shutil
import struct

from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from jupyter_server.base.zmqhandlers import serialize_binary_message

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")
KEY = b"cellgate-fuzz-key"  # codec_fuzz.cpp's kKey
SEP = b"\0\0"  # fuzz_util.hpp's kFrameSeparator


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def messages():
    s = Session(key=KEY, username="fuzz")
    req = s.msg("execute_request", {"code": "print(1+1)", "silent": False, "store_history": True,
                                    "user_expressions": {}, "allow_stdin": True,
                                    "stop_on_error": True})
    out = [("execute_request", req, [])]
    out.append(("stream", s.msg("stream", {"name": "stdout", "text": "2\n"}, parent=req), []))
    out.append(("execute_reply", s.msg("execute_reply", {"status": "ok", "execution_count": 1,
                                                         "user_expressions": {}}, parent=req), []))
    out.append(("comm_msg", s.msg("comm_msg", {"comm_id": "c1", "data": {"x": [1, 2.5, None]}},
                                  parent=req), [b"\x00\x01\x02binary", b""]))
    out.append(("status", s.msg("status", {"execution_state": "idle"}, parent=req), []))
    return s, out


def broker_seeds():
    """Requests as the gateway's BrokerBackend sends them (kernel-launcher/broker/src/client.cpp)."""
    put("broker_request", "launch.json", json.dumps({
        "op": "launch", "id": 1, "kernel_id": "3f2a-k1", "kernelspec": "python3", "uid": 2900000,
        "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        "conn_files": {"cellgate_display.py": "print('hi')\n"}}))
    put("broker_request", "signal.json", '{"op":"signal","id":2,"handle":1,"signal":2}')
    put("broker_request", "stop.json", '{"op":"stop","id":3,"handle":1}')
    put("broker_request", "detach.json", '{"op":"detach","id":4,"handle":1}')
    put("broker_request", "log_tail.json", '{"op":"log_tail","id":5,"handle":1,"max_bytes":2000}')
    put("broker_request", "release_work.json", '{"op":"release_work","id":6,"kernel_id":"3f2a-k1"}')
    put("broker_request", "wait_fast.json", '{"op":"wait_fast","id":7,"timeout_ms":5000}')
    put("broker_request", "weaker-jail.json", '{"op":"launch","id":8,"kernel_id":"k","kernelspec":"python3","uid":1,"env":{},"jail":{"network":true}}')


def main():
    if os.path.isdir(CORPUS):
        shutil.rmtree(CORPUS)
    s, msgs = messages()
    for name, msg, buffers in msgs:
        msg["buffers"] = buffers
        frames = s.serialize(msg, ident=[b"client-identity"])
        put("codec", name + ".frames", SEP.join(frames + buffers))
        channel = "iopub" if name in ("stream", "status", "comm_msg") else "shell"
        parts = [msg["header"], msg["parent_header"], msg["metadata"], msg["content"]]
        jsons = [json.dumps(p, default=json_default).encode() for p in parts]
        # v1.kernel.websocket.jupyter.org: offsets as uint64 LE, channel, 4 JSON parts, buffers.
        chunks = [channel.encode()] + jsons + buffers
        n = len(chunks) + 1
        offsets, pos = [], 8 * (n + 1)
        for c in chunks:
            offsets.append(pos)
            pos += len(c)
        offsets.append(pos)
        put("ws_frames", name + ".v1", struct.pack("<%dQ" % (n + 1), n, *offsets) + b"".join(chunks))
        legacy = {"header": msg["header"], "parent_header": msg["parent_header"],
                  "metadata": msg["metadata"], "content": msg["content"], "channel": channel,
                  "msg_id": msg["header"]["msg_id"], "msg_type": msg["msg_type"], "buffers": []}
        put("ws_frames", name + ".legacy.json", json.dumps(legacy, default=json_default))
        if buffers:
            legacy["buffers"] = buffers
            put("ws_frames", name + ".legacy.bin",
                serialize_binary_message(json.loads(json.dumps(legacy, default=json_default)) | {"buffers": buffers}))
    for path in sorted(glob.glob(os.path.join(ROOT, "tests/fixtures/ipykernel/*.json"))):
        capture = json.load(open(path))
        frames = [base64.b64decode(f) for f in capture["frames_b64"]]
        put("codec", "ipykernel-" + os.path.basename(path)[:-5] + ".frames", SEP.join(frames))

    # HTTP: requests as curl, a browser and JupyterLab send them, on one connection or alone.
    get = b"GET /api HTTP/1.1\r\nHost: 127.0.0.1:8888\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n"
    body = b'{"code": "print(1)", "timeout": 5}'
    post = (b"POST /api/kernels/k1/execute HTTP/1.1\r\nHost: 127.0.0.1:8888\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    start = b'{"name": "python3"}'
    control = (b"POST /api/kernels HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(start)) + start
    chunked = (b"POST /api/kernels/k1/execute HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    upgrade = (b"GET /api/kernels/k/channels?session_id=s1 HTTP/1.1\r\nHost: 127.0.0.1:8888\r\n"
               b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
               b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: v1.kernel.websocket.jupyter.org\r\n\r\n")
    # A masked client text frame after the handshake ("hello").
    mask = b"\x01\x02\x03\x04"
    frame = b"\x81\x85" + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(b"hello"))
    put("http_session", "get", get)
    put("http_session", "post-execute", post)
    put("http_session", "post-control", control)
    put("http_session", "chunked", chunked)
    put("http_session", "keep-alive", get + post + b"GET /api/kernels/k1/files/a/b.txt HTTP/1.1\r\nHost: x\r\n\r\n")
    put("http_session", "upgrade", upgrade + frame)
    put("http_session", "upgrade-refused", upgrade.replace(b"/k/", b"/other/"))
    put("http_session", "http10", b"GET /api HTTP/1.0\r\n\r\n")
    put("http_session", "put-405", b"DELETE /api HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")

    for path in sorted(glob.glob(os.path.join(ROOT, "notebooks/examples/*.ipynb"))):
        put("notebook", os.path.basename(path), open(path, "rb").read())
    put("notebook", "params.yaml", "---\nalpha: 0.5\nratio: .5\nname: 'x'\nitems:\n  - 1\n  - two\nflags: {a: yes, b: ~}\n")
    notebook_seeds()
    notebook_outputs_seeds()

    # JailSpec as the gateway writes it (spec_json.hpp's example, plus the keys a kernel gets).
    put("jail_spec", "example.json", json.dumps({
        "memory_bytes": 536870912, "pids": 64, "cpus": 1.0, "work_dir": "/var/lib/cellgate/k1/work",
        "binds": [{"source": "/usr/local/bin/probe", "target": "/opt/probe", "writable": False}],
        "optional": ["swap"], "uid": 60001, "gid": 60001, "name": "k1", "hostname": "jail",
        "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}}, indent=1))
    put("jail_spec", "minimal.json", "{}")

    broker_seeds()

    put("api_requests", "execute.json", '{"code": "import numpy\\nprint(numpy.arange(3))", "timeout": 30, "stdin": ["yes"]}')
    put("api_requests", "oneshot.json", json.dumps({"code": "print(open('data/in.csv').read())", "kernel_name": "python3",
                                                    "files": {"data/in.csv": base64.b64encode(b"a,b\n1,2\n").decode()}}))
    put("api_requests", "e2b-execute.json", '{"code":"x = 1\\nx","context_id":"c1","env_vars":{"FOO":"bar"}}')
    put("api_requests", "e2b-language.json", '{"code":"console.log(1)","language":"js"}')
    put("api_requests", "e2b-context.json", '{"language":"python","cwd":"/home/user/project"}')

    for name, path in [("plain", "a.txt"), ("nested", "dir/b.txt"), ("dots", "./dir//./b.txt/"),
                       ("escape", "../outside/secret.txt"), ("via-link", "up/secret.txt"),
                       ("abs-link", "abs/secret.txt"), ("inner-link", "in/b.txt"), ("loop", "loop/x"),
                       ("new", "new/deep/file.txt")]:
        put("files_path", name, path)

    content_paths()


# The content paths (cell_output, result_mapping, audit_redact): what kernels really send (the
# ipykernel captures), and the worst of what they can send: the _render_traceback_ line that
# crashed the gateway, every shape the traceback scan matches at 200 KB, a bundle of many MIME
# types, a long display id, deep JSON.
CELL_TYPES = ["execute_input", "stream", "stream-dom", "execute_result", "display_data",
              "update_display_data", "error", "clear_output"]  # cell_output_fuzz.cpp's kTypes


def cell(*messages, tight=False):
    """A cell_output input: the limits byte, then (type, content) messages split by SEP."""
    parts = [bytes([CELL_TYPES.index(t)]) + (c if isinstance(c, bytes) else json.dumps(c).encode())
             for t, c in messages]
    return bytes([1 if tight else 0]) + SEP.join(parts)


def content_paths():
    captured = []
    for name in ("stream", "display_data", "execute_result", "error"):
        fixture = json.load(open(os.path.join(ROOT, "tests/fixtures/ipykernel", name + ".json")))
        frames = [base64.b64decode(f) for f in fixture["frames_b64"]]
        content = frames[frames.index(b"<IDS|MSG>") + 5]
        captured.append(("stream-dom" if name == "stream" else name, content))
    put("cell_output", "ipykernel", cell(*captured))
    put("cell_output", "ipykernel-tight", cell(*captured, tight=True))
    n = 200000
    for name, line in [("dashes", "-" * n), ("arrow", "-" * n + "> 3 x = 1"),
                       ("cell-in", "Cell In [" + "1" * n + "], line 3"),
                       ("line-number", "Cell In[4], line " + "9" * n),
                       ("many-cell-in", "Cell In[" * (n // 8))]:
        put("cell_output", "traceback-" + name, cell(
            ("execute_input", {"code": "raise E()", "execution_count": 1}),
            ("error", {"ename": "E", "evalue": "", "traceback": [line]})))
    put("cell_output", "long-ename", cell(("error", {"ename": "E" * n, "evalue": "v" * 20000,
                                                     "traceback": ["x" * 1000] * 50})))
    put("cell_output", "mime-types", cell(("display_data", {
        "data": {"application/x-t%d" % i: "v" for i in range(2000)}, "metadata": {}})))
    display_id = "d" * 20000
    put("cell_output", "display-id", cell(
        ("display_data", {"data": {"text/plain": "0"}, "metadata": {},
                          "transient": {"display_id": display_id}}),
        *[("update_display_data", {"data": {"text/plain": str(i)}, "metadata": {},
                                   "transient": {"display_id": display_id}}) for i in range(5)]))
    deep = b'{"data":{"application/json":' + b"[" * 1000 + b"]" * 1000 + b'},"metadata":{}}'
    put("cell_output", "deep-json", cell(("display_data", deep)))
    put("cell_output", "stdout-no-newline", cell(("stream", {"name": "stdout", "text": "x" * n}),
                                                 tight=True))

    answer = {"status": "error", "execution_count": 3, "stdout": "hi\n", "stderr": "",
              "outputs": [{"output_type": "stream", "name": "stdout", "text": "hi\n"},
                          {"output_type": "display_data", "data": {
                              "image/png": "iVBORw0KGgo=", "text/plain": "<Figure>",
                              "application/vnd.cellgate.chart+json": {"type": "line",
                                                                      "elements": []}},
                           "metadata": {}},
                          {"output_type": "error", "ename": "E", "evalue": "v",
                           "traceback": ["-" * 1000]}],
              "result": None, "error": {"ename": "E", "evalue": "v", "traceback": ["----> 3 x"],
                                        "line": 3},
              "artifacts": [{"sha256": "ab" * 32, "mime_type": "image/png", "size": 8}],
              "charts": [], "data": [{"columns": ["a"], "rows": [[1]]}],
              "notices": ["stdout is over the per-cell limit"],
              "truncated": {"stdout": False, "stderr": False, "outputs": False, "dropped_bytes": 0}}
    events = [{"type": "stream", "name": "stdout", "text": "hi\n"},
              {"type": "display_data", "data": {"text/plain": "x", "text/html": "<b>x</b>",
                                                "application/x-t1": "v"}, "metadata": {}},
              {"type": "error", "ename": "E", "evalue": "v", "traceback": ["-" * n]},
              {"type": "notice", "message": "cut"}, {"type": "keepalive"},
              {"type": "end", "answer": answer}]
    put("result_mapping", "answer", "\n".join(json.dumps(e) for e in events) + "\n")
    put("result_mapping", "deep", "[" * 2000 + "]" * 2000 + "\n" + json.dumps(answer))

    secrets = ("token = 'abc'\nAuthorization: Bearer abc.def\nAKIAIOSFODNN7EXAMPLE "
               "ghp_" + "q" * 36 + " sk-" + "w" * 30 + "\n-----BEGIN RSA PRIVATE KEY-----\nMII\n")
    put("audit_redact", "defaults", b"\0" + secrets.encode())
    put("audit_redact", "custom", b"\1user=alice internal-42 abcy x")
    put("audit_redact", "own-pattern", b"\2(?i)(key=)[a-z]+\nKEY=abc key=" + b"a" * 100000)
    put("audit_redact", "long-ename", b"\0" + b"E" * n)


def notebook_seeds():
    """A notebook nested 100,000 deep (issue 24): nlohmann parses it, and dump() then overflowed
    the stack; parse() refuses it now (it is also given to the -y reader, which recursed too)."""
    deep = 100000
    put("notebook", "deep.ipynb", '{"nbformat": 4, "nbformat_minor": 5, "cells": [], "metadata": {"deep": '
        + "[" * deep + "]" * deep + "}}")


def notebook_outputs_seeds():
    """NDJSON bodies of POST /api/kernels/{id}/execute as `cellgate serve` streams them (the
    executor's events, gateway/execute/include/cellgate/execute/executor.hpp), one per cell,
    separated by two NUL bytes."""
    def body(*events):
        return "".join(json.dumps(e) + "\n" for e in events)

    def end(status="ok", count=1):
        return {"type": "end", "answer": {"status": status, "execution_count": count, "notices": []}}

    def show(text, display_id=None, kind="display_data", png=None):
        e = {"type": kind, "data": {"text/plain": text}, "metadata": {}}
        if png:
            e["data"]["image/png"] = png
        if display_id:
            e["display_id"] = display_id
        return e

    def out(text, name="stdout"):
        return {"type": "stream", "name": name, "text": text}

    def clear(wait):
        return {"type": "clear_output", "wait": wait}

    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(64))).decode()
    cells = [
        body(show("'Hello'", "d1"), out("a"), {"type": "keepalive"}, out("b"), end()),
        body(show("'world'", "d1", "update_display_data"), show("2", None, "execute_result") | {"execution_count": 2},
             end(count=2)),
        body(show("'again'", "d1"), out("err\n", "stderr"), end(count=3)),
    ]
    put("notebook_outputs", "displays.ndjson", SEP.join(c.encode() for c in cells))
    frames = [e for i in range(5) for e in (clear(True), show("frame %d" % i, png=png))]
    put("notebook_outputs", "animation.ndjson", body(*frames, out("done\n"), end()).encode())
    updates = [show("%d%%" % i, "bar", "update_display_data") for i in range(0, 101, 20)]
    put("notebook_outputs", "progress.ndjson", SEP.join([
        body(show("0%", "bar"), end()).encode(),
        body(*updates, clear(False), show("100%", "bar", "update_display_data"), end(count=2)).encode()]))
    put("notebook_outputs", "error.ndjson", body(
        out("before\n"), {"type": "notice", "message": "stdout is over the per-cell limit"},
        {"type": "error", "ename": "ZeroDivisionError", "evalue": "division by zero",
         "traceback": ["Traceback (most recent call last)", "ZeroDivisionError: division by zero"], "line": 1},
        {"type": "end", "answer": {"status": "error", "execution_count": 1,
                                   "error": {"ename": "ZeroDivisionError", "evalue": "division by zero"}}}).encode())
    nested = "[" * 250 + "]" * 250
    put("notebook_outputs", "nested.ndjson", (
        '{"type": "display_data", "data": {"application/json": ' + nested + '}, "metadata": {}}\n'
        '{"type": "display_data", "data": {"application/json": [' + nested + ']}, "metadata": {}}\n'
        + json.dumps(end()) + "\n").encode())


if __name__ == "__main__":
    main()
