"""What operators' tools read, on a real `cellgate serve`: Debian's `promtool check metrics` on a
live /metrics scrape after kernel starts and a cell (the standard process_* names, build info,
requests by route pattern, kernel starts by source, kernels running by kernelspec, with sane
values), then scraped by Debian's own Prometheus server (the target up, its series queryable);
--log-format json with SPDLOG_LEVEL=debug (every log line one JSON object with ts, level and msg;
debug lines shown; kernel starts, interrupts, restarts, shutdowns and a failed start as
jupyter_server's kernel_actions events); --log-level warn over SPDLOG_LEVEL (nothing below warn);
and the Grafana dashboard in deploy/ parses and queries only families the gateway exports."""
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import gateway_bench as gb  # noqa: E402

BIN_DIR = os.environ.get("CELLGATE_BIN_DIR", "build/bin")
ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "cellgate-dashboard.json"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
LEVELS = ("trace", "debug", "info", "warn", "error", "critical")
KERNEL_ACTION_FIELDS = {"action", "kernel_id", "kernel_name", "status"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus_query(port, query):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def scrape_with_prometheus(server, tmp):
    """Debian's Prometheus server scrapes the gateway (Bearer token, as operators configure it)
    until the target is up; returns what it then holds of cellgate_kernels_running."""
    tmp = pathlib.Path(tmp)
    (tmp / "token").write_text(server.token)
    port = free_port()
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: cellgate\n"
        f"    authorization:\n      credentials_file: {tmp / 'token'}\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{server.port}']\n")
    log = (tmp / "prometheus.log").open("wb")
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'prometheus-data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert prom.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (
                "Prometheus never saw the target up:\n" + (tmp / "prometheus.log").read_text()[-3000:])
            try:
                up = prometheus_query(port, 'up{job="cellgate"}')
                running = prometheus_query(port, "cellgate_kernels_running")
            except OSError:
                up, running = [], []  # not listening yet
            if up and up[0]["value"][1] == "1" and running:
                break
            if up and up[0]["value"][1] == "0":
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets",
                                            timeout=10) as r:
                    targets = json.loads(r.read())["data"]["activeTargets"]
                errors = [t.get("lastError") for t in targets if t.get("lastError")]
                assert not errors, f"Prometheus could not scrape the gateway: {errors}"
            time.sleep(0.2)
        return running
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        log.close()


def parse(text):
    """[(name, {label: value}, value)] of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample: {line!r}"
        labels = dict(LABEL.findall(m.group(2) or ""))
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def one(samples, name, **labels):
    found = [v for n, ls, v in samples if n == name and all(ls.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


def wait_log(server, needle, timeout=120):
    deadline = time.monotonic() + timeout
    while needle not in pathlib.Path(server.log_path).read_text(errors="replace"):
        assert server.proc.poll() is None, server.log_tail()
        assert time.monotonic() < deadline, f"no {needle!r} in the log:\n" + server.log_tail()
        time.sleep(0.05)


def json_log_lines(server):
    """The log's JSON lines, checking every other line is the banner on stdout."""
    lines = []
    for line in pathlib.Path(server.log_path).read_text(errors="replace").splitlines():
        if line.startswith("{"):
            obj = json.loads(line)
            assert list(obj)[:3] == ["ts", "level", "msg"], obj
            if len(obj) > 3:  # a kernel lifecycle event: jupyter_server's kernel_actions names
                assert set(obj) - {"ts", "level", "msg"} <= KERNEL_ACTION_FIELDS, obj
                assert obj["action"] in ("start", "interrupt", "shutdown", "restart"), obj
                assert obj["status"] in ("success", "error"), obj
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", obj["ts"]), obj
            assert obj["level"] in LEVELS, obj
            lines.append(obj)
        else:
            assert line.startswith(("cellgate serve:", "  ")) or not line.strip(), \
                f"a log line that is not JSON: {line!r}"
    return lines


@pytest.mark.skipif(os.geteuid() != 0, reason="the jail needs root")
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing (package prometheus)")
def test_metrics_pass_promtool_and_logs_are_json(monkeypatch):
    monkeypatch.setenv("SPDLOG_LEVEL", "debug")
    with tempfile.TemporaryDirectory() as tmp:
        server = gb.start_cellgate(BIN_DIR, tmp, 4, ("--pool-size", "1", "--pool-max", "1",
                                                     "--log-format", "json"))
        try:
            wait_log(server, "zygote: ready")
            # A client env is never served by the pool: forked from the ready zygote.
            forked = gb.start_kernel(server, env={"KERNEL_METRICS_TEST": "1"})
            gb.wait_pool_ready(server, 1, timeout=120)
            pooled = gb.start_kernel(server)
            status, body = gb.http_request(server, "POST", f"/api/kernels/{pooled}/execute",
                                           {"code": "print(6 * 7)", "timeout": 30}, timeout=90)
            assert status == 200 and json.loads(body)["status"] == "ok", body
            assert gb.http_request(server, "GET", f"/api/kernels/{forked}")[0] == 200
            assert gb.http_request(server, "GET", "/api/no-such-route/12345")[0] == 404

            status, body = gb.http_request(server, "GET", "/metrics")
            assert status == 200
            text = body.decode()
            scrape = pathlib.Path(tmp) / "metrics.txt"
            scrape.write_text(text)
            check = subprocess.run(["promtool", "check", "metrics"], stdin=scrape.open("rb"),
                                   capture_output=True, text=True, timeout=30)
            assert check.returncode == 0, f"promtool:\n{check.stdout}{check.stderr}"

            s = parse(text)
            now = time.time()
            start = one(s, "process_start_time_seconds")
            assert now - 600 < start <= now + 1, start
            assert one(s, "process_cpu_seconds_total") > 0
            assert one(s, "process_resident_memory_bytes") > 1 << 20
            assert one(s, "process_virtual_memory_bytes") >= one(s, "process_resident_memory_bytes")
            assert 3 < one(s, "process_open_fds") < one(s, "process_max_fds")
            build = [ls for n, ls, v in s if n == "cellgate_build_info" and v == 1]
            assert len(build) == 1 and re.fullmatch(r"\d+\.\d+\.\d+.*", build[0]["version"]), build

            starts = "cellgate_kernel_start_duration_seconds"
            assert one(s, starts + "_count", kernelspec="python3", source="zygote") == 1
            assert one(s, starts + "_count", kernelspec="python3", source="pool") == 1
            assert 0 < one(s, starts + "_sum", kernelspec="python3", source="zygote") < 120
            assert one(s, starts + "_bucket", kernelspec="python3", source="pool", le="+Inf") == 1
            assert one(s, "cellgate_kernels_running", kernelspec="python3") == 2

            req = "cellgate_http_request_duration_seconds"
            routes = {ls["route"] for n, ls, _ in s if n == req + "_count"}
            assert {"/api/kernels", "/api/kernels/{id}", "/api/kernels/{id}/execute",
                    "/metrics", "other"} <= routes, routes
            assert not [r for r in routes if forked in r or pooled in r or "12345" in r], routes
            assert one(s, req + "_count", method="POST", route="/api/kernels", code="201") == 2
            assert one(s, req + "_count", method="GET", route="/api/kernels/{id}", code="200") == 1
            assert one(s, req + "_count", method="GET", route="other", code="404") == 1
            assert one(s, req + "_count", method="POST", route="/api/kernels/{id}/execute",
                       code="200") == 1
            # Existing names are still there.
            for name in ("cellgate_kernel_starts_total", "cellgate_process_resident_memory_bytes",
                         "cellgate_cells_total", "cellgate_kernels"):
                assert any(n == name for n, _, _ in s), name

            running = scrape_with_prometheus(server, tmp)
            assert [(r["metric"].get("kernelspec"), r["value"][1]) for r in running] == \
                [("python3", "2")], running

            # The lifecycle a client drives, and a start that fails.
            assert gb.http_request(server, "POST", f"/api/kernels/{pooled}/interrupt")[0] == 204
            assert gb.http_request(server, "POST", f"/api/kernels/{forked}/restart",
                                   timeout=120)[0] == 200
            assert gb.http_request(server, "DELETE", f"/api/kernels/{pooled}")[0] == 204
            assert gb.http_request(server, "POST", "/api/kernels", {"name": "no-such-spec"})[0] \
                >= 400

            logs = json_log_lines(server)
            assert any(line["level"] == "debug" and "kernel pool: miss" in line["msg"]
                       for line in logs), "SPDLOG_LEVEL=debug shows debug lines"
            assert any(line["level"] == "info" and "zygote: ready" in line["msg"] for line in logs)
            events = [{k: v for k, v in line.items() if k not in ("ts", "msg")}
                      for line in logs if "action" in line]
            ok = {"level": "info", "status": "success", "kernel_name": "python3"}
            for want in ({"action": "start", "kernel_id": forked, **ok},
                         {"action": "start", "kernel_id": pooled, **ok},
                         {"action": "interrupt", "kernel_id": pooled, **ok},
                         {"action": "restart", "kernel_id": forked, **ok},
                         {"action": "shutdown", "kernel_id": pooled, **ok},
                         {"action": "start", "kernel_name": "no-such-spec", "status": "error",
                          "level": "warn"}):
                assert want in events, f"{want} not in {events}"
        finally:
            server.stop()
            gb.unmount_leftovers(tmp)

        # --log-level (here CELLGATE_LOG_LEVEL) wins over SPDLOG_LEVEL: nothing below warn.
        monkeypatch.setenv("CELLGATE_LOG_LEVEL", "warn")
        quiet = gb.start_cellgate(BIN_DIR, tmp, 1, ("--no-jail", "--no-zygote", "--pool-size", "0",
                                                    "--log-format", "json"), label="quiet")
        try:
            assert gb.http_request(quiet, "GET", "/api/no-such-route")[0] == 404
        finally:
            quiet.stop()
        logs = json_log_lines(quiet)
        assert any(line["level"] == "warn" and "--no-jail" in line["msg"] for line in logs), logs
        assert all(line["level"] in ("warn", "error", "critical") for line in logs), logs


def test_the_dashboard_queries_exported_families():
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 6, exprs
    names = set()
    for expr in exprs:
        names.update(re.findall(r"\b((?:cellgate|process)_[a-z_]+)", expr))
    exported = {"cellgate_kernels_running", "cellgate_kernel_start_duration_seconds_bucket",
                "cellgate_http_request_duration_seconds_bucket",
                "cellgate_http_request_duration_seconds_count", "process_resident_memory_bytes",
                "process_cpu_seconds_total"}
    assert exported <= names, exported - names
    source = (ROOT / "gateway" / "server" / "src" / "metrics.cpp").read_text()
    for name in names:
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert f'"{family}"' in source, f"the dashboard queries {name}, which the gateway lacks"


def test_print_config_shows_the_log_options():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELLGATE_", "KG_"))}
    env.update(CELLGATE_LOG_LEVEL="debug", XDG_CONFIG_HOME=tempfile.gettempdir() + "/none")
    r = subprocess.run([str(pathlib.Path(BIN_DIR) / "cellgate"), "serve", "--print-config",
                        "--log-format", "json"], capture_output=True, text=True, env=env,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(re.match(r'log-level = "debug"\s+#.*CELLGATE_LOG_LEVEL', line) for line in lines), \
        r.stdout
    assert any(re.match(r'log-format = "json"\s+#.*command line', line) for line in lines), r.stdout
    bad = subprocess.run([str(pathlib.Path(BIN_DIR) / "cellgate"), "serve", "--log-level", "loud"],
                         capture_output=True, text=True, env=env, timeout=30)
    assert bad.returncode == 2 and "log-level" in bad.stderr, bad.stderr
