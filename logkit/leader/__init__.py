"""The leader's side of replication, below the broker: what a writable broker needs to
lead its replicas, with no knowledge of how followers copy.

Owns nothing itself; its modules own the parts: `lease.py` the leader lease (who may
write to a replicated root, until when; the `LeaderLog` that refuses writes without it,
and the `LeaderMeta` store that fences metadata writes the same way), `replicas.py` the
replica state (assigned replicas, progress reports, the ISR, the high watermark, and the
`ReplicatedPartition` whose reads stop at it) and `epochs.py` Kafka's
`leader-epoch-checkpoint` file and its truncation rule. The broker builds on these; the
followers, sources and servers in `logkit/replication/` sit above the broker and use
them too (docs/design.md §8). Invariant: nothing here imports the broker, a client or
the replication package.
"""
