"""The follower's copy of the leader's metadata: topics, their configs, committed group
offsets, and where the leader's listener is.

Owns: creating the topics the leader has (and forgetting the ones it deleted), applying
the leader's topic config overrides, copying committed group offsets for the partitions
the follower holds, and noting the leader's listener for the follower's own. Invariant:
the follower's topics and configs follow the leader's as of the last sync; offsets are
copied only for partitions the follower has.

A mixin of `Follower` (follower.py), which owns the state it reads and writes.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Mapping

from ..broker import Broker
from ..config import resolve_config
from ..errors import IllegalStateError, LogkitError
from ..topic import TopicPartition
from .partition_copy import _tp_name
from .source import TopicInfo

log = logging.getLogger("logkit.replication.follower")

_DEFAULTS = resolve_config("topic", None)


def _overrides(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a resolved topic config that differ from Kafka's defaults."""
    return {k: v for k, v in config.items() if _DEFAULTS.get(k) != v}


class _MetadataSync:
    """Metadata sync for `Follower` (see the module docstring)."""

    def _sync_metadata(self) -> None:
        broker = self._require_broker()
        self._topics.clear()
        leader = self.source.topics()
        state = self._state
        before = json.dumps(state, sort_keys=True)
        local = set(broker.topics())
        for name, info in sorted(leader.items()):
            known = state["topics"].get(name)
            if name in local and known is not None and known != info.topic_id:
                log.warning("%s: topic %s was deleted and re-created on the leader; "
                            "deleting its copy", self.path, name)
                broker.delete_topic(name)
                local.discard(name)
                self._forget(name)
            if name not in local:
                broker.create_topic(name, info.partitions, config=info.config,
                                    replication_factor=info.replication_factor)
                local.add(name)
                log.info("%s: created topic %s (%d partition(s)) from the leader",
                         self.path, name, info.partitions)
            else:
                self._sync_config(broker, name, info)
            state["topics"][name] = info.topic_id
            state["configs"][name] = info.config
            state.setdefault("wire_ids", {})[name] = info.wire_topic_id or info.topic_id
        for name in sorted(local - leader.keys()):
            if name in state["topics"]:
                log.warning("%s: topic %s is gone from the leader; deleting its copy",
                            self.path, name)
                broker.delete_topic(name)
                self._forget(name)
        partitions = []
        for name, info in sorted(leader.items()):
            have = broker.topic(name).num_partitions
            if have < info.partitions:                  # grown on the leader
                have = broker.create_partitions(name, info.partitions).num_partitions
            partitions += [TopicPartition(name, n) for n in range(min(have, info.partitions))]
        self._partitions = partitions
        self._sync_offsets(broker, set(partitions))
        if json.dumps(state, sort_keys=True) != before:
            self._save_state()
        if self._server is not None:
            self._note_leader_listener()

    def _note_leader_listener(self) -> None:
        """The leader's Kafka listener as the source names it (kept when it names
        none: a leader killed, or between two looks)."""
        from ..protocol.cluster import keep_cluster_id, parse_node
        try:
            found = self.source.leader_listener()
            if found and isinstance(found.get("cluster_id"), str):
                keep_cluster_id(self.path, found["cluster_id"])
        except (LogkitError, OSError) as exc:
            log.debug("%s: the leader's listener cannot be read: %s", self.path, exc)
            return
        node = parse_node(found) if found else None
        if node is not None and node != self.leader_listener:
            log.info("%s: the leader's Kafka listener is node %d at %s:%d", self.path,
                     node.node_id, node.host, node.port)
            self.leader_listener = node

    def _sync_config(self, broker: Broker, name: str, info: TopicInfo) -> None:
        applied = self._state["configs"].get(name)
        if applied is None:                 # a topic this directory had already
            applied = _overrides(broker.topic(name).config)
        if applied == info.config:
            return
        changes: dict[str, Any] = {k: None for k in applied if k not in info.config}
        changes.update(info.config)
        broker.alter_topic_config(name, changes)
        log.info("%s: topic %s config overrides now %s, as on the leader", self.path,
                 name, info.config)

    def _forget(self, name: str) -> None:
        self._state["topics"].pop(name, None)
        self._state["configs"].pop(name, None)
        for tp in [tp for tp in self._epochs if tp.topic == name]:
            self._epochs.pop(tp, None)
            self._checked.discard(tp)
            self._ends.pop(tp, None)
            self._caught_up_ms.pop(tp, None)
            self._state["leader_epochs"].pop(_tp_name(tp), None)
            self._state.get("clean_counts", {}).pop(_tp_name(tp), None)
            self._clean_pending.pop(tp, None)
            self._local_digests.pop(tp, None)

    def _sync_offsets(self, broker: Broker, partitions: set[TopicPartition]) -> None:
        leader = self.source.committed_offsets()
        copied = set(self._state["groups"])
        for group, offsets in sorted(leader.items()):
            wanted = {tp: o for tp, o in offsets.items() if tp in partitions}
            if not wanted:
                continue
            handle = broker.group(group)
            current = handle.committed()
            changed = {tp: o for tp, o in wanted.items() if current.get(tp) != o}
            if changed:
                try:
                    handle.reset_offsets(changed)
                except IllegalStateError as exc:      # a member consumes from the copy
                    self._warn_once(f"group {group}", "%s: committed offsets of group %s "
                                    "not copied: %s", self.path, group, exc)
                    continue
            copied.add(group)
        for group in sorted(copied - leader.keys()):
            try:
                broker.group(group).delete()
            except IllegalStateError as exc:
                self._warn_once(f"group {group}", "%s: group %s is gone from the leader "
                                "but not deleted here: %s", self.path, group, exc)
                continue
            copied.discard(group)
        self._state["groups"] = sorted(copied & leader.keys())
