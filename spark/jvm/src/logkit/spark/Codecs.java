/*
 * The record batch codecs on the JVM: gzip through java.util.zip; snappy (xerial
 * framing or raw), lz4 (LZ4 frame) and zstd through the libraries Spark already ships
 * (snappy-java, lz4-java, zstd-jni).
 *
 * Invariant: a codec whose library is not on the classpath is refused with a
 * LogkitReadException naming it, never read as garbage; a batch inflates to at most
 * 256 MiB, as in logkit's Python codecs.
 */
package logkit.spark;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.zip.GZIPInputStream;

final class Codecs {
    private static final int MAX_INFLATED = 256 << 20;
    private static final byte[] XERIAL = {(byte) 0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0};

    private Codecs() {
    }

    static byte[] decompress(int codec, byte[] b, int off, int len, String path, long position) {
        String name = codec == 1 ? "gzip" : codec == 2 ? "snappy" : codec == 3 ? "lz4"
                      : codec == 4 ? "zstd" : "codec " + codec;
        try {
            switch (codec) {
                case 1:
                    return drain(new GZIPInputStream(new ByteArrayInputStream(b, off, len)));
                case 2:
                    return Snappy.decompress(b, off, len);
                case 3:
                    return drain(Lz4.stream(new ByteArrayInputStream(b, off, len)));
                case 4:
                    return drain(Zstd.stream(new ByteArrayInputStream(b, off, len)));
                default:
                    throw new LogkitCorruptRecordException("unknown compression codec " + codec,
                                                           path, position);
            }
        } catch (NoClassDefFoundError e) {
            throw new LogkitReadException("logkit: " + path + " holds " + name + "-compressed"
                + " batches and the " + name + " library is not on Spark's classpath ("
                + e.getMessage() + "); set spark.logkit.jvm.enabled=false to read them"
                + " through the Python source");
        } catch (IOException | RuntimeException e) {
            if (e instanceof LogkitReadException) {
                throw (LogkitReadException) e;
            }
            throw new LogkitCorruptRecordException(name + " data does not decompress ("
                + e.getMessage() + ")", path, position);
        }
    }

    static boolean xerial(byte[] b, int off, int len) {
        if (len < XERIAL.length) {
            return false;
        }
        for (int i = 0; i < XERIAL.length; i++) {
            if (b[off + i] != XERIAL[i]) {
                return false;
            }
        }
        return true;
    }

    private static byte[] drain(InputStream in) throws IOException {
        try (InputStream stream = in) {
            byte[] out = stream.readNBytes(MAX_INFLATED + 1);
            if (out.length > MAX_INFLATED) {
                throw new IOException("a batch inflates past " + MAX_INFLATED + " bytes");
            }
            return out;
        }
    }

    private static final class Snappy {
        static byte[] decompress(byte[] b, int off, int len) throws IOException {
            if (xerial(b, off, len)) {
                return drain(new org.xerial.snappy.SnappyInputStream(
                    new ByteArrayInputStream(b, off, len)));
            }
            int size = org.xerial.snappy.Snappy.uncompressedLength(b, off, len);
            if (size > MAX_INFLATED) {
                throw new IOException("a batch inflates past " + MAX_INFLATED + " bytes");
            }
            byte[] out = new byte[size];
            org.xerial.snappy.Snappy.uncompress(b, off, len, out, 0);
            return out;
        }
    }

    private static final class Lz4 {
        static InputStream stream(InputStream in) throws IOException {
            return new net.jpountz.lz4.LZ4FrameInputStream(in);
        }
    }

    private static final class Zstd {
        static InputStream stream(InputStream in) throws IOException {
            return new com.github.luben.zstd.ZstdInputStream(in);
        }
    }
}
