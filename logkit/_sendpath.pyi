"""Type stub of the optional C extension `logkit._sendpath` (logkit/_sendpath.c):
Producer.send()'s common case in C. Import it through `logkit._native`.

`Sender` reads these Python attributes by name (each marked "_sendpath.c" where it is
defined, in producer.py and accumulator.py): on a topic state `sticky`, `cache`, `open`;
on an open batch `size`, `inbox` (a deque: `append`), `sealed`. Renaming one of them silently sends every call to the
Python fallback or breaks the compiled path.
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

class Sender:
    """Sender(send_py, rescue, states, future_type, acks, batch_size): callable like
    Producer.send; every call it does not take goes to `send_py` unchanged."""

    slow: int        # nonzero: every call goes to the Python method
    def __init__(self, send_py: Callable[..., Any], rescue: Callable[..., Any],
                 states: dict[str, Any], future_type: type, acks: Any,
                 batch_size: int, /) -> None: ...
    def __call__(self, topic: str, value: Any = ..., key: Any = ...,
                 **kwargs: Any) -> Any: ...
