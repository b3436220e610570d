"""Who leads, who replicates, and where their listeners are: the cluster a Kafka
listener describes in Metadata and FindCoordinator, and whether it may take Produce,
Fetch, group and admin requests itself.

Owns: the node id of a broker root on the wire (`node_id_for`: the broker setting
`broker.id`, else 1 for a root that never followed and a number made from the follower
id otherwise, so it is stable across a promotion), the file `<root>/listener.json`
in which a running listener names itself (`(node id, host, port)`; written atomically
at start, removed at close), and the two views a listener answers from:

- `LeaderView`, over a read-write `Broker`: this node leads while its lease is not
  fenced; replicas and ISR are the leader's own (leader.py's `ReplicaState`, the
  followers by node id), followers' listeners come with the progress they report
  (`replicas/<id>.json` carries a `listener`); once fenced, the lease's holder is
  named as the leader (its listener from the progress it reported while it followed);
- `FollowerView`, over a `Follower` that serves: the leader is the node its source
  names (`ReplicaSource.leader_listener()`, read by the follower's own thread with the
  metadata, every second); this node is a replica, in the ISR while it is caught up.

Invariant: a view that does not lead says so (`leads()` False) before any write could
be tried, so a listener that is not the leader answers NOT_LEADER_OR_FOLLOWER /
NOT_COORDINATOR instead of writing; the epoch it reports for a partition is never
newer than the one its own log knows.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
import uuid
import zlib
from typing import Any, Mapping, NamedTuple

from .._files import open_file

__all__ = ["Node", "LeaderView", "FollowerView", "node_id_for", "auto_node_id",
           "write_listener", "remove_listener", "read_listener", "read_listener_body",
           "cluster_id_for", "keep_cluster_id", "parse_node", "LISTENER_FILE"]

log = logging.getLogger(__name__)

LISTENER_FILE = "listener.json"
CLUSTER_ID_FILE = "cluster.id"              # a follower keeps its leader's cluster id
FOLLOWER_STATE_FILE = "follower.json"       # replication/follower.py's STATE_FILE
DEFAULT_NODE_ID = 1                         # a root that never followed (as before)
AUTO_BASE = 1001                            # Kafka's first generated broker id
AUTO_SPAN = 1 << 30
REPLICAS_TTL_S = 0.5                        # a leader's replica view is reused this long


class Node(NamedTuple):
    """One broker as Metadata names it."""

    node_id: int
    host: str
    port: int

    def entry(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "host": self.host, "port": self.port,
                "rack": None}


def auto_node_id(replica_id: str) -> int:
    """The node id of a follower root without `broker.id`: stable, from its id."""
    return AUTO_BASE + zlib.crc32(replica_id.encode()) % AUTO_SPAN


def _follower_id(root: str) -> str | None:
    try:
        with open(open_file(os.path.join(root, FOLLOWER_STATE_FILE), os.O_RDONLY),
                  encoding="utf-8") as f:
            found = json.load(f).get("follower_id")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) and found else None


def node_id_for(root: str, config: Mapping[str, Any]) -> int:
    """This root's node id: `broker.id` when set, else 1 for a root that never
    followed, else `auto_node_id(follower id)` (kept across its promotion)."""
    configured = config.get("broker.id", -1)
    if configured is not None and configured >= 0:
        return int(configured)
    follower = _follower_id(root)
    return DEFAULT_NODE_ID if follower is None else auto_node_id(follower)


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def cluster_id_for(root: str) -> str:
    """The cluster id a listener on `root` reports: the one in `<root>/cluster.id` (a
    follower keeps its leader's there, so every replica reports one id and a promoted
    follower keeps it), else a stable 22-character id (Kafka's base64 UUID shape) made
    from the root's path."""
    try:
        with open(open_file(os.path.join(root, CLUSTER_ID_FILE), os.O_RDONLY),
                  encoding="ascii") as f:
            found = f.read().strip()
        if found:
            return found
    except (OSError, ValueError):
        pass
    raw = uuid.uuid5(uuid.NAMESPACE_URL, "logkit:" + os.path.realpath(root)).bytes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def keep_cluster_id(root: str, cluster_id: str) -> None:
    """Record the leader's cluster id in a follower's root."""
    if cluster_id and cluster_id_for(root) != cluster_id:
        _write_atomically(os.path.join(root, CLUSTER_ID_FILE), cluster_id + "\n")


def write_listener(root: str, node: Node, cluster_id: str) -> None:
    """Name this root's running listener in `<root>/listener.json` (atomically)."""
    _write_atomically(os.path.join(root, LISTENER_FILE),
                      json.dumps({**node._asdict(), "cluster_id": cluster_id}))


def remove_listener(root: str, node: Node) -> None:
    """Remove `<root>/listener.json` if it still names `node` (a listener started
    later on the same root keeps its own)."""
    if read_listener(root) == node:
        try:
            os.unlink(os.path.join(root, LISTENER_FILE))
        except FileNotFoundError:
            pass


def read_listener_body(root: str) -> dict[str, Any] | None:
    """`<root>/listener.json` as written (node_id, host, port, cluster_id), or None."""
    try:
        with open(open_file(os.path.join(root, LISTENER_FILE), os.O_RDONLY),
                  encoding="utf-8") as f:
            body = json.load(f)
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) and parse_node(body) is not None else None


def read_listener(root: str) -> Node | None:
    """The listener `<root>/listener.json` names, None when there is none."""
    body = read_listener_body(root)
    return None if body is None else parse_node(body)


def parse_node(body: Any) -> Node | None:
    """A Node from its JSON form, None when `body` is not one."""
    try:
        node = Node(int(body["node_id"]), str(body["host"]), int(body["port"]))
    except (TypeError, KeyError, ValueError):
        return None
    return node if node.node_id >= 0 and 0 < node.port < 65536 else None


class PartitionView(NamedTuple):
    """One partition as Metadata names it."""

    leader_id: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    error_code: int = 0


class LeaderView:
    """The cluster as a read-write broker's listener sees it (see the module doc)."""

    def __init__(self, broker: Any, node: Node) -> None:
        from ..leader.replicas import ReplicaState
        self.broker = broker
        self.node = node
        self._replica_id: str | None = None
        self._state = ReplicaState(broker.path, writable=False,
                                   lag_time_max_ms=broker.config["replica.lag.time.max.ms"])
        # (topic, partition) -> (when, (replica names, ISR names)): describe() stats
        # every progress file, so a burst of Metadata requests shares one look
        self._cache: dict[tuple[str, int], tuple[float, tuple[list[str], list[str]]]] = {}
        self._lock = threading.Lock()
        self._cluster_id = cluster_id_for(broker.path)
        from ..leader.lease import wire_topic_ids
        self._wire_ids = wire_topic_ids(broker.path)      # a promoted follower's

    def cluster_id(self) -> str:
        return self._cluster_id

    def wire_topic_id(self, topic: Any) -> str:
        return self._wire_ids.get(topic.topic_id, topic.topic_id)

    def leads(self) -> bool:
        return not self.broker.fenced

    def _listeners(self) -> dict[str, Node]:
        """Each follower's listener, as its latest progress report names it."""
        out = {}
        for name, report in self._state.reports().items():
            node = parse_node(report.listener) if report.listener else None
            if node is not None:
                out[name] = node
        return out

    def _node_of(self, replica: str, listeners: Mapping[str, Node]) -> int:
        if replica == "leader":
            return self.node.node_id
        found = listeners.get(replica)
        return found.node_id if found is not None else auto_node_id(replica)

    def _holder(self) -> Node | None:
        """The replica leading instead of this fenced one, when its listener is known."""
        from ..leader.lease import read_lease
        lease = read_lease(self.broker.path)
        if lease is None:
            return None
        return self._listeners().get(lease.holder)

    def brokers(self) -> list[Node]:
        nodes = {self.node.node_id: self.node}
        for node in self._listeners().values():
            nodes.setdefault(node.node_id, node)
        return list(nodes.values())

    def controller(self) -> Node | None:
        return self.node if self.leads() else self._holder()

    coordinator = controller

    def partitions(self, topic: Any) -> list[PartitionView]:
        factor = topic.replication_factor
        if not self.leads():
            holder = self._holder()
            leader, code = (holder.node_id, 0) if holder is not None else (-1, 5)
            return [PartitionView(leader, p.leader_epoch,
                                  [self.node.node_id] + ([leader] if leader >= 0 else []),
                                  [leader] if leader >= 0 else [], code)
                    for p in topic.partitions]
        if factor == 1:
            me = self.node.node_id
            return [PartitionView(me, p.leader_epoch, [me], [me]) for p in topic.partitions]
        listeners = self._listeners()
        out = []
        now = time.monotonic()
        for p in topic.partitions:
            key = (topic.name, p.partition)
            with self._lock:
                cached = self._cache.get(key)
                if cached is not None and now - cached[0] < REPLICAS_TTL_S:
                    replicas, isr = cached[1]
                else:
                    info = self._state.describe(p, topic.topic_id, factor)
                    replicas, isr = info.replicas, info.isr
                    self._cache[key] = (now, (replicas, isr))
            out.append(PartitionView(self.node.node_id, p.leader_epoch,
                                     [self._node_of(r, listeners) for r in replicas],
                                     [self._node_of(r, listeners) for r in isr]))
        return out

    def close(self) -> None:
        self._state.close()


class FollowerView:
    """The cluster as a serving follower's listener sees it (see the module doc)."""

    def __init__(self, follower: Any, node: Node) -> None:
        self.follower = follower
        self.node = node

    def cluster_id(self) -> str:
        return cluster_id_for(self.follower.path)

    def wire_topic_id(self, topic: Any) -> str:
        return self.follower.wire_topic_id(topic.name) or topic.topic_id

    def leads(self) -> bool:
        return False

    def leader(self) -> Node | None:
        return self.follower.leader_listener

    def brokers(self) -> list[Node]:
        leader = self.leader()
        if leader is None or leader.node_id == self.node.node_id:
            return [self.node]
        return [leader, self.node]

    def controller(self) -> Node | None:
        return self.leader()

    coordinator = controller

    def partitions(self, topic: Any) -> list[PartitionView]:
        leader = self.leader()
        lag_ms = self.follower.config["replica.lag.time.max.ms"]
        now_ms = int(time.time() * 1000)
        out = []
        for p in topic.partitions:
            epoch = self.follower.seen_leader_epoch(p.topic_partition)
            if leader is None:
                out.append(PartitionView(-1, epoch, [self.node.node_id], [], 5))
                continue
            caught = self.follower.caught_up_ms(p.topic_partition)
            isr = [leader.node_id]
            if caught is not None and now_ms - caught <= lag_ms:
                isr.append(self.node.node_id)
            out.append(PartitionView(leader.node_id, epoch,
                                     [leader.node_id, self.node.node_id], isr))
        return out

    def close(self) -> None:
        pass
