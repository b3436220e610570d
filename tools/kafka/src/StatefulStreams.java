/*
 * A stateful Kafka Streams word count for tests/kafka/test_kafka_streams_stateful.py: the same
 * program runs against the real Kafka and against logkit's listener. Usage:
 *   StatefulStreams BOOTSTRAP APPLICATION_ID INPUT OUTPUT UPDATES STATE_DIR [hold]
 * It reads INPUT (String lines), splits each line into words, re-keys by word (Streams'
 * repartition topic), counts per word in a KTable backed by the persistent store "counts"
 * (its changelog, APPLICATION_ID-counts-changelog, is a compacted topic Streams creates)
 * and writes every count update to OUTPUT (String word, Long count). The record cache is
 * off, so each input word makes exactly one update. It exits 0 once UPDATES count updates
 * have been written and Streams has closed (offsets committed, changelog flushed), after
 * printing "restored N records" (what the store read back from its changelog at start)
 * and "processed ..."; exit 1 when that does not happen within two minutes or Streams
 * fails. With "hold" it prints "restored ..." and "counted" at that point instead and
 * keeps running, never closing: the test kills it (SIGKILL) once the group's committed
 * offsets show everything counted was committed. The consumer is a static group member
 * (KIP-345), so the next life takes over its place at once.
 */
import java.time.Duration;
import java.util.Arrays;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;

public class StatefulStreams {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], applicationId = args[1], input = args[2], output = args[3];
        long updates = Long.parseLong(args[4]);
        String stateDir = args[5];
        boolean hold = args.length > 6 && args[6].equals("hold");

        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.AT_LEAST_ONCE);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG),
                  "earliest");
        // Streams' consumer does not leave its group at close (a bounce would rebalance),
        // so a new life would wait out the old member's session (45 s); a static member
        // (KIP-345) under the same instance id takes its place at once instead.
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG),
                  applicationId + "-instance");

        CountDownLatch written = new CountDownLatch((int) updates);
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
               .flatMapValues(line -> Arrays.asList(line.toLowerCase(Locale.ROOT).split("\\s+")))
               .filter((key, word) -> !word.isEmpty())
               .groupBy((key, word) -> word, Grouped.with(Serdes.String(), Serdes.String()))
               .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts")
                                  .withKeySerde(Serdes.String())
                                  .withValueSerde(Serdes.Long()))
               .toStream()
               .peek((word, count) -> written.countDown())
               .to(output, Produced.with(Serdes.String(), Serdes.Long()));

        AtomicLong restored = new AtomicLong();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition partition, String store, long start,
                                       long end) {
            }

            @Override
            public void onBatchRestored(TopicPartition partition, String store, long end,
                                        long count) {
                restored.addAndGet(count);
            }

            @Override
            public void onRestoreEnd(TopicPartition partition, String store, long total) {
            }
        });
        streams.setUncaughtExceptionHandler(error -> {
            failure.set(error);
            while (written.getCount() > 0) {
                written.countDown();
            }
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
                    .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        long began = System.nanoTime();
        streams.start();
        boolean done = written.await(120, TimeUnit.SECONDS);
        if (hold && done && failure.get() == null) {
            System.out.println("restored " + restored.get() + " records");
            System.out.println("counted");
            System.out.flush();
            Thread.sleep(Long.MAX_VALUE);       // until the test kills the process
        }
        streams.close(Duration.ofSeconds(60));
        if (failure.get() != null) {
            failure.get().printStackTrace();
            System.exit(1);
        }
        if (!done) {
            System.err.println("only " + (updates - written.getCount()) + " of " + updates
                               + " count updates written within 120 s");
            System.exit(1);
        }
        System.out.println("restored " + restored.get() + " records");
        System.out.println("processed " + updates + " count updates in "
                           + (System.nanoTime() - began) / 1_000_000 + " ms");
    }
}
