"""CRC-32C (Castagnoli) for record batches.

Owns: the choice of implementation. Prefers the hardware-accelerated `crc32c` package,
then `crcmod`'s C extension (from the `crcmod-plus` distribution); on a pure-Python
`crcmod` it still works but warns once, because every append and read pays for it.
Invariant: `crc32c(b"123456789") == 0xE3069283` for whichever implementation is chosen.
"""

from __future__ import annotations

import logging
import warnings
from typing import Callable

__all__ = ["crc32c", "crc32c_crcmod", "IMPLEMENTATION"]

log = logging.getLogger(__name__)

CHECK_INPUT = b"123456789"
CHECK_VALUE = 0xE3069283


def _crcmod_function() -> tuple[Callable[[bytes], int], bool]:
    import crcmod  # type: ignore[import-untyped]
    import crcmod.predefined  # type: ignore[import-untyped]

    try:
        from crcmod import _crcfunext  # type: ignore[attr-defined]  # noqa: F401
        compiled = True
    except ImportError:
        compiled = False
    return crcmod.predefined.mkCrcFun("crc-32c"), compiled


crc32c_crcmod, _crcmod_compiled = _crcmod_function()

try:
    import crc32c as _crc32c_pkg  # type: ignore[import-untyped]

    crc32c: Callable[[bytes], int] = _crc32c_pkg.crc32c
    IMPLEMENTATION = "crc32c"
except ImportError:  # the accelerator is optional
    crc32c = crc32c_crcmod
    IMPLEMENTATION = "crcmod" if _crcmod_compiled else "crcmod-pure-python"
    if not _crcmod_compiled:
        warnings.warn(
            "logkit: crcmod runs without its C extension, so CRC-32C is pure Python and "
            "slow; install 'crc32c' or 'crcmod-plus' with a wheel for this platform",
            RuntimeWarning, stacklevel=2)

if crc32c(CHECK_INPUT) != CHECK_VALUE or crc32c_crcmod(CHECK_INPUT) != CHECK_VALUE:
    raise ImportError(f"logkit: CRC-32C from {IMPLEMENTATION} fails its check value "
                      f"(crc32c({CHECK_INPUT!r}) must be {CHECK_VALUE:#x}); reinstall "
                      "'crc32c' or 'crcmod-plus'")
