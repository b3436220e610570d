"""The power-cut model: from a parsed trace and a moment, a directory a power cut could
have left (the model of ALICE and LazyFS, for the calls logkit makes).

Owns `materialise(trace, cut, mode, rng, dest)`. At the cut (an index into the trace's
operations) the disk holds:

- every directory-entry change (create, mkdir, rename, unlink, rmdir) followed, before
  the cut, by an fsync of its parent directory (either parent for a rename) or by a
  syncfs; of the others, mode "synced" keeps none, "prefix" a prefix in program order,
  "subset" any subset (each kept or not at random, applied in order; a rename whose
  source is gone still names the file at its destination, any other such change is
  skipped);
- of each file, every content and size change followed by an fsync/fdatasync of that
  file (or a syncfs); of the later ones, "synced" keeps none, "prefix" a random prefix,
  "subset" a random subset of their 4 KiB pieces (reordered writes) and of the size
  changes;
- of a file written through a shared writable map (the calls do not show those stores):
  a tail (`logkit.tail`) holds its bytes at its last msync or syncfs (the observer's
  snapshot, traced.py; zeros before any) in mode "synced", else any version stored since (one at
  random: write-back may have taken any); an index holds its bytes at its last msync
  (zeros before any); any other mapped file (LMDB's lock file, the doorbell) zeros.
  Their sizes follow the rules for files.

Then a reboot: every tail's boot id is replaced (a tail written before a power cut was
written under the previous boot), as the next boot would find it.

Invariant: nothing is on disk that the workload did not write before the cut, and
everything that was synced before the cut is.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from .trace import DIR, Op, Trace

MODES = ("synced", "prefix", "subset")
PAGE = 4096
OTHER_BOOT = b"\xee" * 16
TAIL_NAME = "logkit.tail"
ENTRY_KINDS = ("create", "mkdir", "rename", "unlink", "rmdir")
CONTENT_KINDS = ("write", "truncate", "extend", "zero")


@dataclass
class State:
    """What the cut left: the files written, and what was dropped (for reports)."""

    entries_kept: int
    entries_dropped: int
    content_kept: int
    content_dropped: int


def _parents(op: Op) -> tuple[str, ...]:
    if op.kind == "rename":
        return os.path.dirname(op.path), os.path.dirname(op.dest)
    return (os.path.dirname(op.path),)


def _apply_entry(ns: dict, op: Op) -> None:
    if op.kind in ("create", "mkdir"):
        if ns.get(os.path.dirname(op.path)) == DIR:
            ns[op.path] = DIR if op.kind == "mkdir" else op.ino
    elif op.kind == "rename":
        if ns.get(os.path.dirname(op.dest)) != DIR:
            return
        if op.path not in ns:
            # a file whose old name never reached the disk (made in a directory that was
            # not synced, renamed out of it, the new directory synced): the new name
            # still points at its inode, which the file's own fsync made durable
            if op.ino >= 0:
                ns[op.dest] = op.ino
            return
        moved = {p: n for p, n in ns.items() if p == op.path or p.startswith(op.path + "/")}
        for p in [p for p in ns if p == op.dest or p.startswith(op.dest + "/")]:
            del ns[p]
        for p, n in moved.items():
            del ns[p]
            ns[op.dest + p[len(op.path):]] = n
    else:
        for p in [p for p in ns if p == op.path or p.startswith(op.path + "/")]:
            del ns[p]


def _apply_content(buf: bytearray, op: Op) -> None:
    if op.kind == "write":
        end = op.offset + len(op.data)
        if len(buf) < end:
            buf.extend(bytes(end - len(buf)))
        buf[op.offset:end] = op.data
    elif op.kind == "truncate":
        if op.size < len(buf):
            del buf[op.size:]
        else:
            buf.extend(bytes(op.size - len(buf)))
    elif op.kind == "extend":
        if op.size > len(buf):
            buf.extend(bytes(op.size - len(buf)))
    elif op.kind == "zero":
        end = min(len(buf), op.offset + op.size)
        buf[op.offset:end] = bytes(max(0, end - op.offset))


def _pieces(op: Op) -> list[Op]:
    """A write split at 4 KiB page boundaries (what write-back may reorder)."""
    if op.kind != "write":
        return [op]
    out, pos, end = [], op.offset, op.offset + len(op.data)
    while pos < end:
        nxt = min(end, (pos // PAGE + 1) * PAGE)
        out.append(Op("write", ino=op.ino, offset=pos,
                      data=op.data[pos - op.offset:nxt - op.offset]))
        pos = nxt
    return out


def _choose_entries(pending: list, mode: str, rng: random.Random) -> set[int]:
    if mode == "prefix":
        return set(map(id, pending[:rng.randint(0, len(pending))]))
    if mode == "subset":
        return {id(e) for e in pending if rng.random() < 0.5}
    return set()


def _choose(pending: list, mode: str, rng: random.Random) -> list:
    if mode == "synced" or not pending:
        return []
    if mode == "prefix":
        return pending[:rng.randint(0, len(pending))]
    return [p for p in pending if rng.random() < 0.5]


def materialise(trace: Trace, cut: int, mode: str, rng: random.Random, dest: str) -> State:
    ops = trace.ops[:cut]
    entries: list[tuple[Op, bool]] = []          # (op, covered by a sync)
    content: dict[int, list[tuple[Op, bool]]] = {}
    snaps: dict[int, list[Op]] = {}
    for op in ops:
        if op.kind in ENTRY_KINDS:
            entries.append((op, False))
        elif op.kind in CONTENT_KINDS:
            content.setdefault(op.ino, []).append((op, False))
        elif op.kind == "dirsync":
            entries = [(e, c or op.path in _parents(e)) for e, c in entries]
        elif op.kind == "fsync" or (op.kind == "snap" and op.snap.endswith("-sync")):
            content[op.ino] = [(e, True) for e, _ in content.get(op.ino, [])]
        elif op.kind == "syncfs":
            entries = [(e, True) for e, _ in entries]
            content = {ino: [(e, True) for e, _ in lst] for ino, lst in content.items()}
            for lst in snaps.values():      # write-back of every map: its last version
                if lst[-1].snap == "tail-version":
                    lst.append(Op("snap", ino=lst[-1].ino, snap="tail-sync",
                                  data=lst[-1].data))
        if op.kind == "snap":
            snaps.setdefault(op.ino, []).append(op)
    # directory entries
    pending = [e for e, c in entries if not c]
    chooser = getattr(rng, "choose_entries", None)     # a test's own choice
    kept = chooser(pending) if chooser else _choose_entries(pending, mode, rng)
    ns: dict[str, object] = {trace.root: DIR}
    for e, c in entries:
        if c or id(e) in kept:
            _apply_entry(ns, e)
    state = State(sum(1 for _, c in entries if c) + len(kept), len(pending) - len(kept),
                  0, 0)
    # file contents
    files: dict[int, bytearray] = {}
    for ino in {n for n in ns.values() if n != DIR}:
        lst = content.get(ino, [])
        synced = [e for e, c in lst if c]
        later = [p for e, c in lst if not c for p in (_pieces(e) if mode == "subset"
                                                       else [e])]
        chosen = _choose(later, mode, rng)
        state.content_kept += len(synced) + len(chosen)
        state.content_dropped += len(later) - len(chosen)
        buf = bytearray()
        for e in synced + chosen:
            _apply_content(buf, e)
        if ino in trace.mapped:
            buf = _mapped_bytes(trace, ino, snaps.get(ino, []), len(buf), mode, rng)
        files[ino] = buf
    # write the directory
    for path in sorted(ns, key=lambda p: (p.count("/"), p)):
        out = dest + path[len(trace.root):]
        node = ns[path]
        if node == DIR:
            os.makedirs(out, exist_ok=True)
            continue
        data = files[node]
        if os.path.basename(path) == TAIL_NAME and len(data) >= 32 and data[:4] == b"LKT1":
            data[16:32] = OTHER_BOOT
        with open(out, "wb") as f:
            f.write(data)
    return state


def _mapped_bytes(trace: Trace, ino: int, snaps: list[Op], size: int, mode: str,
                  rng: random.Random) -> bytearray:
    name = os.path.basename(trace.ino_paths[ino])
    last_sync = max((i for i, s in enumerate(snaps) if s.snap.endswith("-sync")),
                    default=-1)
    base = snaps[last_sync].data if last_sync >= 0 else b""
    if name == TAIL_NAME and mode != "synced":
        versions = [base] + [s.data for s in snaps[last_sync + 1:]
                             if s.snap == "tail-version"]
        base = rng.choice(versions)
    elif not name.endswith((".index", ".timeindex", TAIL_NAME)):
        base = b""
    buf = bytearray(base[:size])
    buf.extend(bytes(size - len(buf)))
    return buf
