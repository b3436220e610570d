"""Kafka's wire protocol over an embedded broker: unmodified Kafka clients produce,
consume and join groups on a logkit directory (docs/design.md §10, docs/kafka-protocol.md).

Layers, each its own module, each knowing only the one below it:
  schema.py    field types, Kafka's two encodings, one interpreter for message schemas
  messages.py  the table of APIs we serve: versions, request and response schemas
  frame.py     frames and headers: bytes in, typed requests out, responses to bytes
  handlers.py  one handler per API over the broker's public methods (no sockets)
  groups.py    the classic group protocol for wire members
  producers.py a produced batch through the log's producer state (retries, sequences)
  transactions.py the transaction APIs over the broker's transaction coordinator
  server.py    sockets, threads, TLS, SASL/PLAIN, timeouts and bounds

Applications call `broker.serve(...)`; `KafkaServer` is the handle it returns.
"""

import logging

from .server import KafkaServer, serve

__all__ = ["KafkaServer", "serve"]

log = logging.getLogger(__name__)
