"""envd's WatchDir watcher (the `watch` operation of gateway/envd/src/filesystem.cpp's program),
run as the gateway runs it in a jail, here on a temp dir: trees made in one go under a recursive
watch are reported whole, each path created once. A directory is watched only after its CREATE is
read, so what is made in it before then comes from a scan; the scan's copies that the new watch
queued as well are dropped. No root, no gateway: the program is read from the source."""
import json
import pathlib
import subprocess
import sys
import threading

import pytest

SOURCE = pathlib.Path(__file__).resolve().parents[2] / "gateway/envd/src/filesystem.cpp"


def program():
    text = SOURCE.read_text()
    return text.split('R"PY(', 1)[1].split(')PY"', 1)[0]


def watcher(path, recursive=True, with_entry=False):
    args = {"path": str(path), "recursive": recursive, "includeEntry": with_entry, "maxWatches": 1024}
    proc = subprocess.Popen([sys.executable, "-I", "-c", program(), "watch", json.dumps(args)],
                            stdout=subprocess.PIPE, text=True)
    assert json.loads(proc.stdout.readline()) == {"start": {}}
    return proc


def events_until(proc, sentinel, deadline_s=120):
    """The watcher's events up to `sentinel`'s; a watcher silent past the deadline is killed,
    which ends the read and fails the test."""
    timer = threading.Timer(deadline_s, proc.kill)
    timer.start()
    seen = []
    try:
        for line in proc.stdout:
            event = json.loads(line)["filesystem"]
            seen.append(event)
            if event["name"] == sentinel:
                return seen
    finally:
        timer.cancel()
    pytest.fail("the watcher ended before %s: %r" % (sentinel, seen))


@pytest.mark.parametrize("round_", range(20))
def test_a_tree_made_in_one_go_is_reported_whole_and_once(tmp_path, round_):
    proc = watcher(tmp_path, with_entry=round_ == 0)
    try:
        made = []
        for i in range(5):
            top = tmp_path / ("t%d" % i)
            (top / "u/v/w").mkdir(parents=True)
            (top / "u/v/w/f").write_text("x")
            (top / "u/g").write_text("y")
            (top / "u/v/x").mkdir()
            made += ["t%d/%s" % (i, p) if p else "t%d" % i
                     for p in ("", "u", "u/v", "u/v/w", "u/v/w/f", "u/g", "u/v/x")]
        (tmp_path / "sentinel").write_text("s")
        seen = events_until(proc, "sentinel")
    finally:
        proc.kill()
        proc.wait()
    creates = [e["name"] for e in seen if e["type"] == "EVENT_TYPE_CREATE"]
    wrong = {name: creates.count(name) for name in made if creates.count(name) != 1}
    assert not wrong, "created paths not reported exactly once: %r" % wrong
    if round_ == 0:  # includeEntry: a scanned file's entry too
        entries = {e["name"]: e.get("entry") for e in seen if e["type"] == "EVENT_TYPE_CREATE"}
        assert entries["t0/u/v/w/f"]["path"] == str(tmp_path / "t0/u/v/w/f")


def test_not_recursive_reports_only_its_own_directory(tmp_path):
    (tmp_path / "inner").mkdir()
    proc = watcher(tmp_path, recursive=False)
    try:
        (tmp_path / "new/deeper").mkdir(parents=True)
        (tmp_path / "inner/hidden").write_text("h")
        (tmp_path / "sentinel").write_text("s")
        seen = events_until(proc, "sentinel")
    finally:
        proc.kill()
        proc.wait()
    names = {e["name"] for e in seen}
    assert "new" in names
    assert not any(n.startswith("new/") or n.startswith("inner/") for n in names), names
