"""The zygote's Python (kernel-launcher/python/cellgate_zygote.py) against Debian's ipykernel,
without the zygote, the jail or root.

A child process plays the zygote: it runs the file in a module named _cellgate_zygote with the
two globals the embedder sets, reports what the preload left behind, parses the next kernel's
command line (prepare_kernel_app) and forks a kernel that calls start_kernel, as
zygote_server.cpp does. The test then drives that kernel with jupyter_client.

    /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/launcher/test_zygote_python.py

Every process started here is stopped by its pid; the temp dir is removed. ~10 s.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

SOURCE = Path(__file__).resolve().parents[2] / "kernel-launcher" / "python" / "cellgate_zygote.py"
TIMEOUT = 60  # seconds for the preload or a reply on a loaded machine

# The zygote's part: the preload, a report of its state on stdout (one JSON line), then the fork.
ZYGOTE = textwrap.dedent("""
    import gc, json, os, sys, threading, types
    source, home, connection_file = sys.argv[1:4]
    module = types.ModuleType("_cellgate_zygote")
    sys.modules["_cellgate_zygote"] = module
    module._cellgate_preload = ["ipykernel", "IPython"]
    module._cellgate_home = home
    exec(compile(open(source).read(), source, "exec"), module.__dict__)

    from ipykernel.iostream import IOPubThread, OutStream
    from ipykernel.kernelapp import IPKernelApp
    args = ["-f", connection_file]
    module.prepare_kernel_app(args)
    print(json.dumps({
        "environ": dict(os.environ),
        "threads": threading.active_count(),
        "frozen": gc.get_freeze_count(),
        "app_is_ipkernelapp": issubclass(module.CellgateKernelApp, IPKernelApp),
        "shell_id": id(module._shell),
        "shell_history": module._shell.history_manager.hist_file,
        "flush": OutStream.flush.__name__,
        "schedule": IOPubThread.schedule.__qualname__,
        "handle_event": IOPubThread._handle_event.__name__,
        "parsed_argv": module._parsed_argv,
    }), flush=True)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            module.start_kernel(args, {"HOME": home, "PATH": "/usr/bin:/bin"})
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
""")


@pytest.fixture(scope="module")
def zygote():
    """The zygote's report and a client of the kernel it forked."""
    tmp = Path(tempfile.mkdtemp(prefix="cellgate-zygote-py-"))
    home = tmp / "home"
    home.mkdir()
    connection_file = str(tmp / "kernel.json")
    write_connection_file(connection_file, ip="127.0.0.1", transport="tcp")
    proc = subprocess.Popen([sys.executable, "-c", ZYGOTE, str(SOURCE), str(home),
                             connection_file],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(home)})
    client = None
    try:
        line = proc.stdout.readline()
        if not line:
            pytest.fail("the preload failed:\n" + proc.stderr.read())
        report = json.loads(line)
        client = BlockingKernelClient(connection_file=connection_file)
        client.load_connection_file()
        client.start_channels()
        client.wait_for_ready(timeout=TIMEOUT)
        yield report, client, proc
    finally:
        if client is not None:
            client.stop_channels()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # the kernel, its child, sees its parent go
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def run(client, code):
    """Executes `code`; returns (stdout text, the execute_result's text/plain or None)."""
    msg_id = client.execute(code)
    stdout, result = "", None
    while True:
        msg = client.get_iopub_msg(timeout=TIMEOUT)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream" and content["name"] == "stdout":
            stdout += content["text"]
        elif kind == "execute_result":
            result = content["data"]["text/plain"]
        elif kind == "error":
            pytest.fail("the cell failed: " + "\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            break
    reply = client.get_shell_msg(timeout=TIMEOUT)
    assert reply["content"]["status"] == "ok"
    return stdout, result


def test_preload_leaves_no_thread_no_environment_and_a_frozen_heap(zygote):
    report, _, _ = zygote
    assert report["environ"] == {}, "the preload clears the environment before any fork"
    assert report["threads"] == 1
    assert report["frozen"] > 0, "gc.freeze() after the preload"


def test_preload_patches_ipykernel_and_builds_the_shell(zygote):
    report, _, _ = zygote
    assert report["app_is_ipkernelapp"]
    assert report["flush"] == "quick_flush"
    assert report["schedule"] != "IOPubThread.schedule", "iopub wake-ups coalesced"
    assert report["handle_event"] == "counted_handle_event"
    assert report["shell_history"] == ":memory:", "the zygote's shell keeps no history file"
    assert report["parsed_argv"][:2] == ["-f", report["parsed_argv"][1]]


def test_kernel_adopts_the_shell_and_runs_cells(zygote):
    report, client, _ = zygote
    stdout, result = run(client, textwrap.dedent("""
        import os, sys
        ip = get_ipython()
        print(id(ip))
        print(ip.history_manager.hist_file)
        print(os.environ["HOME"], ip.home_dir)
        print(getattr(ip.kernel, "_execute_sleep", 0))
        6 * 7
    """))
    shell_id, hist_file, homes, sleep = stdout.splitlines()
    assert int(shell_id) == report["shell_id"], "the kernel runs the shell the zygote built"
    assert hist_file != ":memory:" and hist_file.endswith("history.sqlite")
    home, home_dir = homes.split()
    assert home == home_dir, "the adopted shell's home is the kernel's"
    assert float(sleep) == 0
    assert result == "42"


def test_empty_flushes_and_output_arrive_in_order(zygote):
    _, client, _ = zygote
    stdout, _ = run(client, "import sys\nfor i in range(3):\n    print(i)\n    sys.stdout.flush()\n"
                            "sys.stdout.flush()\nprint('end')")
    assert stdout == "0\n1\n2\nend\n"


def test_kernel_shuts_down_with_exit_code_zero(zygote):
    _, client, proc = zygote
    client.shutdown()
    assert proc.wait(timeout=TIMEOUT) == 0
