"""Type stub of the optional C extension `logkit._sendpath` (logkit/_sendpath.c):
Producer.send()'s common case in C. Import it through `logkit._native`.

`BatchBase` and `TopicBase` hold, as C fields, what the compiled path reads: the
accumulator's Batch (`rows`, `size`, `sealed`) and TopicBatches (`open`, `cache`,
`sticky`) subclass them when this module is built (logkit/accumulator.py). Renaming
one of them on the Python side breaks the compiled path.
"""

from typing import Any, Callable

class FutureBase:
    """The fields of FutureRecordMetadata, allocated without a Python __init__."""

    @property
    def _batch(self) -> Any: ...
    @property
    def _row(self) -> Any: ...
    @property
    def _acks(self) -> Any: ...
    def __init__(self, batch: Any, row: Any, acks: Any) -> None: ...

class BatchBase:
    """The fields of accumulator.Batch that the send path reads and writes."""

    rows: list[tuple]
    size: int
    sealed: bool
    def offer(self, row: tuple, size: int, /) -> bool:
        """Add `row` unless the batch is sealed, in one step (no lock, GIL held)."""

class TopicBase:
    """The fields of accumulator.TopicBatches that the send path reads."""

    open: list[Any]
    cache: dict[bytes, int]
    sticky: int

class Sender:
    """Sender(send_py, states, future_type, acks, batch_size): callable like
    Producer.send; every call it does not take goes to `send_py` unchanged."""

    slow: int        # nonzero: every call goes to the Python method
    def __init__(self, send_py: Callable[..., Any], states: dict[str, Any],
                 future_type: type, acks: Any, batch_size: int, /) -> None: ...
    def __call__(self, topic: str, value: Any = ..., key: Any = ...,
                 **kwargs: Any) -> Any: ...
