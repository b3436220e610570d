"""The prose of the docs against the settings table (logkit/config.py): a sentence that
calls settings ignored names none that the table says logkit honours. The tables of
docs/configuration.md are generated from the settings table and checked by
tests/test_config.py; this checks the hand-written sentences around them, where
`request_timeout_ms` was once called ignored on two pages while the producer honours
it."""

from __future__ import annotations

import pathlib
import re

import pytest

from logkit import config

DOCS = pathlib.Path(__file__).resolve().parent.parent
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


def sentences_calling_ignored(text: str) -> list[str]:
    text = " ".join(GENERATED.sub("", FENCE.sub("", text)).split())
    return [s for s in SENTENCE_END.split(text)
            if re.search(r"\bignored\b", s) and not re.search(r"not ignored|honoured", s)]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_sentence_calls_an_honoured_setting_ignored(page):
    honoured = honoured_names()
    wrong = [(name, sentence[:160]) for sentence in
             sentences_calling_ignored(page.read_text(encoding="utf-8"))
             for name in NAME.findall(sentence) if name in honoured]
    assert wrong == [], f"{page.name} calls honoured settings ignored: {wrong}"


def test_the_check_sees_a_wrong_sentence():
    """The old sentence of docs/configuration.md is caught."""
    old = "`retries` and `request_timeout_ms` are ignored for the same reason."
    assert [n for s in sentences_calling_ignored(old) for n in NAME.findall(s)
            if n in honoured_names()] == ["request_timeout_ms"]
