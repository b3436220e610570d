/*
 * The JVM batch scan: a plan from the Python planner (Planner), one Spark input
 * partition per planned offset range, read as columnar batches on the executors.
 *
 * Invariant: the offsets and the byte ranges read are exactly the planner's, resolved
 * by logkit itself (published ends only); when the planner refuses the options or the
 * offsets, the query fails on the driver with the Python source's own message
 * ("LogkitSparkError: logkit: ..."). Streaming goes to the Python scan.
 */
package logkit.spark;

import java.util.ArrayList;
import java.util.List;

import com.fasterxml.jackson.databind.JsonNode;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnarBatch;

final class LogkitScan implements Scan {
    static final class Builder implements ScanBuilder, SupportsPushDownRequiredColumns {
        private final CaseInsensitiveStringMap options;
        private final ScanBuilder fallback;     // the Python source's: streaming
        private StructType required;

        Builder(CaseInsensitiveStringMap options, StructType schema, ScanBuilder fallback) {
            this.options = options;
            this.required = schema;
            this.fallback = fallback;
        }

        @Override
        public void pruneColumns(StructType requiredSchema) {
            required = requiredSchema;
        }

        @Override
        public Scan build() {
            return new LogkitScan(options, required, fallback);
        }
    }

    private final CaseInsensitiveStringMap options;
    private final StructType required;
    private final ScanBuilder fallback;
    private Batch batch;

    private LogkitScan(CaseInsensitiveStringMap options, StructType required,
                       ScanBuilder fallback) {
        this.options = options;
        this.required = required;
        this.fallback = fallback;
    }

    @Override
    public StructType readSchema() {
        return required;
    }

    @Override
    public String description() {
        return "logkit (JVM reader) " + options.asCaseSensitiveMap();
    }

    @Override
    public ColumnarSupportMode columnarSupportMode() {
        // the reader factory says, per partition: the JVM reader's is columnar, the
        // Python stream's (toMicroBatchStream) is not
        return ColumnarSupportMode.PARTITION_DEFINED;
    }

    @Override
    public synchronized Batch toBatch() {
        if (batch == null) {
            JsonNode plan = Planner.plan(options.asCaseSensitiveMap());
            if (!plan.path("ok").asBoolean(false)) {
                // logkit refused the options or the offsets (the Python source's own
                // checks): its message, on the driver, before any task
                throw new IllegalArgumentException(plan.path("error").asText());
            }
            batch = new PlannedBatch(plan, required);
        }
        return batch;
    }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
        Scan python = fallback.build();
        if (!python.readSchema().equals(required)) {
            // Spark does not prune a streaming scan's columns; if it ever did, the Python
            // stream's rows would not match the pruned schema
            throw new IllegalStateException("logkit: a streaming read with pruned columns "
                + required.simpleString() + "; set spark.logkit.jvm.enabled=false");
        }
        return python.toMicroBatchStream(checkpointLocation);
    }

    /** Planned input partitions, each read by a ColumnarReader. */
    static final class PlannedBatch implements Batch {
        private final InputPartition[] partitions;
        private final StructType required;

        PlannedBatch(JsonNode plan, StructType required) {
            this.required = required;
            boolean failOnDataLoss = plan.path("failOnDataLoss").asBoolean(true);
            List<InputPartition> out = new ArrayList<>();
            for (JsonNode p : plan.path("partitions")) {
                JsonNode segments = p.path("segments");
                int n = segments.size();
                String[] paths = new String[n];
                long[] positions = new long[n];
                long[] lengths = new long[n];
                long[] inodes = new long[n];
                for (int i = 0; i < n; i++) {
                    paths[i] = segments.get(i).get(0).asText();
                    positions[i] = segments.get(i).get(1).asLong();
                    lengths[i] = segments.get(i).get(2).asLong();
                    inodes[i] = segments.get(i).path(3).asLong(-1);
                }
                JsonNode aborted = p.path("aborted");     // [[first offset, producer id]]
                long[] abortedFirst = new long[aborted.size()];
                long[] abortedProducer = new long[aborted.size()];
                for (int i = 0; i < aborted.size(); i++) {
                    abortedFirst[i] = aborted.get(i).get(0).asLong();
                    abortedProducer[i] = aborted.get(i).get(1).asLong();
                }
                out.add(new OffsetRange(p.get("topic").asText(), p.get("partition").asInt(),
                                        p.get("start").asLong(), p.get("end").asLong(),
                                        failOnDataLoss, paths, positions, lengths, inodes,
                                        p.path("compacted").asBoolean(false),
                                        abortedFirst, abortedProducer));
            }
            partitions = out.toArray(new InputPartition[0]);
        }

        @Override
        public InputPartition[] planInputPartitions() {
            return partitions;
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return new ReaderFactory(required);
        }
    }

    static final class ReaderFactory implements PartitionReaderFactory {
        private static final long serialVersionUID = 1L;
        private final StructType required;

        ReaderFactory(StructType required) {
            this.required = required;
        }

        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return true;
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            throw new UnsupportedOperationException("the logkit JVM reader is columnar");
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            return new ColumnarReader((OffsetRange) partition, required);
        }
    }

}
