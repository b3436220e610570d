"""The prose of the docs against the settings table (logkit/config.py): a sentence that
calls settings ignored names none that the table says logkit honours. The tables of
docs/configuration.md are generated from the settings table and checked by
tests/kit/test_config.py; this checks the hand-written sentences around them, where
`request_timeout_ms` was once called ignored on two pages while the producer honours
it."""

from __future__ import annotations

import pathlib
import re

import pytest

from logkit import config

DOCS = pathlib.Path(__file__).resolve().parent.parent.parent
PAGES = sorted([DOCS / "README.md", *(DOCS / "docs").glob("*.md")])
FENCE = re.compile(r"```.*?```", re.S)
GENERATED = re.compile(r"<!-- generated.*?<!-- end generated -->", re.S)
SENTENCE_END = re.compile(r"(?<=[.;:])\s+(?=[A-Z*`(])")
NAME = re.compile(r"`([a-z_.]+)`")


def honoured_names() -> set[str]:
    """Kafka names and client keywords of every honoured setting outside Spark (whose
    option names, such as `topic`, are ordinary words in other sentences)."""
    return {name for row in config.SETTINGS
            if row.status == config.HONOURED and row.scope not in config.SPARK_SCOPES
            for name in (row.name, row.keyword) if name}


CLAUSE_END = re.compile(r"[:;|]")
IGNORED = re.compile(r"\bignored\b( \(([^)]*)\))?")


def called_ignored(text: str) -> list[tuple[str, str]]:
    """(name, clause) for every `name` a clause calls ignored: the names before
    "ignored" in its clause (clauses end at ':', ';', '|' and sentence ends), and those
    in a parenthesis right after it ("accepted but ignored (`a`, `b`)")."""
    text = " ".join(GENERATED.sub("", FENCE.sub("", text)).split())
    found = []
    for sentence in SENTENCE_END.split(text):
        if re.search(r"not ignored|honoured", sentence):
            continue
        for match in IGNORED.finditer(sentence):
            clause = CLAUSE_END.split(sentence[:match.start()])[-1]
            named = NAME.findall(clause) + NAME.findall(match.group(2) or "")
            found += [(name, (clause + match.group(0))[-160:]) for name in named]
    return found


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_sentence_calls_an_honoured_setting_ignored(page):
    honoured = honoured_names()
    wrong = [(name, clause) for name, clause in
             called_ignored(page.read_text(encoding="utf-8")) if name in honoured]
    assert wrong == [], f"{page.name} calls honoured settings ignored: {wrong}"


@pytest.mark.parametrize("text,wrong", [
    ("`retries` and `request_timeout_ms` are ignored for the same reason.",
     ["request_timeout_ms"]),
    ("which ones are accepted but ignored (`retries`, `request_timeout_ms`) and why",
     ["request_timeout_ms"]),
    ("`group.instance.id` is accepted and ignored: the group waits `session.timeout.ms`",
     []),
    ("**`min.insync.replicas` is honoured, not ignored.**", [])])
def test_the_check_reads_which_names_a_clause_calls_ignored(text, wrong):
    assert [n for n, _ in called_ignored(text) if n in honoured_names()] == wrong
