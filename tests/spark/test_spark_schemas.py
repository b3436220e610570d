"""Typed key/value columns in the logkit Spark data source (issue 12, deliverable 5), on
the suite's real local[2] session: Avro, JSON and Protobuf values decoded into Spark
types through the directory's schema registry, a streaming query that keeps its reader
schema while producers move to a compatible new version, undecodable records, typed
writes in Confluent's framing, bad options."""

from __future__ import annotations

import datetime
import decimal
import json

import pytest

import logkit
from logkit.serde import AvroSerde, JsonSchemaSerde, wire

pytestmark = pytest.mark.spark
pytest.importorskip("fastavro")

ORDER_V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "note", "type": ["null", "string"], "default": None}]}
ORDER_V2 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "currency", "type": "string", "default": "EUR"}]}

RICH = {"type": "record", "name": "Rich", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "name", "type": "string"}, {"name": "age", "type": ["null", "int"]}]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "prices", "type": {"type": "map", "values": "double"}},
    {"name": "status", "type": {"type": "enum", "name": "Status",
                                "symbols": ["NEW", "PAID"]}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                "precision": 9, "scale": 2}},
    {"name": "alarm", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "small", "type": ["int", "long"]}]}


def produce(root, topic, schema, values, partitions=1):
    with logkit.Broker(root) as broker:
        broker.create_topic(topic, partitions, exist_ok=True)
        producer = broker.producer(value_serializer=AvroSerde(broker, topic, schema))
        for value in values:
            producer.send(topic, value).result()
        producer.close()


def reader(spark, root, **options):
    return spark.read.format("logkit").options(path=str(root), **options).load()


def test_avro_values_read_as_typed_columns(spark, tmp_path):
    """valueFormat=avro with the topic's subject (the default) maps records, arrays,
    maps, enums, null unions and logical types to Spark types, as from_avro does."""
    at = datetime.datetime(2026, 3, 1, 12, 30, tzinfo=datetime.timezone.utc)
    produce(tmp_path, "rich", RICH, [
        {"id": 1, "customer": {"name": "ann", "age": 30}, "tags": ["a", "b"],
         "prices": {"x": 1.5}, "status": "PAID", "at": at,
         "day": datetime.date(2026, 3, 1), "amount": decimal.Decimal("12.34"),
         "alarm": datetime.time(7, 0, 1), "small": 5},
        {"id": 2, "customer": {"name": "bo", "age": None}, "tags": [], "prices": {},
         "status": "NEW", "at": at, "day": datetime.date(2026, 1, 2),
         "amount": decimal.Decimal("0.01"), "alarm": datetime.time(0, 0), "small": 1}])
    df = reader(spark, tmp_path, subscribe="rich", valueFormat="avro")
    assert df.schema["value"].dataType.simpleString() == (
        "struct<id:bigint,customer:struct<name:string,age:int>,tags:array<string>,"
        "prices:map<string,double>,status:string,at:timestamp,day:date,"
        "amount:decimal(9,2),alarm:int,small:bigint>")
    assert df.schema["key"].dataType.simpleString() == "binary"
    rows = df.orderBy("offset").selectExpr("value.*",
                                           "value.customer.name AS who").collect()
    assert [r.who for r in rows] == ["ann", "bo"]        # a nested field in SQL
    first = rows[0].asDict(recursive=True)
    assert first["customer"] == {"name": "ann", "age": 30}
    assert (first["tags"], first["prices"], first["status"]) == (["a", "b"], {"x": 1.5},
                                                                 "PAID")
    assert first["at"].replace(tzinfo=None) == \
        at.astimezone().replace(tzinfo=None)   # Spark shows session-local time
    assert (first["day"], first["amount"], first["alarm"], first["small"]) == \
        (datetime.date(2026, 3, 1), decimal.Decimal("12.34"), 25201000, 5)
    assert rows[1].customer.age is None


def test_a_streaming_query_keeps_its_reader_schema_across_a_new_version(spark, tmp_path):
    """A streaming query reading the subject's latest version (v1) keeps working when
    producers move to v2 (a field added with a default): v2 records arrive in the v1
    columns. A read with v2 as its schema fills the default into v1 records."""
    produce(tmp_path, "orders", ORDER_V1, [{"id": 1, "note": "first"}, {"id": 2}])
    stream = (spark.readStream.format("logkit").option("path", str(tmp_path))
              .option("subscribe", "orders").option("startingOffsets", "earliest")
              .option("valueFormat", "avro").load())
    query = (stream.select("offset", "value.*").writeStream.format("memory")
             .queryName("orders_typed").option("checkpointLocation",
                                               str(tmp_path / "ck")).start())
    try:
        query.processAllAvailable()
        produce(tmp_path, "orders", ORDER_V2, [{"id": 3, "currency": "NOK"},
                                               {"id": 4, "note": "v2"}])
        query.processAllAvailable()
        assert query.exception() is None
        rows = spark.sql("SELECT * FROM orders_typed ORDER BY offset").collect()
    finally:
        query.stop()
    assert [tuple(r) for r in rows] == [(0, 1, "first"), (1, 2, None), (2, 3, None),
                                        (3, 4, "v2")]
    with logkit.Broker(tmp_path) as broker:
        assert broker.schema_registry().versions("orders-value") == [1, 2]
    newer = reader(spark, tmp_path, subscribe="orders", valueFormat="avro",
                   valueSchema=json.dumps(ORDER_V2))
    assert [tuple(r) for r in newer.orderBy("offset").select("value.*").collect()] == \
        [(1, "first", "EUR"), (2, None, "EUR"), (3, None, "NOK"), (4, "v2", "EUR")]
    pinned = reader(spark, tmp_path, subscribe="orders", valueFormat="avro",
                    valueSubject="orders-value", valueSchemaVersion="1")
    assert pinned.select("value.*").columns == ["id", "note"]


def test_a_record_that_does_not_decode_fails_the_query_or_reads_as_null(spark, tmp_path,
                                                                      caplog):
    """By default a value that is not in the wire format fails the read naming topic,
    partition and offset; failOnDecodeError=false reads it with a null value."""
    produce(tmp_path, "mixed", ORDER_V1, [{"id": 1}])
    with logkit.Broker(tmp_path) as broker:
        broker.topic("mixed").partition(0).append([(b"k", b"not avro", None, None)])
    produce(tmp_path, "mixed", ORDER_V1, [{"id": 3}])
    with pytest.raises(Exception) as failed:
        reader(spark, tmp_path, subscribe="mixed", valueFormat="avro").collect()
    assert "mixed-0 offset 1 does not decode as avro" in str(failed.value)
    lenient = reader(spark, tmp_path, subscribe="mixed", valueFormat="avro",
                     failOnDecodeError="false")
    got = [(r.offset, r.key, r.value and r.value.id) for r in
           lenient.orderBy("offset").collect()]
    assert got == [(0, None, 1), (1, b"k", None), (2, None, 3)]


def test_typed_writes_are_framed_with_the_subject_schema_and_bad_rows_refused(spark,
                                                                            tmp_path):
    """A struct value column written with valueFormat=avro lands as Confluent-framed
    Avro with the subject's id (read back by AvroSerde); a row that does not match the
    schema fails the write, named, and nothing lands."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("out", 1)
        schema_id = broker.schema_registry().register("out-value", json.dumps(ORDER_V1))
    df = spark.createDataFrame([(1, "a"), (2, None)], "id bigint, note string") \
        .selectExpr("CAST(id AS STRING) AS key", "struct(id, note) AS value")
    (df.write.format("logkit").option("path", str(tmp_path)).option("topic", "out")
     .option("valueFormat", "avro").mode("append").save())
    with logkit.Broker(tmp_path) as broker:
        records = broker.topic("out").partition(0).read(0)
        assert {wire.unframe(r.value)[0] for r in records} == {schema_id}
        serde = AvroSerde(broker, "out")
        assert sorted((r.key, serde.deserialize(r.value)["id"]) for r in records) == \
            [(b"1", 1), (b"2", 2)]
    bad = spark.createDataFrame([(5, "x"), (None, "y")], "id bigint, note string") \
        .selectExpr("struct(id, note) AS value")
    with pytest.raises(Exception) as failed:
        (bad.write.format("logkit").option("path", str(tmp_path)).option("topic", "out")
         .option("valueFormat", "avro").mode("append").save())
    assert "refused" in str(failed.value) and "id" in str(failed.value)
    with logkit.Broker(tmp_path) as broker:
        assert broker.topic("out").partition(0).high_watermark == 2


def test_json_and_protobuf_values_read_as_typed_columns(spark, tmp_path):
    """valueFormat=json takes a JSON Schema (framed records, through the subject) or
    plain JSON values with valueSchema; valueFormat=protobuf reads by field number into
    the subject's message, or into the message of .proto text given as valueSchema."""
    pytest.importorskip("google.protobuf")
    doc = {"type": "object", "properties": {
        "n": {"type": "integer"}, "when": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"type": "string"}}}}
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("docs", 1)
        producer = broker.producer(value_serializer=JsonSchemaSerde(broker, "docs", doc))
        producer.send("docs", {"n": 7, "when": "2026-01-02", "tags": ["x"]}).result()
        producer.close()
        broker.create_topic("plain", 1)
        broker.topic("plain").partition(0).append([(None, b'{"n": 1, "extra": true}',
                                                     None, None)])
        proto = ('syntax = "proto3";\npackage shop;\nenum Kind { A = 0; B = 1; }\n'
                 'message Item { int64 id = 1; string name = 2; Kind kind = 3; '
                 'repeated int32 sizes = 4; map<string, int64> stock = 5; Sub sub = 6; }\n'
                 'message Sub { bool ok = 1; }\n')
        item_id = broker.schema_registry().register("items-value", proto, "PROTOBUF")
        broker.create_topic("items", 1)
        payload = b"\x08\x05\x12\x03pen\x18\x01\x22\x02\x01\x02" \
            b"\x2a\x05\x0a\x01a\x10\x03"
        broker.topic("items").partition(0).append(
            [(None, wire.frame(item_id, payload, [0]), None, None)])
    docs = reader(spark, tmp_path, subscribe="docs", valueFormat="json")
    assert docs.schema["value"].dataType.simpleString() == \
        "struct<n:bigint,when:date,tags:array<string>>"
    assert docs.select("value.*").first().asDict() == \
        {"n": 7, "when": datetime.date(2026, 1, 2), "tags": ["x"]}
    plain = reader(spark, tmp_path, subscribe="plain", valueFormat="json",
                   valueSchema=json.dumps(doc))
    assert plain.select("value.n").first()[0] == 1
    items = reader(spark, tmp_path, subscribe="items", valueFormat="protobuf")
    assert items.schema["value"].dataType.simpleString() == (
        "struct<id:bigint,name:string,kind:string,sizes:array<int>,"
        "stock:map<string,bigint>,sub:struct<ok:boolean>>")
    row = items.select("value.*").first().asDict(recursive=True)
    assert row == {"id": 5, "name": "pen", "kind": "B", "sizes": [1, 2],
                   "stock": {"a": 3}, "sub": None}
    # the reader's .proto as text (no protoc), here a subset: fields by number
    subset = 'syntax = "proto3";\npackage shop;\nmessage Item { string name = 2; }\n'
    named = reader(spark, tmp_path, subscribe="items", valueFormat="protobuf",
                   valueSchema=subset)
    assert named.select("value.*").first().asDict() == {"name": "pen"}


EVENT = {"type": "record", "name": "Event", "namespace": "shop", "fields": [
    {"name": "what", "type": ["null", "int", "string",
                              {"type": "record", "name": "Point",
                               "fields": [{"name": "x", "type": "int"}]},
                              {"type": "enum", "name": "Colour", "symbols": ["RED"]},
                              "long"]},
    {"name": "at", "type": ["null", "Point"], "default": None}]}


def test_avro_unions_of_several_types_read_as_member_structs(spark, tmp_path):
    """A union other than null + T reads as from_avro shows it: a struct with a nullable
    member<i> per non-null branch, the branch the value took set (named branches told
    apart by name, an enum read as its symbol); null + a named type stays that type,
    nullable. Writing such a struct back into the union is refused on the driver."""
    produce(tmp_path, "events", EVENT, [
        {"what": 7, "at": {"x": 1}}, {"what": "hi"}, {"what": ("shop.Point", {"x": 2})},
        {"what": ("shop.Colour", "RED")}, {"what": 2 ** 40}, {"what": None}])
    df = reader(spark, tmp_path, subscribe="events", valueFormat="avro")
    assert df.schema["value"].dataType.simpleString() == (
        "struct<what:struct<member0:int,member1:string,member2:struct<x:int>,"
        "member3:string,member4:bigint>,at:struct<x:int>>")
    rows = [r.asDict(recursive=True) for r in
            df.orderBy("offset").select("value.*").collect()]
    members = [None if r["what"] is None else
               {k: v for k, v in r["what"].items() if v is not None} for r in rows]
    assert members == [{"member0": 7}, {"member1": "hi"}, {"member2": {"x": 2}},
                       {"member3": "RED"}, {"member4": 2 ** 40}, None]
    assert [r["at"] for r in rows] == [{"x": 1}] + [None] * 5
    with pytest.raises(Exception) as failed:
        (df.select("value").write.format("logkit").option("path", str(tmp_path))
         .option("topic", "events").option("valueFormat", "avro").mode("append").save())
    assert "union of several types" in str(failed.value)


RECURSIVE = {"type": "record", "name": "Node", "fields": [
    {"name": "next", "type": ["null", "Node"]}]}


@pytest.fixture(scope="module")
def orders_root(tmp_path_factory):
    """A directory with one v1 order in topic "orders" (read only by the tests)."""
    root = tmp_path_factory.mktemp("orders")
    produce(root, "orders", ORDER_V1, [{"id": 1}])
    return root


@pytest.mark.parametrize("options, message", [
    ({"valueSchema": "{}"}, "needs valueFormat"),
    ({"valueFormat": "xml"}, "must be avro, json or protobuf"),
    ({"valueFormat": "avro", "valueSubject": "nope-value"}, "nope-value"),
    ({"valueFormat": "protobuf", "valueSchema": "syntax = \"proto3\";"},
     "at least one message"),
    ({"valueFormat": "protobuf", "valueSchema": "message {"}, "does not parse"),
    ({"valueFormat": "avro", "valueSchema": json.dumps(RECURSIVE)}, "recursive type"),
    ({"valueFormat": "avro", "failOnDecodeError": "maybe"}, "true or false"),
])
def test_bad_typed_options_are_refused_by_the_source_schema(orders_root, options,
                                                            message):
    """Typed-column options are checked by the source's schema(), which Spark calls on
    the driver when the read is defined, before any job; called here in-process with
    the case-insensitive options Spark passes."""
    from pyspark.sql.datasource import CaseInsensitiveDict
    from pyspark_logkit import LogkitDataSource, LogkitSparkError
    source = LogkitDataSource(CaseInsensitiveDict(
        {"path": str(orders_root), "subscribe": "orders", **options}))
    with pytest.raises(LogkitSparkError) as failed:
        source.schema()
    assert message in str(failed.value)


def test_a_bad_typed_option_fails_the_spark_read_before_any_job(spark, orders_root):
    """Through Spark itself: the source's refusal reaches the caller when the read is
    defined (`.schema`), with the source's message."""
    with pytest.raises(Exception) as failed:
        reader(spark, orders_root, subscribe="orders", valueFormat="avro",
               valueSchema=json.dumps(RECURSIVE)).schema
    assert "the Avro type Node refers to itself" in str(failed.value)
