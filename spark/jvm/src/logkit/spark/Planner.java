/*
 * The driver's link to logkit's own planning: one long-lived Python process
 * (`python -m pyspark_logkit.plan`) per driver JVM, asked one JSON line per query.
 *
 * Owns: starting that process with the interpreter Spark's Python workers use, and
 * restarting it if it died. Invariant: every offset and byte range the JVM reader reads
 * comes from logkit's Python code (the same option checks, offset resolution, range
 * cuts and published ends as the Python source); the JVM never guesses what is
 * published.
 */
package logkit.spark;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.spark.SparkConf;
import org.apache.spark.sql.SparkSession;

final class Planner {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static Process process;
    private static BufferedReader replies;
    private static OutputStream requests;

    private Planner() {
    }

    /** The interpreter to plan with: the one Spark's Python workers run. */
    static String python() {
        SparkConf conf = SparkSession.active().sparkContext().getConf();
        for (String key : new String[] {"spark.logkit.python", "spark.pyspark.driver.python",
                                        "spark.pyspark.python"}) {
            if (conf.contains(key)) {
                return conf.get(key);
            }
        }
        for (String name : new String[] {"PYSPARK_DRIVER_PYTHON", "PYSPARK_PYTHON"}) {
            String value = System.getenv(name);
            if (value != null && !value.isEmpty()) {
                return value;
            }
        }
        return "python3";
    }

    /** The plan for a batch read with these options: {"ok": true, "partitions": [...]}
     *  or {"ok": false, "error": "..."} when logkit refuses them. */
    static JsonNode plan(Map<String, String> options) {
        Map<String, Object> request = new HashMap<>();
        request.put("op", "read");
        request.put("options", options);
        return ask(request);
    }

    /** One request to the planner process, one reply. */
    static synchronized JsonNode ask(Map<String, Object> request) {
        String line;
        try {
            line = JSON.writeValueAsString(request);
        } catch (IOException e) {
            throw new IllegalStateException("logkit: could not encode the read options", e);
        }
        for (int attempt = 0; ; attempt++) {
            try {
                start();
                requests.write((line + "\n").getBytes(StandardCharsets.UTF_8));
                requests.flush();
                String reply = replies.readLine();
                if (reply == null) {
                    throw new IOException("the planner process exited");
                }
                return JSON.readTree(reply);
            } catch (IOException e) {
                stop();
                if (attempt > 0) {
                    throw new IllegalStateException(
                        "logkit: the JVM reader's planner (" + python()
                        + " -m pyspark_logkit.plan) failed: " + e.getMessage()
                        + "; set spark.logkit.python to an interpreter with logkit installed,"
                        + " or spark.logkit.jvm.enabled=false to read through the Python"
                        + " source", e);
                }
            }
        }
    }

    private static void start() throws IOException {
        if (process != null && process.isAlive()) {
            return;
        }
        ProcessBuilder builder = new ProcessBuilder(python(), "-m", "pyspark_logkit.plan");
        builder.redirectError(ProcessBuilder.Redirect.INHERIT);
        process = builder.start();
        replies = new BufferedReader(new InputStreamReader(process.getInputStream(),
                                                           StandardCharsets.UTF_8));
        requests = process.getOutputStream();
        Process started = process;
        Runtime.getRuntime().addShutdownHook(new Thread(started::destroy));
    }

    private static void stop() {
        if (process != null) {
            process.destroy();
            process = null;
        }
    }
}
