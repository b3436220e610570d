"""Replication: a file-shipping follower (DESIGN §8, docs/replication.md).

Owns nothing itself; its modules own the parts: `source.py` the pluggable
`ReplicaSource` contract, `directory.py` the `DirectorySource`, `epochs.py` Kafka's
`leader-epoch-checkpoint` file and the truncation rule, `follower.py` the `Follower`.
The public names are re-exported by `logkit/__init__.py`.
"""

from .directory import DirectorySource
from .follower import Follower
from .source import PartitionInfo, ReplicaSource, TopicInfo

__all__ = ["Follower", "ReplicaSource", "DirectorySource", "TopicInfo", "PartitionInfo"]
