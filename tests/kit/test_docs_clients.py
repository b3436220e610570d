"""docs/clients.md's "Delivery semantics" as a reader follows it: its Python blocks saved
under the names their first lines give, its shell lines run in order in a fresh
directory, and every output the page promises (after `#`) checked — at most once, at
least once, and the exactly-once copier run twice without writing anything twice."""

from __future__ import annotations

import os
import re
import subprocess
import sys

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(CHECKOUT, "docs", "clients.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def section_blocks(language: str) -> list[str]:
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    start = text.index("\n## Delivery semantics\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end > 0 else len(text)]
    return [body for lang, body in FENCE.findall(section) if lang == language]


def test_the_delivery_semantics_examples_run_as_written(tmp_path):
    names = []
    for body in section_blocks("python"):
        name = re.match(r"# (\w+\.py)", body).group(1)
        (tmp_path / name).write_text(body)
        names.append(name)
    assert names == ["orders.py", "at_most_once.py", "at_least_once.py",
                     "exactly_once.py"]
    [run_block] = section_blocks("sh")
    lines = [line for line in run_block.splitlines() if line.strip()]
    assert len(lines) == 6
    for line in lines:
        command, _, promised = (part.strip() for part in line.partition("#"))
        assert command.startswith("python ")
        proc = subprocess.run([sys.executable, *command.split()[1:]], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": CHECKOUT})
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
        assert proc.stdout.strip() == promised, (command, proc.stdout)
