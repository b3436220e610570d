/*
 * The table behind format("logkit"): batch reads through the JVM reader when it can
 * serve them, everything else through the Python source's table.
 *
 * Invariant: the capabilities are the Python table's (plus batch reads); the JVM scan
 * and the JVM writer hand streaming (toMicroBatchStream, toStreaming) to the Python
 * source's, and every shape they do not serve goes to it whole.
 */
package logkit.spark;

import java.util.HashSet;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

final class LogkitTable implements Table, SupportsRead, SupportsWrite {
    private final StructType schema;
    private final Table python;

    LogkitTable(StructType schema, Table python) {
        this.schema = schema;
        this.python = python;
    }

    @Override
    public String name() {
        return python.name();
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
        return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
        Set<TableCapability> out = new HashSet<>(python.capabilities());
        out.add(TableCapability.BATCH_READ);
        return out;
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        ScanBuilder fallback = ((SupportsRead) python).newScanBuilder(options);
        if (LogkitProvider.jvmReads(options) && schema.equals(LogkitProvider.SCHEMA)) {
            return new LogkitScan.Builder(options, schema, fallback);
        }
        return fallback;
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        WriteBuilder fallback = ((SupportsWrite) python).newWriteBuilder(info);
        if (LogkitWrite.jvmWrites(info)) {
            return new LogkitWrite(info, fallback);
        }
        return fallback;
    }
}
