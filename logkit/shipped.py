"""Reading what `broker.ship()` wrote, for a reader that is not a Broker: the Spark
source's executors on other machines (docs/spark.md, "Beyond one machine").

Owns nothing of its own: it is the public face of the object store's manifest
(`read_manifest`, `may_have_gaps`; for read_committed `committed_view`, the last stable
offset and `AbortedTransaction`s a partition entry records, and `AbortedBatches`, which
batches such a reader leaves out) and of the batch walk over fetched bytes
(`iter_batches`, `read_header`, `decode_batch`, `BATCH_HEADER_BYTES`), so code outside
the package reads shipped objects through public names only (the seam test). Every
walk checks what the log's own readers check: sizes, offsets in order, CRCs.
"""

from __future__ import annotations

from .records import RECORDS_OFFSET, decode_batch, iter_batches, read_header
from .replication.objectstore import (AbortedBatches, AbortedTransaction, committed_view,
                                     may_have_gaps, read_manifest)

__all__ = ["read_manifest", "may_have_gaps", "committed_view", "AbortedTransaction",
           "AbortedBatches", "iter_batches", "read_header", "decode_batch",
           "BATCH_HEADER_BYTES"]

BATCH_HEADER_BYTES = RECORDS_OFFSET      # a batch's fixed header, before its records
