// The Java client with its defaults against a Kafka-protocol broker (logkit serve or Kafka):
// what a user of KafkaProducer and KafkaConsumer sees, printed as lines a test parses
// (tests/kafka/test_kafka_java_client.py). Compiled by tests/helpers/kafka.py into tools/kafka/classes.
//
//   produce BOOTSTRAP TOPIC COUNT
//       a KafkaProducer with nothing set but the serializers (so enable.idempotence=true,
//       acks=all); keys "key-" + (i % 10), values "value-" + i; prints
//       "SENT partition offset" per record in send order.
//   group BOOTSTRAP TOPIC GROUP PROTOCOL ASSIGNOR MEMBERS EXPECTED [static|static-restart]
//       MEMBERS consumers of group GROUP (PROTOCOL classic or consumer; ASSIGNOR range,
//       cooperative-sticky or "-" for the default), started one after another, each once
//       the one before has an assignment; each polls until the group together has read
//       EXPECTED records and every member holds partitions. Prints per member
//       "MEMBER i assigned=[..] revoked=[[..],..] generation=G", then "CONSUMED n" (distinct
//       records) and commits. "static": members have group.instance.id "static-i";
//       "static-restart" then restarts the last member under the same instance id and
//       prints "RESTART generation_before=G generation_after=G restarted_generation=G
//       revoked_after=[..] assigned_before=[..] assigned_after=[..]" (member 0's
//       generation and revocations, the restarted member's partitions).
// Any exception: "ERROR <class>: <message>" and exit 3; a deadline passed: "TIMEOUT ..." and
// exit 2.

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Collectors;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class ClientScenarios {
    static final long DEADLINE_MS = 60_000;
    // Kafka gives a restarted static member its partitions back at once (no rebalance)
    static final long RESTART_DEADLINE_MS = 10_000;

    public static void main(String[] args) {
        try {
            if (args[0].equals("produce")) {
                produce(args[1], args[2], Integer.parseInt(args[3]));
            } else if (args[0].equals("group")) {
                group(args[1], args[2], args[3], args[4], args[5], Integer.parseInt(args[6]),
                      Integer.parseInt(args[7]), args.length > 8 ? args[8] : "");
            } else {
                throw new IllegalArgumentException("unknown scenario " + args[0]);
            }
        } catch (Timeout t) {
            System.out.println("TIMEOUT " + t.getMessage());
            System.out.flush();
            System.exit(2);
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

    static final class Timeout extends RuntimeException {
        Timeout(String what) {
            super(what);
        }
    }

    static void produce(String bootstrap, String topic, int count) throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class);
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, "key-" + (i % 10),
                                                            "value-" + i)));
            }
            producer.flush();
            for (Future<RecordMetadata> future : sent) {
                RecordMetadata md = future.get();
                System.out.println("SENT " + md.partition() + " " + md.offset());
            }
        }
    }

    /** One consumer in its own thread, polling until told to stop. */
    static final class Member implements Runnable, ConsumerRebalanceListener {
        final int index;
        final KafkaConsumer<String, String> consumer;
        final String topic;
        final Set<String> seen;
        final List<List<Integer>> revoked = new ArrayList<>();
        final AtomicReference<Set<Integer>> assigned = new AtomicReference<>(new TreeSet<>());
        final AtomicBoolean stop = new AtomicBoolean();
        final AtomicBoolean commit = new AtomicBoolean();
        final AtomicBoolean committed = new AtomicBoolean();
        volatile int generation = -1;
        volatile Throwable failure;
        final Thread thread;

        Member(int index, Properties props, String topic, Set<String> seen) {
            this.index = index;
            this.consumer = new KafkaConsumer<>(props);
            this.topic = topic;
            this.seen = seen;
            this.thread = new Thread(this, "member-" + index);
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            if (!partitions.isEmpty()) {
                synchronized (revoked) {
                    revoked.add(partitions.stream().map(TopicPartition::partition).sorted()
                                .collect(Collectors.toList()));
                }
            }
        }

        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
        }

        @Override
        public void run() {
            try {
                consumer.subscribe(List.of(topic), this);
                while (!stop.get()) {
                    for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(100))) {
                        seen.add(r.partition() + ":" + r.offset());
                    }
                    assigned.set(consumer.assignment().stream().map(TopicPartition::partition)
                                 .collect(Collectors.toCollection(TreeSet::new)));
                    generation = consumer.groupMetadata().generationId();
                    if (commit.get() && !committed.get() && caughtUp()) {
                        consumer.commitSync();
                        committed.set(true);
                    }
                }
            } catch (Throwable t) {
                failure = t;
            } finally {
                consumer.close(Duration.ofSeconds(5));
            }
        }

        /** Every assigned partition read to its end, so a commit commits the ends (a
         *  partition just assigned may have no position yet, and commitSync() would
         *  leave it out). */
        boolean caughtUp() {
            Set<TopicPartition> held = consumer.assignment();
            Map<TopicPartition, Long> ends = consumer.endOffsets(held);
            for (TopicPartition tp : held) {
                if (consumer.position(tp) < ends.get(tp)) {
                    return false;
                }
            }
            return true;
        }

        String revokedText() {
            synchronized (revoked) {
                return revoked.toString().replace(" ", "");
            }
        }
    }

    static Properties consumerProps(String bootstrap, String group, String protocol,
                                    String assignor, String instanceId) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class);
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class);
        if (!assignor.equals("-")) {
            String name = assignor.equals("range")
                    ? "org.apache.kafka.clients.consumer.RangeAssignor"
                    : "org.apache.kafka.clients.consumer.CooperativeStickyAssignor";
            props.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, name);
        }
        if (instanceId != null) {
            props.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, instanceId);
            props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, 10_000);
        }
        return props;
    }

    static void waitFor(String what, long deadline, java.util.function.BooleanSupplier done,
                        List<Member> members) throws InterruptedException {
        while (!done.getAsBoolean()) {
            for (Member m : members) {
                if (m.failure != null) {
                    throw new RuntimeException(m.failure);
                }
            }
            if (System.currentTimeMillis() > deadline) {
                StringBuilder state = new StringBuilder(what);
                for (Member m : members) {
                    state.append(" member-").append(m.index).append("=").append(m.assigned.get());
                }
                throw new Timeout(state.toString());
            }
            Thread.sleep(20);
        }
    }

    static void group(String bootstrap, String topic, String group, String protocol,
                      String assignor, int count, int expected, String membership)
            throws Exception {
        boolean isStatic = membership.startsWith("static");
        long deadline = System.currentTimeMillis() + DEADLINE_MS;
        Set<String> seen = ConcurrentHashMap.newKeySet();
        List<Member> members = new ArrayList<>();
        try {
            for (int i = 0; i < count; i++) {
                Member m = new Member(i, consumerProps(bootstrap, group, protocol, assignor,
                                                       isStatic ? "static-" + i : null),
                                      topic, seen);
                members.add(m);
                m.thread.start();
                waitFor("member " + i + " assigned", deadline,
                        () -> !m.assigned.get().isEmpty(), members);
            }
            waitFor("every record read and every member assigned", deadline,
                    () -> seen.size() >= expected
                          && members.stream().allMatch(m -> !m.assigned.get().isEmpty()),
                    members);
            // the assignment settled: every member holds partitions, none twice, and every
            // member is in the same generation
            waitFor("a settled assignment", deadline, () -> {
                Set<Integer> all = new TreeSet<>();
                Set<Integer> generations = new TreeSet<>();
                int total = 0;
                for (Member m : members) {
                    all.addAll(m.assigned.get());
                    total += m.assigned.get().size();
                    generations.add(m.generation);
                }
                return total == all.size() && generations.size() == 1;
            }, members);
            for (Member m : members) {
                System.out.println("MEMBER " + m.index + " assigned="
                                   + m.assigned.get().toString().replace(" ", "")
                                   + " revoked=" + m.revokedText() + " generation=" + m.generation);
            }
            System.out.println("CONSUMED " + seen.size());
            for (Member m : members) {
                m.commit.set(true);
            }
            waitFor("offsets committed", deadline,
                    () -> members.stream().allMatch(m -> m.committed.get()), members);
            System.out.println("COMMITTED");
            if (membership.equals("static-restart")) {
                restartLast(bootstrap, topic, group, protocol, assignor, members, seen,
                            System.currentTimeMillis() + RESTART_DEADLINE_MS);
            }
        } finally {
            for (Member m : members) {
                m.stop.set(true);
            }
            for (Member m : members) {
                m.thread.join(30_000);
            }
        }
        System.out.flush();
    }

    /** Static membership: the last member leaves (a static member's close sends no
     *  LeaveGroup) and comes back under the same group.instance.id. */
    static void restartLast(String bootstrap, String topic, String group, String protocol,
                            String assignor, List<Member> members, Set<String> seen,
                            long deadline) throws Exception {
        Member first = members.get(0);
        int before = first.generation;
        int revokedBefore;
        synchronized (first.revoked) {
            revokedBefore = first.revoked.size();
        }
        Member last = members.remove(members.size() - 1);
        Set<Integer> lastAssigned = last.assigned.get();
        last.stop.set(true);
        last.thread.join(30_000);
        Member again = new Member(last.index, consumerProps(bootstrap, group, protocol, assignor,
                                                            "static-" + last.index),
                                  topic, seen);
        members.add(again);
        again.thread.start();
        waitFor("the restarted static member assigned", deadline,
                () -> !again.assigned.get().isEmpty(), members);
        // a rebalance, if any, completes for member 0 before it is read
        long settle = System.currentTimeMillis() + 3_000;
        while (System.currentTimeMillis() < settle && first.generation == before
               && again.generation == before) {
            Thread.sleep(20);
        }
        String revokedAfter;
        synchronized (first.revoked) {
            revokedAfter = first.revoked.subList(revokedBefore, first.revoked.size()).toString()
                    .replace(" ", "");
        }
        System.out.println("RESTART generation_before=" + before + " generation_after="
                           + first.generation + " restarted_generation=" + again.generation
                           + " revoked_after=" + revokedAfter
                           + " assigned_before=" + lastAssigned.toString().replace(" ", "")
                           + " assigned_after=" + again.assigned.get().toString().replace(" ", ""));
    }
}
