"""Record-set compression codecs, as Kafka applies them to a whole batch's records.

Owns: codec ids (docs/design.md §3: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), their names,
and compress/decompress. Snappy is written in the xerial framing Kafka's Java client
uses and read in either framing; lz4 is the LZ4 frame format; zstd is a standard frame.
Invariant: `decompress(codec, compress(codec, data)) == data`, and decompression never
produces more than `MAX_DECOMPRESSED_BYTES`. A codec whose package is missing raises
`CodecUnavailableError` naming the package to install.
"""

from __future__ import annotations

import logging
import struct
import zlib
from typing import Any

from .errors import CodecUnavailableError, ConfigError

__all__ = ["CODEC_NONE", "CODEC_GZIP", "CODEC_SNAPPY", "CODEC_LZ4", "CODEC_ZSTD",
           "codec_id", "compress", "decompress", "MAX_DECOMPRESSED_BYTES",
           "TOPIC_COMPRESSION_TYPE"]

log = logging.getLogger(__name__)

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {"none": CODEC_NONE, "uncompressed": CODEC_NONE, "gzip": CODEC_GZIP,
               "snappy": CODEC_SNAPPY, "lz4": CODEC_LZ4, "zstd": CODEC_ZSTD}
# Each codec's value of the topic setting `compression.type` (which also takes
# "producer": keep the producer's codec).
TOPIC_COMPRESSION_TYPE = {CODEC_NONE: "uncompressed", CODEC_GZIP: "gzip",
                          CODEC_SNAPPY: "snappy", CODEC_LZ4: "lz4", CODEC_ZSTD: "zstd"}
_PACKAGES = {CODEC_SNAPPY: ("snappy", "python-snappy"), CODEC_LZ4: ("lz4.frame", "lz4"),
             CODEC_ZSTD: ("zstandard", "zstandard")}

# A batch is at most max.message.bytes compressed; this bounds what it may inflate to.
MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024

_XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_BYTES = 32 * 1024
_modules: dict[int, Any] = {}


def codec_id(name: str | None) -> int:
    """Map Kafka's compression.type name ('gzip', None...) to the attribute codec id."""
    if name is None:
        return CODEC_NONE
    try:
        return CODEC_NAMES[name]
    except KeyError:
        raise ConfigError(f"unknown compression_type {name!r}; use one of "
                          f"{sorted(CODEC_NAMES)} or None") from None


def _module(codec: int) -> Any:
    module = _modules.get(codec)
    if module is None:
        import importlib
        module_name, package = _PACKAGES[codec]
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            raise CodecUnavailableError(
                f"compression codec {codec} needs the '{package}' package: "
                f"pip install {package} (or logkit[codecs])") from None
        _modules[codec] = module
    return module


def require(codec: int) -> None:
    """Raise CodecUnavailableError now, not at the first send, when a codec is missing."""
    if codec in _PACKAGES:
        _module(codec)
    elif codec not in (CODEC_NONE, CODEC_GZIP):
        raise ConfigError(f"unknown codec id {codec}")


def compress(codec: int, data: bytes) -> bytes:
    if codec == CODEC_GZIP:
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: gzip framing
        return compressor.compress(data) + compressor.flush()
    if codec == CODEC_SNAPPY:
        snappy = _module(codec)
        blocks = [_XERIAL_HEADER]
        for start in range(0, len(data), _XERIAL_BLOCK_BYTES):
            block = snappy.compress(data[start:start + _XERIAL_BLOCK_BYTES])
            blocks.append(struct.pack(">i", len(block)))
            blocks.append(block)
        return b"".join(blocks)
    if codec == CODEC_LZ4:
        return _module(codec).compress(data)
    if codec == CODEC_ZSTD:
        return _module(codec).ZstdCompressor().compress(data)
    raise ConfigError(f"unknown codec id {codec}")


def decompress(codec: int, data: bytes) -> bytes:
    """Inflate one batch's records; raises ValueError on malformed input (whatever the
    codec library raises is turned into ValueError, so callers see CorruptRecordError)."""
    if codec in _PACKAGES:
        _module(codec)                     # CodecUnavailableError stays what it is
    try:
        return _decompress(codec, data)
    except (ValueError, MemoryError):
        raise
    except Exception as exc:   # zlib.error, snappy.UncompressError, lz4's RuntimeError...
        raise ValueError(f"{type(exc).__name__}: {exc}") from None


def _decompress(codec: int, data: bytes) -> bytes:
    if codec == CODEC_GZIP:
        inflater = zlib.decompressobj(47)  # 32 + 15: accept gzip or zlib headers
        out = inflater.decompress(data, MAX_DECOMPRESSED_BYTES)
        if inflater.unconsumed_tail:
            raise ValueError("gzip batch inflates beyond MAX_DECOMPRESSED_BYTES")
        return out
    if codec == CODEC_SNAPPY:
        snappy = _module(codec)
        if data[:8] != _XERIAL_HEADER[:8]:
            return snappy.decompress(data)
        blocks, pos, total = [], 16, 0
        while pos < len(data):
            (size,) = struct.unpack_from(">i", data, pos)
            block = snappy.decompress(data[pos + 4:pos + 4 + size])
            total += len(block)
            if size < 0 or total > MAX_DECOMPRESSED_BYTES:
                raise ValueError("snappy batch malformed or too large")
            blocks.append(block)
            pos += 4 + size
        return b"".join(blocks)
    if codec == CODEC_LZ4:
        out = _module(codec).decompress(data)
    elif codec == CODEC_ZSTD:
        inflater = _module(codec).ZstdDecompressor().decompressobj()
        out = inflater.decompress(data)
    else:
        raise ValueError(f"unknown codec id {codec}")
    if len(out) > MAX_DECOMPRESSED_BYTES:
        raise ValueError("batch inflates beyond MAX_DECOMPRESSED_BYTES")
    return out
