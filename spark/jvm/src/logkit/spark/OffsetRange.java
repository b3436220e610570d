/*
 * One Spark input partition of the JVM reader: a topic partition's offsets
 * [start, end) and the byte ranges of the segment files that hold them, as the Python
 * planner resolved them (logkit's Partition.batch_file_ranges: whole batches below the
 * published end of each segment), with each file's inode when planned and whether the
 * topic is compacted (its cleaner may replace a planned file while the query runs),
 * and, for kafka.isolation.level=read_committed, the aborted transactions overlapping
 * the range (first offset and producer id, by first offset: a Fetch response's list).
 *
 * Invariant: the reader reads no byte outside these ranges, except the whole of the
 * cleaned file that replaced a planned one (ColumnarReader.openReplacement).
 */
package logkit.spark;

import org.apache.spark.sql.connector.read.InputPartition;

final class OffsetRange implements InputPartition {
    private static final long serialVersionUID = 1L;

    final String topic;
    final int partition;
    final long start;
    final long end;
    final boolean failOnDataLoss;
    final String[] paths;
    final long[] positions;
    final long[] lengths;
    final long[] inodes;                 // -1: not planned (then not checked)
    final boolean compacted;
    final long[] abortedFirst;           // by first offset; empty: read every record
    final long[] abortedProducer;

    OffsetRange(String topic, int partition, long start, long end, boolean failOnDataLoss,
                String[] paths, long[] positions, long[] lengths, long[] inodes,
                boolean compacted, long[] abortedFirst, long[] abortedProducer) {
        this.topic = topic;
        this.partition = partition;
        this.start = start;
        this.end = end;
        this.failOnDataLoss = failOnDataLoss;
        this.paths = paths;
        this.positions = positions;
        this.lengths = lengths;
        this.inodes = inodes;
        this.compacted = compacted;
        this.abortedFirst = abortedFirst;
        this.abortedProducer = abortedProducer;
    }

    String name() {
        return topic + "-" + partition;
    }
}
