"""The aborted-transactions index of one segment: the `.txnindex` file, Kafka's layout.

Owns: the file's bytes (entries appended under the partition's append lock, read by
anyone without a lock) and the search that Kafka's `collectAbortedTxns` does over the
segments of a fetch. One entry per aborted transaction whose ABORT marker is in the
segment, in marker order:

    off  field               type
    0    version (= 0)       int16
    2    producerId          int64
    10   firstOffset         int64   the transaction's first offset on this partition
    18   lastOffset          int64   the offset of its ABORT marker
    26   lastStableOffset    int64   the partition's LSO once the abort completed

Kafka's `kafka-dump-log` reads these files. Invariant: every entry names a transaction
whose records are in [firstOffset, lastOffset] with that producer id. An entry is
written before its marker is published (log_txn.py), so a writer killed in between
leaves an entry whose marker never landed: a reader keeps only entries whose lastOffset
holds an ABORT control batch of that producer (`PartitionLog.aborted_transactions`
checks), and a trailing partial entry (a write cut by a power loss) is ignored.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from ._files import fsync_path, open_file

__all__ = ["AbortedTxn", "TXN_INDEX_SUFFIX", "TXN_ENTRY_BYTES", "txn_index_path",
           "append_entry", "read_entries", "TxnIndexCache"]

TXN_INDEX_SUFFIX = ".txnindex"
TXN_INDEX_VERSION = 0
_ENTRY = struct.Struct(">hqqqq")
TXN_ENTRY_BYTES = _ENTRY.size
assert TXN_ENTRY_BYTES == 34          # Kafka's AbortedTxn.TOTAL_SIZE


class AbortedTxn(NamedTuple):
    """One `.txnindex` entry (see the module docstring)."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def txn_index_path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, f"{base_offset:020d}{TXN_INDEX_SUFFIX}")


def append_entry(path: str, entry: AbortedTxn, *, sync: bool = False) -> None:
    """Append one entry (creating the file). Caller holds the partition's append lock.
    With `sync`, a file this call creates has its name synced too (its directory): a
    flush may later put the recovery point past the marker, and recovery then no
    longer re-adds the entry."""
    created = sync and not os.path.exists(path)
    fd = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        data = _ENTRY.pack(TXN_INDEX_VERSION, *entry)
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"{path}: short write ({written} of {len(data)} bytes)")
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_path(os.path.dirname(path) or ".")


def _parse(data: bytes) -> list[AbortedTxn]:
    whole = len(data) - len(data) % TXN_ENTRY_BYTES       # a torn last entry: ignored
    return [AbortedTxn(*fields[1:]) for fields in _ENTRY.iter_unpack(data[:whole])]


def read_entries(path: str) -> list[AbortedTxn]:
    """The entries of one file, oldest first ([] when there is no file)."""
    try:
        with open(path, "rb") as f:
            return _parse(f.read())
    except FileNotFoundError:
        return []


def truncate_entries(path: str, keep: int) -> None:
    """Keep only the first `keep` entries (recovery, after cutting the log)."""
    try:
        os.truncate(path, keep * TXN_ENTRY_BYTES)
    except FileNotFoundError:
        pass


class TxnIndexCache:
    """Parsed `.txnindex` files of one partition for one process, re-read when a file's
    size changes (entries are only appended). Thread-safe as far as dict operations
    are; callers hold the partition's thread lock."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._files: dict[int, tuple[int, list[AbortedTxn]]] = {}

    def entries(self, base_offset: int) -> list[AbortedTxn]:
        path = txn_index_path(self.directory, base_offset)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            self._files.pop(base_offset, None)
            return []
        cached = self._files.get(base_offset)
        if cached is not None and cached[0] == size:
            return cached[1]
        entries = read_entries(path)
        self._files[base_offset] = (size, entries)
        return entries

    def forget(self, keep: set[int] | None = None) -> None:
        """Drop cached files (all, or those not in `keep`)."""
        if keep is None:
            self._files.clear()
        else:
            for base in [b for b in self._files if b not in keep]:
                del self._files[base]

    def collect(self, bases: list[int], start_offset: int, end_offset: int
                ) -> list[AbortedTxn]:
        """Kafka's collectAbortedTxns over the segments `bases` (the live ones, oldest
        first): entries of transactions overlapping [start_offset, end_offset), from the
        segment holding `start_offset` on; a segment's search ends the walk once one of
        its entries' lastStableOffset reaches `end_offset` (nothing later can overlap)."""
        out: list[AbortedTxn] = []
        n = len(bases)
        for i, base in enumerate(bases):
            if i + 1 < n and bases[i + 1] <= start_offset:
                continue                      # wholly below the range
            complete = False
            for entry in self.entries(base):
                if entry.last_offset >= start_offset and entry.first_offset < end_offset:
                    out.append(entry)
                if entry.last_stable_offset >= end_offset:
                    complete = True
                    break
            if complete:
                break
        return out
