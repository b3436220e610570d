"""Leader leases: which replica may write to a replicated broker root, and until when.

Owns: the lease record `<root>/leader.lease` (JSON: holder, epoch, ttl_ms, renewed_ms),
its lock file `<root>/leader.lease.lock`, a root's replica id (the follower id a
`Follower` keeps in `follower.json`, else `<root>/replica.id`), and `LeaseKeeper`: a
leading Broker's renewals, its self-fencing and the write guard its partitions and
metadata store ask before every write (`LeaderLog`, `LeaderMeta`).

The lease at a root says who leads the replica set that root belongs to:
- a Broker opened on the root whose lease names this root's replica id leads, and once
  the root is replicated (a follower has reported progress under `replicas/`, or the
  lease already names it) renews the lease every TTL/3; it looks for a first report
  every TAKE_CHECK_S, and a running auto-promoting follower's `catch_up()` returns only
  once it sees the lease, so a follower in the ISR always has a lease to see expire;
- a lease naming another replica means a promotion happened elsewhere in a newer
  epoch: a Broker on this root refuses every write with NotLeaderError (it may still be
  read, and a `Follower` may use it to rejoin the new leader);
- `take_next()` is a promotion: it writes the next epoch under a new holder, unless
  another holder's lease is still valid (NotLeaderError).

Invariant: the lease file changes only inside `_locked()` (an exclusive flock on the
side file, waited for at most LOCK_WAIT_S), by read - check - write to a temporary
file - fsync - rename - fsync of the directory, so of two writers racing, the second
reads what the first wrote and decides on it: two promotions cannot both win. Expiry is
judged by wall-clock time (`renewed_ms + ttl_ms`), so leader and followers need clocks
that agree (one machine, or NTP on a shared filesystem); a leader also stops writing on
its own monotonic clock once TTL has passed since its last renewal began, which is
never later than a follower can see the lease expire.

Threads: one keeper thread per leading Broker; `check()` is called from any thread and
only reads one float.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import threading
import time
import uuid
from typing import Any, Iterator, Mapping, NamedTuple

from .._threads import start_thread
from ..errors import LogkitTimeoutError, NotLeaderError, StorageError
from ..log import LOCK_TIMEOUT_S, PartitionLog
from ..meta import MetaStore
from .._files import open_file

__all__ = ["Lease", "LeaseKeeper", "LeaderLog", "LeaderMeta", "LEASE_FILE",
           "LEASE_LOCK_FILE", "REPLICA_ID_FILE", "read_lease", "take_next", "renew",
           "release", "replica_id", "wire_topic_ids"]

log = logging.getLogger(__name__)

LEASE_FILE = "leader.lease"
LEASE_LOCK_FILE = "leader.lease.lock"
REPLICA_ID_FILE = "replica.id"
FOLLOWER_STATE_FILE = "follower.json"    # follower.py's STATE_FILE (not imported: a cycle)
REPLICAS_DIR = "replicas"                # directory.py's progress files
LOCK_WAIT_S = 1.0                        # the longest wait for the lease's lock
RENEWALS_PER_TTL = 3
TAKE_CHECK_S = 0.1                       # while unleased: the longest wait between looks


def _now_ms() -> int:
    return int(time.time() * 1000)


class Lease(NamedTuple):
    """One lease record: `holder` (a replica id) leads in `epoch` until `expires_ms`."""

    holder: str
    epoch: int
    ttl_ms: int
    renewed_ms: int

    @property
    def expires_ms(self) -> int:
        return self.renewed_ms + self.ttl_ms

    def valid(self, now_ms: int | None = None) -> bool:
        return (_now_ms() if now_ms is None else now_ms) < self.expires_ms


# ---- the record and its conditional writes ------------------------------------------------

def read_lease(root: str | os.PathLike[str]) -> Lease | None:
    """The lease at `root`, None when there is none. A malformed file raises
    StorageError naming it."""
    path = os.path.join(os.fspath(root), LEASE_FILE)
    try:
        fd = open_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with open(fd, encoding="utf-8") as f:
        text = f.read()
    try:
        body = json.loads(text)
        return Lease(str(body["holder"]), int(body["epoch"]), int(body["ttl_ms"]),
                     int(body["renewed_ms"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"{path} is not a lease record ({exc}); remove it only if no "
                           "other replica leads", operation="read lease", path=path) from None


def _write(root: str, lease: Lease) -> None:
    path = os.path.join(root, LEASE_FILE)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        json.dump({"version": 1, **lease._asdict()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def _locked(root: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """The lease's lock, waited for at most `wait_s` (then LogkitTimeoutError)."""
    fd = os.open(os.path.join(root, LEASE_LOCK_FILE),
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LogkitTimeoutError(f"the lease of {root} stayed locked by another "
                                             f"process for {wait_s:g} s") from None
                time.sleep(0.005)
        yield
    finally:
        os.close(fd)                                # releases the flock


def take_next(root: str | os.PathLike[str], holder: str, *, ttl_ms: int,
              min_epoch: int = 1) -> Lease:
    """A promotion: make `holder` lead `root`'s replica set in the next epoch (one above
    the lease's, at least `min_epoch`). NotLeaderError while another holder's lease is
    valid; LogkitTimeoutError when the lock stays taken; OSError when the root cannot
    be written."""
    root = os.fspath(root)
    with _locked(root):
        current = read_lease(root)
        now = _now_ms()
        if current is not None and current.holder != holder and current.valid(now):
            raise NotLeaderError(
                f"{root} is led by replica {current.holder} in epoch {current.epoch}, whose "
                f"lease is valid for {current.expires_ms - now} ms more; a promotion waits "
                "until it expires (stop that leader, or let its lease lapse)")
        epoch = max(min_epoch, current.epoch + 1 if current is not None else 1)
        lease = Lease(holder, epoch, ttl_ms, now)
        _write(root, lease)
        return lease


def renew(root: str | os.PathLike[str], holder: str, epoch: int, *, ttl_ms: int) -> Lease:
    """A leader's renewal (or first take) of `root`'s lease in `epoch`: written when the
    root has no lease, when the lease is `holder`'s in `epoch`, or when it is older
    than `epoch`. NotLeaderError when it names another holder in `epoch` or any holder
    in a newer one (this replica is fenced)."""
    root = os.fspath(root)
    with _locked(root):
        current = read_lease(root)
        if current is not None and current.epoch >= epoch \
                and (current.holder, current.epoch) != (holder, epoch):
            raise NotLeaderError(_fenced_message(root, current))
        lease = Lease(holder, epoch, ttl_ms, _now_ms())
        _write(root, lease)
        return lease


def release(root: str | os.PathLike[str], holder: str, epoch: int) -> bool:
    """End `holder`'s lease now (a clean shutdown), keeping holder and epoch; returns
    whether it was still `holder`'s to end."""
    root = os.fspath(root)
    with _locked(root):
        current = read_lease(root)
        if current is None or (current.holder, current.epoch) != (holder, epoch):
            return False
        _write(root, current._replace(renewed_ms=_now_ms() - current.ttl_ms))
        return True


def _fenced_message(root: str, lease: Lease) -> str:
    return (f"{root} is no longer the leader: its lease names replica {lease.holder} in "
            f"epoch {lease.epoch} (a newer leader); it may be read, and rejoins as a "
            "logkit.Follower of the new leader")


# ---- replica ids ---------------------------------------------------------------------

def replica_id(root: str | os.PathLike[str], *, create: bool = True) -> str | None:
    """This root's replica id: the follower id in `follower.json` when there is one,
    else `replica.id` (made here when `create`)."""
    root = os.fspath(root)
    try:
        fd = open_file(os.path.join(root, FOLLOWER_STATE_FILE), os.O_RDONLY)
        with open(fd, encoding="utf-8") as f:
            found = json.load(f).get("follower_id")
        if isinstance(found, str) and found:
            return found
    except (OSError, ValueError, AttributeError, StorageError):
        pass
    path = os.path.join(root, REPLICA_ID_FILE)
    try:
        with open(open_file(path, os.O_RDONLY), encoding="ascii") as f:
            found = f.read().strip()
        if found:
            return found
    except FileNotFoundError:
        pass
    if not create:
        return None
    made = uuid.uuid4().hex[:16]
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with open(fd, "w", encoding="ascii") as f:
        f.write(made + "\n")
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)                       # the first id made wins a race
    except FileExistsError:
        os.unlink(tmp)
        return replica_id(root, create=False)
    os.unlink(tmp)
    return made


def wire_topic_ids(root: str | os.PathLike[str]) -> dict[str, str]:
    """{local topic id: the id Kafka clients know it by} for a promoted follower's
    root (`wire_topic_ids` in its follower.json: the first leader's ids, which its
    Kafka listener goes on reporting); empty for any other root."""
    try:
        fd = open_file(os.path.join(os.fspath(root), FOLLOWER_STATE_FILE), os.O_RDONLY)
        with open(fd, encoding="utf-8") as f:
            found = json.load(f).get("wire_topic_ids")
    except (OSError, ValueError, AttributeError, StorageError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): str(v) for k, v in found.items()}


def replicated(root: str) -> bool:
    """Whether a follower has reported progress under `<root>/replicas/`."""
    try:
        return any(name.endswith(".json") for name in os.listdir(os.path.join(root,
                                                                               REPLICAS_DIR)))
    except OSError:
        return False


# ---- the leader's side ---------------------------------------------------------------

class LeaseKeeper:
    """A read-write Broker's lease: `check()` before every write, a renewing thread.

    States: *unleased* (no lease at the root, or none taken yet: writes allowed),
    *leading* (renewed every TTL/3; writes allowed until TTL after the last renewal
    began), *fenced* (the lease names another replica: every write raises
    NotLeaderError for good), *following* (the root is a Follower's: no checks, no
    renewals)."""

    def __init__(self, root: str, config: Mapping[str, Any]) -> None:
        self.root = root
        self.ttl_ms = int(config["broker.session.timeout.ms"])
        self.epoch: int | None = None
        self.holder: str | None = None
        self._until = math.inf               # monotonic: writes refused from then on
        self._fence: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False
        self._renewed = False                # this keeper wrote the lease at least once
        current = read_lease(root)
        if current is not None:
            me = replica_id(root)
            if current.holder == me:
                self.holder, self.epoch = me, current.epoch
            else:
                self._fenced(_fenced_message(root, current))

    @property
    def fenced(self) -> bool:
        return self._fence is not None

    @property
    def leading(self) -> bool:
        """Whether this broker holds the root's lease (renewing it)."""
        return self.epoch is not None and self._fence is None

    def check(self) -> None:
        """Raise NotLeaderError when this broker may not write (fenced, or its lease
        has not been renewed for a TTL). The hot path: one clock read."""
        if time.monotonic() >= self._until:
            raise NotLeaderError(self._fence or
                                 f"{self.root}: the leader's lease was not renewed for "
                                 f"broker.session.timeout.ms={self.ttl_ms}; writes wait "
                                 "for a renewal (another replica may be taking over)")

    def fence(self, message: str) -> None:
        """Refuse every write from now on, for good, with NotLeaderError(`message`):
        another replica leads (its lease is held elsewhere, e.g. in the object store a
        Shipper ships to). A no-op once fenced."""
        if self._fence is None:
            self._fenced(message)

    def follow(self) -> None:
        """The root is a Follower's: no write checks, no renewals."""
        self._stop.set()
        self._fence, self._until = None, math.inf
        self.epoch = None

    def start(self) -> None:
        """Run the renewing thread (a broker with background chores)."""
        if self._thread is None and self._fence is None and not self._stop.is_set():
            if self.epoch is not None:           # held at open: valid for one TTL
                self._until = time.monotonic() + self.ttl_ms / 1000
            thread = threading.Thread(target=self._run, daemon=True,
                                      name=f"logkit-lease {self.root}")
            start_thread(thread, "the leader lease's renewing thread")
            self._thread = thread

    def close(self) -> None:
        """Stop renewing and, if this keeper renewed it, release the lease (Kafka's
        controlled shutdown: a follower may take over at once). Safe twice."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if self._renewed and self.leading and self.holder is not None \
                and self.epoch is not None:
            try:
                release(self.root, self.holder, self.epoch)
            except (OSError, LogkitTimeoutError, StorageError) as exc:
                log.warning("%s: could not release the leader's lease: %s", self.root, exc)
        self.epoch = None

    def _fenced(self, message: str) -> None:
        self._fence = message
        self._until = -math.inf
        log.warning("%s", message)

    def _run(self) -> None:
        interval_s = self.ttl_ms / 1000 / RENEWALS_PER_TTL
        while not self._stop.is_set():
            self.tick()
            if self._fence is not None:
                return
            # Unleased, look often: a follower's catch_up() waits for the first lease
            # (follower.py), which must exist before this leader can stop unnoticed.
            self._stop.wait(interval_s if self.epoch is not None
                            else min(interval_s, TAKE_CHECK_S))

    def tick(self) -> None:
        """One renewal (the thread's step): take the lease once the root is
        replicated, renew it after; fence on a newer holder."""
        if self._stop.is_set() or self._fence is not None:
            return
        if self.epoch is None:
            if not replicated(self.root):
                return
            self.holder = replica_id(self.root)
            self.epoch = 0
        began = time.monotonic()
        try:
            assert self.holder is not None
            renew(self.root, self.holder, self.epoch, ttl_ms=self.ttl_ms)
        except NotLeaderError as exc:
            self._fenced(str(exc))
            return
        except (OSError, LogkitTimeoutError, StorageError) as exc:
            if not self._warned:
                self._warned = True
                log.warning("%s: cannot renew the leader's lease (%s); writes stop "
                            "%d ms after the last renewal", self.root, exc, self.ttl_ms)
            return
        if not self._renewed:
            log.info("%s: leading in lease epoch %d (broker.session.timeout.ms=%d)",
                     self.root, self.epoch, self.ttl_ms)
        self._warned = False
        self._renewed = True
        self._until = began + self.ttl_ms / 1000


class LeaderLog(PartitionLog):
    """A read-write broker's partition log: every append asks the lease first."""

    def __init__(self, *args: Any, lease: LeaseKeeper, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lease = lease

    def append_batch_nowait(self, batch: bytearray, *, verify: bool = False,
                            lock_timeout_s: float | None = LOCK_TIMEOUT_S) -> Any:
        self._lease.check()             # append_batch comes here too
        return super().append_batch_nowait(batch, verify=verify,
                                           lock_timeout_s=lock_timeout_s)


class LeaderMeta(MetaStore):
    """A read-write broker's metadata store: every write transaction (topics, configs,
    group membership and commits) asks the lease first."""

    def __init__(self, path: str, *, lease: LeaseKeeper, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self._lease = lease

    def _check(self, write: bool) -> None:
        if write:
            self._lease.check()
        super()._check(write)
