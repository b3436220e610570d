"""docs/tutorial.md as a reader follows it: its files saved as written (each Python block
names its file in its first line), its shell lines run in order in a fresh directory,
every output it promises in a comment checked, a subscriber SIGKILLed mid-way and
restarted, and its test file run by pytest through the installed plugin."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TUTORIAL = os.path.join(CHECKOUT, "docs", "tutorial.md")
BIN = os.path.dirname(sys.executable)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(language: str) -> list[str]:
    with open(TUTORIAL, encoding="utf-8") as f:
        return [body for lang, body in FENCE.findall(f.read()) if lang == language]


def save_files(directory) -> list[str]:
    """Every Python block, saved under the name its first line gives."""
    names = []
    for body in blocks("python"):
        name = re.match(r"# (\w+\.py)\n", body).group(1)
        (directory / name).write_text(body)
        names.append(name)
    return names


def shell(directory, line: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(["bash", "-c", line.replace("python ", f"{sys.executable} ", 1)],
                          cwd=directory, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_tutorial_runs_as_written(tmp_path):
    assert save_files(tmp_path) == ["events.py", "publisher.py", "subscriber.py",
                                    "test_sync.py"]
    run_block, describe_block = blocks("sh")
    for line in run_block.strip().splitlines():
        command, promised = (part.strip() for part in line.split("#", 1))
        proc = shell(tmp_path, command)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == promised, (command, proc.stdout)
    proc = shell(tmp_path, describe_block.split("#")[0].strip())
    assert proc.returncode == 0, proc.stderr
    header, *rows = [row.split() for row in proc.stdout.splitlines() if row.strip()]
    lags = [row[header.index("LAG")] for row in rows]
    assert len(lags) == 3 and set(lags) == {"0"}, proc.stdout


def test_a_killed_subscriber_restarts_from_its_commit_and_loses_nothing(tmp_path):
    """Kill -9 B after it applied part of the events; the next run finishes the copy.
    Events after the last commit are replayed (at-least-once) and change nothing."""
    save_files(tmp_path)
    assert shell(tmp_path, "python publisher.py 200").returncode == 0
    env = dict(os.environ)
    child = subprocess.Popen([sys.executable, "-c",
                              "import runpy, sys; sys.argv = ['subscriber.py', '150'];"
                              "runpy.run_path('subscriber.py')"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    child.wait(timeout=120)                          # stopped after >= 150 applied
    assert child.returncode == 0
    copy_file = tmp_path / "copy.json"
    before = json.loads(copy_file.read_text())
    assert before and sorted(s["version"] for s in before.values()) != [200, 200, 200]
    # A second run is killed hard once it has saved a copy of its own (or when it is
    # done, whichever comes first): whatever it applied after its last commit replays.
    saved = copy_file.stat().st_mtime_ns
    victim = subprocess.Popen([sys.executable, "subscriber.py"], cwd=tmp_path,
                              stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while (victim.poll() is None and copy_file.stat().st_mtime_ns == saved
           and time.monotonic() < deadline):
        time.sleep(0.001)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    proc = shell(tmp_path, "python subscriber.py")
    assert proc.returncode == 0, proc.stderr
    after = json.loads((tmp_path / "copy.json").read_text())
    assert {c: s["version"] for c, s in after.items()} == {"alice": 200, "bob": 200,
                                                           "carol": 200}
    assert after["alice"]["email"] == "alice+200@example.com"


def test_the_tutorial_s_test_passes_through_the_installed_plugin(tmp_path):
    save_files(tmp_path)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_sync.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
