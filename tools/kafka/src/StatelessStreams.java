/*
 * A stateless Kafka Streams topology for tests/kafka/test_kafka_streams.py: the same program
 * runs against the real Kafka and against logkit's listener, and the test compares the
 * output topics. Usage:
 *   StatelessStreams BOOTSTRAP APPLICATION_ID INPUT OUTPUT RECORDS STATE_DIR [GUARANTEE]
 * It reads INPUT (String keys and values), drops the values that start with "drop",
 * maps each kept value to upper case with its key appended, writes OUTPUT (GUARANTEE:
 * processing.guarantee, at_least_once by default, Kafka Streams' default; or
 * exactly_once_v2), and exits 0 once RECORDS input records have been seen
 * and Streams has closed (its producer flushed, its offsets committed); exit 1 when
 * that does not happen within two minutes or Streams fails.
 */
import java.time.Duration;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;

public class StatelessStreams {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], applicationId = args[1], input = args[2], output = args[3];
        long records = Long.parseLong(args[4]);
        String stateDir = args[5];
        String guarantee = args.length > 6 ? args[6] : StreamsConfig.AT_LEAST_ONCE;

        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG),
                  "earliest");

        CountDownLatch seen = new CountDownLatch((int) records);
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
               .peek((key, value) -> seen.countDown())
               .filter((key, value) -> value != null && !value.startsWith("drop"))
               .mapValues((key, value) -> value.toUpperCase(Locale.ROOT) + "|" + key)
               .to(output, Produced.with(Serdes.String(), Serdes.String()));

        AtomicReference<Throwable> failure = new AtomicReference<>();
        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setUncaughtExceptionHandler(error -> {
            failure.set(error);
            while (seen.getCount() > 0) {
                seen.countDown();
            }
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
                    .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        long began = System.nanoTime();
        streams.start();
        boolean done = seen.await(120, TimeUnit.SECONDS);
        streams.close(Duration.ofSeconds(60));
        if (failure.get() != null) {
            failure.get().printStackTrace();
            System.exit(1);
        }
        if (!done) {
            System.err.println("only " + (records - seen.getCount()) + " of " + records
                               + " records seen within 120 s");
            System.exit(1);
        }
        System.out.println("processed " + records + " records in "
                           + (System.nanoTime() - began) / 1_000_000 + " ms");
    }
}
