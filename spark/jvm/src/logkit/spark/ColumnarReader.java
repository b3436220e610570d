/*
 * Reads one planned offset range on an executor: Kafka record batches (magic 2) from
 * the planned byte ranges of the segment files, decoded into Spark column vectors.
 *
 * Owns: the batch walk (header, CRC-32C check, base offsets in sequence within a
 * segment), the codecs (Codecs), the record decoding (zig-zag varints) and the
 * columns Spark asked for. Invariant: it returns exactly the records of the range with
 * offsets in [start, end), each once; a batch that does not check out raises
 * LogkitCorruptRecordException naming the file and byte position, and its records are
 * never returned; control batches are skipped, as logkit's own reads skip them.
 */
package logkit.spark;

import java.io.File;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.zip.CRC32C;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.ConstantColumnVector;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.unsafe.types.UTF8String;

final class ColumnarReader implements PartitionReader<ColumnarBatch> {
    private static final Logger LOG = LoggerFactory.getLogger("logkit.spark");
    static final int ROWS = 4096;                    // rows per columnar batch
    private static final int WINDOW = 4 << 20;       // bytes read from a file at a time
    static final int HEADER = 61;                    // docs/design.md §3
    private static final int ATTR_CODEC = 0x07;
    private static final int ATTR_LOG_APPEND_TIME = 0x08;
    private static final int ATTR_CONTROL = 0x20;

    private final OffsetRange range;
    private final OnHeapColumnVector keys;
    private final OnHeapColumnVector values;
    private final OnHeapColumnVector offsets;
    private final OnHeapColumnVector timestamps;
    private final ColumnVector[] columns;
    private final ColumnarBatch batch;
    private final CRC32C crc = new CRC32C();

    // the file being read
    private int segment = -1;
    private FileChannel channel;
    private String path;
    private long pos;
    private long stopPos;
    private long expectedBase;
    private byte[] window = new byte[0];
    private long windowStart;
    private int windowLength;

    // the Kafka batch being decoded
    private byte[] data;
    private int dataPos;
    private int dataEnd;
    private int recordsLeft;
    private long baseOffset;
    private long baseTimestamp;
    private long appendTime;
    private long batchPos;
    private boolean finished;

    ColumnarReader(OffsetRange range, StructType required) {
        this.range = range;
        StructField[] fields = required.fields();
        columns = new ColumnVector[fields.length];
        OnHeapColumnVector k = null;
        OnHeapColumnVector v = null;
        OnHeapColumnVector o = null;
        OnHeapColumnVector t = null;
        for (int i = 0; i < fields.length; i++) {
            switch (fields[i].name()) {
                case "key":
                    columns[i] = k = new OnHeapColumnVector(ROWS, DataTypes.BinaryType);
                    break;
                case "value":
                    columns[i] = v = new OnHeapColumnVector(ROWS, DataTypes.BinaryType);
                    break;
                case "offset":
                    columns[i] = o = new OnHeapColumnVector(ROWS, DataTypes.LongType);
                    break;
                case "timestamp":
                    columns[i] = t = new OnHeapColumnVector(ROWS, DataTypes.TimestampType);
                    break;
                case "topic": {
                    ConstantColumnVector c = new ConstantColumnVector(ROWS, DataTypes.StringType);
                    c.setUtf8String(UTF8String.fromString(range.topic));
                    columns[i] = c;
                    break;
                }
                case "partition": {
                    ConstantColumnVector c = new ConstantColumnVector(ROWS, DataTypes.IntegerType);
                    c.setInt(range.partition);
                    columns[i] = c;
                    break;
                }
                case "timestampType": {
                    // as the Python source: 0 for every record
                    ConstantColumnVector c = new ConstantColumnVector(ROWS, DataTypes.IntegerType);
                    c.setInt(0);
                    columns[i] = c;
                    break;
                }
                default:
                    throw new IllegalArgumentException("logkit: no column " + fields[i].name());
            }
        }
        keys = k;
        values = v;
        offsets = o;
        timestamps = t;
        batch = new ColumnarBatch(columns);
    }

    @Override
    public boolean next() throws IOException {
        if (keys != null) {
            keys.reset();
        }
        if (values != null) {
            values.reset();
        }
        if (offsets != null) {
            offsets.reset();
        }
        if (timestamps != null) {
            timestamps.reset();
        }
        int rows = 0;
        try {
            rows = fill();
        } catch (ArrayIndexOutOfBoundsException | NegativeArraySizeException e) {
            throw corrupt("record batch body is malformed (" + e.getMessage() + ")", batchPos);
        }
        batch.setNumRows(rows);
        return rows > 0;
    }

    private int fill() throws IOException {
        int rows = 0;
        while (rows < ROWS && !finished) {
            if (recordsLeft == 0) {
                if (!nextBatch()) {
                    finished = true;
                    break;
                }
                continue;
            }
            byte[] d = data;
            int p = dataPos;
            long length = varlong(d, p);
            p = varPos;
            int recordEnd = p + (int) length;
            if (length < 0 || recordEnd > dataEnd) {
                throw corrupt("a record runs past its batch", batchPos);
            }
            p++;                                                  // attributes
            long timestampDelta = varlong(d, p);
            p = varPos;
            long offset = baseOffset + varlong(d, p);
            p = varPos;
            recordsLeft--;
            dataPos = recordEnd;
            if (offset < range.start) {
                continue;
            }
            if (offset >= range.end) {
                finished = true;
                break;
            }
            if (keys != null || values != null) {
                int keyLength = (int) varlong(d, p);
                p = varPos;
                if (p + Math.max(keyLength, 0) > recordEnd) {
                    throw corrupt("a record's key runs past the record", batchPos);
                }
                if (keys != null) {
                    if (keyLength < 0) {
                        keys.putNull(rows);
                    } else {
                        keys.putByteArray(rows, d, p, keyLength);
                    }
                }
                if (keyLength > 0) {
                    p += keyLength;
                }
                if (values != null) {
                    int valueLength = (int) varlong(d, p);
                    p = varPos;
                    if (p + Math.max(valueLength, 0) > recordEnd) {
                        throw corrupt("a record's value runs past the record", batchPos);
                    }
                    if (valueLength < 0) {
                        values.putNull(rows);
                    } else {
                        values.putByteArray(rows, d, p, valueLength);
                    }
                }
            }
            if (offsets != null) {
                offsets.putLong(rows, offset);
            }
            if (timestamps != null) {
                long ms = appendTime >= 0 ? appendTime : baseTimestamp + timestampDelta;
                timestamps.putLong(rows, ms * 1000L);
            }
            rows++;
        }
        return rows;
    }

    private int varPos;

    /** A zig-zag varint (Kafka's varint and varlong) at p; varPos is set past it. */
    private long varlong(byte[] d, int p) {
        long raw = 0;
        int shift = 0;
        while (true) {
            byte b = d[p++];
            raw |= (long) (b & 0x7f) << shift;
            if (b >= 0) {
                break;
            }
            shift += 7;
            if (shift > 63) {
                throw corrupt("a varint is longer than 10 bytes", batchPos);
            }
        }
        varPos = p;
        return (raw >>> 1) ^ -(raw & 1);
    }

    /** Moves to the next Kafka batch holding records of the range; false at its end. */
    private boolean nextBatch() throws IOException {
        while (true) {
            if (channel == null || pos >= stopPos) {
                if (!openNextSegment()) {
                    return false;
                }
                continue;
            }
            batchPos = pos;
            if (stopPos - pos < HEADER) {
                throw corrupt("batch runs past the end of the data", pos);
            }
            int at = load(pos, HEADER);
            long base = getLong(window, at);
            int batchLength = getInt(window, at + 8);
            long size = 12L + batchLength;
            if (batchLength < HEADER - 12 || pos + size > stopPos) {
                throw corrupt("batch runs past the end of the data", pos);
            }
            at = load(pos, (int) size);
            byte[] w = window;
            if (w[at + 16] != 2) {
                throw corrupt("unsupported record batch magic " + w[at + 16], pos);
            }
            long expectedCrc = getInt(w, at + 17) & 0xffffffffL;
            crc.reset();
            crc.update(w, at + 21, (int) size - 21);
            if (crc.getValue() != expectedCrc) {
                throw corrupt("record batch CRC mismatch (expected " + expectedCrc + ", got "
                              + crc.getValue() + ")", pos);
            }
            if (expectedBase >= 0 && base != expectedBase) {
                throw corrupt("record batch base offset out of sequence (expected "
                              + expectedBase + ", got " + base + ")", pos);
            }
            int attributes = getShort(w, at + 21);
            long lastOffset = base + getInt(w, at + 23);
            expectedBase = lastOffset + 1;
            pos += size;
            if (base >= range.end) {
                return false;
            }
            if ((attributes & ATTR_CONTROL) != 0 || lastOffset < range.start) {
                continue;
            }
            baseOffset = base;
            baseTimestamp = getLong(w, at + 27);
            appendTime = (attributes & ATTR_LOG_APPEND_TIME) != 0 ? getLong(w, at + 35) : -1;
            recordsLeft = getInt(w, at + 57);
            int codec = attributes & ATTR_CODEC;
            if (codec == 0) {
                data = w;
                dataPos = at + HEADER;
                dataEnd = at + (int) size;
            } else {
                data = Codecs.decompress(codec, w, at + HEADER, (int) size - HEADER, path, batchPos);
                dataPos = 0;
                dataEnd = data.length;
            }
            return true;
        }
    }

    /** Makes file bytes [p, p + n) available in the window; returns their index. */
    private int load(long p, int n) throws IOException {
        if (p >= windowStart && p + n <= windowStart + windowLength) {
            return (int) (p - windowStart);
        }
        int want = (int) Math.min(Math.max(n, WINDOW), stopPos - p);
        if (window.length < want) {
            window = new byte[Math.max(want, WINDOW)];
        }
        ByteBuffer target = ByteBuffer.wrap(window, 0, want);
        long at = p;
        while (target.hasRemaining()) {
            int got = channel.read(target, at);
            if (got < 0) {
                throw corrupt("the file ends before its planned range", at);
            }
            at += got;
        }
        windowStart = p;
        windowLength = want;
        return 0;
    }

    private boolean openNextSegment() throws IOException {
        closeChannel();
        segment++;
        if (segment >= range.paths.length) {
            return false;
        }
        path = range.paths[segment];
        pos = range.positions[segment];
        stopPos = pos + range.lengths[segment];
        expectedBase = -1;
        windowLength = 0;
        File file = new File(path);
        if (!file.exists()) {
            // retention renames a segment *.deleted before it unlinks it
            File renamed = new File(path + ".deleted");
            if (renamed.exists()) {
                file = renamed;
            } else if (range.failOnDataLoss) {
                throw new LogkitReadException("logkit: records of " + range.name() + " in "
                    + path + " were removed by retention before they were read. Set"
                    + " failOnDataLoss=false to skip them.");
            } else {
                LOG.warn("records of {} in {} were removed by retention before they were"
                         + " read; skipped (failOnDataLoss=false)", range.name(), path);
                pos = stopPos;
                return true;
            }
        }
        try {
            channel = FileChannel.open(Path.of(file.getPath()), StandardOpenOption.READ);
        } catch (java.nio.file.NoSuchFileException e) {
            throw new LogkitReadException("logkit: " + path + " of " + range.name()
                + " disappeared while it was read (retention?)");
        }
        if (channel.size() < stopPos) {
            throw new LogkitReadException("logkit: " + file + " holds " + channel.size()
                + " bytes, fewer than the " + stopPos + " planned: it was truncated while"
                + " the query ran; run it again");
        }
        return true;
    }

    private void closeChannel() throws IOException {
        if (channel != null) {
            channel.close();
            channel = null;
        }
    }

    private LogkitCorruptRecordException corrupt(String what, long position) {
        return new LogkitCorruptRecordException(what, path, position);
    }

    static long getLong(byte[] b, int i) {
        return ((long) getInt(b, i) << 32) | (getInt(b, i + 4) & 0xffffffffL);
    }

    static int getInt(byte[] b, int i) {
        return (b[i] << 24) | ((b[i + 1] & 0xff) << 16) | ((b[i + 2] & 0xff) << 8)
               | (b[i + 3] & 0xff);
    }

    static int getShort(byte[] b, int i) {
        return ((b[i] & 0xff) << 8) | (b[i + 1] & 0xff);
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    @Override
    public void close() throws IOException {
        closeChannel();
        batch.close();
    }
}
