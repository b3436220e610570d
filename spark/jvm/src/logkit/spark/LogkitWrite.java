/*
 * The JVM batch writer: tasks encode rows into Kafka record batches in staging files,
 * as the Python sink's tasks do; the driver's commit and abort are the Python sink's own
 * (pyspark_logkit.writer.append_staged and the staging clean-up, run by the planner
 * process), so a batch write is all or nothing exactly as without this jar.
 *
 * Owns: the task side for the common shape — a `topic` option, `value` (and `key`)
 * binary or string, an optional int `partition` column, no headers, no typed columns —
 * keyed rows to murmur2(key) % partitions like the producer, null keys sticky to one
 * random partition per task, batches under 2,000 records and half the topic's
 * max.message.bytes. Invariant: staging files are byte-for-byte the format
 * writer.read_staged reads; streaming writes and every other shape go to the Python
 * sink.
 */
package logkit.spark;

import java.io.BufferedOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ThreadLocalRandom;
import java.util.zip.CRC32C;

import com.fasterxml.jackson.databind.JsonNode;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.SupportsTruncate;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

final class LogkitWrite implements WriteBuilder, SupportsTruncate, Write {
    static final int STAGED_BATCH_RECORDS = 2000;   // writer.STAGED_BATCH_RECORDS

    private final LogicalWriteInfo info;
    private final WriteBuilder python;

    LogkitWrite(LogicalWriteInfo info, WriteBuilder python) {
        this.info = info;
        this.python = python;
    }

    /** Whether the JVM writer serves a write of this shape (else the Python sink). */
    static boolean jvmWrites(LogicalWriteInfo info) {
        Map<String, String> options = info.options().asCaseSensitiveMap();
        if (!LogkitProvider.jvmReads(options)) {      // disabled, or typed options
            return false;
        }
        boolean topicOption = false;
        for (String key : options.keySet()) {
            topicOption |= key.toLowerCase(Locale.ROOT).equals("topic");
        }
        if (!topicOption) {
            return false;
        }
        for (StructField field : info.schema().fields()) {
            DataType type = field.dataType();
            switch (field.name()) {
                case "key":
                case "value":
                    if (!(type instanceof BinaryType || type instanceof StringType)) {
                        return false;           // Python names the column and the fix
                    }
                    break;
                case "partition":
                    if (!(type instanceof IntegerType)) {
                        return false;
                    }
                    break;
                case "topic":
                case "headers":
                    return false;
                default:
                    break;                      // other columns are ignored, as in Python
            }
        }
        return info.schema().getFieldIndex("value").isDefined();
    }

    @Override
    public Write build() {
        return this;
    }

    /** mode("overwrite") and streaming complete mode: the Python sink's answer (a
     *  batch overwrite is refused there: topics are append-only). */
    @Override
    public WriteBuilder truncate() {
        if (python instanceof SupportsTruncate) {
            return ((SupportsTruncate) python).truncate();
        }
        throw new UnsupportedOperationException(
            "logkit: topics are append-only; use mode('append')");
    }

    @Override
    public String description() {
        return "logkit (JVM writer)";
    }

    @Override
    public BatchWrite toBatch() {
        Map<String, Object> request = new HashMap<>();
        request.put("op", "write");
        request.put("options", info.options().asCaseSensitiveMap());
        request.put("schema", info.schema().json());
        JsonNode plan = Planner.ask(request);
        if (!plan.path("ok").asBoolean(false)) {
            throw new IllegalArgumentException(plan.path("error").asText());
        }
        StructType schema = info.schema();
        return new Staged(plan.get("path").asText(), plan.get("writerId").asText(),
                          plan.get("topic").asText(), plan.get("partitions").asInt(),
                          plan.get("limitBytes").asInt(),
                          plan.path("compacted").asBoolean(false)
                          ? plan.path("cleanupPolicy").asText("compact") : null, schema);
    }

    @Override
    public StreamingWrite toStreaming() {
        return python.build().toStreaming();
    }

    /** The driver side: the Python sink's commit and abort. */
    static final class Staged implements BatchWrite {
        private final String path;
        private final String writerId;
        private final Factory factory;

        Staged(String path, String writerId, String topic, int partitions, int limitBytes,
               String compactedPolicy, StructType schema) {
            this.path = path;
            this.writerId = writerId;
            this.factory = new Factory(path, writerId, topic, partitions, limitBytes,
                                       compactedPolicy,
                                       schema.getFieldIndex("key").isDefined()
                                       ? schema.fieldIndex("key") : -1,
                                       schema.fieldIndex("value"),
                                       schema.getFieldIndex("partition").isDefined()
                                       ? schema.fieldIndex("partition") : -1,
                                       schema.getFieldIndex("key").isDefined()
                                       && schema.apply("key").dataType() instanceof StringType,
                                       schema.apply("value").dataType() instanceof StringType);
        }

        @Override
        public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo physical) {
            return factory;
        }

        @Override
        public void commit(WriterCommitMessage[] messages) {
            List<String> files = new ArrayList<>();
            for (WriterCommitMessage m : messages) {
                if (m != null) {
                    files.add(((StagedFile) m).path);
                }
            }
            Map<String, Object> request = new HashMap<>();
            request.put("op", "commit");
            request.put("path", path);
            request.put("writerId", writerId);
            request.put("files", files);
            JsonNode reply = Planner.ask(request);
            if (!reply.path("ok").asBoolean(false)) {
                throw new IllegalStateException(reply.path("error").asText());
            }
        }

        @Override
        public void abort(WriterCommitMessage[] messages) {
            Map<String, Object> request = new HashMap<>();
            request.put("op", "abort");
            request.put("path", path);
            request.put("writerId", writerId);
            Planner.ask(request);
        }
    }

    static final class StagedFile implements WriterCommitMessage {
        private static final long serialVersionUID = 1L;
        final String path;
        final long records;

        StagedFile(String path, long records) {
            this.path = path;
            this.records = records;
        }
    }

    static final class Factory implements DataWriterFactory {
        private static final long serialVersionUID = 1L;
        final String path;
        final String writerId;
        final String topic;
        final int partitions;
        final int limitBytes;
        final String compactedPolicy;        // the topic's cleanup.policy when compacted
        final int keyIndex;
        final int valueIndex;
        final int partitionIndex;
        final boolean keyString;
        final boolean valueString;

        Factory(String path, String writerId, String topic, int partitions, int limitBytes,
                String compactedPolicy, int keyIndex, int valueIndex, int partitionIndex,
                boolean keyString, boolean valueString) {
            this.path = path;
            this.writerId = writerId;
            this.topic = topic;
            this.partitions = partitions;
            this.limitBytes = limitBytes;
            this.compactedPolicy = compactedPolicy;
            this.keyIndex = keyIndex;
            this.valueIndex = valueIndex;
            this.partitionIndex = partitionIndex;
            this.keyString = keyString;
            this.valueString = valueString;
        }

        @Override
        public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
            try {
                return new TaskWriter(this);
            } catch (IOException e) {
                throw new LogkitReadException("logkit: cannot create a staging file under "
                    + path + ": " + e.getMessage());
            }
        }
    }

    /** One task: rows into per-partition Kafka batches in one staging file. */
    static final class TaskWriter implements DataWriter<InternalRow> {
        private final Factory f;
        private final File file;
        private final FileOutputStream stream;
        private final BufferedOutputStream out;
        private final BatchEncoder[] open;
        private final byte[] topicName;
        private int sticky = -1;
        private long records;

        TaskWriter(Factory f) throws IOException {
            this.f = f;
            File directory = new File(new File(f.path, ".spark-staging"), f.writerId);
            directory.mkdirs();
            file = new File(directory, UUID.randomUUID().toString().replace("-", "") + ".stage");
            stream = new FileOutputStream(file);
            out = new BufferedOutputStream(stream, 1 << 20);
            open = new BatchEncoder[f.partitions];
            topicName = f.topic.getBytes(StandardCharsets.UTF_8);
        }

        @Override
        public void write(InternalRow row) throws IOException {
            byte[] key = null;
            if (f.keyIndex >= 0 && !row.isNullAt(f.keyIndex)) {
                key = f.keyString ? row.getUTF8String(f.keyIndex).getBytes()
                                  : row.getBinary(f.keyIndex);
            }
            if (key == null && f.compactedPolicy != null) {
                // the Python sink's message (writer.py _keyless)
                throw new IllegalArgumentException("logkit: topic '" + f.topic + "' is"
                    + " compacted (cleanup.policy=" + f.compactedPolicy + "): every row"
                    + " needs a non-null 'key' (a keyless record is refused, as Kafka"
                    + " refuses it); nothing of this write was appended");
            }
            byte[] value = null;
            if (!row.isNullAt(f.valueIndex)) {
                value = f.valueString ? row.getUTF8String(f.valueIndex).getBytes()
                                      : row.getBinary(f.valueIndex);
            }
            int number;
            if (f.partitionIndex >= 0 && !row.isNullAt(f.partitionIndex)) {
                number = row.getInt(f.partitionIndex);
                if (number < 0 || number >= f.partitions) {
                    throw new IllegalArgumentException("logkit: partition " + number
                        + " does not exist in topic '" + f.topic + "' (" + f.partitions
                        + " partitions); as with Spark's Kafka sink, a 'partition' column"
                        + " picks the partition: to let keys choose, select the columns to"
                        + " write, e.g. df.select('key', 'value')");
                }
            } else if (key != null) {
                number = (murmur2(key) & 0x7fffffff) % f.partitions;
            } else {
                if (sticky < 0) {
                    sticky = ThreadLocalRandom.current().nextInt(f.partitions);
                }
                number = sticky;
            }
            BatchEncoder batch = open[number];
            if (batch == null) {
                batch = open[number] = new BatchEncoder();
            }
            if (!batch.fits(key, value, f.limitBytes)) {
                emit(number);
                batch = open[number] = new BatchEncoder();
            }
            batch.add(key, value);
            records++;
        }

        private void emit(int number) throws IOException {
            BatchEncoder batch = open[number];
            if (batch == null || batch.count == 0) {
                return;
            }
            byte[] encoded = batch.build();
            byte[] frame = new byte[10];
            frame[0] = (byte) (topicName.length >>> 8);
            frame[1] = (byte) topicName.length;
            putInt(frame, 2, number);
            putInt(frame, 6, encoded.length);
            out.write(frame);
            out.write(topicName);
            out.write(encoded);
            open[number] = null;
        }

        @Override
        public WriterCommitMessage commit() throws IOException {
            for (int i = 0; i < open.length; i++) {
                emit(i);
            }
            out.flush();
            stream.getFD().sync();
            out.close();
            return new StagedFile(file.getPath(), records);
        }

        @Override
        public void abort() throws IOException {
            out.close();
            file.delete();
        }

        @Override
        public void close() throws IOException {
            out.close();
        }
    }

    /** One Kafka record batch (magic 2) being built: records appended as encoded. */
    static final class BatchEncoder {
        private final ByteArrayOutputStream records = new ByteArrayOutputStream(1 << 14);
        private final byte[] scratch = new byte[10];
        int count;

        boolean fits(byte[] key, byte[] value, int limitBytes) {
            if (count == 0) {
                return true;
            }
            if (count >= STAGED_BATCH_RECORDS) {
                return false;
            }
            int size = 21 + (key == null ? 0 : key.length) + (value == null ? 0 : value.length);
            return ColumnarReader.HEADER + records.size() + size <= limitBytes;
        }

        void add(byte[] key, byte[] value) {
            int keyLength = key == null ? -1 : key.length;
            int valueLength = value == null ? -1 : value.length;
            int body = 1 + 1 + varintSize(count) + varintSize(keyLength)
                       + Math.max(keyLength, 0) + varintSize(valueLength)
                       + Math.max(valueLength, 0) + 1;
            writeVarint(body);
            records.write(0);                  // attributes
            records.write(0);                  // timestamp delta 0
            writeVarint(count);                // offset delta
            writeVarint(keyLength);
            if (key != null) {
                records.write(key, 0, key.length);
            }
            writeVarint(valueLength);
            if (value != null) {
                records.write(value, 0, value.length);
            }
            records.write(0);                  // no headers
            count++;
        }

        byte[] build() {
            long now = System.currentTimeMillis();
            byte[] body = records.toByteArray();
            int size = ColumnarReader.HEADER + body.length;
            byte[] b = new byte[size];
            // baseOffset 0 (stamped by the appender)
            putInt(b, 8, size - 12);            // batchLength
            putInt(b, 12, -1);                  // partitionLeaderEpoch
            b[16] = 2;                          // magic
            // attributes 0 (no codec, CreateTime)
            putInt(b, 23, count - 1);           // lastOffsetDelta
            putLong(b, 27, now);                // baseTimestamp
            putLong(b, 35, now);                // maxTimestamp
            putLong(b, 43, -1L);                // producerId
            b[51] = (byte) 0xff;                // producerEpoch -1
            b[52] = (byte) 0xff;
            putInt(b, 53, -1);                  // baseSequence
            putInt(b, 57, count);
            System.arraycopy(body, 0, b, ColumnarReader.HEADER, body.length);
            CRC32C crc = new CRC32C();
            crc.update(b, 21, size - 21);
            putInt(b, 17, (int) crc.getValue());
            return b;
        }

        private static int varintSize(long v) {
            long zz = (v << 1) ^ (v >> 63);
            int n = 1;
            while ((zz & ~0x7fL) != 0) {
                zz >>>= 7;
                n++;
            }
            return n;
        }

        private void writeVarint(long v) {
            long zz = (v << 1) ^ (v >> 63);
            int n = 0;
            while ((zz & ~0x7fL) != 0) {
                scratch[n++] = (byte) ((zz & 0x7f) | 0x80);
                zz >>>= 7;
            }
            scratch[n++] = (byte) zz;
            records.write(scratch, 0, n);
        }
    }

    static void putInt(byte[] b, int i, int v) {
        b[i] = (byte) (v >>> 24);
        b[i + 1] = (byte) (v >>> 16);
        b[i + 2] = (byte) (v >>> 8);
        b[i + 3] = (byte) v;
    }

    static void putLong(byte[] b, int i, long v) {
        putInt(b, i, (int) (v >>> 32));
        putInt(b, i + 4, (int) v);
    }

    /** Kafka's murmur2 (the default partitioner's hash), as logkit.murmur2. */
    static int murmur2(byte[] data) {
        int length = data.length;
        int m = 0x5bd1e995;
        int h = 0x9747b28c ^ length;
        int length4 = length / 4;
        for (int i = 0; i < length4; i++) {
            int i4 = i * 4;
            int k = (data[i4] & 0xff) + ((data[i4 + 1] & 0xff) << 8)
                    + ((data[i4 + 2] & 0xff) << 16) + ((data[i4 + 3] & 0xff) << 24);
            k *= m;
            k ^= k >>> 24;
            k *= m;
            h *= m;
            h ^= k;
        }
        int tail = length & ~3;
        switch (length % 4) {
            case 3:
                h ^= (data[tail + 2] & 0xff) << 16;
                // fall through
            case 2:
                h ^= (data[tail + 1] & 0xff) << 8;
                // fall through
            case 1:
                h ^= data[tail] & 0xff;
                h *= m;
                break;
            default:
                break;
        }
        h ^= h >>> 13;
        h *= m;
        h ^= h >>> 15;
        return h;
    }
}
