"""`cellgate serve --api notebook-http`: Kernel Gateway 2.5.2's notebook-http mode against a real
gateway and real jailed kernels. One server (2 seeded kernels, a base URL, /_api/source, /public)
serves every check of the notebook in tests/fixtures/notebook_http (its name is not ASCII); then
the refusals to start (no endpoints, a failing seed cell, Kernel Gateway's spellings) and SIGTERM
leaving no kernel. Expected bodies are Kernel Gateway's (notebook_http/handlers.py, mixins.py)."""

import hashlib
import http.client
import json
import os
import pathlib
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from gateway_support import processes_of, reap_leftovers  # noqa: E402

BIN = pathlib.Path(os.environ.get("CELLGATE_BIN_DIR", "build/bin")) / "cellgate"
FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "notebook_http"
NOTEBOOK = FIXTURES / "api_h\u00e9llo.ipynb"
TOKEN = "nbhttp-test-token"
BASE = "/kg"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")


class Gateway:
    def __init__(self, tmp, args, env=None):
        self.tmp = pathlib.Path(tmp)
        self.proc = subprocess.Popen(
            [str(BIN), "serve", "--ip", "127.0.0.1", "--port", "0",
             "--state-dir", str(self.tmp / "state"), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True)
        self.lines = queue.Queue()
        self.output = []
        threading.Thread(target=self._drain, daemon=True).start()
        self.port = None

    def _drain(self):
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_listening(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                return False
            if "listening on http://" in line:
                self.port = int(line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
                return True
        raise AssertionError("no 'listening on' within %d s:\n%s" % (timeout, "".join(self.output)))

    def wait_exit(self, timeout):
        return self.proc.wait(timeout=timeout)

    def request(self, method, path, body=None, headers=None, token=True):
        headers = dict(headers or {})
        if token:
            headers.setdefault("Authorization", "token " + TOKEN)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers)
            res = conn.getresponse()
            return res.status, {k.lower(): v for k, v in res.getheaders()}, res.read()
        finally:
            conn.close()

    def get(self, path, **kw):
        return self.request("GET", BASE + path, **kw)


@pytest.fixture(scope="module")
def gateway():
    with tempfile.TemporaryDirectory() as tmp:
        gw = Gateway(tmp, ["--api", "notebook-http", "--seed", str(NOTEBOOK), "--prespawn", "2",
                           "--token", TOKEN, "--base-url", BASE + "/",
                           "--allow-notebook-download", "--static-path", str(FIXTURES / "public")])
        try:
            assert gw.wait_listening(), "".join(gw.output)
            yield gw
        finally:
            if gw.proc.poll() is None:
                gw.proc.send_signal(signal.SIGTERM)
                try:
                    gw.wait_exit(30)
                except subprocess.TimeoutExpired:
                    gw.proc.kill()
            reap_leftovers(pathlib.Path(tmp))


def echo(gw, method, path="/echo", **kw):
    status, headers, body = gw.request(method, BASE + path, **kw)
    assert status == 200, (status, body)
    assert headers["content-type"] == "text/plain"
    return json.loads(body)


def test_request_global_shape(gateway):
    got = echo(gateway, "GET", "/echo?a=1&a=x+y%21&b=&c")
    assert got["method"] == "GET"
    req = got["request"]
    assert list(req) == ["body", "args", "path", "headers"]
    assert req["body"] == "" and req["path"] == {}
    assert req["args"] == {"a": ["1", "x y!"], "b": [""], "c": [""]}
    # Tornado's header case; a repeated header is a list.
    assert req["headers"]["Authorization"] == "token " + TOKEN
    status, _, raw = gateway.get("/raw_request", headers={"x-my-HEADER": "v"})
    assert status == 200
    # REQUEST is json.dumps' text: ", " and ": ", keys in request order.
    assert raw.startswith(b'{"body": "", "args": {}, "path": {}, "headers": {'), raw
    assert b'"X-My-Header": "v"' in raw
    assert gateway.get("/request_type")[2] == b"str\n"


def test_bodies_by_content_type(gateway):
    as_json = echo(gateway, "POST", body=json.dumps({"z": [1, 2], "a": "\u00e9"}),
                   headers={"Content-Type": "application/json"})
    assert as_json["method"] == "POST" and as_json["request"]["body"] == {"z": [1, 2], "a": "\u00e9"}
    bad_json = echo(gateway, "PUT", body="{not json", headers={"Content-Type": "application/json"})
    assert bad_json["request"]["body"] == "{not json"
    form = echo(gateway, "POST", body="a=1&a=2&b=c+d",
                headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert form["request"]["body"] == {"a": ["1", "2"], "b": ["c d"]}
    multipart = ("--XyZ\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nvalue\r\n"
                 "--XyZ\r\nContent-Disposition: form-data; name=\"up\"; filename=\"a.txt\"\r\n\r\n"
                 "file\r\n--XyZ--\r\n")
    mp = echo(gateway, "POST", body=multipart,
              headers={"Content-Type": "multipart/form-data; boundary=XyZ"})
    assert mp["request"]["body"] == {"f": ["value"]}
    text = echo(gateway, "DELETE", body="plain words", headers={"Content-Type": "text/plain"})
    assert text["method"] == "DELETE" and text["request"]["body"] == "plain words"


def test_path_parameters_percent_decoded_and_non_ascii(gateway):
    status, _, body = gateway.get("/echo/%C3%A9t%C3%A9/a%2Fb+c")
    assert status == 200 and json.loads(body) == {"a": "\u00e9t\u00e9", "b": "a/b+c"}
    status, _, body = gateway.get("/caf%C3%A9/%E2%9C%93")
    assert status == 200 and body.decode() == "bonjour \u2713\n"
    assert gateway.get("/unicode")[2].decode() == "h\u00e9llo \u2713 \U0001F600\n"
    # Constant paths before parameters.
    assert gateway.get("/order/fixed")[2] == b"fixed\n"
    assert gateway.get("/order/other")[2] == b"param\n"


def test_response_info_status_and_headers(gateway):
    status, headers, body = gateway.get("/status/418?x=arg")
    assert status == 418 and body == b"status 418\n"
    assert headers["content-type"] == "application/x-custom"
    assert headers["x-echo-arg"] == "arg"
    status, headers, body = gateway.request("POST", BASE + "/created", body="new",
                                            headers={"Content-Type": "text/plain"})
    assert status == 201 and headers["location"] == "/created/1"
    assert json.loads(body) == {"created": "new"}
    status, headers, body = gateway.get("/nocontent")
    assert status == 204 and body == b""


def test_outputs_errors_and_etag(gateway):
    status, headers, body = gateway.get("/execute_result")
    assert (status, body) == (200, b'{"text/plain": "42"}')
    assert headers["etag"] == '"%s"' % hashlib.sha1(body).hexdigest()
    assert gateway.get("/execute_result", headers={"If-None-Match": headers["etag"]})[0] == 304
    assert gateway.get("/stream_and_result")[2] == b"from stdout\n"
    assert gateway.get("/stderr")[2] == b"on stdout\n"
    assert gateway.get("/empty")[:3:2] == (200, b"")
    assert gateway.get("/multi")[2] == b"42\n"
    status, headers, body = gateway.get("/error")
    assert (status, body) == (500, b"Error ValueError: boom \n")
    status, _, body = gateway.get("/bad_response_info")
    assert (status, body) == (500, b"Error RuntimeError: info failed \n")


def test_404_405_401_options(gateway):
    for path in ("/nope", "/from_markdown", "/echo/1", "/order/a/b"):
        status, headers, body = gateway.get(path)
        assert (status, json.loads(body)) == (404, {"reason": "Not Found", "message": ""}), path
        assert headers["content-type"] == "application/json"
    assert gateway.request("GET", "/echo")[0] == 404  # outside the base URL
    status, headers, body = gateway.request("POST", BASE + "/tag")
    assert (status, body) == (405, b"")
    status, _, body = gateway.request("PATCH", BASE + "/tag")
    assert status == 405 and json.loads(body)["reason"] == "Method Not Allowed"
    status, _, body = gateway.get("/tag", token=False)
    assert (status, json.loads(body)) == (401, {"reason": "Unauthorized", "message": ""})
    assert gateway.get("/tag?token=" + TOKEN, token=False)[0] == 200
    status, _, body = gateway.request("OPTIONS", BASE + "/tag", token=False)
    assert (status, body) == (200, b"")


def test_swagger_source_and_public(gateway):
    status, headers, body = gateway.get("/_api/spec/swagger.json")
    assert status == 200 and headers["content-type"] == "application/json"
    spec = json.loads(body)
    assert spec["swagger"] == "2.0" and spec["info"] == {"version": "0.0.0", "title": "api_h\u00e9llo"}
    assert spec["paths"]["/echo"] == {v: {"responses": {"200": {"description": "Success"}}}
                                      for v in ("get", "post", "put", "delete")}
    assert "/caf\u00e9/:name" in spec["paths"] and "/from_markdown" in spec["paths"]
    status, _, body = gateway.get("/_api/source")
    assert status == 200 and body == NOTEBOOK.read_bytes()
    assert gateway.get("/_api/source", token=False)[0] == 401
    status, headers, body = gateway.get("/public/index.html", token=False)
    assert status == 200 and headers["content-type"] == "text/html" and b"static file" in body
    for path in ("/public/missing.html", "/public/../api_h%C3%A9llo.ipynb", "/public/%2E%2E/x"):
        assert gateway.get(path)[0] == 404, path


def test_kernels_are_seeded_jailed_and_marked(gateway):
    assert gateway.get("/env")[2] == b"1\n"
    # State persists in a kernel (the counter lives in whichever kernel served the POST).
    counts = [int(gateway.request("POST", BASE + "/counter")[2]) for _ in range(4)]
    assert sorted(counts) == [1, 1, 2, 2], counts


def test_pool_is_first_in_first_out_and_requests_queue(gateway):
    tags = [gateway.get("/tag")[2].decode().strip() for _ in range(4)]
    assert tags[0] != tags[1] and tags[2] == tags[0] and tags[3] == tags[1], tags
    results = []

    def slow(i):
        status, _, body = gateway.get("/sleep/%d?s=1.0" % i)
        results.append((status, json.loads(body)))

    threads = [threading.Thread(target=slow, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [s for s, _ in results] == [200, 200, 200]
    spans = sorted((r["start"], r["end"], r["tag"]) for _, r in results)
    # Two kernels: the first two overlap, the third starts only once one of them ended.
    assert spans[1][0] < spans[0][1], spans
    assert spans[2][0] >= min(spans[0][1], spans[1][1]) - 0.01, spans
    assert {s[2] for s in spans} == {tags[0], tags[1]}


def write_notebook(path, sources):
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3"}},
          "cells": [{"cell_type": "code", "source": s, "metadata": {}, "outputs": [],
                     "execution_count": None} for s in sources]}
    path.write_text(json.dumps(nb))
    return path


@pytest.mark.parametrize("sources, says", [
    (["x = 1", "print(x)"], "no endpoints"),
    (["raise ValueError('seed failure')", "# GET /x\nprint(1)"], "seed failure"),
])
def test_refuses_to_start(sources, says):
    with tempfile.TemporaryDirectory() as tmp:
        nb = write_notebook(pathlib.Path(tmp) / "bad.ipynb", sources)
        gw = Gateway(tmp, ["--api", "notebook-http", "--seed", str(nb), "--token", TOKEN])
        try:
            assert gw.wait_exit(120) != 0
            gw.lines.get(timeout=10)
            out = "".join(gw.output)
            assert "listening on" not in out and says in out, out
        finally:
            if gw.proc.poll() is None:
                gw.proc.kill()
            assert reap_leftovers(pathlib.Path(tmp)) == []


def test_kernel_gateway_spellings_and_sigterm_leaves_no_kernel():
    with tempfile.TemporaryDirectory() as tmp:
        nb = write_notebook(pathlib.Path(tmp) / "kg.ipynb", ["v = 7", "# GET /v\nprint(v)"])
        env = dict(os.environ, KG_AUTH_TOKEN=TOKEN)
        gw = Gateway(tmp, ["--KernelGatewayApp.api=kernel_gateway.notebook_http",
                           "--KernelGatewayApp.seed_uri=" + str(nb),
                           "--KernelGatewayApp.prespawn_count", "2"], env=env)
        try:
            assert gw.wait_listening(), "".join(gw.output)
            assert gw.request("GET", "/v")[2] == b"7\n"
            assert processes_of(pathlib.Path(tmp)), "no kernel process names the state dir"
            started = time.monotonic()
            gw.proc.send_signal(signal.SIGTERM)
            assert gw.wait_exit(20) == 0
            assert time.monotonic() - started < 20
            assert processes_of(pathlib.Path(tmp)) == []
        finally:
            if gw.proc.poll() is None:
                gw.proc.kill()
            reap_leftovers(pathlib.Path(tmp))
