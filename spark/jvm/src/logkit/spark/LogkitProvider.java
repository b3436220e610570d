/*
 * format("logkit") on the JVM: the entry point Spark's DataSourceRegister lookup finds.
 *
 * Owns: deciding, per read, whether the JVM reader serves it or the Python data source
 * (pyspark_logkit) does. Invariant: the JVM reader only serves batch reads of binary key
 * and value columns without headers from a directory; everything else (writes, streaming,
 * includeHeaders, an object-store URL as path,
 * typed key/value columns, a session with spark.logkit.jvm=false) is handed to the Python
 * source registered under the same name, so options, schema and the exactly-once sink
 * behave exactly as they do without this jar. No option is ever silently ignored.
 */
package logkit.spark;

import java.util.Locale;
import java.util.Map;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

public final class LogkitProvider implements TableProvider, DataSourceRegister {
    /** Session setting: "false" sends every read to the Python source. */
    public static final String ENABLED_CONF = "spark.logkit.jvm.enabled";

    /** The typed-column options (pyspark_logkit.options.TYPED_OPTIONS): Python only. */
    private static final String[] TYPED = {"keyformat", "keyschema", "keysubject",
        "keyschemaversion", "valueformat", "valueschema", "valuesubject",
        "valueschemaversion", "failondecodeerror"};

    /** Spark's Kafka source schema without headers: what the JVM reader produces. */
    public static final StructType SCHEMA = new StructType(new StructField[] {
        DataTypes.createStructField("key", DataTypes.BinaryType, true),
        DataTypes.createStructField("value", DataTypes.BinaryType, true),
        DataTypes.createStructField("topic", DataTypes.StringType, true),
        DataTypes.createStructField("partition", DataTypes.IntegerType, true),
        DataTypes.createStructField("offset", DataTypes.LongType, true),
        DataTypes.createStructField("timestamp", DataTypes.TimestampType, true),
        DataTypes.createStructField("timestampType", DataTypes.IntegerType, true)});

    private PythonDataSourceV2 python;

    @Override
    public String shortName() {
        return "logkit";
    }

    synchronized PythonDataSourceV2 python() {
        if (python == null) {
            python = new PythonDataSourceV2();
            python.setShortName("logkit");
        }
        return python;
    }

    /** Whether the JVM reader can serve a batch read with these options. */
    static boolean jvmReads(Map<String, String> options) {
        SparkSession session = SparkSession.active();
        if (!"true".equalsIgnoreCase(session.conf().get(ENABLED_CONF, "true"))) {
            return false;
        }
        for (Map.Entry<String, String> e : options.entrySet()) {
            String key = e.getKey().toLowerCase(Locale.ROOT);
            for (String typed : TYPED) {
                if (typed.equals(key)) {
                    return false;
                }
            }
            if (key.equals("includeheaders") && !"false".equalsIgnoreCase(e.getValue().trim())) {
                return false;       // headers (or a value Python will check): Python
            }
            if (key.equals("path") && e.getValue().contains("://")) {
                return false;       // a shipped object store (DESIGN 18): Python
            }
        }
        return true;
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        if (jvmReads(options)) {
            return SCHEMA;
        }
        return python().inferSchema(options);
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning,
                          Map<String, String> properties) {
        Table delegate = python().getTable(schema, partitioning, properties);
        return new LogkitTable(schema, delegate);
    }

    @Override
    public boolean supportsExternalMetadata() {
        return python().supportsExternalMetadata();
    }
}
