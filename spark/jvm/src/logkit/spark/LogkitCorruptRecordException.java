/*
 * A record batch whose bytes do not check out (CRC-32C, length, magic, sequence):
 * logkit's CorruptRecordError on the JVM, naming the file and the byte position.
 * Invariant: raised before any record of that batch is returned.
 */
package logkit.spark;

public final class LogkitCorruptRecordException extends LogkitReadException {
    private static final long serialVersionUID = 1L;
    private final String path;
    private final long position;

    public LogkitCorruptRecordException(String what, String path, long position) {
        super("logkit: " + what + " in " + path + " at position " + position);
        this.path = path;
        this.position = position;
    }

    public String path() {
        return path;
    }

    public long position() {
        return position;
    }
}
