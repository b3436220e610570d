"""Replication: a file-shipping follower (docs/design.md §8, docs/replication.md).

Owns nothing itself; its modules own the parts: `source.py` the pluggable
`ReplicaSource` contract, `directory.py` the `DirectorySource`, `epochs.py` Kafka's
`leader-epoch-checkpoint` file and the truncation rule, `follower.py` the `Follower` (with its parts `partition_copy.py`,
`metadata_sync.py` and `election.py`),
`tcp.py` the TCP wire format and `TcpSource`, `tcp_server.py` the server behind
`broker.serve_replication()`.
The public names are re-exported by `logkit/__init__.py`.
"""

from .directory import DirectorySource
from .follower import Follower
from .source import PartitionInfo, ReplicaSource, SegmentInfo, TopicInfo
from .tcp import ReplicationAuthError, TcpSource

__all__ = ["Follower", "ReplicaSource", "DirectorySource", "TopicInfo", "PartitionInfo",
           "SegmentInfo", "TcpSource", "ReplicationAuthError"]
