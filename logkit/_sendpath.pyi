"""Type stub of the optional C extension `logkit._sendpath` (logkit/_sendpath.c):
Producer.send()'s common case in C. Import it through `logkit._native`.

`BatchBase` and `TopicBase` hold, as C fields, what the compiled path reads: the
accumulator's Batch (`rows`, `size`, `sealed`, `finished`, `callbacks`) and
TopicBatches (`open`, `cache`, `sticky`) subclass them when this module is built
(logkit/accumulator.py). Renaming one of them on the Python side breaks the compiled
path.
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
    @property
    def _index(self) -> int: ...     # the row's place in batch.rows, -1 if not known
    def __init__(self, batch: Any, row: Any, acks: Any) -> None: ...
    def add_callback(self, fn: Callable[[Any], Any], /) -> Any:
        """Register fn(metadata) in C; every other case goes to the Python `_add`."""
    def add_errback(self, fn: Callable[[BaseException], Any], /) -> Any: ...

class BatchBase:
    """The fields of accumulator.Batch that the send path reads and writes."""

    rows: list[tuple]
    size: int
    sealed: bool
    finished: bool
    callbacks: list[tuple]
    def offer(self, row: tuple, size: int, /) -> bool:
        """Add `row` unless the batch is sealed, in one step (no lock, GIL held)."""

class TopicBase:
    """The fields of accumulator.TopicBatches that the send path reads."""

    open: list[Any]
    cache: dict[bytes, int]
    sticky: int

def run_callbacks(callbacks: list[tuple], metadata_type: type, topic: str,
                  partition: int, base_offset: int, timestamp_ms: int,
                  outcome: Callable[[tuple], Any],
                  on_raise: Callable[[BaseException], Any], /) -> None:
    """Producer._resolve's callback loop for a batch stored whole."""

def forked() -> None:
    """Mark this process a forked child (callback registration takes Python's path)."""

class Sender:
    """Sender(send_py, states, future_type, acks, batch_size, look=None,
    look_every=0): callable like Producer.send; every call it does not take goes to
    `send_py` unchanged; `look()` is called before every `look_every`-th call."""

    slow: int        # nonzero: every call goes to the Python method
    def __init__(self, send_py: Callable[..., Any], states: dict[str, Any],
                 future_type: type, acks: Any, batch_size: int,
                 look: Callable[[], Any] | None = None, look_every: int = 0, /
                 ) -> None: ...
    def __call__(self, topic: str, value: Any = ..., key: Any = ...,
                 **kwargs: Any) -> Any: ...
