"""Record a workload's file operations with strace and parse them into a replayable list.

Owns: the strace command line (`record`), and `parse`, which turns its output into the
ordered operations the model (model.py) replays: directory-entry changes under the
root, data and size changes of files by inode, the syncs (fsync, fdatasync, syncfs, and
msync through the observer's snapshots, traced.py), and the workload's acknowledgements
(its ledger lines, written with writev to a file outside the root, so they sit in the
trace at the exact point where the acknowledgement was made).

Invariant: operations come in the order their system calls completed (strace -f into
one file; a call split by another thread's is joined at its completion), and every
file is named by an inode number that stays the same across renames.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from .traced import MARK

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRACE = shutil.which("strace") or "/usr/bin/strace"
SYSCALLS = ("openat", "open", "creat", "write", "writev", "pwrite64", "pwritev",
            "pwritev2", "fsync", "fdatasync", "syncfs", "sync", "truncate", "ftruncate",
            "fallocate", "rename", "renameat", "renameat2", "unlink", "unlinkat", "mkdir",
            "mkdirat", "rmdir", "mmap", "lseek", "clone", "clone3", "fork", "vfork")
O_CREAT, O_TRUNC, O_APPEND = "O_CREAT", "O_TRUNC", "O_APPEND"
FALLOC_KEEP_SIZE, FALLOC_PUNCH = "FALLOC_FL_KEEP_SIZE", "FALLOC_FL_PUNCH_HOLE"
DIR = "dir"


def child_env() -> dict:
    env = dict(os.environ)
    env.update(PYTHONPATH=ROOT_DIR, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
    return env


def record(root: str, variant: str, ledger: str, trace: str, *, timeout: float = 300
           ) -> subprocess.CompletedProcess:
    """Run the traced workload under strace; the root is created first (its own entry
    is the user's, not logkit's, to make durable)."""
    os.makedirs(root, exist_ok=True)
    argv = [STRACE, "-f", "-qq", "-y", "-xx", "-s", str(1 << 22), "-o", trace,
            "-e", "trace=" + ",".join(SYSCALLS), "-e", "signal=none",
            sys.executable, "-m", "tests.powercut.traced", root, variant, ledger]
    return subprocess.run(argv, cwd=ROOT_DIR, env=child_env(), capture_output=True,
                          text=True, timeout=timeout)


# ---- parsing -----------------------------------------------------------------------------

@dataclass
class Op:
    """One replayable operation. kind and its fields:
    create(path, ino) mkdir(path) rename(path, dest, ino: the file's, -1 for a directory)
    unlink(path) rmdir(path) — entries;
    write(ino, offset, data) truncate(ino, size) extend(ino, size) zero(ino, offset,
    size) — a file's content; fsync(ino) — a file's data and size; dirsync(path);
    syncfs; snap(ino, snap, data) — a mapped file's bytes (snap: tail-version,
    tail-sync, index-sync); mapped(ino); ack(entry)."""

    kind: str
    path: str = ""
    dest: str = ""
    ino: int = -1
    offset: int = 0
    size: int = 0
    data: bytes = b""
    snap: str = ""
    entry: dict = field(default_factory=dict)


@dataclass
class Trace:
    root: str
    ops: list[Op]
    ino_paths: dict[int, str]          # an inode's first path (for messages)
    mapped: set[int]                   # inodes written through a shared writable map
    calls: int                         # system calls parsed


_HEAD = re.compile(r"^(\d+)\s+(.*)$")
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
_FD = re.compile(r"^(-?\d+|AT_FDCWD)<((?:\\x[0-9a-f]{2})*)>$")


def _hex(s: str) -> bytes:
    return bytes.fromhex(s.replace("\\x", ""))


def split_args(s: str) -> list[str]:
    out, depth, cur, quote = [], 0, [], False
    i = 0
    while i < len(s):
        c = s[i]
        if quote:
            cur.append(c)
            if c == "\\":
                cur.append(s[i + 1])
                i += 1
            elif c == '"':
                quote = False
        elif c == '"':
            quote = True
            cur.append(c)
        elif c in "[{(<":
            depth += 1
            cur.append(c)
        elif c in "]})>":
            depth -= 1
            cur.append(c)
        elif c == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    if cur or out:
        out.append("".join(cur).strip())
    return out


def _string(tok: str) -> bytes:
    if tok.endswith("..."):
        raise ValueError(f"strace cut a string short: {tok[-40:]}")
    if not (tok.startswith('"') and tok.endswith('"')):
        raise ValueError(f"not a string: {tok[:60]}")
    return _hex(tok[1:-1])


def _fd(tok: str) -> tuple[str, str | None]:
    m = _FD.match(tok)
    if not m:
        return tok, None
    return m.group(1), _hex(m.group(2)).decode("utf-8", "replace")


def _iov(tok: str) -> bytes:
    return b"".join(_hex(m) for m in re.findall(r'iov_base="((?:\\x[0-9a-f]{2})*)"', tok))


def _lines(path: str):
    """(tid, call text) per completed call, unfinished halves joined."""
    pending: dict[str, str] = {}
    with open(path, errors="replace") as f:
        for raw in f:
            m = _HEAD.match(raw.rstrip("\n"))
            if not m:
                continue
            tid, text = m.groups()
            if text.endswith("<unfinished ...>"):
                pending[tid] = text[: -len("<unfinished ...>")].rstrip()
                continue
            r = _RESUMED.match(text)
            if r:
                text = pending.pop(tid, r.group(1) + "(") + r.group(2)
            yield tid, text


_CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(.*)$")


class Parser:
    def __init__(self, root: str, ledger: str) -> None:
        self.root = os.path.abspath(root)
        self.ledger = os.path.abspath(ledger)
        self.marks = self.ledger + ".marks"
        self.ns: dict[str, object] = {self.root: DIR}      # live names: path -> ino | DIR
        self.sizes: dict[int, int] = {}
        # descriptors are per process: keyed "tgid:fd" (threads share their process's)
        self.tgid: dict[str, str] = {}                     # thread id -> process id
        self.tid = ""
        self.fds: dict[str, tuple[int, str]] = {}          # fd -> (ino, path at open)
        self.pos: dict[str, int] = {}
        self.append_fd: set[str] = set()
        self.sync_fd: set[str] = set()                     # opened O_SYNC / O_DSYNC
        self.ops: list[Op] = []
        self.ino_paths: dict[int, str] = {}
        self.mapped: set[int] = set()
        self.next_ino = 1
        self.calls = 0

    def under(self, path: str | None) -> bool:
        return bool(path) and (path == self.root or path.startswith(self.root + "/"))

    def resolve(self, dirtok: str | None, path: bytes) -> str:
        p = path.decode("utf-8", "replace")
        if p.startswith("/"):
            return os.path.normpath(p)
        base = _fd(dirtok)[1] if dirtok else os.getcwd()
        return os.path.normpath(os.path.join(base or "/", p))

    def ino_of(self, fdtok: str) -> int | None:
        fd, path = _fd(fdtok)
        if path is None:
            return None
        if path.endswith(" (deleted)"):
            got = self.fds.get(self.key(fd))
            return got[0] if got else None
        node = self.ns.get(path)
        return node if isinstance(node, int) else None

    def new_file(self, path: str) -> int:
        ino = self.next_ino
        self.next_ino += 1
        self.ns[path] = ino
        self.sizes[ino] = 0
        self.ino_paths[ino] = path
        self.ops.append(Op("create", path=path, ino=ino))
        return ino

    def data(self, ino: int, offset: int, data: bytes, fd: str) -> None:
        if data:
            self.ops.append(Op("write", ino=ino, offset=offset, data=data))
            self.sizes[ino] = max(self.sizes[ino], offset + len(data))
            if fd in self.sync_fd:         # O_DSYNC: durable when the write returns
                self.ops.append(Op("fsync", ino=ino))

    def key(self, fd: str) -> str:
        return f"{self.tgid.get(self.tid, self.tid)}:{fd}"

    def parse(self, trace_path: str) -> Trace:
        for tid, text in _lines(trace_path):
            m = _CALL.match(text)
            if not m:
                continue
            name, args, ret = m.groups()
            if ret.startswith("-1") or ret.startswith("?"):
                continue
            self.tid = tid
            self.calls += 1
            handler = getattr(self, "on_" + name, None)
            if handler is not None:
                handler(split_args(args), ret)
        return Trace(self.root, self.ops, self.ino_paths, self.mapped, self.calls)

    # ---- opens and entries

    def on_openat(self, a: list[str], ret: str) -> None:
        self._open(a[0], _string(a[1]), a[2], ret)

    def on_open(self, a: list[str], ret: str) -> None:
        self._open(None, _string(a[0]), a[1], ret)

    def _open(self, dirtok, rel: bytes, flags: str, ret: str) -> None:
        fd, path = _fd(ret.split()[0])
        if path is None:
            return
        if not self.under(path):
            return
        fd = self.key(fd)
        node = self.ns.get(path)
        if node == DIR:
            return
        if node is None:
            if O_CREAT not in flags:
                return
            node = self.new_file(path)
        elif O_TRUNC in flags and self.sizes.get(node):
            self.ops.append(Op("truncate", ino=node, size=0))
            self.sizes[node] = 0
        self.fds[fd] = (node, path)
        self.pos[fd] = 0
        for flag, fds in ((O_APPEND, self.append_fd), ("SYNC", self.sync_fd)):
            if flag in flags:
                fds.add(fd)
            else:
                fds.discard(fd)

    def on_mkdir(self, a, ret, dirtok=None):
        path = self.resolve(dirtok, _string(a[0]))
        if self.under(path):
            self.ns[path] = DIR
            self.ops.append(Op("mkdir", path=path))

    def on_mkdirat(self, a, ret):
        self.on_mkdir(a[1:], ret, a[0])

    def _rename(self, src: str, dst: str) -> None:
        if not (self.under(src) or self.under(dst)):
            return
        moved = {p: n for p, n in self.ns.items() if p == src or p.startswith(src + "/")}
        for p in list(self.ns):
            if p == dst or p.startswith(dst + "/"):
                del self.ns[p]
        for p, n in moved.items():
            del self.ns[p]
            if self.under(dst):
                self.ns[dst + p[len(src):]] = n
        # the file's inode rides along: a synced rename names it in its new directory
        # even when its old name (a staging directory's) never reached the disk
        node = moved.get(src)
        self.ops.append(Op("rename", path=src, dest=dst,
                           ino=node if isinstance(node, int) else -1))

    def on_rename(self, a, ret):
        self._rename(self.resolve(None, _string(a[0])), self.resolve(None, _string(a[1])))

    def on_renameat(self, a, ret):
        self._rename(self.resolve(a[0], _string(a[1])), self.resolve(a[2], _string(a[3])))

    on_renameat2 = on_renameat

    def _unlink(self, path: str, rmdir: bool) -> None:
        if not self.under(path):
            return
        for p in list(self.ns):
            if p == path or p.startswith(path + "/"):
                del self.ns[p]
        self.ops.append(Op("rmdir" if rmdir else "unlink", path=path))

    def on_unlink(self, a, ret):
        self._unlink(self.resolve(None, _string(a[0])), False)

    def on_rmdir(self, a, ret):
        self._unlink(self.resolve(None, _string(a[0])), True)

    def on_unlinkat(self, a, ret):
        self._unlink(self.resolve(a[0], _string(a[1])), "AT_REMOVEDIR" in a[2])

    # ---- content

    def on_write(self, a, ret):
        fd, path = _fd(a[0])
        fd = self.key(fd)
        n = int(ret.split()[0])
        if path == self.marks:
            self.on_mark(_string(a[1])[:n])
            return
        ino = self.ino_of(a[0])
        if ino is None:
            return
        data = _string(a[1])[:n]
        offset = self.sizes[ino] if fd in self.append_fd else self.pos.get(fd, 0)
        self.data(ino, offset, data, fd)
        self.pos[fd] = offset + n

    def on_clone(self, a, ret):
        child = ret.split()[0]
        parent = self.tgid.get(self.tid, self.tid)
        if "CLONE_THREAD" in ",".join(a):
            self.tgid[child] = parent
            for table in (self.fds, self.pos):        # calls it made before this line
                for k in [k for k in table if k.startswith(child + ":")]:
                    table[parent + k[len(child):]] = table.pop(k)
        else:                                          # a process: a copy of the table
            for table in (self.fds, self.pos):
                for k in [k for k in table if k.startswith(parent + ":")]:
                    table.setdefault(child + k[len(parent):], table[k])
            for fds in (self.append_fd, self.sync_fd):
                fds |= {child + k[len(parent):] for k in fds if k.startswith(parent + ":")}

    on_clone3 = on_clone
    on_fork = on_clone
    on_vfork = on_clone

    def on_lseek(self, a, ret):
        fd, path = _fd(a[0])
        if path is not None and self.under(path):
            self.pos[self.key(fd)] = int(ret.split()[0])

    def on_writev(self, a, ret):
        fd, path = _fd(a[0])
        fd = self.key(fd)
        n = int(ret.split()[0])
        if path in (self.ledger, self.ledger + ".2"):
            for line in _iov(a[1])[:n].splitlines():
                self.ops.append(Op("ack", entry=json.loads(line)))
            return
        ino = self.ino_of(a[0])
        if ino is None:
            return
        offset = self.sizes[ino] if fd in self.append_fd else self.pos.get(fd, 0)
        self.data(ino, offset, _iov(a[1])[:n], fd)
        self.pos[fd] = offset + n

    def on_pwrite64(self, a, ret):
        ino = self.ino_of(a[0])
        if ino is not None:
            self.data(ino, int(a[3]), _string(a[1])[: int(ret.split()[0])], self.key(_fd(a[0])[0]))

    def on_pwritev(self, a, ret):
        ino = self.ino_of(a[0])
        if ino is not None:
            self.data(ino, int(a[3]), _iov(a[1])[: int(ret.split()[0])], self.key(_fd(a[0])[0]))

    on_pwritev2 = on_pwritev

    def _resize(self, ino: int | None, size: int) -> None:
        if ino is None:
            return
        self.ops.append(Op("truncate", ino=ino, size=size))
        self.sizes[ino] = size

    def on_ftruncate(self, a, ret):
        self._resize(self.ino_of(a[0]), int(a[1]))

    def on_truncate(self, a, ret):
        node = self.ns.get(self.resolve(None, _string(a[0])))
        self._resize(node if isinstance(node, int) else None, int(a[1]))

    def on_fallocate(self, a, ret):
        ino = self.ino_of(a[0])
        if ino is None:
            return
        mode, offset, length = a[1], int(a[2]), int(a[3])
        if FALLOC_PUNCH in mode:
            self.ops.append(Op("zero", ino=ino, offset=offset, size=length))
        elif FALLOC_KEEP_SIZE not in mode and offset + length > self.sizes[ino]:
            self.ops.append(Op("extend", ino=ino, size=offset + length))
            self.sizes[ino] = offset + length

    def on_mmap(self, a, ret):
        if "MAP_SHARED" in a[3] and "PROT_WRITE" in a[2]:
            ino = self.ino_of(a[4])
            if ino is not None and ino not in self.mapped:
                self.mapped.add(ino)
                self.ops.append(Op("mapped", ino=ino))

    # ---- syncs

    def on_fsync(self, a, ret):
        fd, path = _fd(a[0])
        if not self.under(path):
            return
        if self.ns.get(path) == DIR:
            self.ops.append(Op("dirsync", path=path))
            return
        ino = self.ino_of(a[0])
        if ino is not None:
            self.ops.append(Op("fsync", ino=ino))

    on_fdatasync = on_fsync

    def on_syncfs(self, a, ret):
        self.ops.append(Op("syncfs"))

    def on_sync(self, a, ret):
        self.ops.append(Op("syncfs"))

    def on_mark(self, data: bytes) -> None:
        assert data.startswith(MARK), data[:40]
        kind, path, content = data[len(MARK):].split(b"\0", 2)
        node = self.ns.get(path.decode())
        if isinstance(node, int):
            self.ops.append(Op("snap", ino=node, snap=kind.decode(), data=content))


def parse(trace_path: str, root: str, ledger: str) -> Trace:
    return Parser(root, ledger).parse(trace_path)
