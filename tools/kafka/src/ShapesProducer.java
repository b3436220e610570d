// Writes known records into a real Kafka with the Java producer, one producer per topic,
// so a test can read the broker's partition directories back record for record
// (tests/kafka/test_kafka_read_back.py). Each argument is TOPIC:COMPRESSION:IDEMPOTENT:COUNT;
// the records are a function of the topic and the index alone, mirrored in the test:
//   key       null when i % 5 == 0, else "key-" + (i % 23)
//   value     null when i % 17 == 16, else TOPIC + " " + i + " " + "x" * (i % 20)
//   headers   none when i % 3 == 0, else ("trace", "t" + i), ("n", empty)
//   timestamp BASE_TIMESTAMP_MS + i, partition 0
// Compiled by tests/helpers/kafka.py (javac against tools/kafka/lib) into tools/kafka/classes.

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class ShapesProducer {
    static final long BASE_TIMESTAMP_MS = 1_700_000_000_000L;

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        for (int a = 1; a < args.length; a++) {
            String[] spec = args[a].split(":");
            produce(bootstrap, spec[0], spec[1], Boolean.parseBoolean(spec[2]),
                    Integer.parseInt(spec[3]));
        }
    }

    static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static void produce(String bootstrap, String topic, String compression, boolean idempotent,
                        int count) throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        props.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, compression);
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, idempotent);
        props.put(ProducerConfig.ACKS_CONFIG, idempotent ? "all" : "1");
        props.put(ProducerConfig.LINGER_MS_CONFIG, 5);
        props.put(ProducerConfig.BATCH_SIZE_CONFIG, 4096);
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                byte[] key = i % 5 == 0 ? null : utf8("key-" + (i % 23));
                byte[] value = i % 17 == 16 ? null
                        : utf8(topic + " " + i + " " + "x".repeat(i % 20));
                ProducerRecord<byte[], byte[]> record = new ProducerRecord<>(
                        topic, 0, BASE_TIMESTAMP_MS + i, key, value);
                if (i % 3 != 0) {
                    record.headers().add(new RecordHeader("trace", utf8("t" + i)));
                    record.headers().add(new RecordHeader("n", new byte[0]));
                }
                sent.add(producer.send(record));
            }
            producer.flush();
            long last = -1;
            for (Future<RecordMetadata> f : sent) {
                last = f.get().offset();
            }
            System.out.println("produced " + topic + " " + count + " last offset " + last);
        }
    }
}
