"""The file rules every file of a broker root follows.

Owns: the mode of data files (the owner's alone), opening a file without following a
symbolic link planted at its path (`open_file`), checking that a partition directory is
a real directory (`check_directory`), and the process's descriptor budget
(`raise_descriptor_limit`, `DESCRIPTORS_PER_PARTITION`). Invariant: no file logkit
writes is reached through a symbolic link. Any module that opens a file of a broker root
opens it here.
"""

from __future__ import annotations

import errno
import logging
import os
import stat

from .errors import StorageError

__all__ = ["FILE_MODE", "open_file", "check_directory", "raise_descriptor_limit",
           "DESCRIPTORS_PER_PARTITION"]

log = logging.getLogger("logkit.tail")      # its records keep the name they always had

FILE_MODE = 0o600                     # data files are the owner's alone (docs/storage.md)


def open_file(path: str, flags: int) -> int:
    """os.open that never follows a symbolic link at `path` (a link planted in the data
    directory must not redirect our writes); raises StorageError naming the path."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StorageError(f"refusing to open {path}: it is a symbolic link",
                               operation="open", path=path, errno=exc.errno) from exc
        raise


# What one partition holds open in a process that appends to it: the tail file and
# its map (Python's mmap keeps a descriptor of its own) and the active segment's .log;
# index maps hold none (index.py). A reader adds the .log's map and at most one sealed
# segment (log.py's MAX_OPEN_SEGMENTS).
DESCRIPTORS_PER_PARTITION = 3


def raise_descriptor_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit, as the JVM does for
    Kafka's broker (thousands of partitions need thousands of descriptors; the common
    soft limit of 1024 is a default, not a decision). Returns the soft limit now; one
    that cannot be raised is left as it is, and running out later is an EMFILE that
    `storage_error` names."""
    try:
        import resource
    except ImportError:                     # not a POSIX system: nothing to raise
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.debug("raised the soft descriptor limit from %d to %d", soft, target)
            soft = target
        except (ValueError, OSError) as exc:
            log.debug("could not raise the soft descriptor limit %d: %s", soft, exc)
    return soft


def check_directory(path: str, *, create: bool = False) -> None:
    """A partition directory must be a real directory, not a link to one elsewhere;
    with `create`, a missing one is made (mode 0700). One lstat when it exists."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        if not create:
            return                    # the open that follows names what is missing
        os.makedirs(path, mode=0o700, exist_ok=True)
        mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        raise StorageError(f"refusing to use {path}: it is a symbolic link",
                           operation="open", path=path, errno=errno.ELOOP)


def fsync_path(path: str) -> None:
    """fsync a file or a directory by name (a directory's fsync makes the renames,
    creates and unlinks in it durable)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
