"""The listener's message schemas against kafka-python 3's independent implementation of
Kafka's protocol: for every API and every version we accept, a request or response with
random field values, encoded by one side, decodes on the other and re-encodes to the same
bytes. Plus the primitive edge cases the fuzz test leans on."""

import random

import pytest

from logkit.protocol import messages
from logkit.protocol.errors import ProtocolError
from logkit.protocol.schema import Array, Reader, Struct, _within

kp_message = pytest.importorskip("kafka.protocol.api_message")
pytest.importorskip("kafka.protocol.consumer")      # registers the message classes


def _kafka_python_classes():
    import kafka.protocol.admin  # noqa: F401  (imports register the classes)
    import kafka.protocol.consumer  # noqa: F401
    import kafka.protocol.metadata  # noqa: F401
    import kafka.protocol.producer  # noqa: F401
    import kafka.protocol.sasl  # noqa: F401
    found = {}
    stack = [kp_message.ApiMessage]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if getattr(cls, "_class_version", None) is not None:
            continue
        try:
            key, request = cls.API_KEY, cls.is_request()
        except Exception:
            continue
        found[(key, request)] = cls
    return found


KP = _kafka_python_classes()


def _value(kind, version, rng, nullable):
    if nullable and rng.random() < 0.2:
        return None
    if isinstance(kind, Struct):
        return _random_struct(kind, version, rng)
    if isinstance(kind, Array):
        return [_value(kind.item, version, rng, False) for _ in range(rng.randint(0, 3))]
    if kind == "int8":
        return rng.randint(-128, 127)
    if kind == "int16":
        return rng.randint(-2**15, 2**15 - 1)
    if kind == "int32":
        return rng.randint(-2**31, 2**31 - 1)
    if kind == "int64":
        return rng.randint(-2**63, 2**63 - 1)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "string":
        return "".join(rng.choice("abcxyz-é") for _ in range(rng.randint(0, 12)))
    if kind in ("bytes", "records"):
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 20)))
    if kind == "uuid":
        return bytes(rng.randrange(256) for _ in range(16))
    raise AssertionError(kind)


def _random_struct(struct, version, rng):
    return {f.name: _value(f.kind, version, rng, _within(f.nullable, version))
            for f in struct.fields if _within(f.span, version)}


CASES = [(api, version, side) for api in messages.APIS.values()
         for version in range(api.min_version, api.max_version + 1)
         for side in ("request", "response")]


@pytest.mark.parametrize("api,version,side", CASES,
                         ids=[f"{a.name}-v{v}-{s}" for a, v, s in CASES])
def test_every_version_matches_kafka_python_byte_for_byte(api, version, side):
    kp_class = KP.get((api.key, side == "request"))
    if kp_class is None or version > kp_class.max_version:
        pytest.skip(f"kafka-python has no {api.name} {side} v{version}")
    struct = api.request if side == "request" else api.response
    flexible = api.is_flexible(version)
    rng = random.Random(api.key * 1000 + version * 2 + (side == "request"))
    for _ in range(6):
        value = _random_struct(struct, version, rng)
        if api.key == 18 and side == "response":
            value["error_code"] = 0    # an error answer is v0-shaped (KIP-511), tested apart
        ours = bytearray()
        struct.write(ours, value, version, flexible)
        theirs = kp_class.decode(bytes(ours), version=version)
        theirs._header = None                      # decoded without one
        assert bytes(theirs.encode(version=version)) == bytes(ours)
        back = struct.read(Reader(bytes(ours)), version, flexible)
        again = bytearray()
        struct.write(again, back, version, flexible)
        assert again == ours


def test_a_count_larger_than_the_bytes_left_is_refused_before_allocating():
    api = messages.APIS[3]
    body = b"\x7f\xff\xff\xff"            # Metadata v1: 2^31-1 topics, no bytes after
    with pytest.raises(ProtocolError, match="cannot fit"):
        api.request.read(Reader(body), 1, False)


def test_a_truncated_string_is_refused():
    api = messages.APIS[10]
    with pytest.raises(ProtocolError, match="truncated"):
        api.request.read(Reader(b"\x00\x09abc"), 0, False)


def test_a_varint_longer_than_five_bytes_is_refused():
    with pytest.raises(ProtocolError, match="varint"):
        Reader(b"\xff" * 10).uvarint()


def test_null_in_a_non_nullable_string_is_refused():
    api = messages.APIS[10]
    with pytest.raises(ProtocolError, match="not allowed"):
        api.request.read(Reader(b"\xff\xff"), 0, False)


def test_unknown_tagged_fields_are_skipped():
    api = messages.APIS[18]
    body = bytearray(b"\x02a\x021")              # name "a", version "1"
    body += b"\x01\x07\x02zz"                    # one tagged field: tag 7, 2 bytes
    decoded = api.request.read(Reader(bytes(body)), 3, True)
    assert decoded == {"client_software_name": "a", "client_software_version": "1"}
