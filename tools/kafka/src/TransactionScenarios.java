// The Java client's transactions against a Kafka-protocol broker (logkit serve or Kafka):
// what a user of a transactional KafkaProducer and a read_committed KafkaConsumer sees,
// printed as lines a test parses (tests/kafka/test_kafka_java_transactions.py). Compiled by
// tests/helpers/kafka.py into tools/kafka/classes.
//
//   transactions BOOTSTRAP TOPIC PARTITIONS SOURCE GROUP
//       a KafkaProducer with transactional.id: a transaction of 6 records ("c1-i") committed,
//       one of 4 ("ab-i") aborted, one of 3 ("c2-i") committed with offset 7 of SOURCE-0
//       sent for GROUP (sendOffsetsToTransaction); record i goes to partition i % PARTITIONS.
//       Then a read_committed and a read_uncommitted KafkaConsumer (assigned every
//       partition, from the beginning) each print "READ <isolation> v1 v2 ..." (sorted
//       values), and "POSITION <isolation> p0 p1 ..." (their positions at the end).
//   fence BOOTSTRAP TOPIC
//       two producers of one transactional.id: the first opens a transaction and sends
//       "zombie", the second calls initTransactions; the first's commitTransaction then
//       prints "FENCED <exception class>"; the second commits "live".
// Any exception: "ERROR <class>: <message>" and exit 3.

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class TransactionScenarios {
    static final long READ_DEADLINE_MS = 30_000;

    public static void main(String[] args) {
        try {
            if (args[0].equals("transactions")) {
                transactions(args[1], args[2], Integer.parseInt(args[3]), args[4], args[5]);
            } else if (args[0].equals("fence")) {
                fence(args[1], args[2]);
            } else {
                throw new IllegalArgumentException("unknown scenario " + args[0]);
            }
        } catch (Throwable t) {
            Throwable cause = t;
            while (cause.getCause() != null && cause != cause.getCause()) {
                cause = cause.getCause();
            }
            System.out.println("ERROR " + cause.getClass().getName() + ": " + cause.getMessage());
            System.out.flush();
            System.exit(3);
        }
        System.exit(0);
    }

    static KafkaProducer<String, String> producer(String bootstrap, String transactionalId) {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        return new KafkaProducer<>(props);
    }

    static void send(KafkaProducer<String, String> producer, String topic, int partitions,
                     String prefix, int count) {
        for (int i = 0; i < count; i++) {
            producer.send(new ProducerRecord<>(topic, i % partitions, "k" + i, prefix + i));
        }
    }

    static void transactions(String bootstrap, String topic, int partitions, String source,
                             String group) {
        try (KafkaProducer<String, String> producer =
                 producer(bootstrap, "java-" + UUID.randomUUID())) {
            producer.initTransactions();
            producer.beginTransaction();
            send(producer, topic, partitions, "c1-", 6);
            producer.commitTransaction();
            producer.beginTransaction();
            send(producer, topic, partitions, "ab-", 4);
            producer.flush();
            producer.abortTransaction();
            producer.beginTransaction();
            send(producer, topic, partitions, "c2-", 3);
            producer.sendOffsetsToTransaction(
                Map.of(new TopicPartition(source, 0), new OffsetAndMetadata(7)),
                new ConsumerGroupMetadata(group));
            producer.commitTransaction();
        }
        read(bootstrap, topic, partitions, "read_committed", 9);
        read(bootstrap, topic, partitions, "read_uncommitted", 13);
    }

    static void read(String bootstrap, String topic, int partitions, String isolation,
                     int expected) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG,
                  StringDeserializer.class.getName());
        List<TopicPartition> assigned = new ArrayList<>();
        for (int p = 0; p < partitions; p++) {
            assigned.add(new TopicPartition(topic, p));
        }
        List<String> values = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.assign(assigned);
            consumer.seekToBeginning(assigned);
            long deadline = System.currentTimeMillis() + READ_DEADLINE_MS;
            int quiet = 0;
            while (System.currentTimeMillis() < deadline && (values.size() < expected || quiet < 3)) {
                int before = values.size();
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                    values.add(record.value());
                }
                quiet = values.size() == before ? quiet + 1 : 0;
            }
            StringBuilder positions = new StringBuilder("POSITION " + isolation);
            for (TopicPartition tp : assigned) {
                positions.append(' ').append(consumer.position(tp));
            }
            Collections.sort(values);
            System.out.println("READ " + isolation + " " + String.join(" ", values));
            System.out.println(positions);
        }
    }

    static void fence(String bootstrap, String topic) {
        String id = "java-fence-" + UUID.randomUUID();
        KafkaProducer<String, String> old = producer(bootstrap, id);
        old.initTransactions();
        old.beginTransaction();
        old.send(new ProducerRecord<>(topic, 0, "k", "zombie"));
        old.flush();
        try (KafkaProducer<String, String> live = producer(bootstrap, id)) {
            live.initTransactions();
            try {
                old.commitTransaction();
                System.out.println("COMMITTED the fenced producer's transaction");
            } catch (KafkaException e) {
                System.out.println("FENCED " + e.getClass().getName());
            }
            old.close(Duration.ZERO);
            live.beginTransaction();
            live.send(new ProducerRecord<>(topic, 0, "k", "live"));
            live.commitTransaction();
        }
    }
}
