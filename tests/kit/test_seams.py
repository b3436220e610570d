"""The public seam (docs/design.md §5): the Spark data source and the CLI use logkit only
through what `logkit/__init__.py` exports (and the public submodules `logkit.serde`,
`logkit.testing` and `logkit.shipped`), and never touch an underscore attribute of a logkit object.

The check reads the source with `ast`, so it also sees imports inside functions. It is
stricter than the rule needs in one way: any `._name` outside `self`/`cls` counts, not
only logkit's own (the code held to it uses no third-party private either)."""

from __future__ import annotations

import ast
import pathlib

import pytest

import logkit

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
HELD = sorted((ROOT / "spark" / "pyspark_logkit").glob("*.py")) + [ROOT / "logkit" / "cli.py"]
PUBLIC_SUBMODULES = {"serde", "testing", "shipped"}
# Named-tuple methods carry an underscore only to stay clear of field names.
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def reaches(source: str, *, inside_logkit: bool, public: set[str] | None = None) -> list[str]:
    """Every place in `source` that goes past logkit's public surface, as
    "line: what" strings. `inside_logkit`: the module lives in the logkit package, so
    `from . import X` means logkit."""
    public = set(logkit.__all__) | {"__version__"} if public is None else public
    tree = ast.parse(source)
    found: list[str] = []
    aliases = set()                                # names bound to the logkit package

    def check_from_logkit(node: ast.ImportFrom, submodule: str | None) -> None:
        if submodule is None:
            for alias in node.names:
                if alias.name not in public and alias.name not in PUBLIC_SUBMODULES:
                    found.append(f"{node.lineno}: imports {alias.name!r}, not in "
                                 "logkit.__all__")
        elif submodule.split(".")[0] not in PUBLIC_SUBMODULES:
            found.append(f"{node.lineno}: imports from private module logkit.{submodule}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] != "logkit":
                    continue
                if len(parts) > 1 and parts[1] not in PUBLIC_SUBMODULES:
                    found.append(f"{node.lineno}: imports private module {alias.name}")
                elif len(parts) == 1:
                    aliases.add(alias.asname or "logkit")
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module is not None and \
                    node.module.split(".")[0] == "logkit":
                check_from_logkit(node, node.module.partition(".")[2] or None)
            elif node.level == 1 and inside_logkit:
                check_from_logkit(node, node.module)
            elif node.level > 1 and inside_logkit:
                found.append(f"{node.lineno}: relative import beyond the package")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and base.id in aliases:
                if node.attr not in public and node.attr not in PUBLIC_SUBMODULES:
                    found.append(f"{node.lineno}: uses {base.id}.{node.attr}, not in "
                                 "logkit.__all__")
            elif _private(node.attr) and not (isinstance(base, ast.Name)
                                              and base.id in ("self", "cls")):
                found.append(f"{node.lineno}: touches .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value):
            found.append(f"{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_" \
        and name not in NAMEDTUPLE_API


@pytest.mark.parametrize("path", HELD, ids=lambda p: str(p.relative_to(ROOT)))
def test_spark_and_the_cli_use_only_public_logkit_names(path):
    """Spark's data source and the CLI import only top-level logkit names (or
    logkit.serde / logkit.testing) and touch no underscore attribute of logkit objects."""
    inside = path.parent.name == "logkit"
    found = reaches(path.read_text(), inside_logkit=inside)
    assert not found, f"{path}:\n" + "\n".join(found)


def test_every_exported_name_exists():
    """`logkit.__all__` lists only names the package really has, so the seam it draws
    is real."""
    missing = [name for name in logkit.__all__ if not hasattr(logkit, name)]
    assert missing == []


@pytest.mark.parametrize("source, inside, expected", [
    ("import logkit.records", False, "imports private module logkit.records"),
    ("from logkit.columns import Columns", False, "private module logkit.columns"),
    ("from logkit import PartitionLog", False, "'PartitionLog', not in logkit.__all__"),
    ("import logkit as lk\nlk.records.encode_batch([])", False, "uses lk.records"),
    ("def f(p):\n    return p._log.read(0)", False, "touches ._log"),
    ("def f(b):\n    return getattr(b, '_closed')", False, "getattr(..., '_closed')"),
    ("from .records import read_header", True, "private module logkit.records"),
    ("from . import Broker, _fork", True, "'_fork', not in logkit.__all__"),
    ("from ..x import y", True, "relative import beyond the package"),
])
def test_the_seam_check_catches_each_kind_of_reach(source, inside, expected):
    """Each kind of reach the rule forbids is reported (the check can fail)."""
    found = reaches(source, inside_logkit=inside)
    assert len(found) == 1 and expected in found[0], found


def test_the_seam_check_accepts_public_use():
    """Public names, the public submodules, own attributes and named-tuple methods
    pass."""
    source = """
import logkit
import logkit.serde
from logkit import Broker, TopicPartition
from logkit.testing import produce
class Reader:
    def __init__(self):
        self._target = None
def f(tp):
    return logkit.Broker, tp._replace(partition=1), logkit.__version__
"""
    assert reaches(source, inside_logkit=False) == []
    assert reaches("from . import Broker, serde\nfrom .testing import produce",
                   inside_logkit=True) == []
