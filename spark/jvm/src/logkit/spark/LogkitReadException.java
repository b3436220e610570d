/*
 * A read of the JVM reader that cannot go on: data removed by retention, a file cut
 * while the query ran, a codec whose library is missing. Its message starts "logkit:"
 * and says what to do, as the Python source's LogkitSparkError does.
 */
package logkit.spark;

public class LogkitReadException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public LogkitReadException(String message) {
        super(message);
    }
}
