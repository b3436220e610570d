"""Regenerate the tables of docs/configuration.md from logkit's settings table.

Owns: nothing but the rewrite. Each generated block sits between
`<!-- generated: NAME -->` and `<!-- end generated -->`, where NAME is a scope of
logkit/config.py ("broker", "topic", "producer", "consumer", "spark read",
"spark write") or a status ("ignored", "refused"). tests/kit/test_config.py checks the page
against the same rendering, so the page cannot drift from the table.

Usage: .venv/bin/python tools/config_docs.py [--check]
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from logkit import config  # noqa: E402  (after the path is set)

PAGE = ROOT / "docs" / "configuration.md"
BLOCK = re.compile(r"(<!-- generated: (?P<name>[a-z ]+) -->\n)(?P<body>.*?)"
                   r"(<!-- end generated -->)", re.S)


def render(name: str) -> str:
    """The generated text of one block."""
    if name in (config.IGNORED, config.REFUSED):
        return config.markdown_flagged(name)
    return config.markdown(name)


def rewrite(text: str) -> str:
    """`text` with every generated block rendered afresh."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("name")) + m.group(4), text)


def blocks(text: str) -> dict[str, str]:
    """{name: body} of the generated blocks in `text`."""
    return {m.group("name"): m.group("body") for m in BLOCK.finditer(text)}


def main(argv: list[str]) -> int:
    text = PAGE.read_text(encoding="utf-8")
    fresh = rewrite(text)
    if "--check" in argv:
        if fresh != text:
            print(f"{PAGE} is stale: run tools/config_docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
