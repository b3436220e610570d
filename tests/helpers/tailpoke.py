"""Test helper: edit fields of a partition's `logkit.tail` file the way a crash would
leave them (see logkit/log.py for the layout)."""

from __future__ import annotations

import os
import struct

BOOT_ID_AT = 16
FIELD_AT = {"log_start_offset": 32, "log_end_offset": 40, "active_base_offset": 48,
            "active_size": 56, "recovery_point": 112, "clean": 128}


def poke(directory: str, **fields: int) -> None:
    with open(os.path.join(directory, "logkit.tail"), "r+b") as f:
        for name, value in fields.items():
            f.seek(FIELD_AT[name])
            f.write(struct.pack("<q", value))


def simulate_reboot(directory: str, *, recovery_point: int | None = None) -> None:
    """Make the tail look written before an OS crash: another boot, not clean."""
    with open(os.path.join(directory, "logkit.tail"), "r+b") as f:
        f.seek(BOOT_ID_AT)
        f.write(b"\xee" * 16)
    poke(directory, clean=0)
    if recovery_point is not None:
        poke(directory, recovery_point=recovery_point)


def batch_positions(log_path: str) -> list[int]:
    """Byte position of every batch in a .log file, read from the length fields."""
    with open(log_path, "rb") as f:
        data = f.read()
    positions, pos = [], 0
    while pos + 12 <= len(data):
        positions.append(pos)
        pos += 12 + struct.unpack_from(">i", data, pos + 8)[0]
    return positions
