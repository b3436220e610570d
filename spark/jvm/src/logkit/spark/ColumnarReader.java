/*
 * Reads one planned offset range on an executor: Kafka record batches (magic 2) from
 * the planned byte ranges of the segment files, decoded into Spark column vectors.
 *
 * Owns: the batch walk (header, CRC-32C check, base offsets rising within a segment:
 * contiguous, or with the gaps a compacted log's cleaner leaves), the codecs (Codecs),
 * the record decoding (zig-zag varints), the columns Spark asked for, and a compacted
 * topic's planned file that its cleaner replaced while the query ran
 * (`openReplacement`). Invariant: it returns the records of the range with offsets in
 * [start, end) that its files hold, each once, in rising offset order; a batch that does not check out raises
 * LogkitCorruptRecordException naming the file and byte position, and its records are
 * never returned; control batches are skipped, as logkit's own reads skip them, and
 * with read_committed so are the batches of the range's aborted transactions (the
 * planner's list, Kafka's consumer rule: `aborted`).
 */
package logkit.spark;

import java.io.File;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
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
    private static final int ATTR_TRANSACTIONAL = 0x10;
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

    // the next offset a record may have: rises past every record returned, so a cleaned
    // file read whole after a swap never repeats one (starts at range.start)
    private long nextOffset;
    // reading a cleaned file in place of a planned one (openReplacement), and the offset
    // its batches reached: the planned segments below it are skipped (-1: none)
    private boolean replacing;
    private long replacedUpTo = -1;

    // read_committed: the producers whose aborted transaction the batches have reached
    // and whose ABORT marker they have not (Kafka's consumer keeps the same set)
    private int abortedNext;
    private final java.util.Set<Long> abortedProducers = new java.util.HashSet<>();

    ColumnarReader(OffsetRange range, StructType required) {
        this.range = range;
        this.nextOffset = range.start;
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
            if (offset < nextOffset) {
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
            nextOffset = offset + 1;
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

    /**
     * read_committed: whether a batch belongs to an aborted transaction (Kafka's consumer
     * rule): a producer joins the set when the batches reach its aborted transaction's
     * first offset and leaves it at its next control batch (that transaction's ABORT
     * marker); its transactional batches in between are skipped.
     */
    private boolean aborted(int attributes, long producerId, long lastOffset) {
        while (abortedNext < range.abortedFirst.length
               && range.abortedFirst[abortedNext] <= lastOffset) {
            abortedProducers.add(range.abortedProducer[abortedNext++]);
        }
        if ((attributes & ATTR_CONTROL) != 0) {
            abortedProducers.remove(producerId);
            return false;
        }
        return (attributes & ATTR_TRANSACTIONAL) != 0 && abortedProducers.contains(producerId);
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
            // a compacted log's batches may leave gaps (the cleaner drops whole
            // batches), never overlap or go back
            if (expectedBase >= 0 && base < expectedBase) {
                throw corrupt("record batch base offset out of sequence (expected "
                              + expectedBase + " or more, got " + base + ")", pos);
            }
            int attributes = getShort(w, at + 21);
            long lastOffset = base + getInt(w, at + 23);
            expectedBase = lastOffset + 1;
            pos += size;
            if (base >= range.end) {
                return false;
            }
            if (replacing) {
                replacedUpTo = Math.max(replacedUpTo, lastOffset + 1);
            }
            if (range.abortedFirst.length > 0 && lastOffset >= nextOffset
                    && aborted(attributes, getLong(w, at + 43), lastOffset)) {
                continue;
            }
            if ((attributes & ATTR_CONTROL) != 0 || lastOffset < nextOffset) {
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
        replacing = false;
        File file = new File(path);
        long planned = range.inodes == null ? -1 : range.inodes[segment];
        if (range.compacted && planned >= 0) {
            if (baseOf(file) < replacedUpTo) {
                pos = stopPos;                   // its records were in the replacement
                return true;
            }
            // the planned file where it was, or swapped out and not yet removed; its
            // inode is checked again once open, so a swap meanwhile is not missed
            for (File candidate : new File[] {file, new File(path + ".deleted")}) {
                if (inode(candidate) != planned) {
                    continue;
                }
                FileChannel opened = openOrNull(candidate);
                if (opened != null && inode(candidate) == planned
                        && opened.size() >= stopPos) {
                    channel = opened;
                    return true;
                }
                if (opened != null) {
                    opened.close();
                }
            }
            return openReplacement(file);
        }
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

    private static FileChannel openOrNull(File file) throws IOException {
        try {
            return FileChannel.open(file.toPath(), StandardOpenOption.READ);
        } catch (NoSuchFileException e) {
            return null;
        }
    }

    /**
     * The planned file of a compacted partition is gone or another file: the cleaner
     * swapped in a cleaned file for a group of segments (Kafka's .cleaned/.swap). The
     * live segment holding the planned one's base offset (the greatest base at or below
     * it) is that cleaned file: it is read whole, its records below nextOffset skipped,
     * and the planned segments it covers are skipped after it. No such segment: the log
     * start passed the planned one (retention, DeleteRecords), which is data loss.
     */
    private boolean openReplacement(File planned) throws IOException {
        long base = baseOf(planned);
        File chosen = null;
        long chosenBase = -1;
        File[] files = planned.getParentFile().listFiles();
        for (File f : files == null ? new File[0] : files) {
            long b = baseOf(f);
            if (b >= 0 && f.getName().endsWith(".log") && b <= base && b > chosenBase) {
                chosen = f;
                chosenBase = b;
            }
        }
        if (chosen == null) {
            if (range.failOnDataLoss) {
                throw new LogkitReadException("logkit: records of " + range.name() + " in "
                    + path + " were removed by retention before they were read. Set"
                    + " failOnDataLoss=false to skip them.");
            }
            LOG.warn("records of {} in {} were removed by retention before they were"
                     + " read; skipped (failOnDataLoss=false)", range.name(), path);
            pos = stopPos;
            return true;
        }
        LOG.info("{}: {} was compacted while the query ran; reading {} instead",
                 range.name(), path, chosen);
        path = chosen.getPath();
        channel = openOrNull(chosen);
        if (channel == null) {
            throw new LogkitReadException("logkit: " + path + " of " + range.name()
                + " was replaced twice while it was read; run the query again");
        }
        pos = 0;
        stopPos = channel.size();
        replacing = true;
        return true;
    }

    /** A segment file's base offset from its name (20 digits), -1 for any other file. */
    private static long baseOf(File file) {
        String name = file.getName();
        if (name.length() < 24 || !name.startsWith(".log", 20)) {
            return -1;
        }
        try {
            return Long.parseLong(name.substring(0, 20));
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    /** The file's inode number, -1 when it does not exist. */
    private static long inode(File file) throws IOException {
        try {
            return ((Number) Files.getAttribute(file.toPath(), "unix:ino")).longValue();
        } catch (NoSuchFileException e) {
            return -1;
        }
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
