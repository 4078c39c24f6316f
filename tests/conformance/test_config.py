"""`cellgate serve`'s configuration as a Kernel Gateway user moves into it: every option from a
CELLGATE_* variable, Kernel Gateway's KG_* names, config files and their precedence,
--print-config naming each value's source, sizes with units, --version, and — on a running
gateway — KG_* settings in effect, --default-kernel, force_kernel_name and list_kernels,
KERNEL_GATEWAY=1 in kernels,
JUPYTER_DATA_DIR in kernelspec discovery and --client-ca (mutual TLS)."""
import json
import os
import pathlib
import queue
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")
CELLGATE = str(pathlib.Path(BIN_DIR) / "cellgate")


def clean_env(**extra):
    """The environment without any CELLGATE_*/KG_* the caller has, plus `extra`; HOME and
    XDG_CONFIG_HOME point at an empty dir so no user config file is read."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CELLGATE_", "KG_")) and k not in ("XDG_CONFIG_HOME",)}
    empty = tempfile.mkdtemp(prefix="cellgate-config-home-")
    env["HOME"] = empty
    env["XDG_CONFIG_HOME"] = empty + "/config"
    env.update(extra)
    return env


def print_config(*args, **env):
    r = subprocess.run([CELLGATE, "serve", "--print-config", *args], env=clean_env(**env),
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    return r


def entries(output):
    """{key: (value text, source)} of --print-config's lines."""
    out = {}
    for line in output.splitlines():
        m = re.match(r"^(#\s)?([a-z0-9-]+) = (.*?)  # (.*)$", line)
        if m:
            out[m.group(2)] = (m.group(3), m.group(4))
    return out


def test_version():
    r = subprocess.run([CELLGATE, "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert re.match(r"^cellgate \d+\.\d+\.\d+$", r.stdout.strip()), r.stdout


def test_every_option_has_an_environment_name():
    r = print_config(CELLGATE_CULL_INTERVAL="12", CELLGATE_CULL_BUSY="1",
                     CELLGATE_EXECUTE_GRACE="7", CELLGATE_THREADS="3")
    assert r.returncode == 0, r.stderr
    e = entries(r.stdout)
    assert e["cull-interval"] == ("12", "environment CELLGATE_CULL_INTERVAL")
    assert e["cull-busy"] == ("true", "environment CELLGATE_CULL_BUSY")
    assert e["execute-grace"] == ("7", "environment CELLGATE_EXECUTE_GRACE")
    assert e["threads"] == ("3", "environment CELLGATE_THREADS")
    assert e["cull-connected"] == ("false", "default")
    assert e["port"] == ("8888", "default")
    # Every option is listed with a source.
    help_text = subprocess.run([CELLGATE, "serve", "--help"], capture_output=True, text=True,
                               timeout=30).stdout
    names = set(re.findall(r"^\s+(?:-\w,\s*)?--([a-z0-9-]+)", help_text, re.M))
    names -= {"help", "config", "print-config"}
    assert len(names) > 50, names
    assert names <= set(e), names - set(e)


def test_kernel_gateway_names_are_read_and_ours_win():
    r = print_config(KG_PORT="9123", KG_PRESPAWN_COUNT="3", KG_ENV_PROCESS_WHITELIST="A,B",
                     KG_MAX_KERNELS="9", CELLGATE_MAX_KERNELS="11",
                     KG_WS_PING_INTERVAL_SECS="15")
    assert r.returncode == 0, r.stderr
    e = entries(r.stdout)
    assert e["port"] == ("9123", "environment KG_PORT (Kernel Gateway's name for CELLGATE_PORT)")
    assert e["pool-size"][0] == "3"
    assert e["env-allow"][0] == '["A", "B"]'
    assert e["ws-ping-interval"][0] == "15"
    assert e["max-kernels"] == ("11", "environment CELLGATE_MAX_KERNELS")


def test_config_files_and_precedence():
    with tempfile.TemporaryDirectory() as tmp:
        xdg = pathlib.Path(tmp) / "xdg"
        (xdg / "cellgate").mkdir(parents=True)
        user = xdg / "cellgate" / "cellgate.toml"
        user.write_text('max-kernels = 5\nmemory = "512M"\nallow-origin = ["https://a.example"]\n'
                        'pids = 12\n')
        # The user's file is read by default; the environment beats it, the command line both.
        r = print_config("--cull-interval", "33", CELLGATE_PIDS="99",
                         CELLGATE_CULL_INTERVAL="44", XDG_CONFIG_HOME=str(xdg))
        assert r.returncode == 0, r.stderr
        e = entries(r.stdout)
        assert e["max-kernels"] == ("5", f"config file {user}")
        assert e["pids"] == ("99", "environment CELLGATE_PIDS")
        assert e["memory"] == (str(512 << 20), f"config file {user}")
        assert e["allow-origin"][0] == '["https://a.example"]'
        assert e["cull-interval"] == ("33", "command line")
        # --config replaces the default files; a later one wins.
        a, b = pathlib.Path(tmp) / "a.toml", pathlib.Path(tmp) / "b.toml"
        a.write_text("max-kernels = 3\npids = 77\n")
        b.write_text("max-kernels = 4\n")
        r = print_config("--config", str(a), "--config", str(b), XDG_CONFIG_HOME=str(xdg))
        assert r.returncode == 0, r.stderr
        e = entries(r.stdout)
        assert e["max-kernels"] == ("4", f"config file {b}")
        assert e["pids"] == ("77", f"config file {a}")
        assert e["memory"][1] == "default", "the user's file is not read with --config"
        # An unknown key is an error naming it; a missing --config file too.
        bad = pathlib.Path(tmp) / "bad.toml"
        bad.write_text("max-kernel = 3\n")
        r = print_config("--config", str(bad))
        assert r.returncode == 2 and "max-kernel" in r.stderr + r.stdout, r
        r = print_config("--config", str(pathlib.Path(tmp) / "missing.toml"))
        assert r.returncode == 2 and "missing.toml" in r.stderr + r.stdout, r
        # What --print-config printed reads back to the same configuration.
        r = print_config("--port", "9001", "--memory", "1G", "--allow-origin", "x,y")
        printed = pathlib.Path(tmp) / "printed.toml"
        printed.write_text(r.stdout)
        again = print_config("--config", str(printed))
        assert again.returncode == 0, again.stderr
        first, second = entries(r.stdout), entries(again.stdout)
        assert {k: v[0] for k, v in first.items()} == {k: v[0] for k, v in second.items()}


def test_sizes_take_units_and_the_token_is_hidden():
    r = print_config("--memory", "2G", "--max-body-bytes", "64k", "--token", "s3cret-token")
    assert r.returncode == 0, r.stderr
    e = entries(r.stdout)
    assert e["memory"][0] == str(2 << 30)
    assert e["max-body-bytes"][0] == str(64 << 10)
    assert "s3cret-token" not in r.stdout
    assert "# token = (hidden)  # command line" in r.stdout
    r = print_config("--memory", "2Q")
    assert r.returncode == 2, r.stdout


def make_certs(tmp):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, with openssl."""
    d = pathlib.Path(tmp)

    def ossl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
         "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        ossl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
             "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))
        (d / f"{name}.ext").write_text(ext + "\n")
        ossl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
             "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
             "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.pem"))
    return d


class Gateway:
    """`cellgate serve` with a chosen environment; the banner tells when it listens."""

    def __init__(self, tmp, args, env):
        self.log = pathlib.Path(tmp) / "serve.log"
        self.proc = subprocess.Popen([CELLGATE, "serve", *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.lines = queue.Queue()
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def _drain(self):
        with open(self.log, "wb") as log:
            for raw in self.proc.stdout:
                log.write(raw)
                log.flush()
                self.lines.put(raw.decode(errors="replace"))
        self.lines.put(None)

    def wait_listening(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            if "listening on http" in line:
                return line
        raise AssertionError("no 'listening on' line:\n" + self.log.read_text(errors="replace"))

    def wait_exit(self, timeout=60):
        code = self.proc.wait(timeout=timeout)
        self.drain.join(timeout=timeout)  # its last lines are in the log once the pipe is read
        return code

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def request(url, token, method="GET", body=None, context=None, timeout=120):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Authorization": f"token {token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
        return r.status, json.loads(r.read() or b"null")


@pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")
def test_kernel_gateway_settings_on_a_running_gateway():
    with tempfile.TemporaryDirectory() as tmp:
        # A kernelspec only the user's data dir has.
        data = pathlib.Path(tmp) / "jupyter-data"
        spec = data / "kernels" / "kg-python"
        spec.mkdir(parents=True)
        spec.joinpath("kernel.json").write_text(json.dumps({
            "argv": ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python (data dir)", "language": "python"}))
        port = gb.free_port()
        env = clean_env(KG_PORT=str(port), KG_IP="127.0.0.1", KG_AUTH_TOKEN="kg-token-123",
                        KG_DEFAULT_KERNEL_NAME="kg-python", KG_PRESPAWN_COUNT="0",
                        JUPYTER_DATA_DIR=str(data))
        gw = Gateway(tmp, ["--state-dir", str(pathlib.Path(tmp) / "state"), "--no-zygote"], env)
        try:
            banner = gw.wait_listening()
            assert f"127.0.0.1:{port}" in banner, banner
            base = f"http://127.0.0.1:{port}"
            with pytest.raises(urllib.error.HTTPError) as denied:
                request(base + "/api/kernels", "wrong-token")
            assert denied.value.code in (401, 403)
            status, specs = request(base + "/api/kernelspecs", "kg-token-123")
            assert status == 200
            assert specs["default"] == "kg-python"
            assert "kg-python" in specs["kernelspecs"]
            status, kernel = request(base + "/api/kernels", "kg-token-123", "POST", {})
            assert status == 201 and kernel["name"] == "kg-python", kernel
            status, answer = request(base + f"/api/kernels/{kernel['id']}/execute", "kg-token-123",
                                     "POST", {"code": "import os; os.environ.get('KERNEL_GATEWAY')",
                                              "timeout": 60})
            assert answer["status"] == "ok", answer
            assert answer["result"]["text/plain"] == "'1'", answer
            log = gw.log.read_text(errors="replace")
            assert "KG_PORT (Kernel Gateway's name) is read as CELLGATE_PORT (--port)" in log
        finally:
            gw.stop()
        # A default kernel that does not exist stops the gateway with a clear error.
        gw = Gateway(tmp, ["--state-dir", str(pathlib.Path(tmp) / "state2"), "--port", "0",
                           "--default-kernel", "no-such-kernel", "--no-zygote",
                           "--pool-size", "0"], clean_env())
        try:
            assert gw.wait_exit() != 0
            assert "no-such-kernel" in gw.log.read_text(errors="replace")
        finally:
            gw.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")
def test_force_kernel_name_and_list_kernels_in_the_kernel_gateway_spellings():
    """--KernelGatewayApp.force_kernel_name: every start runs that kernelspec, whatever the
    request names; --KernelGatewayApp.list_kernels=False: the kernel and session lists are 403
    (Kernel Gateway's default), while the kernels themselves still answer."""
    with tempfile.TemporaryDirectory() as tmp:
        data = pathlib.Path(tmp) / "jupyter-data"
        spec = data / "kernels" / "forced-python"
        spec.mkdir(parents=True)
        spec.joinpath("kernel.json").write_text(json.dumps({
            "argv": ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python (forced)", "language": "python"}))
        port = gb.free_port()
        gw = Gateway(tmp, ["--state-dir", str(pathlib.Path(tmp) / "state"), "--no-zygote",
                           "--ip", "127.0.0.1", "--port", str(port), "--token", "t-forced",
                           "--pool-size", "0",
                           "--KernelGatewayApp.force_kernel_name=forced-python",
                           "--KernelGatewayApp.list_kernels=False"],
                     clean_env(JUPYTER_DATA_DIR=str(data)))
        try:
            gw.wait_listening()
            base = f"http://127.0.0.1:{port}"
            status, kernel = request(base + "/api/kernels", "t-forced", "POST", {"name": "python3"})
            assert status == 201 and kernel["name"] == "forced-python", kernel
            status, session = request(base + "/api/sessions", "t-forced", "POST",
                                      {"path": "a.ipynb", "type": "notebook",
                                       "kernel": {"name": "python3"}})
            assert status == 201 and session["kernel"]["name"] == "forced-python", session
            for listing in ("/api/kernels", "/api/sessions"):
                with pytest.raises(urllib.error.HTTPError) as denied:
                    request(base + listing, "t-forced")
                assert denied.value.code == 403, listing
                assert json.loads(denied.value.read())["error"] == "list_forbidden"
            status, model = request(base + f"/api/kernels/{kernel['id']}", "t-forced")
            assert status == 200 and model["name"] == "forced-python", model
        finally:
            gw.stop()
        # A forced kernelspec that does not exist stops the gateway with a clear error.
        gw = Gateway(tmp, ["--state-dir", str(pathlib.Path(tmp) / "state2"), "--port", "0",
                           "--force-kernel", "no-such-kernel", "--no-zygote",
                           "--pool-size", "0"], clean_env())
        try:
            assert gw.wait_exit() != 0
            assert "--force-kernel no-such-kernel" in gw.log.read_text(errors="replace")
        finally:
            gw.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")
def test_client_ca_requires_a_client_certificate():
    with tempfile.TemporaryDirectory() as tmp:
        d = make_certs(tmp)
        gw = Gateway(tmp, ["--state-dir", str(d / "state"), "--port", "0", "--token", "tls-token",
                           "--certfile", str(d / "server.pem"), "--keyfile", str(d / "server.key"),
                           "--no-zygote", "--pool-size", "0"],
                     clean_env(KG_CLIENT_CA=str(d / "ca.pem")))
        try:
            banner = gw.wait_listening()
            port = int(re.search(r"https://[^:]+:(\d+)", banner).group(1))
            url = f"https://127.0.0.1:{port}/api"
            without = ssl.create_default_context(cafile=str(d / "ca.pem"))
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                request(url, "tls-token", context=without, timeout=30)
            with_cert = ssl.create_default_context(cafile=str(d / "ca.pem"))
            with_cert.load_cert_chain(str(d / "client.pem"), str(d / "client.key"))
            status, body = request(url, "tls-token", context=with_cert, timeout=30)
            assert status == 200 and "version" in body, body
        finally:
            gw.stop()
