import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.ConsumerGroupState;
import org.apache.kafka.common.GroupType;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.InvalidConfigurationException;
import org.apache.kafka.common.errors.InvalidRequestException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The Java Admin client (kafka-clients 3.9.1) against the consumer group protocol (KIP-848) and
 * client-metrics subscriptions (KIP-714).
 *
 * Usage: java GregorKip848 BOOTSTRAP SCENARIO [ARGS...]
 * Scenarios:
 *   describe-groups GROUP...   describeConsumerGroups; one "GROUP {json}" or "GROUPERR id Exception" line each
 *   list-groups                listConsumerGroups unfiltered, by type consumer, by state Stable:
 *                              "LIST <filter> {json}" lines
 *   consumer GROUP TOPIC       a group.protocol=consumer consumer; prints "ASSIGNED p,p,.." whenever
 *                              its assignment changes, until stdin closes
 *   client-metrics NAME        creates, reads, lists, alters and deletes a subscription, with
 *                              Kafka's refusals of bad values; asserts as it goes
 * Exit 0 and "OK SCENARIO" when done; 1 with "MISMATCH:" or "ERROR:" otherwise.
 */
public class GregorKip848 {
    static String bootstrap;

    static class Mismatch extends RuntimeException {
        Mismatch(String m) { super(m); }
    }

    static void check(boolean cond, String msg) {
        if (!cond) throw new Mismatch(msg);
    }

    public static void main(String[] args) throws Exception {
        bootstrap = args[0];
        String scenario = args[1];
        try {
            switch (scenario) {
                case "describe-groups": describeGroups(Arrays.asList(args).subList(2, args.length)); break;
                case "list-groups": listGroups(); break;
                case "consumer": consumer(args[2], args[3]); break;
                case "client-metrics": clientMetrics(args[2]); break;
                default:
                    System.err.println("unknown scenario " + scenario);
                    System.exit(2);
            }
        } catch (Mismatch m) {
            System.err.println("MISMATCH: " + m.getMessage());
            System.exit(1);
        } catch (Throwable t) {
            System.err.println("ERROR: " + t);
            t.printStackTrace();
            System.exit(1);
        }
        System.out.println("OK " + scenario);
        System.out.flush();
        System.exit(0);
    }

    static Admin admin() {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "30000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "60000");
        return Admin.create(p);
    }

    // -------------------------------------------------------------- a little JSON

    static String q(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    static String partitions(Collection<TopicPartition> tps) {
        List<String> out = new ArrayList<>();
        for (TopicPartition tp : tps) out.add(q(tp.topic() + ":" + tp.partition()));
        Collections.sort(out);
        return "[" + String.join(",", out) + "]";
    }

    static String opt(Optional<?> o) {
        return o.map(v -> q(v.toString())).orElse("null");
    }

    // -------------------------------------------------------------- groups

    static void describeGroups(List<String> groups) throws Exception {
        try (Admin a = admin()) {
            DescribeConsumerGroupsResult res = a.describeConsumerGroups(groups);
            for (String g : groups) {
                ConsumerGroupDescription d;
                try {
                    d = res.describedGroups().get(g).get();
                } catch (ExecutionException e) {
                    System.out.println("GROUPERR " + g + " " + e.getCause().getClass().getSimpleName() + ": "
                            + e.getCause().getMessage());
                    continue;
                }
                List<String> members = new ArrayList<>();
                for (MemberDescription m : d.members()) {
                    members.add("{\"member_id\":" + q(m.consumerId())
                            + ",\"instance_id\":" + opt(m.groupInstanceId())
                            + ",\"client_id\":" + q(m.clientId())
                            + ",\"host\":" + q(m.host())
                            + ",\"assignment\":" + partitions(m.assignment().topicPartitions())
                            + ",\"target_assignment\":" + m.targetAssignment()
                                    .map(t -> partitions(t.topicPartitions())).orElse("null")
                            + "}");
                }
                System.out.println("GROUP {\"group_id\":" + q(d.groupId())
                        + ",\"type\":" + q(d.type() == null ? null : d.type().toString())
                        + ",\"state\":" + q(d.state() == null ? null : d.state().toString())
                        + ",\"simple\":" + d.isSimpleConsumerGroup()
                        + ",\"assignor\":" + q(d.partitionAssignor())
                        + ",\"coordinator\":" + (d.coordinator() == null ? "null" : d.coordinator().id())
                        + ",\"members\":[" + String.join(",", members) + "]}");
            }
        }
    }

    static void printListing(String filter, Collection<ConsumerGroupListing> listings) {
        List<String> out = new ArrayList<>();
        for (ConsumerGroupListing l : listings) {
            out.add("{\"group_id\":" + q(l.groupId()) + ",\"simple\":" + l.isSimpleConsumerGroup()
                    + ",\"state\":" + opt(l.state()) + ",\"type\":" + opt(l.type()) + "}");
        }
        System.out.println("LIST " + filter + " [" + String.join(",", out) + "]");
    }

    static void listGroups() throws Exception {
        try (Admin a = admin()) {
            printListing("all", a.listConsumerGroups().all().get());
            printListing("type-consumer", a.listConsumerGroups(
                    new ListConsumerGroupsOptions().withTypes(Collections.singleton(GroupType.CONSUMER))).all().get());
            printListing("type-classic", a.listConsumerGroups(
                    new ListConsumerGroupsOptions().withTypes(Collections.singleton(GroupType.CLASSIC))).all().get());
            printListing("state-stable", a.listConsumerGroups(
                    new ListConsumerGroupsOptions().inStates(Collections.singleton(ConsumerGroupState.STABLE))).all().get());
        }
    }

    static void consumer(String group, String topic) throws Exception {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "java-" + group);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        AtomicBoolean stop = new AtomicBoolean(false);
        Thread watcher = new Thread(() -> {
            try (BufferedReader r = new BufferedReader(new InputStreamReader(System.in))) {
                while (r.readLine() != null) { }
            } catch (java.io.IOException ignored) { }
            stop.set(true);
        });
        watcher.setDaemon(true);
        watcher.start();
        String last = null;
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            c.subscribe(Collections.singletonList(topic));
            while (!stop.get()) {
                c.poll(Duration.ofMillis(200));
                List<Integer> parts = new ArrayList<>();
                for (TopicPartition tp : c.assignment()) parts.add(tp.partition());
                Collections.sort(parts);
                String now = parts.toString().replaceAll("[\\[\\] ]", "");
                if (!now.equals(last)) {
                    System.out.println("ASSIGNED " + now);
                    System.out.flush();
                    last = now;
                }
            }
        }
    }

    // -------------------------------------------------------------- client metrics

    static ConfigResource cm(String name) {
        return new ConfigResource(ConfigResource.Type.CLIENT_METRICS, name);
    }

    static void alter(Admin a, String name, AlterConfigOp... ops) throws Exception {
        a.incrementalAlterConfigs(Collections.singletonMap(cm(name), Arrays.asList(ops))).all().get();
    }

    static AlterConfigOp op(String key, String value, AlterConfigOp.OpType type) {
        return new AlterConfigOp(new ConfigEntry(key, value), type);
    }

    static Map<String, ConfigEntry> describe(Admin a, String name) throws Exception {
        Config c = a.describeConfigs(Collections.singleton(cm(name))).all().get().get(cm(name));
        Map<String, ConfigEntry> out = new TreeMap<>();
        for (ConfigEntry e : c.entries()) out.put(e.name(), e);
        return out;
    }

    static Set<String> listed(Admin a) throws Exception {
        Set<String> out = new TreeSet<>();
        for (ClientMetricsResourceListing l : a.listClientMetricsResources().all().get()) out.add(l.name());
        return out;
    }

    /** Runs `alter` and expects it to fail with `want`; returns the message. */
    static String refused(Admin a, String name, Class<?> want, AlterConfigOp... ops) throws Exception {
        try {
            alter(a, name, ops);
        } catch (ExecutionException e) {
            check(want.isInstance(e.getCause()), Arrays.toString(ops) + ": " + e.getCause() + ", want " + want.getSimpleName());
            System.out.println("REFUSED " + Arrays.toString(ops) + " " + e.getCause().getClass().getSimpleName()
                    + ": " + e.getCause().getMessage());
            return e.getCause().getMessage();
        }
        throw new Mismatch(Arrays.toString(ops) + " was accepted, want " + want.getSimpleName());
    }

    static void expectValue(Map<String, ConfigEntry> got, String key, String value, ConfigEntry.ConfigSource source) {
        ConfigEntry e = got.get(key);
        check(e != null, key + " missing from " + got.keySet());
        check(Objects.equals(e.value(), value), key + " = " + e.value() + ", want " + value);
        check(e.source() == source, key + " source " + e.source() + ", want " + source);
    }

    static void clientMetrics(String name) throws Exception {
        AlterConfigOp.OpType SET = AlterConfigOp.OpType.SET, APPEND = AlterConfigOp.OpType.APPEND,
                SUBTRACT = AlterConfigOp.OpType.SUBTRACT, DELETE = AlterConfigOp.OpType.DELETE;
        ConfigEntry.ConfigSource CM = ConfigEntry.ConfigSource.DYNAMIC_CLIENT_METRICS_CONFIG;
        try (Admin a = admin()) {
            check(!listed(a).contains(name), name + " listed before it exists");

            // Kafka's refusals: push interval outside [100, 3600000] and unknown keys are
            // INVALID_REQUEST; a match pattern that is not one, INVALID_CONFIG. None is stored.
            refused(a, name, InvalidRequestException.class, op("interval.ms", "99", SET));
            refused(a, name, InvalidRequestException.class, op("interval.ms", "3600001", SET));
            refused(a, name, InvalidRequestException.class, op("no.such.key", "1", SET));
            refused(a, name, InvalidConfigurationException.class, op("match", "nobody=x", SET));
            refused(a, name, InvalidConfigurationException.class, op("match", "client_id=(", SET));
            check(!listed(a).contains(name), name + " listed after refused changes");

            // Create.
            alter(a, name, op("metrics", "org.apache.kafka.producer.,org.apache.kafka.consumer.", SET),
                    op("interval.ms", "1000", SET), op("match", "client_id=gregor-.*,client_software_name=apache-kafka-java", SET));
            Map<String, ConfigEntry> got = describe(a, name);
            System.out.println("DESCRIBED " + got.values());
            expectValue(got, "metrics", "org.apache.kafka.producer.,org.apache.kafka.consumer.", CM);
            expectValue(got, "interval.ms", "1000", CM);
            expectValue(got, "match", "client_id=gregor-.*,client_software_name=apache-kafka-java", CM);
            check(listed(a).contains(name), name + " not listed: " + listed(a));

            // Alter: APPEND and SUBTRACT on the list configs, SET on the interval.
            alter(a, name, op("metrics", "org.apache.kafka.admin.", APPEND), op("interval.ms", "60000", SET));
            got = describe(a, name);
            expectValue(got, "metrics", "org.apache.kafka.producer.,org.apache.kafka.consumer.,org.apache.kafka.admin.", CM);
            expectValue(got, "interval.ms", "60000", CM);
            alter(a, name, op("metrics", "org.apache.kafka.consumer.", SUBTRACT),
                    op("match", "client_software_name=apache-kafka-java", SUBTRACT));
            got = describe(a, name);
            expectValue(got, "metrics", "org.apache.kafka.producer.,org.apache.kafka.admin.", CM);
            expectValue(got, "match", "client_id=gregor-.*", CM);

            // A refused change leaves the subscription as it was.
            refused(a, name, InvalidRequestException.class, op("interval.ms", "50", SET));
            expectValue(describe(a, name), "interval.ms", "60000", CM);

            // Delete one value: it falls back to its default.
            alter(a, name, op("interval.ms", null, DELETE));
            got = describe(a, name);
            check(got.get("interval.ms") == null || got.get("interval.ms").source() != CM,
                    "interval.ms still set after DELETE: " + got.get("interval.ms"));
            check(listed(a).contains(name), name + " not listed after deleting one value");

            // Delete every value: the subscription is gone.
            alter(a, name, op("metrics", null, DELETE), op("match", null, DELETE));
            long deadline = System.currentTimeMillis() + 30_000;
            while (listed(a).contains(name)) {
                check(System.currentTimeMillis() < deadline, name + " still listed after deleting every value");
                Thread.sleep(100);
            }
            got = describe(a, name);
            for (ConfigEntry e : got.values()) {
                check(e.source() != CM, "deleted subscription still has " + e);
            }
            System.out.println("AFTER-DELETE " + got.values());
        }
    }
}
