"""The listener's message schemas against kafka-python 3's independent implementation of
Kafka's protocol: for every API and every version we accept, a request or response with
random field values, encoded by one side, decodes on the other and re-encodes to the same
bytes. Bytes alone prove the sequence of field types, not which field is which (two int32
fields swapped would pass), so the same cases are also compared by field NAME and VALUE:
our encoding decoded into kafka-python's named structs, and kafka-python's encoding of
structs built by name decoded by ours. Plus the primitive edge cases the fuzz test leans
on."""

import random
import uuid

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


# Where kafka-python names a field otherwise: its own renames (metadata.py names both
# authorized-operations fields "authorized_operations") and Kafka's later schema
# (OffsetCommit v9's "GenerationIdOrMemberEpoch"). Same position, same meaning.
KP_NAMES = {"cluster_authorized_operations": "authorized_operations",
            "topic_authorized_operations": "authorized_operations",
            "generation_id": "generation_id_or_member_epoch"}


def _kp_name(name, kp_fields):
    kp = name if name in kp_fields else KP_NAMES.get(name)
    assert kp in kp_fields, f"kafka-python has no field {name!r}: {sorted(kp_fields)}"
    return kp


def _ops_int(operations):
    """kafka-python's set of authorized-operation bits as Kafka's int32 bit field."""
    bits = sum(1 << bit for bit in operations)
    return bits - (1 << 32) if bits >= 1 << 31 else bits


def _ops_set(bits):
    return {bit for bit in range(32) if (bits & 0xFFFFFFFF) >> bit & 1}


def _scalar_from_kp(value):
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (set, frozenset)):
        return _ops_int(value)
    return value


def _from_kp(struct, version, kp_value):
    """A kafka-python struct as our dict: each of our in-version fields, looked up in
    kafka-python's by name."""
    fields = kp_value._struct.fields
    out = {}
    for f in struct.fields:
        if not _within(f.span, version):
            continue
        got = getattr(kp_value, _kp_name(f.name, fields))
        item = f.kind.item if isinstance(f.kind, Array) else f.kind
        convert = ((lambda v: _from_kp(item, version, v)) if isinstance(item, Struct)
                   else _scalar_from_kp)
        if got is None:
            out[f.name] = None
        elif isinstance(f.kind, Array):
            out[f.name] = [convert(v) for v in got]
        else:
            out[f.name] = convert(got)
    return out


def _to_kp(struct, version, value, data_class):
    """Our dict as a kafka-python struct, built field by field by name."""
    fields = data_class._struct.fields
    named = {}
    for f in struct.fields:
        if not _within(f.span, version):
            continue
        name, got = _kp_name(f.name, fields), value[f.name]
        item = f.kind.item if isinstance(f.kind, Array) else f.kind
        if isinstance(item, Struct):
            cls = fields[name].data_class
            convert = (lambda v, cls=cls, item=item: _to_kp(item, version, v, cls))
        elif item == "uuid":
            convert = (lambda v: uuid.UUID(bytes=v))
        elif name == "authorized_operations":
            convert = _ops_set
        else:
            convert = (lambda v: v)
        if got is None:
            named[name] = None
        elif isinstance(f.kind, Array):
            named[name] = [convert(v) for v in got]
        else:
            named[name] = convert(got)
    return data_class(version=version, **named)


def _in_version(struct, version, value):
    """`value` restricted to the fields `version` carries, recursively."""
    out = {}
    for f in struct.fields:
        if not _within(f.span, version):
            continue
        item = f.kind.item if isinstance(f.kind, Array) else f.kind
        got = value[f.name]
        if isinstance(item, Struct) and got is not None:
            got = ([_in_version(item, version, v) for v in got]
                   if isinstance(f.kind, Array) else _in_version(item, version, got))
        out[f.name] = got
    return out


@pytest.mark.parametrize("api,version,side", CASES,
                         ids=[f"{a.name}-v{v}-{s}" for a, v, s in CASES])
def test_every_field_has_the_same_name_and_value_in_kafka_python(api, version, side):
    """Field by field, by name: what we encode, kafka-python decodes into the same named
    values; what kafka-python encodes from named values, we decode into the same."""
    kp_class = KP.get((api.key, side == "request"))
    if kp_class is None or version > kp_class.max_version:
        pytest.skip(f"kafka-python has no {api.name} {side} v{version}")
    struct = api.request if side == "request" else api.response
    flexible = api.is_flexible(version)
    rng = random.Random(api.key * 1000 + version * 2 + (side == "request") + 7)
    for _ in range(4):
        value = _random_struct(struct, version, rng)
        if api.key == 18 and side == "response":
            value["error_code"] = 0    # an error answer is v0-shaped (KIP-511), tested apart
        ours = bytearray()
        struct.write(ours, value, version, flexible)
        assert _from_kp(struct, version, kp_class.decode(bytes(ours), version=version)) \
            == value
        theirs = bytes(_to_kp(struct, version, value, kp_class).encode(version=version))
        decoded = struct.read(Reader(theirs), version, flexible)
        assert _in_version(struct, version, decoded) == value



# The admin APIs added for Kafka's tools (docs/kafka-protocol.md, Coverage): each must be
# checked above in every version we accept, not skipped for want of a kafka-python class.
ADMIN_APIS = {21: ("DeleteRecords", 0, 2), 33: ("AlterConfigs", 0, 2),
              42: ("DeleteGroups", 0, 2), 44: ("IncrementalAlterConfigs", 0, 1)}


@pytest.mark.parametrize("key", sorted(ADMIN_APIS))
def test_the_admin_apis_have_kafkas_versions_and_a_kafka_python_peer(key):
    api = messages.APIS[key]
    assert (api.name, api.min_version, api.max_version) == ADMIN_APIS[key]
    for request in (True, False):
        peer = KP[(key, request)]
        assert peer.max_version >= api.max_version
        assert peer.min_version <= api.min_version


def test_delete_records_and_incremental_alter_configs_read_kafka_pythons_named_fields():
    """A request as kafka-python's admin client builds it, by Kafka's field names, reads
    back with the names and values the handlers use."""
    cases = {
        21: (2, {"topics": [{"name": "t", "partitions": [
            {"partition_index": 0, "offset": -1}, {"partition_index": 3, "offset": 17}]}],
            "timeout_ms": 30000}),
        44: (1, {"resources": [{"resource_type": 2, "resource_name": "t", "configs": [
            {"name": "retention.ms", "config_operation": 0, "value": "1000"},
            {"name": "segment.ms", "config_operation": 1, "value": None}]}],
            "validate_only": True}),
        42: (2, {"groups_names": ["g1", "g2"]}),
    }
    for key, (version, value) in cases.items():
        api = messages.APIS[key]
        theirs = bytes(_to_kp(api.request, version, value, KP[(key, True)])
                       .encode(version=version))
        assert api.request.read(Reader(theirs), version, api.is_flexible(version)) == value


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
