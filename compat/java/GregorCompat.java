import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.record.TimestampType;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Drives the official Java client (kafka-clients 3.9.1) against a gregor broker.
 *
 * Usage: java GregorCompat BOOTSTRAP SCENARIO [ARGS...]
 * Scenarios: metadata, create-topic, produce-consume, codecs, acks, idempotent, list-offsets,
 *            delete-topic, auto-create, configs, produce N TOPIC, verify N TOPIC,
 *            produce-stream TOPIC (sends until stdin closes; prints "ACK seq partition offset"
 *            per acknowledged record), verify-acked TOPIC ACKFILE (each ACK line of ACKFILE is
 *            at its partition/offset after a restart), set-cluster-config KEY VALUE,
 *            client-quotas CLIENT PRODUCE_RATE CONSUME_RATE (sets both byte rates for a client id
 *            and checks DescribeClientQuotas and the refusal of unenforced quotas),
 *            describe-topics-paged TOPIC PARTITIONS PAGE (describeTopics, PAGE partitions per
 *            DescribeTopicPartitions answer),
 *            move-replica-dir TOPIC PARTITION BROKER DIR (alterReplicaLogDirs, then
 *            describeReplicaLogDirs until the replica is in DIR with no future replica left),
 *            transactions (commit, abort, sendOffsetsToTransaction; what each isolation level sees),
 *            txn-fencing (a second producer with the same transactional.id fences the first)
 * Exit 0 = all checks passed; exit 1 with a "MISMATCH:" message otherwise.
 * Consumers use assign() and no group.id (consumer groups are not implemented yet).
 */
public class GregorCompat {
    static String bootstrap;
    static final long BASE_TS = 1_700_000_000_000L;
    static final Duration WAIT = Duration.ofSeconds(60);

    static class Mismatch extends RuntimeException {
        Mismatch(String m) { super(m); }
    }

    static void check(boolean cond, String msg) {
        if (!cond) throw new Mismatch(msg);
    }

    static byte[] b(String s) { return s.getBytes(StandardCharsets.UTF_8); }
    static String s(byte[] b) { return b == null ? null : new String(b, StandardCharsets.UTF_8); }

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: GregorCompat BOOTSTRAP SCENARIO [ARGS...]");
            System.exit(2);
        }
        bootstrap = args[0];
        String scenario = args[1];
        try {
            switch (scenario) {
                case "metadata": metadata(); break;
                case "create-topic": createTopic(); break;
                case "produce-consume": produceConsume(); break;
                case "codecs": codecs(); break;
                case "acks": acks(); break;
                case "idempotent": idempotent(); break;
                case "list-offsets": listOffsets(); break;
                case "delete-topic": deleteTopic(); break;
                case "auto-create": autoCreate(); break;
                case "configs": configs(); break;
                case "produce": produceN(args[3], Integer.parseInt(args[2])); break;
                case "verify": verifyN(args[3], Integer.parseInt(args[2])); break;
                case "produce-stream": produceStream(args[2]); break;
                case "verify-acked": verifyAcked(args[2], args[3]); break;
                case "set-cluster-config": setClusterConfig(args[2], args[3]); break;
                case "client-quotas": clientQuotas(args[2], args[3], args[4]); break;
                case "describe-topics-paged": describeTopicsPaged(args[2], Integer.parseInt(args[3]), Integer.parseInt(args[4])); break;
                case "transactions": transactions(); break;
                case "txn-fencing": txnFencing(); break;
                case "move-replica-dir": moveReplicaDir(args[2], Integer.parseInt(args[3]), Integer.parseInt(args[4]), args[5]); break;
                case "fetch-sessions": fetchSessions(); break;
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
        System.exit(0);
    }

    // ------------------------------------------------------------------ clients

    /** Client settings from the file named by -Dgregor.client.config (security.protocol, sasl.*, ssl.*). */
    static void secure(Properties p) {
        String file = System.getProperty("gregor.client.config");
        if (file == null) return;
        try (java.io.FileInputStream in = new java.io.FileInputStream(file)) {
            Properties extra = new Properties();
            extra.load(in);
            p.putAll(extra);
        } catch (java.io.IOException e) {
            throw new RuntimeException("cannot read " + file, e);
        }
    }

    static Admin admin() {
        Properties p = new Properties();
        secure(p);
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "30000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "60000");
        return Admin.create(p);
    }

    static KafkaProducer<byte[], byte[]> producer(Map<String, String> extra) {
        Properties p = new Properties();
        secure(p);
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.putAll(extra);
        return new KafkaProducer<>(p);
    }

    static KafkaConsumer<byte[], byte[]> consumer() {
        return consumer(Map.of());
    }

    static KafkaConsumer<byte[], byte[]> consumer(Map<String, String> extra) {
        Properties p = new Properties();
        secure(p);
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "60000");
        p.putAll(extra);
        return new KafkaConsumer<>(p);
    }

    // ------------------------------------------------------------------ records

    static class Rec {
        final int seq;
        final String key, value;
        final long ts;
        final List<String[]> headers = new ArrayList<>();
        Rec(String topic, int seq, int valueSize) {
            this.seq = seq;
            this.key = "key-" + (seq % 97) + "-" + seq;
            StringBuilder v = new StringBuilder("value-" + seq + "-");
            while (v.length() < valueSize) v.append((char) ('a' + (seq + v.length()) % 26));
            this.value = v.toString();
            this.ts = BASE_TS + seq * 10L;
            headers.add(new String[]{"seq", Integer.toString(seq)});
            headers.add(new String[]{"client", "java"});
            headers.add(new String[]{"dup", "first"});
            headers.add(new String[]{"dup", "second"});
        }
        ProducerRecord<byte[], byte[]> toRecord(String topic) {
            ProducerRecord<byte[], byte[]> r = new ProducerRecord<>(topic, null, ts, b(key), b(value));
            for (String[] h : headers) r.headers().add(h[0], b(h[1]));
            return r;
        }
    }

    static List<Rec> makeRecs(String topic, int n, int valueSize) {
        List<Rec> out = new ArrayList<>();
        for (int i = 0; i < n; i++) out.add(new Rec(topic, i, valueSize));
        return out;
    }

    /** Sends all, flushes, checks every future; returns the metadata per seq. */
    static List<RecordMetadata> sendAll(KafkaProducer<byte[], byte[]> prod, String topic, List<Rec> recs)
            throws Exception {
        List<Future<RecordMetadata>> fs = new ArrayList<>();
        for (Rec r : recs) fs.add(prod.send(r.toRecord(topic)));
        prod.flush();
        List<RecordMetadata> out = new ArrayList<>();
        for (Future<RecordMetadata> f : fs) out.add(f.get(60, TimeUnit.SECONDS));
        return out;
    }

    static List<ConsumerRecord<byte[], byte[]>> consumeAll(String topic, int expected) {
        try (KafkaConsumer<byte[], byte[]> c = consumer()) {
            List<TopicPartition> tps = new ArrayList<>();
            c.partitionsFor(topic, WAIT).forEach(pi -> tps.add(new TopicPartition(topic, pi.partition())));
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps, WAIT);
            long total = 0;
            for (long v : end.values()) total += v;
            check(total == expected, "end offsets of " + topic + " sum to " + total + ", expected " + expected + " " + end);
            List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>();
            long deadline = System.nanoTime() + WAIT.toNanos();
            while (out.size() < expected) {
                check(System.nanoTime() < deadline, "consumed only " + out.size() + " of " + expected + " from " + topic);
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) out.add(r);
            }
            // nothing beyond the expected records
            for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) out.add(r);
            check(out.size() == expected, "consumed " + out.size() + " records, expected " + expected);
            return out;
        }
    }

    /** Every record back identical; per partition in send order with consecutive offsets. */
    static void verify(String topic, List<Rec> recs, List<ConsumerRecord<byte[], byte[]>> got,
                       List<RecordMetadata> sent) {
        verify(topic, recs, got, sent, true);
    }

    static void verify(String topic, List<Rec> recs, List<ConsumerRecord<byte[], byte[]>> got,
                       List<RecordMetadata> sent, boolean checkOrder) {
        check(got.size() == recs.size(), "got " + got.size() + " records, sent " + recs.size());
        Map<Integer, Long> lastOffset = new HashMap<>();
        Map<Integer, Integer> lastSeq = new HashMap<>();
        Set<Integer> seen = new HashSet<>();
        for (ConsumerRecord<byte[], byte[]> r : got) {
            List<Header> hs = new ArrayList<>();
            r.headers().forEach(hs::add);
            check(!hs.isEmpty() && hs.get(0).key().equals("seq"), "first header is not seq at " + r.partition() + "/" + r.offset());
            int seq = Integer.parseInt(s(hs.get(0).value()));
            check(seq >= 0 && seq < recs.size() && seen.add(seq), "unexpected/duplicate seq " + seq);
            Rec e = recs.get(seq);
            check(e.key.equals(s(r.key())), "key mismatch seq " + seq + ": " + s(r.key()) + " != " + e.key);
            check(e.value.equals(s(r.value())), "value mismatch seq " + seq);
            check(r.timestamp() == e.ts, "timestamp mismatch seq " + seq + ": " + r.timestamp() + " != " + e.ts);
            check(r.timestampType() == TimestampType.CREATE_TIME, "timestamp type " + r.timestampType());
            check(hs.size() == e.headers.size(), "header count " + hs.size() + " != " + e.headers.size() + " seq " + seq);
            for (int i = 0; i < hs.size(); i++) {
                check(hs.get(i).key().equals(e.headers.get(i)[0]) && s(hs.get(i).value()).equals(e.headers.get(i)[1]),
                        "header " + i + " mismatch seq " + seq + ": " + hs.get(i).key() + "=" + s(hs.get(i).value()));
            }
            if (sent != null) {
                RecordMetadata m = sent.get(seq);
                check(m.partition() == r.partition() && m.offset() == r.offset(),
                        "seq " + seq + " acknowledged at " + m.partition() + "/" + m.offset() + " but consumed at "
                                + r.partition() + "/" + r.offset());
            }
            Long lo = lastOffset.get(r.partition());
            check(lo == null ? r.offset() == 0 : r.offset() == lo + 1,
                    "offset gap in partition " + r.partition() + ": " + lo + " -> " + r.offset());
            Integer ls = lastSeq.get(r.partition());
            check(!checkOrder || ls == null || seq > ls,
                    "partition " + r.partition() + " out of order: seq " + ls + " then " + seq);
            lastOffset.put(r.partition(), r.offset());
            lastSeq.put(r.partition(), seq);
        }
    }

    static String uniq(String prefix) {
        return prefix + "-" + UUID.randomUUID().toString().substring(0, 8);
    }

    static void createTopicAndWait(Admin a, String topic, int partitions) throws Exception {
        // -Dgregor.replication.factor=3 where the cluster's min.insync.replicas needs more than one copy
        short rf = Integer.getInteger("gregor.replication.factor", 1).shortValue();
        a.createTopics(List.of(new NewTopic(topic, partitions, rf))).all().get(60, TimeUnit.SECONDS);
        long deadline = System.nanoTime() + WAIT.toNanos();
        while (true) {
            try {
                TopicDescription d = a.describeTopics(List.of(topic)).allTopicNames().get(60, TimeUnit.SECONDS).get(topic);
                boolean ok = d.partitions().size() == partitions;
                for (TopicPartitionInfo pi : d.partitions()) ok &= pi.leader() != null && pi.leader().id() >= 0;
                if (ok) return;
            } catch (ExecutionException e) {
                if (!(e.getCause() instanceof UnknownTopicOrPartitionException)) throw e;
            }
            check(System.nanoTime() < deadline, "topic " + topic + " never got " + partitions + " partitions with leaders");
            Thread.sleep(50);
        }
    }

    // ------------------------------------------------------------------ scenarios

    static void metadata() throws Exception {
        try (Admin a = admin()) {
            DescribeClusterResult dc = a.describeCluster();
            Collection<Node> nodes = dc.nodes().get(60, TimeUnit.SECONDS);
            String[] hp = bootstrap.split(":");
            check(nodes.size() == 1, "expected 1 broker, got " + nodes);
            Node n = nodes.iterator().next();
            check(n.host().equals(hp[0]) && n.port() == Integer.parseInt(hp[1]), "broker " + n + " != " + bootstrap);
            check(dc.clusterId().get() != null && !dc.clusterId().get().isEmpty(), "empty cluster id");
            Node ctl = dc.controller().get();
            check(ctl != null && ctl.id() == n.id(), "controller " + ctl);
            String t = uniq("java-md");
            createTopicAndWait(a, t, 2);
            Set<String> names = a.listTopics().names().get(60, TimeUnit.SECONDS);
            check(names.contains(t), "listTopics lacks " + t + ": " + names);
        }
    }

    static void createTopic() throws Exception {
        try (Admin a = admin()) {
            String t = uniq("java-create");
            createTopicAndWait(a, t, 3);
            TopicDescription d = a.describeTopics(List.of(t)).allTopicNames().get().get(t);
            check(d.partitions().size() == 3, "partitions " + d.partitions().size());
            for (TopicPartitionInfo pi : d.partitions()) {
                check(pi.replicas().size() == 1 && pi.isr().size() == 1, "replicas/isr " + pi);
            }
            check(!d.topicId().equals(org.apache.kafka.common.Uuid.ZERO_UUID), "zero topic id");
            try {
                a.createTopics(List.of(new NewTopic(t, 3, (short) 1))).all().get(60, TimeUnit.SECONDS);
                check(false, "creating an existing topic succeeded");
            } catch (ExecutionException e) {
                check(e.getCause() instanceof org.apache.kafka.common.errors.TopicExistsException,
                        "re-create: expected TopicExistsException, got " + e.getCause());
            }
        }
    }

    static void produceConsume() throws Exception {
        String t = uniq("java-pc");
        try (Admin a = admin()) { createTopicAndWait(a, t, 3); }
        List<Rec> recs = makeRecs(t, 10_000, 100);
        List<RecordMetadata> md;
        try (KafkaProducer<byte[], byte[]> p = producer(Map.of())) { md = sendAll(p, t, recs); }
        Set<Integer> parts = new HashSet<>();
        for (RecordMetadata m : md) parts.add(m.partition());
        check(parts.size() == 3, "keys landed in partitions " + parts + " only");
        verify(t, recs, consumeAll(t, recs.size()), md);
    }

    /**
     * One consumer over many partitions: the Java client opens a fetch session with its first
     * full fetch and then sends incremental ones, which gregor answers with only the partitions
     * that have news. Records produced to two partitions after the consumer caught up must
     * arrive, each exactly once, through the session.
     */
    static void fetchSessions() throws Exception {
        String t = uniq("java-sessions");
        int partitions = 200;
        try (Admin a = admin()) { createTopicAndWait(a, t, partitions); }
        List<Rec> recs = makeRecs(t, 2300, 100);
        List<RecordMetadata> md;
        try (KafkaProducer<byte[], byte[]> p = producer(Map.of())) { md = new ArrayList<>(sendAll(p, t, recs.subList(0, 2000))); }
        try (KafkaConsumer<byte[], byte[]> c = consumer()) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int i = 0; i < partitions; i++) tps.add(new TopicPartition(t, i));
            c.assign(tps);
            c.seekToBeginning(tps);
            List<ConsumerRecord<byte[], byte[]>> got = new ArrayList<>();
            pollUntil(c, got, 2000, t);
            // Caught up: the session's next fetches are incremental and mostly empty.
            for (int i = 0; i < 5; i++) for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(100))) got.add(r);
            check(got.size() == 2000, "consumed " + got.size() + " records before the second round, expected 2000");
            try (KafkaProducer<byte[], byte[]> p = producer(Map.of())) {
                List<Future<RecordMetadata>> fs = new ArrayList<>();
                for (Rec r : recs.subList(2000, 2300)) {
                    ProducerRecord<byte[], byte[]> k = r.toRecord(t);
                    int partition = r.seq % 2 == 0 ? 7 : 150;
                    ProducerRecord<byte[], byte[]> pr = new ProducerRecord<>(t, partition, k.timestamp(), k.key(), k.value(), k.headers());
                    fs.add(p.send(pr));
                }
                p.flush();
                for (Future<RecordMetadata> f : fs) md.add(f.get(60, TimeUnit.SECONDS));
            }
            pollUntil(c, got, 2300, t);
            for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) got.add(r);
            verify(t, recs, got, md);
        }
    }

    static void pollUntil(KafkaConsumer<byte[], byte[]> c, List<ConsumerRecord<byte[], byte[]>> got, int n, String topic) {
        long deadline = System.nanoTime() + WAIT.toNanos();
        while (got.size() < n) {
            check(System.nanoTime() < deadline, "consumed only " + got.size() + " of " + n + " from " + topic);
            for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) got.add(r);
        }
    }

    static void codecs() throws Exception {
        for (String codec : List.of("none", "gzip", "snappy", "lz4", "zstd")) {
            String t = uniq("java-codec-" + codec);
            try (Admin a = admin()) { createTopicAndWait(a, t, 1); }
            List<Rec> recs = makeRecs(t, 2000, 300);
            List<RecordMetadata> md;
            try (KafkaProducer<byte[], byte[]> p = producer(Map.of(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec,
                    ProducerConfig.BATCH_SIZE_CONFIG, "65536"))) {
                md = sendAll(p, t, recs);
            }
            try {
                verify(t, recs, consumeAll(t, recs.size()), md);
            } catch (Mismatch m) {
                throw new Mismatch("codec " + codec + ": " + m.getMessage());
            }
            System.out.println("codec " + codec + " ok");
        }
    }

    static void acks() throws Exception {
        for (String acks : List.of("0", "1", "all")) {
            String t = uniq("java-acks-" + acks);
            try (Admin a = admin()) { createTopicAndWait(a, t, 1); }
            List<Rec> recs = makeRecs(t, 500, 50);
            Map<String, String> cfg = new HashMap<>();
            cfg.put(ProducerConfig.ACKS_CONFIG, acks);
            if (!acks.equals("all")) cfg.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
            List<RecordMetadata> md;
            try (KafkaProducer<byte[], byte[]> p = producer(cfg)) { md = sendAll(p, t, recs); }
            // acks=0: the client cannot know offsets; all records must still arrive, in order
            try {
                if (acks.equals("0")) {
                    waitEndOffset(t, recs.size());
                    verify(t, recs, consumeAll(t, recs.size()), null);
                } else {
                    verify(t, recs, consumeAll(t, recs.size()), md);
                }
            } catch (Mismatch m) {
                throw new Mismatch("acks=" + acks + ": " + m.getMessage());
            }
            System.out.println("acks " + acks + " ok");
        }
    }

    static void waitEndOffset(String t, long want) throws Exception {
        long deadline = System.nanoTime() + WAIT.toNanos();
        try (KafkaConsumer<byte[], byte[]> c = consumer()) {
            TopicPartition tp = new TopicPartition(t, 0);
            while (true) {
                long end = c.endOffsets(List.of(tp), WAIT).get(tp);
                if (end == want) return;
                check(end < want, "end offset " + end + " beyond " + want);
                check(System.nanoTime() < deadline, "end offset stuck at " + end + ", expected " + want);
                Thread.sleep(50);
            }
        }
    }

    static void idempotent() throws Exception {
        String t = uniq("java-idem");
        try (Admin a = admin()) { createTopicAndWait(a, t, 3); }
        List<Rec> recs = makeRecs(t, 3000, 80);
        List<RecordMetadata> md;
        try (KafkaProducer<byte[], byte[]> p = producer(Map.of(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true",
                ProducerConfig.ACKS_CONFIG, "all", ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, "5",
                ProducerConfig.BATCH_SIZE_CONFIG, "4096"))) {
            md = sendAll(p, t, recs);
        }
        verify(t, recs, consumeAll(t, recs.size()), md);
    }

    static void listOffsets() throws Exception {
        String t = uniq("java-lo");
        try (Admin a = admin()) {
            createTopicAndWait(a, t, 1);
            List<Rec> recs = makeRecs(t, 100, 20);  // timestamps BASE_TS + 10*i
            try (KafkaProducer<byte[], byte[]> p = producer(Map.of())) { sendAll(p, t, recs); }
            TopicPartition tp = new TopicPartition(t, 0);
            long e = a.listOffsets(Map.of(tp, OffsetSpec.earliest())).partitionResult(tp).get().offset();
            long l = a.listOffsets(Map.of(tp, OffsetSpec.latest())).partitionResult(tp).get().offset();
            check(e == 0, "admin earliest " + e);
            check(l == 100, "admin latest " + l);
            ListOffsetsResult.ListOffsetsResultInfo ts =
                    a.listOffsets(Map.of(tp, OffsetSpec.forTimestamp(BASE_TS + 425))).partitionResult(tp).get();
            check(ts.offset() == 43 && ts.timestamp() == BASE_TS + 430, "admin forTimestamp -> " + ts);
            ListOffsetsResult.ListOffsetsResultInfo mx =
                    a.listOffsets(Map.of(tp, OffsetSpec.maxTimestamp())).partitionResult(tp).get();
            check(mx.offset() == 99 && mx.timestamp() == BASE_TS + 990, "admin maxTimestamp -> " + mx);
            try (KafkaConsumer<byte[], byte[]> c = consumer()) {
                check(c.beginningOffsets(List.of(tp), WAIT).get(tp) == 0, "consumer beginningOffsets");
                check(c.endOffsets(List.of(tp), WAIT).get(tp) == 100, "consumer endOffsets");
                OffsetAndTimestamp ot = c.offsetsForTimes(Map.of(tp, BASE_TS + 500), WAIT).get(tp);
                check(ot != null && ot.offset() == 50 && ot.timestamp() == BASE_TS + 500, "offsetsForTimes -> " + ot);
                OffsetAndTimestamp none = c.offsetsForTimes(Map.of(tp, BASE_TS + 100_000), WAIT).get(tp);
                check(none == null, "offsetsForTimes past the end -> " + none);
                c.assign(List.of(tp));
                c.seek(tp, 90);
                List<ConsumerRecord<byte[], byte[]>> got = new ArrayList<>();
                long deadline = System.nanoTime() + WAIT.toNanos();
                while (got.size() < 10) {
                    check(System.nanoTime() < deadline, "seek(90) consumed " + got.size());
                    for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) got.add(r);
                }
                check(got.get(0).offset() == 90 && s(got.get(0).value()).startsWith("value-90-"), "seek(90) first " + got.get(0));
            }
        }
    }

    static void deleteTopic() throws Exception {
        try (Admin a = admin()) {
            String t = uniq("java-del");
            createTopicAndWait(a, t, 2);
            a.deleteTopics(List.of(t)).all().get(60, TimeUnit.SECONDS);
            long deadline = System.nanoTime() + WAIT.toNanos();
            while (a.listTopics().names().get().contains(t)) {
                check(System.nanoTime() < deadline, "deleted topic still listed");
                Thread.sleep(50);
            }
            try {
                a.describeTopics(List.of(t)).allTopicNames().get(60, TimeUnit.SECONDS);
                check(false, "describeTopics of a deleted topic succeeded");
            } catch (ExecutionException e) {
                check(e.getCause() instanceof UnknownTopicOrPartitionException, "describe deleted: " + e.getCause());
            }
        }
    }

    static void autoCreate() throws Exception {
        String t = uniq("java-auto");
        List<Rec> recs = makeRecs(t, 50, 20);
        List<RecordMetadata> md;
        try (KafkaProducer<byte[], byte[]> p = producer(Map.of())) { md = sendAll(p, t, recs); }
        try (Admin a = admin()) {
            check(a.listTopics().names().get().contains(t), "auto-created topic not listed");
        }
        verify(t, recs, consumeAll(t, recs.size()), md);
    }

    static void configs() throws Exception {
        try (Admin a = admin()) {
            String t = uniq("java-cfg");
            createTopicAndWait(a, t, 1);
            org.apache.kafka.common.config.ConfigResource r =
                    new org.apache.kafka.common.config.ConfigResource(org.apache.kafka.common.config.ConfigResource.Type.TOPIC, t);
            Config c = a.describeConfigs(List.of(r)).all().get(60, TimeUnit.SECONDS).get(r);
            check(c.get("retention.ms") != null && c.get("cleanup.policy") != null, "topic configs lack retention.ms/cleanup.policy: " + c);
            a.incrementalAlterConfigs(Map.of(r, List.of(new AlterConfigOp(new ConfigEntry("retention.ms", "123456789"),
                    AlterConfigOp.OpType.SET)))).all().get(60, TimeUnit.SECONDS);
            Config c2 = a.describeConfigs(List.of(r)).all().get(60, TimeUnit.SECONDS).get(r);
            check("123456789".equals(c2.get("retention.ms").value()), "retention.ms after alter: " + c2.get("retention.ms"));
            Collection<Node> nodes = a.describeCluster().nodes().get();
            org.apache.kafka.common.config.ConfigResource br = new org.apache.kafka.common.config.ConfigResource(
                    org.apache.kafka.common.config.ConfigResource.Type.BROKER, Integer.toString(nodes.iterator().next().id()));
            Config bc = a.describeConfigs(List.of(br)).all().get(60, TimeUnit.SECONDS).get(br);
            check(!bc.entries().isEmpty(), "no broker configs");
        }
    }

    /** kafka-configs --entity-default --alter: the cluster-wide dynamic broker config. */
    static void setClusterConfig(String key, String value) throws Exception {
        try (Admin a = admin()) {
            org.apache.kafka.common.config.ConfigResource all = new org.apache.kafka.common.config.ConfigResource(
                    org.apache.kafka.common.config.ConfigResource.Type.BROKER, "");
            a.incrementalAlterConfigs(Map.of(all, List.of(new AlterConfigOp(new ConfigEntry(key, value),
                    AlterConfigOp.OpType.SET)))).all().get(60, TimeUnit.SECONDS);
            Config c = a.describeConfigs(List.of(all)).all().get(60, TimeUnit.SECONDS).get(all);
            ConfigEntry e = c.get(key);
            check(e != null && value.equals(e.value()) && e.source() == ConfigEntry.ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
                    "cluster default " + key + " after alter: " + c);
        }
    }

    /**
     * describeTopics as kafka-topics --describe sends it from 3.8 on: DescribeTopicPartitions
     * when the broker offers it, following the cursor over answers of at most PAGE partitions.
     */
    static void describeTopicsPaged(String topic, int partitions, int page) throws Exception {
        try (Admin a = admin()) {
            TopicDescription d = a.describeTopics(List.of(topic),
                    new DescribeTopicsOptions().partitionSizeLimitPerResponse(page))
                    .allTopicNames().get(60, TimeUnit.SECONDS).get(topic);
            check(d.partitions().size() == partitions, "partitions: " + d);
            for (int i = 0; i < partitions; i++) {
                TopicPartitionInfo p = d.partitions().get(i);
                check(p.partition() == i && p.leader() != null && !p.replicas().isEmpty() && !p.isr().isEmpty(),
                        "partition " + i + ": " + d);
            }
            check(d.topicId() != null && !d.topicId().equals(org.apache.kafka.common.Uuid.ZERO_UUID), "topic id: " + d);
            try {
                a.describeTopics(List.of(topic + "-missing")).allTopicNames().get(60, TimeUnit.SECONDS);
                throw new Mismatch("a missing topic was described");
            } catch (ExecutionException e) {
                check(e.getCause() instanceof UnknownTopicOrPartitionException, "missing topic: " + e.getCause());
            }
        }
    }

    /**
     * What kafka-reassign-partitions --execute does with a log_dirs entry: AlterReplicaLogDirs to
     * the broker, then DescribeLogDirs (through describeReplicaLogDirs) until the move is done.
     * A directory outside log.dirs must fail with LogDirNotFoundException.
     */
    static void moveReplicaDir(String topic, int partition, int broker, String dir) throws Exception {
        org.apache.kafka.common.TopicPartitionReplica replica =
                new org.apache.kafka.common.TopicPartitionReplica(topic, partition, broker);
        try (Admin a = admin()) {
            try {
                a.alterReplicaLogDirs(Map.of(replica, dir + "-not-a-log-dir")).all().get(60, TimeUnit.SECONDS);
                throw new Mismatch("a move to a directory outside log.dirs succeeded");
            } catch (ExecutionException e) {
                check(e.getCause() instanceof org.apache.kafka.common.errors.LogDirNotFoundException,
                        "unknown dir: " + e.getCause());
            }
            a.alterReplicaLogDirs(Map.of(replica, dir)).all().get(60, TimeUnit.SECONDS);
            long deadline = System.currentTimeMillis() + 60_000;
            while (true) {
                DescribeReplicaLogDirsResult.ReplicaLogDirInfo info = a.describeReplicaLogDirs(List.of(replica))
                        .all().get(60, TimeUnit.SECONDS).get(replica);
                if (dir.equals(info.getCurrentReplicaLogDir()) && info.getFutureReplicaLogDir() == null) {
                    System.out.println("moved " + info);
                    break;
                }
                check(System.currentTimeMillis() < deadline, "replica never moved: " + info);
                Thread.sleep(100);
            }
        }
    }

    /**
     * What kafka-configs --alter --entity-type clients --add-config producer_byte_rate=..,
     * consumer_byte_rate=.. sends, then --describe, then a quota the broker cannot enforce.
     */
    static void clientQuotas(String clientId, String produceRate, String consumeRate) throws Exception {
        try (Admin a = admin()) {
            org.apache.kafka.common.quota.ClientQuotaEntity client = new org.apache.kafka.common.quota.ClientQuotaEntity(
                    Map.of(org.apache.kafka.common.quota.ClientQuotaEntity.CLIENT_ID, clientId));
            a.alterClientQuotas(List.of(new org.apache.kafka.common.quota.ClientQuotaAlteration(client, List.of(
                    new org.apache.kafka.common.quota.ClientQuotaAlteration.Op("producer_byte_rate", Double.valueOf(produceRate)),
                    new org.apache.kafka.common.quota.ClientQuotaAlteration.Op("consumer_byte_rate", Double.valueOf(consumeRate))))))
                    .all().get(60, TimeUnit.SECONDS);
            Map<org.apache.kafka.common.quota.ClientQuotaEntity, Map<String, Double>> got = a.describeClientQuotas(
                    org.apache.kafka.common.quota.ClientQuotaFilter.containsOnly(List.of(
                            org.apache.kafka.common.quota.ClientQuotaFilterComponent.ofEntity(
                                    org.apache.kafka.common.quota.ClientQuotaEntity.CLIENT_ID, clientId))))
                    .entities().get(60, TimeUnit.SECONDS);
            check(got.equals(Map.of(client, Map.of("producer_byte_rate", Double.valueOf(produceRate),
                    "consumer_byte_rate", Double.valueOf(consumeRate)))), "described quotas: " + got);
            Map<org.apache.kafka.common.quota.ClientQuotaEntity, Map<String, Double>> all = a.describeClientQuotas(
                    org.apache.kafka.common.quota.ClientQuotaFilter.all()).entities().get(60, TimeUnit.SECONDS);
            check(all.containsKey(client), "all quotas: " + all);
            org.apache.kafka.common.quota.ClientQuotaEntity user = new org.apache.kafka.common.quota.ClientQuotaEntity(
                    Map.of(org.apache.kafka.common.quota.ClientQuotaEntity.USER, "alice"));
            try {
                a.alterClientQuotas(List.of(new org.apache.kafka.common.quota.ClientQuotaAlteration(user, List.of(
                        new org.apache.kafka.common.quota.ClientQuotaAlteration.Op("request_percentage", 50.0)))))
                        .all().get(60, TimeUnit.SECONDS);
                check(false, "request_percentage was accepted");
            } catch (ExecutionException e) {
                check(e.getCause() instanceof org.apache.kafka.common.errors.InvalidRequestException
                        && e.getCause().getMessage().contains("request_percentage"), "request_percentage refused with " + e.getCause());
            }
            check(a.describeClientQuotas(org.apache.kafka.common.quota.ClientQuotaFilter.containsOnly(List.of(
                    org.apache.kafka.common.quota.ClientQuotaFilterComponent.ofEntity(
                            org.apache.kafka.common.quota.ClientQuotaEntity.USER, "alice"))))
                    .entities().get(60, TimeUnit.SECONDS).isEmpty(), "a refused quota was stored");
        }
    }

    static void produceN(String t, int n) throws Exception {
        try (Admin a = admin()) { createTopicAndWait(a, t, 3); }
        List<Rec> recs = makeRecs(t, n, 100);
        try (KafkaProducer<byte[], byte[]> p = producer(Map.of(ProducerConfig.ACKS_CONFIG, "all"))) {
            sendAll(p, t, recs);
        }
    }

    /** After a restart: every record exactly once and identical (ordering is checked elsewhere). */
    static void verifyN(String t, int n) throws Exception {
        verify(t, makeRecs(t, n, 100), consumeAll(t, n), null, false);
    }

    /**
     * Sends records seq 0, 1, 2, ... (paced) with acks=all and idempotence until stdin reaches
     * EOF, then flushes.  Every acknowledgement is printed as "ACK seq partition offset" the moment
     * its callback runs, so the test knows what was acknowledged before it killed the broker.
     */
    static void produceStream(String t) throws Exception {
        try (Admin a = admin()) { createTopicAndWait(a, t, 3); }
        Thread eof = new Thread(() -> {
            try { while (System.in.read() >= 0) { } } catch (Exception e) { }
        });
        eof.setDaemon(true);
        eof.start();
        List<String> errors = Collections.synchronizedList(new ArrayList<>());
        Map<String, String> cfg = Map.of(ProducerConfig.ACKS_CONFIG, "all",
                ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true",
                ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "120000",
                ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "30000");
        int sent = 0;
        try (KafkaProducer<byte[], byte[]> p = producer(cfg)) {
            System.out.println("STARTED");
            System.out.flush();
            for (int seq = 0; eof.isAlive() && seq < 1_000_000; seq++) {
                final int sq = seq;
                p.send(new Rec(t, seq, 50).toRecord(t), (m, e) -> {
                    if (e != null) {
                        errors.add(sq + ": " + e);
                    } else {
                        synchronized (System.out) {
                            System.out.println("ACK " + sq + " " + m.partition() + " " + m.offset());
                            System.out.flush();
                        }
                    }
                });
                sent++;
                if (seq % 20 == 0) Thread.sleep(5);
            }
            p.flush();
        }
        check(errors.isEmpty(), errors.size() + " sends failed, e.g. " + errors.subList(0, Math.min(5, errors.size())));
        System.out.println("SENT " + sent);
    }

    /** After a kill -9 and restart: each "ACK seq partition offset" line of ackFile names a record
     * that is there, identical; offsets have no holes; no seq is stored twice. */
    static void verifyAcked(String t, String ackFile) throws Exception {
        Map<Integer, long[]> acked = new HashMap<>();
        for (String line : java.nio.file.Files.readAllLines(java.nio.file.Paths.get(ackFile))) {
            String[] f = line.trim().split(" ");
            if (f.length == 4 && f[0].equals("ACK")) {
                acked.put(Integer.parseInt(f[1]), new long[]{Long.parseLong(f[2]), Long.parseLong(f[3])});
            }
        }
        check(!acked.isEmpty(), "no acknowledgements in " + ackFile);
        int total;
        try (KafkaConsumer<byte[], byte[]> c = consumer()) {
            List<TopicPartition> tps = new ArrayList<>();
            c.partitionsFor(t, WAIT).forEach(pi -> tps.add(new TopicPartition(t, pi.partition())));
            long sum = 0;
            for (long v : c.endOffsets(tps, WAIT).values()) sum += v;
            total = (int) sum;
        }
        Map<String, ConsumerRecord<byte[], byte[]>> at = new HashMap<>();
        Map<Integer, String> seqAt = new HashMap<>();
        Map<Integer, Long> maxOffset = new HashMap<>();
        Map<Integer, Integer> count = new HashMap<>();
        for (ConsumerRecord<byte[], byte[]> r : consumeAll(t, total)) {
            String where = r.partition() + "/" + r.offset();
            check(at.put(where, r) == null, "offset " + where + " consumed twice");
            int seq = Integer.parseInt(s(r.headers().headers("seq").iterator().next().value()));
            String prev = seqAt.put(seq, where);
            check(prev == null, "seq " + seq + " stored twice: at " + prev + " and " + where);
            maxOffset.merge(r.partition(), r.offset(), Math::max);
            count.merge(r.partition(), 1, Integer::sum);
        }
        for (Map.Entry<Integer, Integer> e : count.entrySet()) {
            check(maxOffset.get(e.getKey()) == e.getValue() - 1, "partition " + e.getKey() + ": offsets have holes");
        }
        List<String> lost = new ArrayList<>();
        for (Map.Entry<Integer, long[]> e : acked.entrySet()) {
            int seq = e.getKey();
            String where = e.getValue()[0] + "/" + e.getValue()[1];
            ConsumerRecord<byte[], byte[]> r = at.get(where);
            Rec want = new Rec(t, seq, 50);
            if (r == null || !want.key.equals(s(r.key())) || !want.value.equals(s(r.value())) || r.timestamp() != want.ts) {
                lost.add("seq " + seq + " acked at " + where + " found " + (r == null ? "nothing" : s(r.key())));
            }
        }
        check(lost.isEmpty(), lost.size() + " of " + acked.size() + " acknowledged records not at their offset: "
                + lost.subList(0, Math.min(10, lost.size())));
        System.out.println("VERIFIED " + acked.size() + " acknowledged of " + total + " stored");
    }
    // ------------------------------------------------------------------ transactions

    static KafkaProducer<byte[], byte[]> txnProducer(String txnId) {
        KafkaProducer<byte[], byte[]> p = producer(Map.of(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId,
                ProducerConfig.MAX_BLOCK_MS_CONFIG, "60000"));
        p.initTransactions();
        return p;
    }

    static void sendValues(KafkaProducer<byte[], byte[]> p, String t, String prefix, int n) throws Exception {
        List<Future<RecordMetadata>> fs = new ArrayList<>();
        for (int i = 0; i < n; i++) fs.add(p.send(new ProducerRecord<>(t, i % 2, null, b(prefix + i))));
        p.flush();
        for (Future<RecordMetadata> f : fs) f.get(60, TimeUnit.SECONDS);
    }

    /** Every value of `t` as a consumer at `isolation` sees it: read until its position reaches
     *  the end offsets (the last stable offset for read_committed), so the view is complete. */
    static List<String> readValues(String t, int partitions, String isolation) {
        try (KafkaConsumer<byte[], byte[]> c = consumer(Map.of(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation))) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int i = 0; i < partitions; i++) tps.add(new TopicPartition(t, i));
            c.assign(tps);
            c.seekToBeginning(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps, WAIT);
            List<String> out = new ArrayList<>();
            long deadline = System.nanoTime() + WAIT.toNanos();
            while (true) {
                boolean done = true;
                for (TopicPartition tp : tps) done &= c.position(tp, WAIT) >= end.get(tp);
                if (done) break;
                check(System.nanoTime() < deadline, isolation + " reader stuck at " + out.size() + " values, ends " + end);
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) out.add(s(r.value()));
            }
            Collections.sort(out);
            return out;
        }
    }

    static List<String> values(String prefix, int n) {
        List<String> out = new ArrayList<>();
        for (int i = 0; i < n; i++) out.add(prefix + i);
        return out;
    }

    static void transactions() throws Exception {
        String t = uniq("java-txn");
        String src = uniq("java-txn-src");
        String group = uniq("java-txn-g");
        try (Admin a = admin()) {
            createTopicAndWait(a, t, 2);
            createTopicAndWait(a, src, 1);
        }
        TopicPartition srcTp = new TopicPartition(src, 0);
        try (KafkaProducer<byte[], byte[]> p = txnProducer(uniq("java-tx"))) {
            p.beginTransaction();
            sendValues(p, t, "c1-", 50);
            p.sendOffsetsToTransaction(Map.of(srcTp, new OffsetAndMetadata(7)), new ConsumerGroupMetadata(group));
            p.commitTransaction();
            p.beginTransaction();
            sendValues(p, t, "a-", 30);
            p.sendOffsetsToTransaction(Map.of(srcTp, new OffsetAndMetadata(99)), new ConsumerGroupMetadata(group));
            p.abortTransaction();
            p.beginTransaction();
            sendValues(p, t, "c2-", 10);
            p.commitTransaction();
        }
        List<String> committed = new ArrayList<>(values("c1-", 50));
        committed.addAll(values("c2-", 10));
        List<String> all = new ArrayList<>(committed);
        all.addAll(values("a-", 30));
        Collections.sort(committed);
        Collections.sort(all);
        List<String> rc = readValues(t, 2, "read_committed");
        check(rc.equals(committed), "read_committed saw " + rc.size() + " values, expected the 60 committed: " + rc);
        List<String> ru = readValues(t, 2, "read_uncommitted");
        check(ru.equals(all), "read_uncommitted saw " + ru.size() + " values, expected all 90");
        try (Admin a = admin()) {
            Map<TopicPartition, OffsetAndMetadata> offs =
                    a.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get(60, TimeUnit.SECONDS);
            OffsetAndMetadata o = offs.get(srcTp);
            check(o != null && o.offset() == 7, "the group's committed offset is " + o + ", expected 7 (the aborted 99 discarded)");
        }
    }

    static boolean fenced(Throwable e) {
        for (Throwable c = e; c != null; c = c.getCause()) {
            if (c instanceof org.apache.kafka.common.errors.ProducerFencedException
                    || c instanceof org.apache.kafka.common.errors.InvalidProducerEpochException) return true;
        }
        return false;
    }

    static void txnFencing() throws Exception {
        String t = uniq("java-fence");
        try (Admin a = admin()) { createTopicAndWait(a, t, 2); }
        String txnId = uniq("java-tx");
        KafkaProducer<byte[], byte[]> zombie = txnProducer(txnId);
        try {
            zombie.beginTransaction();
            sendValues(zombie, t, "zombie-", 5);
            try (KafkaProducer<byte[], byte[]> successor = txnProducer(txnId)) {
                Throwable failure = null;
                try {
                    sendValues(zombie, t, "zombie-late-", 5);
                    zombie.commitTransaction();
                } catch (Exception e) {
                    failure = e;
                }
                check(failure != null, "the fenced producer committed");
                check(fenced(failure), "the fenced producer failed with " + failure + ", expected ProducerFencedException");
                successor.beginTransaction();
                sendValues(successor, t, "successor-", 4);
                successor.commitTransaction();
            }
        } finally {
            zombie.close(Duration.ZERO);
        }
        List<String> rc = readValues(t, 2, "read_committed");
        check(rc.equals(values("successor-", 4)), "read_committed saw " + rc + ", expected only the successor's records");
    }

}
