//! The catalogue of broker keys: Kafka's defaults, which keys change at run time, and which
//! keys are known without being read (so a stock server.properties is not a page of warnings).

use std::collections::BTreeMap;

use super::listeners::{METRICS_HOST, METRICS_PORT};
use super::log_config::TOPIC_CONFIGS;
use super::{invalid, ConfigError};

/// Keys that only an authorizer reads.
pub(super) const AUTHORIZER_ONLY_KEYS: &[&str] = &["super.users", "allow.everyone.if.no.acl.found"];
/// Keys outside [`DEFAULTS`] that the security check reads, so they are not "unknown".
pub(super) const SECURITY_KEYS: &[&str] = &[
    "authorizer.class.name",
    "control.plane.listener.name",
    "connection.failed.authentication.delay.ms",
    "connections.max.reauth.ms",
];

/// Kafka's broker keys that gregor reads, with Kafka's defaults. The value strings are parsed by
/// [`BrokerConfig::from_map`]; keys absent here but known to Kafka are accepted silently.
pub const DEFAULTS: &[(&str, &str)] = &[
    ("broker.id", "0"),
    ("broker.rack", ""),
    ("replica.selector.class", ""),
    ("listeners", "PLAINTEXT://127.0.0.1:9092"),
    ("advertised.listeners", ""),
    ("log.dirs", "./data"),
    ("num.partitions", "1"),
    ("max.request.partition.size.limit", "2000"),
    // Kafka has no bound here (it leaves it to a CreateTopicPolicy). Without one, a single
    // CreateTopics or CreatePartitions asking for 2^31 partitions exhausts memory; no real
    // topic comes near these.
    ("gregor.max.partitions.per.topic", "50000"),
    ("gregor.max.partitions.per.request", "100000"),
    // A client that reconnects in a loop after each refusal would otherwise write one log
    // line per attempt, thousands a second; Kafka has no such key.
    ("gregor.connection.log.interval.ms", "60000"),
    // Descriptors of the open-file limit kept for connections, the ZooKeeper session, index
    // files being mapped and reads in flight: segment files may take the rest.
    ("gregor.open.files.reserved", "1024"),
    // Segment `.log` files kept open at once, broker-wide (Kafka has no such bound: it keeps
    // one descriptor per segment). -1: the open-file limit less gregor.open.files.reserved,
    // within [64, 10000].
    ("gregor.log.segment.fd.cache.size", "-1"),
    // Segment index files mapped at once, broker-wide (Kafka maps every segment's two
    // indexes, which vm.max_map_count caps near 30,000 segments). -1: vm.max_map_count less
    // 8,192 maps kept for threads and the allocator.
    ("gregor.log.index.mmap.cache.size", "-1"),
    // Memory the arrays and tagged fields of one decoded request may take. A follower fetching
    // 20,000 partitions needs about 2 MB of it, a Metadata request naming 100,000 topics under
    // 10 MB; a frame of empty elements would otherwise decode into forty times its size.
    ("gregor.max.decoded.bytes.per.request", "67108864"),
    // How often TLS listeners look for a changed keystore or truststore file (0: never).
    ("gregor.ssl.store.check.interval.ms", "30000"),
    ("default.replication.factor", "1"),
    ("auto.create.topics.enable", "true"),
    ("delete.topic.enable", "true"),
    ("message.max.bytes", "1048588"),
    ("socket.request.max.bytes", "104857600"),
    ("max.connections", "2147483647"),
    ("max.connections.per.ip", "2147483647"),
    ("max.connections.per.ip.overrides", ""),
    ("connections.max.idle.ms", "600000"),
    ("max.connection.creation.rate", "2147483647"),
    ("queued.max.request.bytes", "-1"),
    ("queued.max.requests", "500"),
    ("zookeeper.connect", ""),
    ("zookeeper.session.timeout.ms", "18000"),
    ("zookeeper.connection.timeout.ms", ""),
    ("log.segment.bytes", "1073741824"),
    ("log.roll.hours", "168"),
    ("log.roll.ms", ""),
    ("log.retention.hours", "168"),
    ("log.retention.minutes", ""),
    ("log.retention.ms", ""),
    ("log.retention.bytes", "-1"),
    ("log.retention.check.interval.ms", "300000"),
    ("log.index.interval.bytes", "4096"),
    ("log.index.size.max.bytes", "10485760"),
    ("log.flush.interval.messages", "9223372036854775807"),
    ("log.flush.interval.ms", ""),
    ("log.flush.scheduler.interval.ms", "9223372036854775807"),
    ("log.flush.offset.checkpoint.interval.ms", "60000"),
    ("log.segment.delete.delay.ms", "60000"),
    ("log.cleanup.policy", "delete"),
    ("log.cleaner.enable", "true"),
    ("log.cleaner.threads", "1"),
    ("log.cleaner.dedupe.buffer.size", "134217728"),
    ("log.cleaner.io.buffer.size", "524288"),
    ("log.cleaner.io.buffer.load.factor", "0.9"),
    ("log.cleaner.io.max.bytes.per.second", "1.7976931348623157E308"),
    ("log.cleaner.backoff.ms", "15000"),
    ("log.cleaner.min.cleanable.ratio", "0.5"),
    ("log.cleaner.delete.retention.ms", "86400000"),
    ("log.cleaner.min.compaction.lag.ms", "0"),
    ("log.cleaner.max.compaction.lag.ms", "9223372036854775807"),
    ("compression.gzip.level", "-1"),
    ("compression.lz4.level", "9"),
    ("compression.zstd.level", "3"),
    ("log.roll.jitter.hours", "0"),
    ("log.roll.jitter.ms", ""),
    ("log.preallocate", "false"),
    ("log.message.format.version", "3.0-IV1"),
    ("log.message.timestamp.difference.max.ms", "9223372036854775807"),
    ("log.message.timestamp.before.max.ms", "9223372036854775807"),
    ("log.message.timestamp.after.max.ms", "9223372036854775807"),
    ("log.local.retention.ms", "-2"),
    ("log.local.retention.bytes", "-2"),
    ("log.message.timestamp.type", "CreateTime"),
    ("log.message.downconversion.enable", "true"),
    ("compression.type", "producer"),
    ("min.insync.replicas", "1"),
    ("unclean.leader.election.enable", "false"),
    ("offsets.topic.replication.factor", "3"),
    ("offsets.topic.num.partitions", "50"),
    ("offsets.topic.segment.bytes", "104857600"),
    ("transaction.state.log.replication.factor", "3"),
    ("transaction.state.log.min.isr", "2"),
    ("group.initial.rebalance.delay.ms", "3000"),
    ("num.network.threads", "3"),
    ("num.io.threads", "8"),
    ("num.recovery.threads.per.data.dir", "1"),
    ("replica.lag.time.max.ms", "30000"),
    ("socket.send.buffer.bytes", "102400"),
    ("socket.receive.buffer.bytes", "102400"),
    ("replica.fetch.max.bytes", "1048576"),
    ("replica.fetch.wait.max.ms", "500"),
    ("replica.socket.timeout.ms", "30000"),
    ("max.incremental.fetch.session.cache.slots", "1000"),
    ("replica.fetch.response.max.bytes", "10485760"),
    ("leader.replication.throttled.rate", "9223372036854775807"),
    ("follower.replication.throttled.rate", "9223372036854775807"),
    ("replica.alter.log.dirs.io.max.bytes.per.second", "9223372036854775807"),
    ("controlled.shutdown.enable", "true"),
    ("controlled.shutdown.max.retries", "3"),
    ("controlled.shutdown.retry.backoff.ms", "5000"),
    ("replica.fetch.backoff.ms", "1000"),
    ("offset.metadata.max.bytes", "4096"),
    ("offsets.commit.timeout.ms", "5000"),
    ("request.timeout.ms", "30000"),
    ("controller.socket.timeout.ms", "30000"),
    ("auto.leader.rebalance.enable", "true"),
    ("leader.imbalance.check.interval.seconds", "300"),
    ("broker.id.generation.enable", "true"),
    ("offsets.retention.minutes", "10080"),
    // Committed offsets copied to /consumers/<group>/offsets/<topic>/<partition> for the tools
    // of ZooKeeper-era clusters (Burrow's kafka_zk module, CMAK): the latest offset of each
    // partition, written at most max.writes at a time per interval (0 ms: no copy).
    ("gregor.offsets.zookeeper.mirror.interval.ms", "5000"),
    ("gregor.offsets.zookeeper.mirror.max.writes", "5000"),
    // Kafka's ZkNodeChangeNotificationListener's changeExpirationMs, fixed there at 15 minutes.
    ("gregor.config.change.expiration.ms", "900000"),
    // Client telemetry (KIP-714): off by default, as Kafka without a receiver plugin.
    ("gregor.client.telemetry.enable", "false"),
    ("telemetry.max.bytes", "1048576"),
    ("gregor.client.telemetry.max.clients", "16384"),
    ("gregor.client.telemetry.max.series", "10000"),
    ("gregor.client.telemetry.max.series.per.client", "500"),
    ("offsets.retention.check.interval.ms", "600000"),
    ("group.consumer.migration.policy", "bidirectional"),
    ("group.min.session.timeout.ms", "6000"),
    ("group.max.session.timeout.ms", "1800000"),
    ("transaction.state.log.num.partitions", "50"),
    ("transaction.state.log.segment.bytes", "104857600"),
    ("share.coordinator.state.topic.num.partitions", "50"),
    ("share.coordinator.state.topic.replication.factor", "3"),
    ("share.coordinator.state.topic.segment.bytes", "104857600"),
    ("share.coordinator.state.topic.min.isr", "2"),
    ("share.coordinator.snapshot.update.records.per.snapshot", "500"),
];

/// The broker keys that can be changed at run time through `/config/brokers/<id>` and
/// `/config/brokers/<default>` (a subset of Kafka's `DynamicBrokerConfig`): the defaults of
/// the topic-level configs, the replication throttles, the connection limits (Kafka's
/// SocketServer set), the cleaner's (LogCleaner's set), the I/O pool's size (Kafka's
/// DynamicThreadPool) and the SASL keys of Kafka's DynamicListenerConfig set.
pub fn is_dynamic_broker_config(key: &str) -> bool {
    TOPIC_CONFIGS.iter().any(|(_, broker_key)| *broker_key == key)
        || LIVE_BROKER_KEYS.contains(&key)
        || PER_BROKER_SASL_KEYS.contains(&key)
}

/// The SASL keys of Kafka 3.9's DynamicListenerConfig.ReconfigurableConfigs. Kafka takes them
/// for one broker only (`/config/brokers/<id>`), never cluster-wide, and, as its channel
/// builders reconfigure only their TLS, a running listener keeps the SASL settings it was
/// built with. gregor implements neither Kerberos nor OAUTHBEARER's login refresh, so the
/// `sasl.kerberos.*` and `sasl.login.refresh.*` values are kept and described, used by nothing.
pub const PER_BROKER_SASL_KEYS: &[&str] = &[
    "sasl.mechanism.inter.broker.protocol",
    "sasl.jaas.config",
    "sasl.enabled.mechanisms",
    "sasl.kerberos.service.name",
    "sasl.kerberos.kinit.cmd",
    "sasl.kerberos.ticket.renew.window.factor",
    "sasl.kerberos.ticket.renew.jitter",
    "sasl.kerberos.min.time.before.relogin",
    "sasl.kerberos.principal.to.local.rules",
    "sasl.login.refresh.window.factor",
    "sasl.login.refresh.window.jitter",
    "sasl.login.refresh.min.period.seconds",
    "sasl.login.refresh.buffer.seconds",
];

/// Whether Kafka refuses `key` in the cluster-wide entity (DynamicBrokerConfig's
/// PerBrokerConfigs, of those gregor takes).
pub fn is_per_broker_only(key: &str) -> bool {
    PER_BROKER_SASL_KEYS.contains(&key)
}

/// Kafka's type check (validateConfigTypes) of a SASL key's dynamic value: its ConfigDef
/// type, and the ranges of the `sasl.login.refresh.*` keys.
pub(super) fn check_sasl_value(key: &str, value: &str) -> Result<(), ConfigError> {
    let v = value.trim();
    let double = |min: f64, max: f64| -> Result<(), ConfigError> {
        let n: f64 = v.parse().map_err(|_| invalid(key, value, "Not a number of type DOUBLE"))?;
        if n < min {
            return Err(invalid(key, value, format!("Value must be at least {min:?}")));
        }
        if n > max {
            return Err(invalid(key, value, format!("Value must be no more than {max:?}")));
        }
        Ok(())
    };
    let short = |max: i16| -> Result<(), ConfigError> {
        let n: i16 = v.parse().map_err(|_| invalid(key, value, "Not a number of type SHORT"))?;
        if n < 0 {
            return Err(invalid(key, value, "Value must be at least 0"));
        }
        if n > max {
            return Err(invalid(key, value, format!("Value must be no more than {max}")));
        }
        Ok(())
    };
    match key {
        "sasl.kerberos.ticket.renew.window.factor" | "sasl.kerberos.ticket.renew.jitter" => {
            double(f64::NEG_INFINITY, f64::INFINITY)
        }
        "sasl.kerberos.min.time.before.relogin" => {
            v.parse::<i64>().map(|_| ()).map_err(|_| invalid(key, value, "Not a number of type LONG"))
        }
        "sasl.login.refresh.window.factor" => double(0.5, 1.0),
        "sasl.login.refresh.window.jitter" => double(0.0, 0.25),
        "sasl.login.refresh.min.period.seconds" => short(900),
        "sasl.login.refresh.buffer.seconds" => short(3600),
        _ => Ok(()),
    }
}

/// Dynamic broker keys beyond the topic defaults, each applied live by the component using it.
pub(super) const LIVE_BROKER_KEYS: &[&str] = &[
    "leader.replication.throttled.rate",
    "follower.replication.throttled.rate",
    "replica.alter.log.dirs.io.max.bytes.per.second",
    "max.connections",
    "max.connections.per.ip",
    "max.connections.per.ip.overrides",
    "max.connection.creation.rate",
    "log.cleaner.threads",
    "log.cleaner.dedupe.buffer.size",
    "log.cleaner.io.buffer.size",
    "log.cleaner.io.buffer.load.factor",
    "log.cleaner.io.max.bytes.per.second",
    "log.cleaner.backoff.ms",
    "num.io.threads",
];

/// Keys Kafka 3.9 updates dynamically (DynamicBrokerConfig's reconfigurable sets) that gregor
/// cannot apply without a restart: refused rather than stored and ignored. Keys of Kafka's
/// listener and SSL sets are refused by their prefix as well (see
/// [`is_dynamic_in_kafka_only`]).
pub(super) const KAFKA_ONLY_DYNAMIC_KEYS: &[&str] = &[
    "num.replica.fetchers",
    "num.recovery.threads.per.data.dir",
    "background.threads",
    "num.network.threads",
    "metric.reporters",
    "listeners",
    "advertised.listeners",
    "listener.security.protocol.map",
    "principal.builder.class",
    "producer.id.expiration.ms",
    "transaction.partition.verification.enable",
    "ssl.client.auth",
];

/// Whether Kafka 3.9 would update `key` dynamically while gregor cannot (then AlterConfigs
/// refuses it with INVALID_REQUEST naming it).
pub fn is_dynamic_in_kafka_only(key: &str) -> bool {
    if is_dynamic_broker_config(key) {
        return false;
    }
    KAFKA_ONLY_DYNAMIC_KEYS.contains(&key)
        || key.starts_with("listener.name.")
        || key.starts_with("ssl.")
        || key.starts_with("remote.log.")
}

/// Keys Kafka knows that gregor accepts without acting on them, so a stock server.properties
/// does not produce a page of warnings.
pub(super) fn is_passthrough_key(key: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "log.",
        "socket.",
        "num.",
        "replica.",
        "offsets.",
        "transaction.",
        "group.",
        "zookeeper.",
        "listener.",
        "sasl.",
        "ssl.",
        "security.",
        "inter.broker.",
        "controller.",
        "queued.",
        "metric",
        "confluent.",
    ];
    PREFIXES.iter().any(|p| key.starts_with(p))
}

/// Warns about each given key that nothing reads: an authorizer key without an authorizer, or a
/// key neither Kafka's nor gregor's.
pub(super) fn warn_unused(given: &BTreeMap<String, String>) {
    for key in given.keys() {
        if AUTHORIZER_ONLY_KEYS.contains(&key.as_str()) {
            if given.get("authorizer.class.name").is_none_or(|v| v.trim().is_empty()) {
                tracing::warn!(key = %key, "has no effect without authorizer.class.name; ignored");
            }
        } else if !DEFAULTS.iter().any(|(k, _)| k == key)
            && !SECURITY_KEYS.contains(&key.as_str())
            && key != METRICS_PORT
            && key != METRICS_HOST
            && !is_passthrough_key(key)
        {
            tracing::warn!(key = %key, "unknown configuration key; ignored");
        }
    }
}

/// Kafka's defaults overlaid with the given keys.
pub(super) fn with_defaults(given: BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut values: BTreeMap<String, String> = DEFAULTS.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    values.extend(given);
    // `log.dir` is Kafka's single-directory alias, used only when `log.dirs` is not given.
    if let Some(dir) = values.get("log.dir").cloned() {
        if values.get("log.dirs").map(String::as_str) == Some("./data") {
            values.insert("log.dirs".into(), dir);
        }
    }
    values
}
