"""Kafka's message schemas as data, and the one interpreter that reads and writes them.

Owns: the field types of Kafka's protocol (fixed-width integers, strings, bytes,
records, UUIDs, arrays, nested structs), their two encodings (classic: int16/int32
lengths; flexible: unsigned-varint "compact" lengths plus tagged fields at the end of
every struct), and `Struct`, a message body described as a list of `field(...)`s with
Kafka's version ranges ("0+", "3-7", "none").

A decoded message is a plain dict keyed by the fields' snake_case names. Every field of
the schema is present, whatever the version: a field the version does not carry holds
its default. Encoding takes such a dict; a missing key is its default.

Invariant (what the fuzz test holds us to): `Struct.read` either returns a dict or raises
`ProtocolError`; it never reads past `end`, never allocates more than the bytes it was
given could describe (an array or string count is checked against the bytes left before
anything is built), and never loops without consuming bytes.

Thread-safety: schemas are immutable after import; the compiled plans are cached per
version (a benign race builds one twice).
"""

from __future__ import annotations

import logging
import struct
from typing import Any, Callable, NamedTuple

from .errors import ProtocolError

__all__ = ["Struct", "Array", "field", "Reader", "versions"]

log = logging.getLogger(__name__)

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_ANY = (0, 1 << 15)
MAX_VARINT_BYTES = 5             # Kafka's unsigned varints hold at most 32 bits


def versions(text: str | None) -> tuple[int, int] | None:
    """Kafka's version-range notation: "3+", "0-7", "5", "none" (None)."""
    if text is None or text == "none":
        return None
    if text.endswith("+"):
        return int(text[:-1]), _ANY[1]
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def _within(span: tuple[int, int] | None, version: int) -> bool:
    return span is not None and span[0] <= version <= span[1]


class Array(NamedTuple):
    item: Any                       # a type name or a Struct


class Field(NamedTuple):
    name: str
    kind: Any                       # "int32", "string", ..., Array(...), Struct(...)
    span: tuple[int, int] | None
    nullable: tuple[int, int] | None
    tag: int | None
    default: Any


def field(name: str, kind: Any, span: str = "0+", *, null: str | None = None,
          tag: int | None = None, default: Any = None) -> Field:
    return Field(name, kind, versions(span), versions(null), tag, default)


class Reader:
    """A cursor over received bytes; every read checks the bytes left first."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes | memoryview, pos: int = 0, end: int | None = None):
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def _need(self, size: int) -> int:
        pos = self.pos
        if size < 0 or pos + size > self.end:
            raise ProtocolError(f"truncated: need {size} byte(s) at {pos}, "
                                f"{self.end - pos} left")
        self.pos = pos + size
        return pos

    def left(self) -> int:
        return self.end - self.pos

    def take(self, size: int) -> bytes:
        pos = self._need(size)
        return bytes(self.buf[pos:pos + size])

    # The fixed-width reads inline the bounds check: they run once per field of every
    # request, the hottest code of the listener after the append itself.

    def int8(self) -> int:
        pos = self.pos
        if pos + 1 > self.end:
            self._need(1)
        self.pos = pos + 1
        return _I8.unpack_from(self.buf, pos)[0]

    def int16(self) -> int:
        pos = self.pos
        if pos + 2 > self.end:
            self._need(2)
        self.pos = pos + 2
        return _I16.unpack_from(self.buf, pos)[0]

    def uint16(self) -> int:
        return _U16.unpack_from(self.buf, self._need(2))[0]

    def int32(self) -> int:
        pos = self.pos
        if pos + 4 > self.end:
            self._need(4)
        self.pos = pos + 4
        return _I32.unpack_from(self.buf, pos)[0]

    def int64(self) -> int:
        pos = self.pos
        if pos + 8 > self.end:
            self._need(8)
        self.pos = pos + 8
        return _I64.unpack_from(self.buf, pos)[0]

    def float64(self) -> float:
        return _F64.unpack_from(self.buf, self._need(8))[0]

    def uvarint(self) -> int:
        pos = self.pos
        if pos < self.end:
            byte = self.buf[pos]
            if byte < 0x80:                       # one byte: almost every length and tag
                self.pos = pos + 1
                return byte
        value = shift = 0
        for _ in range(MAX_VARINT_BYTES):
            byte = self.buf[self._need(1)]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise ProtocolError(f"unsigned varint longer than {MAX_VARINT_BYTES} bytes "
                            f"ending at {self.pos}")


def _put_uvarint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _fixed(packer: struct.Struct, reader_name: str) -> tuple[Callable, Callable]:
    pack = packer.pack

    def write(out: bytearray, value: Any) -> None:
        out += pack(value)
    return getattr(Reader, reader_name), write


_FIXED = {"int8": _fixed(_I8, "int8"), "int16": _fixed(_I16, "int16"),
          "uint16": _fixed(_U16, "uint16"), "int32": _fixed(_I32, "int32"),
          "int64": _fixed(_I64, "int64"), "float64": _fixed(_F64, "float64")}


def _read_bool(r: Reader) -> bool:
    return r.int8() != 0


def _write_bool(out: bytearray, value: Any) -> None:
    out.append(1 if value else 0)


def _read_uuid(r: Reader) -> bytes:
    return r.take(16)


def _write_uuid(out: bytearray, value: Any) -> None:
    value = bytes(value or bytes(16))
    assert len(value) == 16, "a UUID is 16 bytes"
    out += value


def _length_codec(flexible: bool, wide: bool) -> tuple[Callable, Callable]:
    """Read/write a length prefix; -1 is null. Classic: int16 (strings) or int32
    (bytes, arrays); flexible: unsigned varint of length + 1 (0 is null)."""
    if flexible:
        def read(r: Reader) -> int:
            return r.uvarint() - 1

        def write(out: bytearray, length: int) -> None:
            _put_uvarint(out, length + 1)
        return read, write
    packer = _I32 if wide else _I16
    return (Reader.int32 if wide else Reader.int16), \
        (lambda out, length: out.extend(packer.pack(length)))


def _codec(kind: Any, version: int, flexible: bool, nullable: bool,
           name: str) -> tuple[Callable, Callable]:
    """(read(reader) -> value, write(out, value)) of one field type at one version."""
    if isinstance(kind, str) and kind in _FIXED:
        return _FIXED[kind]
    if kind == "bool":
        return _read_bool, _write_bool
    if kind == "uuid":
        return _read_uuid, _write_uuid
    if kind in ("string", "bytes", "records"):
        read_length, write_length = _length_codec(flexible, wide=kind != "string")
        text = kind == "string"
        may_be_null = nullable or kind == "records"

        def read(r: Reader) -> Any:
            length = read_length(r)
            if length < 0:
                if length == -1 and may_be_null:
                    return None
                raise ProtocolError(f"{name}: length {length} is not allowed here")
            data = r.take(length)
            if not text:
                return data
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError(f"{name}: not valid UTF-8") from None

        def write(out: bytearray, value: Any) -> None:
            if value is None:
                assert may_be_null, f"{name} is not nullable at this version"
                write_length(out, -1)
                return
            data = value.encode("utf-8") if text else value
            write_length(out, len(data))
            out += data
        return read, write
    if isinstance(kind, Array):
        read_count, write_count = _length_codec(flexible, wide=True)
        read_item, write_item = _codec(kind.item, version, flexible, False, name)

        def read_array(r: Reader) -> Any:
            count = read_count(r)
            if count < 0:
                if count == -1 and nullable:
                    return None
                raise ProtocolError(f"{name}: array length {count} is not allowed here")
            if count > r.left():                # every item takes at least one byte
                raise ProtocolError(f"{name}: {count} items cannot fit in the "
                                    f"{r.left()} byte(s) left")
            return [read_item(r) for _ in range(count)]

        def write_array(out: bytearray, value: Any) -> None:
            if value is None:
                assert nullable, f"{name} is not nullable at this version"
                write_count(out, -1)
                return
            write_count(out, len(value))
            for item in value:
                write_item(out, item)
        return read_array, write_array
    if isinstance(kind, Struct):
        plan = kind.plan(version, flexible)
        return plan.read, plan.write
    raise AssertionError(f"unknown field type {kind!r}")


def _default(f: Field, version: int) -> Any:
    if f.default is not None:
        return f.default
    if _within(f.nullable, version):
        return None
    kind = f.kind
    if isinstance(kind, Array):
        return []
    if isinstance(kind, Struct):
        return kind.defaults(version)
    return {"string": "", "bytes": b"", "records": None, "uuid": bytes(16),
            "bool": False, "float64": 0.0}.get(kind, 0)


class _Plan:
    """One struct at one version: the fields in order, the tagged ones by tag, and the
    defaults of the fields this version does not carry."""

    def __init__(self, fields: list[Field], version: int, flexible: bool) -> None:
        self.flexible = flexible
        self.regular: list[tuple[str, Callable, Callable, Any]] = []
        self.tagged: dict[int, tuple[str, Callable, Callable, Any]] = {}
        self.absent: list[tuple[str, Any]] = []
        for f in fields:
            default = _default(f, version)
            if not _within(f.span, version) or (f.tag is not None and not flexible):
                self.absent.append((f.name, default))
                continue
            read, write = _codec(f.kind, version, flexible, _within(f.nullable, version),
                                 f.name)
            if f.tag is not None:
                self.tagged[f.tag] = (f.name, read, write, default)
            else:
                self.regular.append((f.name, read, write, default))
        self.tag_order = sorted(self.tagged)
        self.absent_fixed = {name: default for name, default in self.absent
                             if not isinstance(default, (dict, list))}
        self.absent_mutable = [(name, default) for name, default in self.absent
                               if isinstance(default, (dict, list))]
        # tagged defaults are immutable or copied: a struct default is rebuilt per read
        self.tagged_defaults = {name: default for name, _, _, default in self.tagged.values()
                                if not isinstance(default, (dict, list))}
        self.tagged_mutable = [(name, default) for name, _, _, default in self.tagged.values()
                               if isinstance(default, (dict, list))]

    def read(self, r: Reader) -> dict[str, Any]:
        out = dict(self.absent_fixed)
        for name, default in self.absent_mutable:
            out[name] = dict(default) if isinstance(default, dict) else list(default)
        for name, read, _, _ in self.regular:
            out[name] = read(r)
        if self.flexible:
            out.update(self.tagged_defaults)
            for name, default in self.tagged_mutable:
                out[name] = dict(default) if isinstance(default, dict) else list(default)
            count = r.uvarint()
            if not count:
                return out
            if count > r.left():
                raise ProtocolError(f"{count} tagged fields cannot fit in {r.left()} "
                                    "byte(s)")
            for _ in range(count):
                tag = r.uvarint()
                size = r.uvarint()
                end = r.pos + size
                if end > r.end:
                    raise ProtocolError(f"tagged field {tag}: {size} bytes past the end")
                known = self.tagged.get(tag)
                if known is None:
                    r.pos = end                      # an unknown tag: skipped, as Kafka does
                    continue
                inner = Reader(r.buf, r.pos, end)
                out[known[0]] = known[1](inner)
                r.pos = end
        return out

    def write(self, out: bytearray, value: dict[str, Any]) -> None:
        get = value.get
        for name, _, write, default in self.regular:
            item = get(name, default)
            write(out, default if item is None and default is not None else item)
        if self.flexible:
            present = []
            for tag in self.tag_order:
                name, _, write, default = self.tagged[tag]
                item = get(name, default)
                if item != default:
                    present.append((tag, write, item))
            _put_uvarint(out, len(present))
            for tag, write, item in present:
                body = bytearray()
                write(body, item)
                _put_uvarint(out, tag)
                _put_uvarint(out, len(body))
                out += body


class Struct:
    """A message body or nested struct: fields with version ranges."""

    def __init__(self, *fields: Field) -> None:
        self.fields = list(fields)
        self._plans: dict[tuple[int, bool], _Plan] = {}

    def plan(self, version: int, flexible: bool) -> _Plan:
        key = (version, flexible)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _Plan(self.fields, version, flexible)
        return plan

    def defaults(self, version: int) -> dict[str, Any]:
        return {f.name: _default(f, version) for f in self.fields}

    def read(self, r: Reader, version: int, flexible: bool) -> dict[str, Any]:
        return self.plan(version, flexible).read(r)

    def write(self, out: bytearray, value: dict[str, Any], version: int,
              flexible: bool) -> None:
        self.plan(version, flexible).write(out, value)
