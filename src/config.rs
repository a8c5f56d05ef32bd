//! Broker configuration, read the way Kafka reads it.
//!
//! Sources, lowest precedence first: Kafka's defaults, a `server.properties` (Java properties) or
//! `*.toml` file, `KAFKA_<KEY>` environment variables (as the common Kafka images map them), and
//! `--override key=value` arguments. Every key keeps Kafka's name. An unknown key is a warning;
//! a value that does not parse is an error naming the key, and the broker does not start.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::log::LogConfig;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid TOML: {message}")]
    Toml { path: PathBuf, message: String },
    #[error("invalid value {value:?} for configuration {key}: {reason}")]
    Invalid { key: String, value: String, reason: String },
    #[error("--override expects key=value, got {0:?}")]
    Override(String),
    /// A setting gregor cannot honour, where ignoring it would serve with less security than
    /// the configuration asks for.
    #[error("{key}: {reason}")]
    Unsupported { key: String, reason: String },
}

fn invalid(key: &str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.to_string(), value: value.to_string(), reason: reason.into() }
}

fn unsupported(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Unsupported { key: key.to_string(), reason: reason.into() }
}

/// The authorizer class names gregor serves (the second is the pre-2.4 name of the same
/// authorizer).
pub const ACL_AUTHORIZER_CLASSES: &[&str] =
    &["kafka.security.authorizer.AclAuthorizer", "kafka.security.auth.SimpleAclAuthorizer"];

/// Kafka's `SecurityProtocol` names.
const SECURITY_PROTOCOLS: &[&str] = &["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"];
/// Kafka's default `security.inter.broker.protocol`, and the name of the listener it picks.
const PLAINTEXT: &str = "PLAINTEXT";
/// Kafka's default `listener.security.protocol.map`: each protocol name maps to itself.
const DEFAULT_PROTOCOL_MAP: &str = "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL";
/// Keys that only an authorizer reads.
const AUTHORIZER_ONLY_KEYS: &[&str] = &["super.users", "allow.everyone.if.no.acl.found"];
/// Keys outside [`DEFAULTS`] that [`check_security`] reads, so they are not "unknown".
const SECURITY_KEYS: &[&str] = &[
    "authorizer.class.name",
    "control.plane.listener.name",
    "connection.failed.authentication.delay.ms",
    "connections.max.reauth.ms",
];
/// gregor's own keys (Kafka exposes metrics over JMX instead). Not in [`DEFAULTS`]: unset means
/// off, and DescribeConfigs lists them only where they are set.
const METRICS_PORT: &str = "metrics.port";
const METRICS_HOST: &str = "metrics.host";
const METRICS_DEFAULT_HOST: &str = "0.0.0.0";

/// One `NAME://host:port` entry of `listeners` / `advertised.listeners`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub listener_name: String,
    pub host: String,
    pub port: u16,
    /// From `listener.security.protocol.map` once [`BrokerConfig::from_map`] resolved it; until
    /// then what Kafka's default map gives (the upper-cased name), e.g. for the endpoints of other
    /// brokers read from ZooKeeper, where only host and port are used.
    security_protocol: String,
}

impl Endpoint {
    /// Another broker's endpoint, as the controller passed it on.
    pub fn of_broker(listener_name: String, host: String, port: u16, security_protocol: &str) -> Endpoint {
        Endpoint { listener_name, host, port, security_protocol: security_protocol.to_string() }
    }

    pub fn security_protocol(&self) -> &str {
        &self.security_protocol
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "{}://[{}]:{}", self.listener_name, self.host, self.port)
        } else {
            write!(f, "{}://{}:{}", self.listener_name, self.host, self.port)
        }
    }
}

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
    // Descriptors kept for connections, the ZooKeeper session and rolls when new partitions
    // are weighed against the open-file limit (one descriptor per segment file).
    ("gregor.open.files.reserved", "1024"),
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
    ("offsets.retention.check.interval.ms", "600000"),
    ("group.min.session.timeout.ms", "6000"),
    ("group.max.session.timeout.ms", "1800000"),
    ("transaction.state.log.num.partitions", "50"),
    ("transaction.state.log.segment.bytes", "104857600"),
];

/// Environment variables of Kafka images that are not broker settings.
const NON_CONFIG_ENV: &[&str] = &[
    "KAFKA_HOME",
    "KAFKA_OPTS",
    "KAFKA_HEAP_OPTS",
    "KAFKA_JMX_OPTS",
    "KAFKA_JVM_PERFORMANCE_OPTS",
    "KAFKA_LOG4J_OPTS",
    "KAFKA_DEBUG",
    "KAFKA_GC_LOG_OPTS",
    "KAFKA_VERSION",
    "KAFKA_CLUSTER_ID",
    // The Confluent image's own settings, read by its start scripts rather than by Kafka.
    "KAFKA_JMX_PORT",
    "KAFKA_JMX_HOSTNAME",
    "KAFKA_LOG4J_ROOT_LOGLEVEL",
    "KAFKA_LOG4J_LOGGERS",
    "KAFKA_TOOLS_LOG4J_LOGLEVEL",
];

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub broker_id: i32,
    pub rack: Option<String>,
    /// `replica.selector.class` is Kafka's `RackAwareReplicaSelector`: a leader sends a
    /// consumer in another rack to a replica in the consumer's rack (KIP-392).
    pub rack_aware_selector: bool,
    pub listeners: Vec<Endpoint>,
    pub advertised_listeners: Vec<Endpoint>,
    /// The listener other brokers and the controller reach this one on (and it reaches
    /// them on): `inter.broker.listener.name`, else the listener named after
    /// `security.inter.broker.protocol` (PLAINTEXT), else the first one.
    pub inter_broker_listener: String,
    pub log_dirs: Vec<PathBuf>,
    pub num_partitions: i32,
    /// `max.request.partition.size.limit`: the most partitions one DescribeTopicPartitions
    /// answer holds (Kafka 3.8+).
    pub max_request_partition_size_limit: i32,
    /// `gregor.max.partitions.per.topic`: the most partitions one topic may have.
    pub max_partitions_per_topic: i32,
    /// `gregor.max.partitions.per.request`: the most partitions one CreateTopics or
    /// CreatePartitions request may bring into being.
    pub max_partitions_per_request: i64,
    /// `gregor.connection.log.interval.ms`: per client address, at most one line about a
    /// refused or closed connection in this interval; the rest are counted in the next one.
    pub connection_log_interval: std::time::Duration,
    /// `gregor.open.files.reserved`: of the open-file limit, what new partitions may not take.
    pub open_files_reserved: u64,
    pub default_replication_factor: i16,
    pub auto_create_topics_enable: bool,
    pub delete_topic_enable: bool,
    pub socket_request_max_bytes: usize,
    pub zookeeper_connect: Option<String>,
    pub zookeeper_session_timeout_ms: u64,
    pub zookeeper_connection_timeout_ms: u64,
    pub log_retention_check_interval_ms: u64,
    pub log_flush_scheduler_interval_ms: u64,
    pub log_flush_offset_checkpoint_interval_ms: u64,
    pub min_insync_replicas: i32,
    pub replica_lag_time_max_ms: u64,
    pub replica_fetch_wait_max_ms: u64,
    /// Fetch sessions kept at most (KIP-227); 0: none.
    pub max_incremental_fetch_session_cache_slots: usize,
    pub replica_fetch_max_bytes: i32,
    pub replica_fetch_response_max_bytes: i32,
    /// `leader.replication.throttled.rate` and `follower.replication.throttled.rate`: bytes/s
    /// for the throttled replicas of reassignments (dynamic; Long.MaxValue: none).
    pub leader_replication_throttled_rate: u64,
    pub follower_replication_throttled_rate: u64,
    /// `replica.alter.log.dirs.io.max.bytes.per.second`: bytes/s copied by log dir moves
    /// (dynamic; Long.MaxValue: none).
    pub replica_alter_log_dirs_io_max_bytes_per_second: u64,
    /// Where `/metrics` is served (`metrics.host`, `metrics.port`); None: not served.
    pub metrics_address: Option<(String, u16)>,
    /// `max.connections`: client connections over all listeners but the inter-broker one.
    pub max_connections: usize,
    /// `max.connections.per.ip`, and its `max.connections.per.ip.overrides`.
    pub max_connections_per_ip: usize,
    pub max_connections_per_ip_overrides: Vec<(std::net::IpAddr, usize)>,
    /// `connections.max.idle.ms`: a connection that sends no request for this long is closed.
    pub connections_max_idle: std::time::Duration,
    /// `listener.name.<listener>.max.connections`, by listener name as written in `listeners`.
    pub listener_max_connections: HashMap<String, usize>,
    /// `max.connection.creation.rate`: new connections per second over the broker's listeners
    /// but the inter-broker one (None: Kafka's default, Int.MaxValue, no limit).
    pub max_connection_creation_rate: Option<u32>,
    /// `listener.name.<listener>.max.connection.creation.rate`, by listener name.
    pub listener_max_connection_creation_rate: HashMap<String, u32>,
    /// `gregor.max.decoded.bytes.per.request`: the memory a request's arrays and tagged fields
    /// may take once decoded; a request needing more is refused and its connection closed.
    pub max_decoded_bytes_per_request: usize,
    /// `queued.max.request.bytes`: the memory for requests being read and handled, over all
    /// connections (None: Kafka's default, -1, no limit).
    pub queued_max_request_bytes: Option<usize>,
    /// `queued.max.requests`: requests being decoded and handled at once over all connections;
    /// a request parked in a purgatory (long-poll fetch, acks=all produce) gives its slot back.
    pub queued_max_requests: usize,
    /// `num.io.threads`: appends, fsyncs, segment rolls and the record reads of fetches run on
    /// at most this many threads at once, never on the async network workers.
    pub num_io_threads: usize,
    /// How `__consumer_offsets` is created.
    pub offsets_topic: InternalTopicConfig,
    /// `gregor.offsets.zookeeper.mirror.interval.ms`: how often committed offsets are copied
    /// into ZooKeeper's old offsets tree; None: never.
    pub offsets_zk_mirror_interval: Option<std::time::Duration>,
    /// `gregor.offsets.zookeeper.mirror.max.writes`: znode writes per copy at most.
    pub offsets_zk_mirror_max_writes: usize,
    /// `gregor.config.change.expiration.ms`: how old a `/config/changes` notification must be
    /// before a broker deletes it (Kafka: 15 minutes, not configurable).
    pub config_change_expiration_ms: i64,
    /// How `__transaction_state` is created.
    pub transaction_state_log: InternalTopicConfig,
    /// `offset.metadata.max.bytes`: the longest metadata string an offset commit may carry.
    pub offset_metadata_max_bytes: usize,
    /// `offsets.commit.timeout.ms`: how long an offset commit waits for its append to
    /// `__consumer_offsets` to be replicated before it answers REQUEST_TIMED_OUT.
    pub offsets_commit_timeout: std::time::Duration,
    /// `replica.fetch.backoff.ms`: how long a follower waits after a failed fetch.
    pub replica_fetch_backoff: std::time::Duration,
    /// `controlled.shutdown.max.retries`: how often a stopping broker asks the controller
    /// again to move its leaderships.
    pub controlled_shutdown_max_retries: u32,
    /// `controlled.shutdown.retry.backoff.ms`: the pause between those attempts.
    pub controlled_shutdown_retry_backoff: std::time::Duration,
    /// `request.timeout.ms`: how long a request to another broker may wait for its answer
    /// (the inter-broker client takes it from here).
    pub request_timeout: std::time::Duration,
    /// The topic-level defaults derived from the `log.*` keys.
    pub log: LogConfig,
    /// The `log.cleaner.*` settings.
    pub cleaner: crate::log::cleaner::CleanerConfig,
    /// Every key as finally resolved (defaults included), for DescribeConfigs.
    pub values: BTreeMap<String, String>,
    /// The keys the operator set (file, environment, overrides), as given: what DescribeConfigs
    /// reports as STATIC_BROKER_CONFIG rather than DEFAULT_CONFIG.
    pub given: BTreeMap<String, String>,
}

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
fn check_sasl_value(key: &str, value: &str) -> Result<(), ConfigError> {
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
const LIVE_BROKER_KEYS: &[&str] = &[
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
const KAFKA_ONLY_DYNAMIC_KEYS: &[&str] = &[
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

impl BrokerConfig {
    /// This configuration with dynamic values (cluster-wide defaults overlaid with this
    /// broker's own) over the static ones; `given` stays what the operator set statically.
    pub fn with_dynamic(&self, dynamic: &BTreeMap<String, String>) -> Result<BrokerConfig, ConfigError> {
        if let Some(key) = dynamic.keys().find(|k| !is_dynamic_broker_config(k)) {
            return Err(invalid(key, &dynamic[key], "cannot be updated dynamically"));
        }
        for (k, v) in dynamic.iter().filter(|(k, _)| is_per_broker_only(k)) {
            check_sasl_value(k, v)?;
        }
        let mut map = self.given.clone();
        map.extend(dynamic.iter().map(|(k, v)| (k.clone(), v.clone())));
        // Kafka's precedence among the retention keys is ms, minutes, hours: a dynamic
        // log.retention.ms must win over a static log.retention.hours, which it does.
        let mut next = BrokerConfig::from_map(map)?;
        next.broker_id = self.broker_id;
        next.given = self.given.clone();
        Ok(next)
    }

    /// Reads the file (if any), then the environment, then the overrides.
    pub fn load(
        file: Option<&Path>,
        overrides: &[String],
        env: impl Iterator<Item = (String, String)>,
    ) -> Result<BrokerConfig, ConfigError> {
        let mut map = BTreeMap::new();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
            let entries = if path.extension().is_some_and(|e| e == "toml") {
                parse_toml(&text).map_err(|message| ConfigError::Toml { path: path.to_path_buf(), message })?
            } else {
                parse_properties(&text)
            };
            map.extend(entries);
        }
        for (name, value) in env {
            if let Some(key) = env_to_key(&name) {
                map.insert(key, value);
            }
        }
        for item in overrides {
            let (k, v) = item.split_once('=').ok_or_else(|| ConfigError::Override(item.clone()))?;
            map.insert(k.trim().to_string(), v.trim().to_string());
        }
        Self::from_map(map)
    }

    pub fn from_map(given: BTreeMap<String, String>) -> Result<BrokerConfig, ConfigError> {
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
        let mut values: BTreeMap<String, String> =
            DEFAULTS.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let given_keys = given.clone();
        values.extend(given);
        // `log.dir` is Kafka's single-directory alias, used only when `log.dirs` is not given.
        if let Some(dir) = values.get("log.dir").cloned() {
            if values.get("log.dirs").map(String::as_str) == Some("./data") {
                values.insert("log.dirs".into(), dir);
            }
        }
        let get = |k: &str| values.get(k).map(String::as_str).unwrap_or("");

        let protocols = parse_protocol_map(
            values.get("listener.security.protocol.map").map_or(DEFAULT_PROTOCOL_MAP, String::as_str),
        )?;
        let mut listeners = parse_endpoints("listeners", get("listeners"))?;
        if listeners.is_empty() {
            return Err(invalid("listeners", get("listeners"), "at least one listener is required"));
        }
        resolve_protocols("listeners", &mut listeners, &protocols)?;
        let advertised_listeners = if get("advertised.listeners").is_empty() {
            listeners.clone()
        } else {
            let mut eps = parse_endpoints("advertised.listeners", get("advertised.listeners"))?;
            resolve_protocols("advertised.listeners", &mut eps, &protocols)?;
            eps
        };
        check_security(&values, &listeners, &advertised_listeners)?;
        check_security_keys(&values)?;
        let tls_sasl_keys = tls_sasl_keys(&values);
        if !tls_sasl_keys.is_empty() && listeners.iter().all(|e| e.security_protocol == PLAINTEXT) {
            // Names only: values such as sasl.jaas.config hold secrets.
            tracing::warn!(
                keys = %tls_sasl_keys.join(","),
                "SSL/SASL settings apply to SSL and SASL listeners only; with only PLAINTEXT listeners they have no effect"
            );
        }
        if let Some(ep) =
            advertised_listeners.iter().find(|e| e.host == "0.0.0.0" || e.host == "::" || e.host.is_empty())
        {
            return Err(invalid(
                "advertised.listeners",
                &ep.to_string(),
                "advertised.listeners cannot use the nonroutable meta-address 0.0.0.0; set advertised.listeners to a \
                 routable address",
            ));
        }
        let log_dirs: Vec<PathBuf> =
            get("log.dirs").split(',').map(str::trim).filter(|s| !s.is_empty()).map(PathBuf::from).collect();
        if log_dirs.is_empty() {
            return Err(invalid("log.dirs", get("log.dirs"), "at least one directory is required"));
        }

        let hours_ms = |k: &str| -> Result<i64, ConfigError> { Ok(num::<i64>(k, get(k))?.saturating_mul(3_600_000)) };
        let retention_ms = if !get("log.retention.ms").is_empty() {
            num::<i64>("log.retention.ms", get("log.retention.ms"))?
        } else if !get("log.retention.minutes").is_empty() {
            num::<i64>("log.retention.minutes", get("log.retention.minutes"))?.saturating_mul(60_000)
        } else {
            hours_ms("log.retention.hours")?
        };
        let segment_ms = if get("log.roll.ms").is_empty() {
            hours_ms("log.roll.hours")?
        } else {
            num::<i64>("log.roll.ms", get("log.roll.ms"))?
        };
        let flush_interval_ms = if get("log.flush.interval.ms").is_empty() {
            u64::MAX
        } else {
            num::<u64>("log.flush.interval.ms", get("log.flush.interval.ms"))?
        };
        let message_max_bytes = num::<u32>("message.max.bytes", get("message.max.bytes"))?;
        let (compact, delete) = cleanup_policy("log.cleanup.policy", get("log.cleanup.policy"))?;
        let log = LogConfig {
            segment_bytes: positive::<u64>("log.segment.bytes", get("log.segment.bytes"))?,
            segment_ms,
            index_interval_bytes: num::<u32>("log.index.interval.bytes", get("log.index.interval.bytes"))?,
            max_index_size: positive::<u32>("log.index.size.max.bytes", get("log.index.size.max.bytes"))?,
            retention_ms,
            retention_bytes: num::<i64>("log.retention.bytes", get("log.retention.bytes"))?,
            max_message_bytes: message_max_bytes,
            flush_interval_messages: positive::<u64>(
                "log.flush.interval.messages",
                get("log.flush.interval.messages"),
            )?,
            flush_interval_ms,
            file_delete_delay_ms: num::<u64>("log.segment.delete.delay.ms", get("log.segment.delete.delay.ms"))?,
            message_downconversion_enable: boolean(
                "log.message.downconversion.enable",
                get("log.message.downconversion.enable"),
            )?,
            compact,
            delete,
            delete_retention_ms: at_least(
                "log.cleaner.delete.retention.ms",
                get("log.cleaner.delete.retention.ms"),
                0,
            )?,
            min_compaction_lag_ms: at_least(
                "log.cleaner.min.compaction.lag.ms",
                get("log.cleaner.min.compaction.lag.ms"),
                0,
            )?,
            max_compaction_lag_ms: at_least(
                "log.cleaner.max.compaction.lag.ms",
                get("log.cleaner.max.compaction.lag.ms"),
                1,
            )?,
            min_cleanable_dirty_ratio: ratio(
                "log.cleaner.min.cleanable.ratio",
                get("log.cleaner.min.cleanable.ratio"),
            )?,
            log_append_time: timestamp_type("log.message.timestamp.type", get("log.message.timestamp.type"))?,
        };
        check_compaction_lags("log.cleaner.min.compaction.lag.ms", &log)?;
        let cleaner = crate::log::cleaner::CleanerConfig {
            enable: boolean("log.cleaner.enable", get("log.cleaner.enable"))?,
            threads: positive::<usize>("log.cleaner.threads", get("log.cleaner.threads"))?,
            dedupe_buffer_size: positive::<u64>(
                "log.cleaner.dedupe.buffer.size",
                get("log.cleaner.dedupe.buffer.size"),
            )?,
            io_buffer_size: positive::<usize>("log.cleaner.io.buffer.size", get("log.cleaner.io.buffer.size"))?,
            io_buffer_load_factor: load_factor(
                "log.cleaner.io.buffer.load.factor",
                get("log.cleaner.io.buffer.load.factor"),
            )?,
            max_io_bytes_per_second: positive::<f64>(
                "log.cleaner.io.max.bytes.per.second",
                get("log.cleaner.io.max.bytes.per.second"),
            )?,
            backoff_ms: positive::<u64>("log.cleaner.backoff.ms", get("log.cleaner.backoff.ms"))?,
            decompress_limit: positive::<usize>("socket.request.max.bytes", get("socket.request.max.bytes"))?,
        };
        let zk = get("zookeeper.connect").trim().to_string();
        let session_ms = positive::<u64>("zookeeper.session.timeout.ms", get("zookeeper.session.timeout.ms"))?;
        let connection_ms = if get("zookeeper.connection.timeout.ms").is_empty() {
            session_ms
        } else {
            positive::<u64>("zookeeper.connection.timeout.ms", get("zookeeper.connection.timeout.ms"))?
        };
        let rack = Some(get("broker.rack").to_string()).filter(|r| !r.is_empty());
        let rack_aware_selector =
            match get("replica.selector.class").trim() {
                "" | "org.apache.kafka.common.replica.LeaderSelector" => false,
                "org.apache.kafka.common.replica.RackAwareReplicaSelector" => true,
                other => return Err(invalid(
                    "replica.selector.class",
                    other,
                    "only org.apache.kafka.common.replica.RackAwareReplicaSelector (or LeaderSelector) is available",
                )),
            };
        let inter_broker_listener = inter_broker_listener(
            get("inter.broker.listener.name"),
            get("security.inter.broker.protocol"),
            &advertised_listeners,
        );
        let listener_max_connections = listener_max_connections(&values, &listeners)?;
        let listener_max_connection_creation_rate = listener_creation_rates(&values, &listeners)?;
        let metrics_address = metrics_address(get(METRICS_HOST), get(METRICS_PORT))?;
        let config = BrokerConfig {
            broker_id: num::<i32>("broker.id", get("broker.id"))?,
            rack,
            rack_aware_selector,
            listeners,
            advertised_listeners,
            inter_broker_listener,
            log_dirs,
            num_partitions: positive::<i32>("num.partitions", get("num.partitions"))?,
            max_request_partition_size_limit: positive::<i32>(
                "max.request.partition.size.limit",
                get("max.request.partition.size.limit"),
            )?,
            max_partitions_per_topic: positive::<i32>(
                "gregor.max.partitions.per.topic",
                get("gregor.max.partitions.per.topic"),
            )?,
            max_partitions_per_request: positive::<i64>(
                "gregor.max.partitions.per.request",
                get("gregor.max.partitions.per.request"),
            )?,
            connection_log_interval: std::time::Duration::from_millis(positive::<u64>(
                "gregor.connection.log.interval.ms",
                get("gregor.connection.log.interval.ms"),
            )?),
            open_files_reserved: num::<u64>("gregor.open.files.reserved", get("gregor.open.files.reserved"))?,
            default_replication_factor: positive::<i16>(
                "default.replication.factor",
                get("default.replication.factor"),
            )?,
            auto_create_topics_enable: boolean("auto.create.topics.enable", get("auto.create.topics.enable"))?,
            delete_topic_enable: boolean("delete.topic.enable", get("delete.topic.enable"))?,
            socket_request_max_bytes: positive::<usize>("socket.request.max.bytes", get("socket.request.max.bytes"))?,
            zookeeper_connect: Some(zk).filter(|s| !s.is_empty()),
            zookeeper_session_timeout_ms: session_ms,
            zookeeper_connection_timeout_ms: connection_ms,
            log_retention_check_interval_ms: positive::<u64>(
                "log.retention.check.interval.ms",
                get("log.retention.check.interval.ms"),
            )?,
            log_flush_scheduler_interval_ms: positive::<u64>(
                "log.flush.scheduler.interval.ms",
                get("log.flush.scheduler.interval.ms"),
            )?,
            log_flush_offset_checkpoint_interval_ms: positive::<u64>(
                "log.flush.offset.checkpoint.interval.ms",
                get("log.flush.offset.checkpoint.interval.ms"),
            )?,
            min_insync_replicas: positive::<i32>("min.insync.replicas", get("min.insync.replicas"))?,
            replica_lag_time_max_ms: positive::<u64>("replica.lag.time.max.ms", get("replica.lag.time.max.ms"))?,
            replica_fetch_wait_max_ms: num::<u64>("replica.fetch.wait.max.ms", get("replica.fetch.wait.max.ms"))?,
            max_incremental_fetch_session_cache_slots: num::<usize>(
                "max.incremental.fetch.session.cache.slots",
                get("max.incremental.fetch.session.cache.slots"),
            )?,
            replica_fetch_max_bytes: positive::<i32>("replica.fetch.max.bytes", get("replica.fetch.max.bytes"))?,
            replica_fetch_response_max_bytes: positive::<i32>(
                "replica.fetch.response.max.bytes",
                get("replica.fetch.response.max.bytes"),
            )?,
            leader_replication_throttled_rate: num::<u64>(
                "leader.replication.throttled.rate",
                get("leader.replication.throttled.rate"),
            )?,
            follower_replication_throttled_rate: num::<u64>(
                "follower.replication.throttled.rate",
                get("follower.replication.throttled.rate"),
            )?,
            replica_alter_log_dirs_io_max_bytes_per_second: num::<u64>(
                "replica.alter.log.dirs.io.max.bytes.per.second",
                get("replica.alter.log.dirs.io.max.bytes.per.second"),
            )?,
            metrics_address,
            max_connections: non_negative_usize("max.connections", get("max.connections"))?,
            max_connections_per_ip: non_negative_usize("max.connections.per.ip", get("max.connections.per.ip"))?,
            max_connections_per_ip_overrides: per_ip_overrides(get("max.connections.per.ip.overrides"))?,
            connections_max_idle: std::time::Duration::from_millis(positive::<u64>(
                "connections.max.idle.ms",
                get("connections.max.idle.ms"),
            )?),
            listener_max_connections,
            max_connection_creation_rate: creation_rate(
                "max.connection.creation.rate",
                get("max.connection.creation.rate"),
            )?,
            listener_max_connection_creation_rate,
            queued_max_request_bytes: request_bytes_pool(get("queued.max.request.bytes"))?,
            queued_max_requests: positive("queued.max.requests", get("queued.max.requests"))?,
            num_io_threads: at_least("num.io.threads", get("num.io.threads"), 1)? as usize,
            max_decoded_bytes_per_request: positive(
                "gregor.max.decoded.bytes.per.request",
                get("gregor.max.decoded.bytes.per.request"),
            )?,
            offsets_topic: InternalTopicConfig::parse("offsets.topic", &get)?,
            offsets_zk_mirror_interval: Some(num::<u64>(
                "gregor.offsets.zookeeper.mirror.interval.ms",
                get("gregor.offsets.zookeeper.mirror.interval.ms"),
            )?)
            .filter(|ms| *ms > 0)
            .map(std::time::Duration::from_millis),
            offsets_zk_mirror_max_writes: positive::<usize>(
                "gregor.offsets.zookeeper.mirror.max.writes",
                get("gregor.offsets.zookeeper.mirror.max.writes"),
            )?,
            config_change_expiration_ms: positive::<i64>(
                "gregor.config.change.expiration.ms",
                get("gregor.config.change.expiration.ms"),
            )?,
            transaction_state_log: InternalTopicConfig::parse("transaction.state.log", &get)?,
            offset_metadata_max_bytes: num::<usize>("offset.metadata.max.bytes", get("offset.metadata.max.bytes"))?,
            offsets_commit_timeout: std::time::Duration::from_millis(positive::<u64>(
                "offsets.commit.timeout.ms",
                get("offsets.commit.timeout.ms"),
            )?),
            replica_fetch_backoff: std::time::Duration::from_millis(num::<u64>(
                "replica.fetch.backoff.ms",
                get("replica.fetch.backoff.ms"),
            )?),
            controlled_shutdown_max_retries: num::<u32>(
                "controlled.shutdown.max.retries",
                get("controlled.shutdown.max.retries"),
            )?,
            controlled_shutdown_retry_backoff: std::time::Duration::from_millis(num::<u64>(
                "controlled.shutdown.retry.backoff.ms",
                get("controlled.shutdown.retry.backoff.ms"),
            )?),
            request_timeout: std::time::Duration::from_millis(positive::<u64>(
                "request.timeout.ms",
                get("request.timeout.ms"),
            )?),
            log,
            cleaner,
            values: values.clone(),
            given: given_keys,
        };
        for key in ["log.cleaner.enable", "unclean.leader.election.enable", "controlled.shutdown.enable"] {
            boolean(key, get(key))?;
        }
        if config.num_partitions > config.max_partitions_per_topic {
            return Err(invalid(
                "num.partitions",
                get("num.partitions"),
                format!("exceeds gregor.max.partitions.per.topic ({})", config.max_partitions_per_topic),
            ));
        }
        Ok(config)
    }

    /// The endpoint clients should use, matching the listener they connected to.
    pub fn advertised_for(&self, listener_name: &str) -> Option<&Endpoint> {
        self.advertised_listeners
            .iter()
            .find(|e| e.listener_name == listener_name)
            .or_else(|| self.advertised_listeners.first())
    }
}

/// The shape of an internal topic, from `<prefix>.num.partitions`, `.replication.factor`,
/// `.segment.bytes` and (transaction log only) `.min.isr`. Kafka refuses to start when any is
/// below 1, and so does gregor: a zero here would only surface when the topic is first used.
#[derive(Debug, Clone, PartialEq)]
pub struct InternalTopicConfig {
    pub num_partitions: i32,
    pub replication_factor: i16,
    pub segment_bytes: i32,
    pub min_isr: Option<i32>,
}

impl InternalTopicConfig {
    fn parse<'v>(prefix: &str, get: &impl Fn(&str) -> &'v str) -> Result<Self, ConfigError> {
        let key = |suffix: &str| format!("{prefix}.{suffix}");
        let min_isr_key = key("min.isr");
        let min_isr = get(&min_isr_key);
        Ok(InternalTopicConfig {
            num_partitions: positive(&key("num.partitions"), get(&key("num.partitions")))?,
            replication_factor: positive(&key("replication.factor"), get(&key("replication.factor")))?,
            segment_bytes: positive(&key("segment.bytes"), get(&key("segment.bytes")))?,
            min_isr: if min_isr.is_empty() { None } else { Some(positive(&min_isr_key, min_isr)?) },
        })
    }
}

/// Every topic-level key of Kafka 3.9, each with the broker key that supplies its default
/// ("" where Kafka has none). All are accepted and validated; see docs/configuration.md's compaction
/// notes for the few that gregor accepts without acting on them.
pub const TOPIC_CONFIGS: &[(&str, &str)] = &[
    ("cleanup.policy", "log.cleanup.policy"),
    ("compression.gzip.level", "compression.gzip.level"),
    ("compression.lz4.level", "compression.lz4.level"),
    ("compression.type", "compression.type"),
    ("compression.zstd.level", "compression.zstd.level"),
    ("delete.retention.ms", "log.cleaner.delete.retention.ms"),
    ("file.delete.delay.ms", "log.segment.delete.delay.ms"),
    ("flush.messages", "log.flush.interval.messages"),
    ("flush.ms", "log.flush.interval.ms"),
    ("follower.replication.throttled.replicas", ""),
    ("index.interval.bytes", "log.index.interval.bytes"),
    ("leader.replication.throttled.replicas", ""),
    ("local.retention.bytes", "log.local.retention.bytes"),
    ("local.retention.ms", "log.local.retention.ms"),
    ("max.compaction.lag.ms", "log.cleaner.max.compaction.lag.ms"),
    ("max.message.bytes", "message.max.bytes"),
    ("message.downconversion.enable", "log.message.downconversion.enable"),
    ("message.format.version", "log.message.format.version"),
    ("message.timestamp.after.max.ms", "log.message.timestamp.after.max.ms"),
    ("message.timestamp.before.max.ms", "log.message.timestamp.before.max.ms"),
    ("message.timestamp.difference.max.ms", "log.message.timestamp.difference.max.ms"),
    ("message.timestamp.type", "log.message.timestamp.type"),
    ("min.cleanable.dirty.ratio", "log.cleaner.min.cleanable.ratio"),
    ("min.compaction.lag.ms", "log.cleaner.min.compaction.lag.ms"),
    ("min.insync.replicas", "min.insync.replicas"),
    ("preallocate", "log.preallocate"),
    ("remote.log.copy.disable", ""),
    ("remote.log.delete.on.disable", ""),
    ("remote.storage.enable", ""),
    ("retention.bytes", "log.retention.bytes"),
    ("retention.ms", "log.retention.ms"),
    ("segment.bytes", "log.segment.bytes"),
    ("segment.index.bytes", "log.index.size.max.bytes"),
    ("segment.jitter.ms", "log.roll.jitter.ms"),
    ("segment.ms", "log.roll.ms"),
    ("unclean.leader.election.enable", "unclean.leader.election.enable"),
];

/// `cleanup.policy`: `delete`, `compact` or both, as (compact, delete).
/// CreateTime or LogAppendTime: whether the broker stamps batches with its own clock.
fn timestamp_type(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value {
        "CreateTime" => Ok(false),
        "LogAppendTime" => Ok(true),
        other => Err(invalid(key, other, "expected CreateTime or LogAppendTime")),
    }
}

fn cleanup_policy(key: &str, value: &str) -> Result<(bool, bool), ConfigError> {
    let (mut compact, mut delete) = (false, false);
    for p in value.split(',').map(str::trim) {
        match p {
            "compact" => compact = true,
            "delete" => delete = true,
            _ => return Err(invalid(key, value, "expected delete and/or compact")),
        }
    }
    Ok((compact, delete))
}

fn at_least(key: &str, value: &str, min: i64) -> Result<i64, ConfigError> {
    let n = num::<i64>(key, value)?;
    if n < min {
        return Err(invalid(key, value, format!("must be at least {min}")));
    }
    Ok(n)
}

fn in_range(key: &str, value: &str, min: i64, max: i64) -> Result<i64, ConfigError> {
    let n = num::<i64>(key, value)?;
    if n < min || n > max {
        return Err(invalid(key, value, format!("must be between {min} and {max}")));
    }
    Ok(n)
}

fn ratio(key: &str, value: &str) -> Result<f64, ConfigError> {
    let r = num::<f64>(key, value)?;
    if !(0.0..=1.0).contains(&r) {
        return Err(invalid(key, value, "must be between 0 and 1"));
    }
    Ok(r)
}

/// Kafka's `log.cleaner.io.buffer.load.factor`: how full the offset map may get.
fn load_factor(key: &str, value: &str) -> Result<f64, ConfigError> {
    let r = num::<f64>(key, value)?;
    if !(r > 0.0 && r <= 1.0) {
        return Err(invalid(key, value, "must be greater than 0 and at most 1"));
    }
    Ok(r)
}

fn check_compaction_lags(key: &str, c: &LogConfig) -> Result<(), ConfigError> {
    if c.min_compaction_lag_ms > c.max_compaction_lag_ms {
        return Err(invalid(
            key,
            &c.min_compaction_lag_ms.to_string(),
            format!(
                "conflicts with max.compaction.lag.ms ({}): the minimum compaction lag must not exceed the maximum",
                c.max_compaction_lag_ms
            ),
        ));
    }
    Ok(())
}

/// `leader.replication.throttled.replicas` and its follower twin: empty, `*`, or
/// `partition:broker` pairs.
fn throttled_replicas(key: &str, value: &str) -> Result<(), ConfigError> {
    let v = value.trim();
    if v.is_empty() || v == "*" {
        return Ok(());
    }
    for item in v.split(',').map(str::trim) {
        let ok = item
            .split_once(':')
            .is_some_and(|(p, b)| p.trim().parse::<u32>().is_ok() && b.trim().parse::<u32>().is_ok());
        if !ok {
            return Err(invalid(key, value, "expected * or a list of partition:broker pairs"));
        }
    }
    Ok(())
}

/// Kafka's message format versions (`0.8.0` ... `3.9-IV0`): ignored by a 3.x broker, but a
/// malformed one is still refused.
fn message_format_version(key: &str, value: &str) -> Result<(), ConfigError> {
    let (ver, iv) = match value.split_once("-IV") {
        Some((v, iv)) => (v, Some(iv)),
        None => (value, None),
    };
    let parts: Vec<&str> = ver.split('.').collect();
    let ok = (2..=4).contains(&parts.len())
        && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && iv.is_none_or(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
    if !ok {
        return Err(invalid(key, value, "not a valid message format version"));
    }
    Ok(())
}

impl BrokerConfig {
    /// The broker-wide default of a topic-level key, as DescribeConfigs reports it.
    pub fn topic_default(&self, topic_key: &str) -> Option<String> {
        let (_, broker_key) = TOPIC_CONFIGS.iter().find(|(k, _)| *k == topic_key)?;
        Some(match topic_key {
            "retention.ms" => self.log.retention_ms.to_string(),
            "segment.ms" => self.log.segment_ms.to_string(),
            "flush.ms" => (self.log.flush_interval_ms.min(i64::MAX as u64)).to_string(),
            "segment.jitter.ms" => match self.values.get("log.roll.jitter.ms").filter(|v| !v.is_empty()) {
                Some(v) => v.clone(),
                None => {
                    let h = self.values.get("log.roll.jitter.hours").and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
                    h.saturating_mul(3_600_000).to_string()
                }
            },
            "remote.storage.enable" | "remote.log.copy.disable" | "remote.log.delete.on.disable" => "false".into(),
            _ if broker_key.is_empty() => String::new(),
            _ => self.values.get(*broker_key).cloned().unwrap_or_default(),
        })
    }

    /// The log settings of a topic: broker defaults overlaid with the topic's overrides.
    pub fn log_config_for(&self, overrides: &BTreeMap<String, String>) -> Result<LogConfig, ConfigError> {
        let mut c = self.log.clone();
        for (k, v) in overrides {
            match k.as_str() {
                "segment.bytes" => c.segment_bytes = positive(k, v)?,
                "segment.ms" => c.segment_ms = positive(k, v)?,
                "index.interval.bytes" => c.index_interval_bytes = num(k, v)?,
                "segment.index.bytes" => c.max_index_size = positive(k, v)?,
                "retention.ms" => c.retention_ms = num(k, v)?,
                "retention.bytes" => c.retention_bytes = num(k, v)?,
                "max.message.bytes" => c.max_message_bytes = positive(k, v)?,
                "flush.messages" => c.flush_interval_messages = positive(k, v)?,
                "flush.ms" => c.flush_interval_ms = num(k, v)?,
                "file.delete.delay.ms" => c.file_delete_delay_ms = num(k, v)?,
                "message.downconversion.enable" => c.message_downconversion_enable = boolean(k, v)?,
                "cleanup.policy" => (c.compact, c.delete) = cleanup_policy(k, v)?,
                "delete.retention.ms" => c.delete_retention_ms = at_least(k, v, 0)?,
                "min.compaction.lag.ms" => c.min_compaction_lag_ms = at_least(k, v, 0)?,
                "max.compaction.lag.ms" => c.max_compaction_lag_ms = at_least(k, v, 1)?,
                "min.cleanable.dirty.ratio" => c.min_cleanable_dirty_ratio = ratio(k, v)?,
                "message.timestamp.type" => c.log_append_time = timestamp_type(k, v)?,
                _ => {}
            }
        }
        check_compaction_lags("min.compaction.lag.ms", &c)?;
        Ok(c)
    }

    /// Checks one topic-level override the way CreateTopics/AlterConfigs must (INVALID_CONFIG).
    pub fn validate_topic_config(&self, key: &str, value: &str) -> Result<(), ConfigError> {
        if !TOPIC_CONFIGS.iter().any(|(k, _)| *k == key) {
            return Err(invalid(key, value, "unknown topic configuration"));
        }
        match key {
            "cleanup.policy" => {
                cleanup_policy(key, value)?;
            }
            "compression.gzip.level" => {
                if in_range(key, value, -1, 9)? == 0 {
                    return Err(invalid(key, value, "must be -1 or between 1 and 9"));
                }
            }
            "compression.lz4.level" => {
                in_range(key, value, 1, 17)?;
            }
            "compression.zstd.level" => {
                in_range(key, value, -131072, 22)?;
            }
            "local.retention.bytes" | "local.retention.ms" => {
                at_least(key, value, -2)?;
            }
            "message.timestamp.after.max.ms"
            | "message.timestamp.before.max.ms"
            | "message.timestamp.difference.max.ms"
            | "segment.jitter.ms" => {
                at_least(key, value, 0)?;
            }
            "preallocate" | "remote.log.copy.disable" | "remote.log.delete.on.disable" => {
                boolean(key, value)?;
            }
            "remote.storage.enable" => {
                if boolean(key, value)? {
                    return Err(invalid(
                        key,
                        value,
                        "Tiered Storage functionality is disabled in the broker. Topic cannot be configured with \
                         remote log storage.",
                    ));
                }
            }
            "message.format.version" => message_format_version(key, value)?,
            "leader.replication.throttled.replicas" | "follower.replication.throttled.replicas" => {
                throttled_replicas(key, value)?
            }
            "retention.ms" => {
                at_least(key, value, -1)?;
            }
            "segment.bytes" => {
                // Kafka's floor: the overhead of one legacy record.
                at_least(key, value, 14)?;
                self.log_config_for(&BTreeMap::from([(key.to_string(), value.to_string())]))?;
            }
            "segment.index.bytes" => {
                at_least(key, value, 4)?;
                self.log_config_for(&BTreeMap::from([(key.to_string(), value.to_string())]))?;
            }
            "compression.type" => {
                if !["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"].contains(&value) {
                    return Err(invalid(key, value, "unknown compression type"));
                }
            }
            "message.timestamp.type" => {
                timestamp_type(key, value)?;
            }
            "unclean.leader.election.enable" | "message.downconversion.enable" => {
                boolean(key, value)?;
            }
            "min.insync.replicas" => {
                positive::<i32>(key, value)?;
            }
            _ => {
                let one = BTreeMap::from([(key.to_string(), value.to_string())]);
                self.log_config_for(&one)?;
            }
        }
        Ok(())
    }
}

/// `metrics.host` and `metrics.port`: the port turns the endpoint on; the host defaults to
/// every interface, since a scraper (Prometheus in another container) is rarely local.
fn metrics_address(host: &str, port: &str) -> Result<Option<(String, u16)>, ConfigError> {
    let host = host.trim();
    if port.trim().is_empty() {
        if !host.is_empty() {
            tracing::warn!(key = METRICS_HOST, "has no effect without {METRICS_PORT}; metrics are not served");
        }
        return Ok(None);
    }
    let port = match num::<u16>(METRICS_PORT, port)? {
        0 => return Err(invalid(METRICS_PORT, port, "must be a port number from 1 to 65535")),
        p => p,
    };
    let host = if host.is_empty() { METRICS_DEFAULT_HOST } else { host.trim_start_matches('[').trim_end_matches(']') };
    Ok(Some((host.to_string(), port)))
}

/// `listener.security.protocol.map` (`NAME:PROTOCOL,...`), keyed by upper-cased listener name
/// because Kafka normalises listener names that way.
fn parse_protocol_map(value: &str) -> Result<BTreeMap<String, &'static str>, ConfigError> {
    const KEY: &str = "listener.security.protocol.map";
    let mut out = BTreeMap::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, protocol) =
            item.split_once(':').ok_or_else(|| invalid(KEY, value, format!("expected NAME:PROTOCOL, got {item:?}")))?;
        let name = name.trim();
        if name.is_empty() {
            return Err(invalid(KEY, value, format!("empty listener name in {item:?}")));
        }
        let protocol = security_protocol(KEY, value, protocol)?;
        if out.insert(name.to_ascii_uppercase(), protocol).is_some() {
            return Err(invalid(KEY, value, format!("listener name {name} appears twice")));
        }
    }
    Ok(out)
}

fn security_protocol(key: &str, value: &str, name: &str) -> Result<&'static str, ConfigError> {
    let upper = name.trim().to_ascii_uppercase();
    SECURITY_PROTOCOLS.iter().copied().find(|p| *p == upper).ok_or_else(|| {
        invalid(
            key,
            value,
            format!("unknown security protocol {:?}; expected one of {}", name.trim(), SECURITY_PROTOCOLS.join(", ")),
        )
    })
}

fn resolve_protocols(
    key: &str,
    endpoints: &mut [Endpoint],
    protocols: &BTreeMap<String, &'static str>,
) -> Result<(), ConfigError> {
    for ep in endpoints {
        let protocol = protocols.get(&ep.listener_name.to_ascii_uppercase()).ok_or_else(|| {
            invalid(
                key,
                &ep.to_string(),
                format!(
                    "no security protocol defined for listener {} in listener.security.protocol.map",
                    ep.listener_name
                ),
            )
        })?;
        ep.security_protocol = protocol.to_string();
    }
    Ok(())
}

/// Refuses every security setting gregor cannot honour (a secured control-plane listener,
/// an authorizer other than Kafka's ACL one, ZooKeeper TLS/SASL): serving such a
/// configuration would give clients, or other brokers, more than it allows. Runs before
/// anything binds a port or touches the data directories. The listeners' own TLS and SASL
/// keys, and what this broker needs to connect to the others over a secured inter-broker
/// listener, are checked by `security::Security::from_config` at start.
fn check_security(
    values: &BTreeMap<String, String>,
    listeners: &[Endpoint],
    advertised: &[Endpoint],
) -> Result<(), ConfigError> {
    let get = |k: &str| values.get(k).map(|v| v.trim()).unwrap_or("");
    let named = |eps: &[Endpoint], name: &str| -> Option<Endpoint> {
        eps.iter().find(|e| e.listener_name.eq_ignore_ascii_case(name)).cloned()
    };
    let names = |eps: &[Endpoint]| eps.iter().map(|e| e.listener_name.as_str()).collect::<Vec<_>>().join(",");

    // A single standalone broker has no inter-broker traffic to secure.
    let clustered = !get("zookeeper.connect").is_empty();
    let key = "security.inter.broker.protocol";
    if !get(key).is_empty() {
        let protocol = security_protocol(key, get(key), get(key))?;
        if !get("inter.broker.listener.name").is_empty() {
            // Kafka refuses the pair too: each names the inter-broker listener.
            return Err(invalid(
                key,
                get(key),
                "only one of inter.broker.listener.name and security.inter.broker.protocol may be set",
            ));
        }
        // Kafka takes the listener named after the protocol; it must be advertised, since
        // the other brokers connect to it.
        if clustered && protocol != PLAINTEXT && named(advertised, protocol).is_none() {
            return Err(invalid(
                key,
                protocol,
                format!(
                    "the inter-broker listener {protocol} must be a listener in advertised.listeners ({})",
                    names(advertised)
                ),
            ));
        }
    }
    // Kafka looks the inter-broker listener up among the advertised ones (other brokers connect
    // to it) and the control-plane listener among those it binds.
    for (key, pool, pool_key) in [
        ("inter.broker.listener.name", advertised, "advertised.listeners"),
        ("control.plane.listener.name", listeners, "listeners"),
    ] {
        let name = get(key);
        if name.is_empty() {
            continue;
        }
        let ep = named(pool, name).ok_or_else(|| {
            invalid(key, name, format!("must be a listener name defined in {pool_key} ({})", names(pool)))
        })?;
        // The controller reaches brokers over the inter-broker listener; a control-plane
        // listener of its own would carry nothing, so one secured more than that is refused
        // rather than left unused while the requests go elsewhere.
        if key == "control.plane.listener.name" && ep.security_protocol != PLAINTEXT && clustered {
            return Err(unsupported(
                key,
                format!(
                    "listener {} ({ep}) uses security protocol {}, but gregor's controller sends its requests over \
                     the inter-broker listener, not a separate control-plane one; secure inter.broker.listener.name \
                     instead",
                    ep.listener_name, ep.security_protocol
                ),
            ));
        }
    }
    for (key, eps) in [("listeners", listeners), ("advertised.listeners", advertised)] {
        for ep in eps {
            if eps.iter().filter(|e| e.listener_name.eq_ignore_ascii_case(&ep.listener_name)).count() > 1 {
                return Err(invalid(key, &ep.to_string(), format!("listener {} is defined twice", ep.listener_name)));
            }
        }
    }
    let key = "authorizer.class.name";
    if !get(key).is_empty() && !ACL_AUTHORIZER_CLASSES.contains(&get(key)) {
        return Err(unsupported(
            key,
            format!(
                "{} cannot be loaded by gregor; only Kafka's ZooKeeper ACL authorizer ({}) is served",
                get(key),
                ACL_AUTHORIZER_CLASSES.join(" or ")
            ),
        ));
    }
    // The ZooKeeper client has no TLS and no SASL, so these would be served with less than
    // asked: metadata in the clear, or znodes open to anyone.
    for (key, what) in [
        ("zookeeper.ssl.client.enable", "TLS to ZooKeeper is not supported yet; the connection would be plaintext"),
        (
            "zookeeper.set.acl",
            "ZooKeeper ACLs need a SASL-authenticated ZooKeeper session, which gregor does not support yet; the \
             znodes would be left open",
        ),
    ] {
        if !get(key).is_empty() && boolean(key, get(key))? {
            return Err(unsupported(key, what));
        }
    }
    Ok(())
}

/// The given keys that configure TLS or SASL, which only SSL/SASL listeners read.
fn tls_sasl_keys(values: &BTreeMap<String, String>) -> Vec<&str> {
    values
        .keys()
        .map(String::as_str)
        .filter(|k| k.starts_with("ssl.") || k.starts_with("sasl.") || k.starts_with("listener.name."))
        .collect()
}

/// Keys Kafka knows that gregor accepts without acting on them, so a stock server.properties
/// does not produce a page of warnings.
fn is_passthrough_key(key: &str) -> bool {
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

/// A connection creation rate: Kafka's Int.MaxValue (its default) means no limit.
fn creation_rate(key: &str, value: &str) -> Result<Option<u32>, ConfigError> {
    let n = num::<i32>(key, value)?;
    match n {
        i32::MAX => Ok(None),
        n if n < 0 => Err(invalid(key, value, "must be at least 0")),
        n => Ok(Some(n as u32)),
    }
}

/// `listener.name.<l>.max.connection.creation.rate`, per listener.
fn listener_creation_rates(
    values: &BTreeMap<String, String>,
    listeners: &[Endpoint],
) -> Result<HashMap<String, u32>, ConfigError> {
    let mut out = HashMap::new();
    for ep in listeners {
        let key = format!("listener.name.{}.max.connection.creation.rate", ep.listener_name.to_ascii_lowercase());
        if let Some(v) = values.get(&key) {
            if let Some(rate) = creation_rate(&key, v)? {
                out.insert(ep.listener_name.clone(), rate);
            }
        }
    }
    Ok(out)
}

/// `queued.max.request.bytes`: -1 (Kafka's default) or any negative value is no pool; 0
/// would let no request in at all, so it is refused.
fn request_bytes_pool(value: &str) -> Result<Option<usize>, ConfigError> {
    let key = "queued.max.request.bytes";
    let n = num::<i64>(key, value)?;
    match n {
        n if n < 0 => Ok(None),
        0 => Err(invalid(key, value, "must be positive, or -1 for no limit")),
        n => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
    }
}

/// Kafka's listener-prefixed form of `max.connections`; the listener part is lower case.
fn listener_max_connections(
    values: &BTreeMap<String, String>,
    listeners: &[Endpoint],
) -> Result<HashMap<String, usize>, ConfigError> {
    let mut out = HashMap::new();
    for ep in listeners {
        let key = format!("listener.name.{}.max.connections", ep.listener_name.to_ascii_lowercase());
        if let Some(v) = values.get(&key) {
            out.insert(ep.listener_name.clone(), non_negative_usize(&key, v)?);
        }
    }
    Ok(out)
}

fn non_negative_usize(key: &str, value: &str) -> Result<usize, ConfigError> {
    let n = num::<i64>(key, value)?;
    usize::try_from(n).map_err(|_| invalid(key, value, "must not be negative"))
}

/// `host:count,host:count`, as Kafka takes it; a host name stands for every address it
/// resolves to when the broker starts.
fn per_ip_overrides(value: &str) -> Result<Vec<(std::net::IpAddr, usize)>, ConfigError> {
    const KEY: &str = "max.connections.per.ip.overrides";
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (host, count) =
            item.rsplit_once(':').ok_or_else(|| invalid(KEY, value, format!("{item:?} is not host:count")))?;
        let count = non_negative_usize(KEY, count)?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            out.push((ip, count));
            continue;
        }
        let addrs = std::net::ToSocketAddrs::to_socket_addrs(&(host, 0))
            .map_err(|e| invalid(KEY, value, format!("cannot resolve {host}: {e}")))?;
        out.extend(addrs.map(|a| (a.ip(), count)));
    }
    Ok(out)
}

/// The advertised listener's own spelling of the name, since other brokers match names
/// exactly; check_security has already refused a name that is not advertised. Without
/// `inter.broker.listener.name`, Kafka takes the listener named after
/// `security.inter.broker.protocol` (PLAINTEXT); gregor falls back to the first listener.
fn inter_broker_listener(configured: &str, protocol: &str, advertised: &[Endpoint]) -> String {
    let wanted = match (configured, protocol.trim()) {
        ("", "") => PLAINTEXT,
        ("", p) => p,
        (c, _) => c,
    };
    advertised
        .iter()
        .find(|e| e.listener_name.eq_ignore_ascii_case(wanted))
        .or(advertised.first())
        .map(|e| e.listener_name.clone())
        .unwrap_or_default()
}

/// `KAFKA_ADVERTISED_LISTENERS` -> `advertised.listeners`, with the Confluent image's escapes
/// (`___` for `-`, `__` for `_`); the Bitnami image's `KAFKA_CFG_ADVERTISED_LISTENERS` too.
fn env_to_key(name: &str) -> Option<String> {
    let rest = name.strip_prefix("KAFKA_CFG_").or_else(|| name.strip_prefix("KAFKA_"))?;
    if rest.is_empty() || NON_CONFIG_ENV.contains(&name) {
        return None;
    }
    let lower = rest.to_ascii_lowercase();
    Some(
        lower
            .replace("___", "\u{1}")
            .replace("__", "\u{2}")
            .replace('_', ".")
            .replace('\u{1}', "-")
            .replace('\u{2}', "_"),
    )
}

fn num<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    value.trim().parse::<T>().map_err(|e| invalid(key, value, e.to_string()))
}

fn positive<T: std::str::FromStr + PartialOrd + Default>(key: &str, value: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    let n = num::<T>(key, value)?;
    if n <= T::default() {
        return Err(invalid(key, value, "must be greater than 0"));
    }
    Ok(n)
}

fn boolean(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(key, value, "expected true or false")),
    }
}

pub fn parse_endpoints(key: &str, value: &str) -> Result<Vec<Endpoint>, ConfigError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, addr) = item.split_once("://").ok_or_else(|| invalid(key, value, "expected NAME://host:port"))?;
        let (host, port) = addr.rsplit_once(':').ok_or_else(|| invalid(key, value, "missing port"))?;
        let port: u16 = port.parse().map_err(|_| invalid(key, value, format!("bad port {port:?}")))?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        if name.is_empty() {
            return Err(invalid(key, value, "empty listener name"));
        }
        if out.iter().any(|e: &Endpoint| e.listener_name == name) {
            return Err(invalid(key, value, format!("listener name {name} appears twice")));
        }
        let security_protocol = name.to_ascii_uppercase();
        out.push(Endpoint { listener_name: name.to_string(), host, port, security_protocol });
    }
    Ok(out)
}

/// Java properties: `key=value`, `key: value` or `key value`; `#`/`!` comments; a trailing
/// backslash continues the line.
pub fn parse_properties(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut logical = String::new();
    for raw in text.lines() {
        let line = raw.trim_start();
        if logical.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with('!')) {
            continue;
        }
        if let Some(stripped) = line.strip_suffix('\\') {
            logical.push_str(stripped);
            continue;
        }
        logical.push_str(line);
        let entry = std::mem::take(&mut logical);
        let split = entry.find(['=', ':', ' ', '\t']);
        let (k, v) = match split {
            Some(i) => (&entry[..i], entry[i + 1..].trim_start_matches([' ', '\t', '=', ':'])),
            None => (entry.as_str(), ""),
        };
        out.insert(k.trim().to_string(), unescape(v.trim_end()));
    }
    out
}

fn unescape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// TOML with the same dotted keys: nested tables are flattened back into `a.b.c`.
pub fn parse_toml(text: &str) -> Result<BTreeMap<String, String>, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
    let mut out = BTreeMap::new();
    flatten_toml("", &toml::Value::Table(table), &mut out);
    Ok(out)
}

fn flatten_toml(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
    let scalar = |v: &toml::Value| match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Datetime(d) => d.to_string(),
        toml::Value::Array(_) | toml::Value::Table(_) => String::new(),
    };
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten_toml(&key, v, out);
            }
        }
        toml::Value::Array(items) => {
            out.insert(prefix.to_string(), items.iter().map(scalar).collect::<Vec<_>>().join(","));
        }
        other => {
            out.insert(prefix.to_string(), scalar(other));
        }
    }
}

/// Checks the security keys that can be checked without reading files, as the config is
/// parsed (so `--check`-style failures name the key early); `security::Security::from_config` does
/// the rest at start.
fn check_security_keys(values: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    for key in ["ssl.engine.factory.class", "ssl.provider"] {
        if values.get(key).is_some_and(|v| !v.trim().is_empty()) {
            return Err(unsupported(key, "gregor has its own TLS engine (rustls); this setting cannot be honoured"));
        }
    }
    for (key, v) in values {
        if key.ends_with("sasl.server.callback.handler.class") && !v.trim().is_empty() {
            return Err(unsupported(key, "custom SASL callback handlers cannot be loaded by gregor"));
        }
        if key.ends_with("principal.builder.class") && !v.trim().is_empty() {
            return Err(unsupported(
                key,
                "custom principal builders cannot be loaded by gregor; use ssl.principal.mapping.rules",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(pairs: &[(&str, &str)]) -> Result<BrokerConfig, ConfigError> {
        BrokerConfig::from_map(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    #[test]
    fn keys_kafka_updates_dynamically_but_gregor_cannot_are_told_apart() {
        for k in
            ["num.replica.fetchers", "listeners", "listener.name.plaintext.ssl.keystore.location", "metric.reporters"]
        {
            assert!(is_dynamic_in_kafka_only(k) && !is_dynamic_broker_config(k), "{k}");
        }
        for k in [
            "max.connections.per.ip",
            "log.cleaner.threads",
            "log.retention.ms",
            "message.max.bytes",
            "num.io.threads",
            "sasl.kerberos.min.time.before.relogin",
            "sasl.enabled.mechanisms",
        ] {
            assert!(is_dynamic_broker_config(k) && !is_dynamic_in_kafka_only(k), "{k}");
        }
        assert!(!is_dynamic_in_kafka_only("broker.id") && !is_dynamic_broker_config("broker.id"));
    }

    #[test]
    fn dynamic_values_override_static_ones_and_only_dynamic_keys_are_taken() {
        let c = load(&[("log.retention.hours", "1"), ("num.partitions", "4")]).unwrap();
        assert_eq!(c.log.retention_ms, 3_600_000);
        let dynamic: BTreeMap<String, String> = [("log.retention.ms".to_string(), "5000".to_string())].into();
        let d = c.with_dynamic(&dynamic).unwrap();
        assert_eq!((d.log.retention_ms, d.num_partitions), (5000, 4));
        assert_eq!(d.given, c.given, "what the operator set statically is unchanged");
        let fixed: BTreeMap<String, String> = [("num.partitions".to_string(), "9".to_string())].into();
        assert!(c.with_dynamic(&fixed).is_err());
        let bad: BTreeMap<String, String> = [("log.retention.ms".to_string(), "soon".to_string())].into();
        assert!(c.with_dynamic(&bad).is_err());
    }

    #[test]
    fn defaults_are_kafkas() {
        let c = load(&[]).unwrap();
        assert_eq!(c.broker_id, 0);
        assert_eq!(c.listeners[0].port, 9092);
        assert_eq!(c.log_dirs, vec![PathBuf::from("./data")]);
        assert_eq!(c.log.segment_bytes, 1 << 30);
        assert_eq!(c.log.retention_ms, 168 * 3_600_000);
        assert_eq!(c.log.max_message_bytes, 1_048_588);
        assert_eq!(c.socket_request_max_bytes, 104_857_600);
        assert!(c.zookeeper_connect.is_none());
    }

    #[test]
    fn limits_default_to_kafkas_and_bad_values_are_refused() {
        use std::time::Duration;
        let c = load(&[]).unwrap();
        assert_eq!(c.offset_metadata_max_bytes, 4096);
        assert_eq!(c.offsets_commit_timeout, Duration::from_millis(5000));
        assert_eq!(c.replica_fetch_backoff, Duration::from_millis(1000));
        assert_eq!(c.controlled_shutdown_max_retries, 3);
        assert_eq!(c.controlled_shutdown_retry_backoff, Duration::from_millis(5000));
        assert_eq!(c.request_timeout, Duration::from_millis(30000));
        let c = load(&[
            ("offset.metadata.max.bytes", "0"),
            ("offsets.commit.timeout.ms", "1"),
            ("replica.fetch.backoff.ms", "0"),
            ("controlled.shutdown.max.retries", "0"),
            ("controlled.shutdown.retry.backoff.ms", "0"),
            ("request.timeout.ms", "250"),
        ])
        .unwrap();
        assert_eq!((c.offset_metadata_max_bytes, c.controlled_shutdown_max_retries), (0, 0));
        assert_eq!(c.offsets_commit_timeout, Duration::from_millis(1));
        assert_eq!(c.replica_fetch_backoff, Duration::ZERO);
        assert_eq!(c.controlled_shutdown_retry_backoff, Duration::ZERO);
        assert_eq!(c.request_timeout, Duration::from_millis(250));
        let bad: &[(&str, &[&str])] = &[
            ("offset.metadata.max.bytes", &["-1", "4k"]),
            ("offsets.commit.timeout.ms", &["0", "-5", "soon"]),
            ("replica.fetch.backoff.ms", &["-1", "1s"]),
            ("controlled.shutdown.max.retries", &["-1", "three"]),
            ("controlled.shutdown.retry.backoff.ms", &["-1", ""]),
            ("request.timeout.ms", &["0", "30s"]),
        ];
        for (key, values) in bad {
            for value in *values {
                let err = refusal(&[(key, value)]);
                assert!(err.starts_with(&format!("invalid value {value:?} for configuration {key}")), "{err}");
            }
        }
    }

    #[test]
    fn metrics_are_served_only_with_a_valid_port() {
        assert_eq!(load(&[]).unwrap().metrics_address, None);
        let c = load(&[("metrics.port", "9404")]).unwrap();
        assert_eq!(c.metrics_address, Some(("0.0.0.0".to_string(), 9404)));
        let c = load(&[("metrics.port", " 9404 "), ("metrics.host", "127.0.0.1")]).unwrap();
        assert_eq!(c.metrics_address, Some(("127.0.0.1".to_string(), 9404)));
        let c = load(&[("metrics.port", "9404"), ("metrics.host", "[::1]")]).unwrap();
        assert_eq!(c.metrics_address, Some(("::1".to_string(), 9404)));
        assert_eq!(load(&[("metrics.host", "127.0.0.1")]).unwrap().metrics_address, None);
        for bad in ["http", "-1", "0", "65536", "9404x"] {
            let err = refusal(&[("metrics.port", bad)]);
            assert!(err.starts_with(&format!("invalid value {bad:?} for configuration metrics.port")), "{err}");
        }
        // As the Kafka images spell it in the environment.
        let env = [("KAFKA_METRICS_PORT".to_string(), "9404".to_string())];
        let c = BrokerConfig::load(None, &[], env.into_iter()).unwrap();
        assert_eq!(c.metrics_address.map(|(_, p)| p), Some(9404));
    }

    #[test]
    fn wildcard_listener_needs_an_advertised_address() {
        let err = load(&[("listeners", "PLAINTEXT://0.0.0.0:9092")]).unwrap_err().to_string();
        assert!(err.contains("advertised.listeners"), "{err}");
        let c = load(&[("listeners", "PLAINTEXT://0.0.0.0:9092"), ("advertised.listeners", "PLAINTEXT://kafka:9092")]);
        assert_eq!(c.unwrap().advertised_listeners[0].host, "kafka");
    }

    #[test]
    fn connection_limits() {
        let c = load(&[]).unwrap();
        assert_eq!(c.max_connections, i32::MAX as usize);
        assert_eq!(c.connections_max_idle, std::time::Duration::from_secs(600));
        let c = load(&[
            ("max.connections", "100"),
            ("max.connections.per.ip", "0"),
            ("max.connections.per.ip.overrides", "127.0.0.1:5, [::1]:7"),
        ])
        .unwrap();
        assert_eq!((c.max_connections, c.max_connections_per_ip), (100, 0));
        assert_eq!(
            c.max_connections_per_ip_overrides,
            vec![("127.0.0.1".parse().unwrap(), 5), ("::1".parse().unwrap(), 7)]
        );
        for (key, value) in [
            ("max.connections", "-1"),
            ("max.connections.per.ip", "lots"),
            ("max.connections.per.ip.overrides", "127.0.0.1"),
            ("max.connections.per.ip.overrides", "127.0.0.1:-3"),
            ("connections.max.idle.ms", "0"),
        ] {
            let err = refusal(&[(key, value)]);
            assert!(err.contains(key), "{err}");
        }
    }

    #[test]
    fn inter_broker_traffic_uses_the_named_listener_wherever_it_is_listed() {
        let c = load(&[
            ("listeners", "EXTERNAL://127.0.0.1:19092,INTERNAL://127.0.0.1:9092"),
            ("listener.security.protocol.map", "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT"),
            ("inter.broker.listener.name", "internal"),
        ])
        .unwrap();
        assert_eq!(c.inter_broker_listener, "INTERNAL");
        let c = load(&[
            ("listeners", "PLAINTEXT_HOST://127.0.0.1:19092,PLAINTEXT://127.0.0.1:9092"),
            ("listener.security.protocol.map", "PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT"),
        ])
        .unwrap();
        assert_eq!(c.inter_broker_listener, "PLAINTEXT", "unset: the listener named after the protocol");
        let c = load(&[
            ("listeners", "A://127.0.0.1:19092,B://127.0.0.1:9092"),
            ("listener.security.protocol.map", "A:PLAINTEXT,B:PLAINTEXT"),
        ])
        .unwrap();
        assert_eq!(c.inter_broker_listener, "A");
    }

    fn refusal(pairs: &[(&str, &str)]) -> String {
        match load(pairs) {
            Ok(_) => panic!("{pairs:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    const INTERNAL_EXTERNAL: &[(&str, &str)] = &[
        ("listeners", "INTERNAL://127.0.0.1:9092,EXTERNAL://127.0.0.1:19092"),
        ("advertised.listeners", "INTERNAL://kafka:9092,EXTERNAL://localhost:19092"),
        ("listener.security.protocol.map", "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT"),
        ("inter.broker.listener.name", "INTERNAL"),
    ];

    #[test]
    fn custom_listener_names_map_to_plaintext() {
        let c = load(INTERNAL_EXTERNAL).unwrap();
        assert_eq!(c.listeners.len(), 2);
        assert!(c.listeners.iter().chain(&c.advertised_listeners).all(|e| e.security_protocol() == "PLAINTEXT"));
        assert_eq!(c.advertised_for("EXTERNAL").map(|e| e.port), Some(19092));
        let c = load(&[("listeners", "PLAINTEXT://127.0.0.1:9092")]).unwrap();
        assert_eq!(c.listeners[0].security_protocol(), "PLAINTEXT");
        // Kafka normalises names and protocols to upper case.
        let c = load(&[
            ("listeners", "internal://127.0.0.1:9092"),
            ("listener.security.protocol.map", "Internal:plaintext"),
        ]);
        assert_eq!(c.unwrap().listeners[0].security_protocol(), "PLAINTEXT");
    }

    #[test]
    fn secured_listeners_are_accepted_and_so_is_a_secured_inter_broker_listener() {
        // Standalone there is no inter-broker traffic: any listener may be secured (its TLS
        // and SASL keys are checked when the broker builds them).
        let c = load(&[("listeners", "SASL_SSL://127.0.0.1:29592")]).unwrap();
        assert_eq!(c.listeners[0].security_protocol(), "SASL_SSL");
        for protocol in ["SSL", "SASL_PLAINTEXT", "SASL_SSL"] {
            for inter_broker in ["INTERNAL", "EXTERNAL"] {
                let c = load(&[
                    ("zookeeper.connect", "127.0.0.1:2181"),
                    ("listeners", "INTERNAL://127.0.0.1:9092,EXTERNAL://127.0.0.1:29592"),
                    ("listener.security.protocol.map", &format!("INTERNAL:PLAINTEXT,EXTERNAL:{protocol}")),
                    ("inter.broker.listener.name", inter_broker),
                ])
                .unwrap();
                assert_eq!(c.listeners[1].security_protocol(), protocol);
                assert_eq!(c.inter_broker_listener, inter_broker);
            }
        }
        // In a cluster, the inter-broker listener falls back to the first one; that it is
        // secured is for the broker's start to check (credentials, truststore).
        let c = load(&[("zookeeper.connect", "127.0.0.1:2181"), ("listeners", "SASL_SSL://127.0.0.1:29592")]).unwrap();
        assert_eq!(c.inter_broker_listener, "SASL_SSL");
        let err = refusal(&[("listeners", "PLAINTEXT://127.0.0.1:9092,plaintext://127.0.0.1:9093")]);
        assert!(err.contains("defined twice"), "{err}");
    }

    #[test]
    fn protocol_map_errors_name_the_key() {
        let err = refusal(&[("listeners", "INTERNAL://127.0.0.1:9092")]);
        assert!(
            err.contains("listeners") && err.contains("no security protocol defined for listener INTERNAL"),
            "{err}"
        );
        for bad in ["INTERNAL", "INTERNAL:TLS", ":PLAINTEXT", "INTERNAL:PLAINTEXT,INTERNAL:SSL"] {
            let err = refusal(&[("listeners", "INTERNAL://127.0.0.1:9092"), ("listener.security.protocol.map", bad)]);
            assert!(err.contains("listener.security.protocol.map"), "{bad}: {err}");
        }
        let err =
            refusal(&[("listeners", "PLAINTEXT://127.0.0.1:9092"), ("advertised.listeners", "OTHER://kafka:9092")]);
        assert!(err.contains("advertised.listeners") && err.contains("listener OTHER"), "{err}");
    }

    #[test]
    fn inter_broker_protocol_picks_its_listener_and_a_secured_control_plane_is_refused() {
        // security.inter.broker.protocol names the listener, as in Kafka; it must exist.
        let err = refusal(&[("security.inter.broker.protocol", "SASL_SSL"), ("zookeeper.connect", "zk:2181")]);
        assert!(err.contains("security.inter.broker.protocol") && err.contains("advertised.listeners"), "{err}");
        let c = load(&[
            ("security.inter.broker.protocol", "sasl_ssl"),
            ("zookeeper.connect", "zk:2181"),
            ("listeners", "PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093"),
        ])
        .unwrap();
        assert_eq!(c.inter_broker_listener, "SASL_SSL");
        let err = refusal(&[("security.inter.broker.protocol", "KERBEROS")]);
        assert!(err.contains("security.inter.broker.protocol") && err.contains("unknown security protocol"), "{err}");
        assert!(load(&[("security.inter.broker.protocol", "PLAINTEXT")]).is_ok());

        let with = |key: &'static str, value: &'static str| {
            let mut pairs = INTERNAL_EXTERNAL.to_vec();
            pairs.retain(|(k, _)| *k != key);
            pairs.push((key, value));
            pairs
        };
        let err = refusal(&with("security.inter.broker.protocol", "PLAINTEXT"));
        assert!(err.contains("only one of inter.broker.listener.name and security.inter.broker.protocol"), "{err}");
        let err = refusal(&with("inter.broker.listener.name", "REPLICATION"));
        assert!(err.contains("inter.broker.listener.name") && err.contains("INTERNAL,EXTERNAL"), "{err}");
        let err = refusal(&with("control.plane.listener.name", "CONTROL"));
        assert!(err.contains("control.plane.listener.name"), "{err}");
        assert!(load(&with("control.plane.listener.name", "INTERNAL")).is_ok());

        let mut secured = with("listener.security.protocol.map", "INTERNAL:SASL_PLAINTEXT,EXTERNAL:PLAINTEXT");
        secured.push(("zookeeper.connect", "zk:2181"));
        assert_eq!(load(&secured).unwrap().inter_broker_listener, "INTERNAL");
        secured.push(("control.plane.listener.name", "internal"));
        let err = refusal(&secured);
        assert!(err.starts_with("control.plane.listener.name: listener INTERNAL (INTERNAL://127.0.0.1:9092)"), "{err}");
    }

    #[test]
    fn zookeeper_tls_and_acls_are_refused_when_asked_for() {
        for key in ["zookeeper.ssl.client.enable", "zookeeper.set.acl"] {
            let err = refusal(&[(key, "true")]);
            assert!(err.starts_with(&format!("{key}: ")), "{err}");
            assert!(load(&[(key, "false")]).is_ok());
            assert!(refusal(&[(key, "yes")]).contains(key));
        }
    }

    #[test]
    fn only_kafkas_acl_authorizer_is_accepted() {
        for class in ["kafka.security.authorizer.AclAuthorizer", "kafka.security.auth.SimpleAclAuthorizer"] {
            assert!(load(&[("authorizer.class.name", class)]).is_ok());
        }
        let err = refusal(&[("authorizer.class.name", "org.apache.kafka.metadata.authorizer.StandardAuthorizer")]);
        assert!(
            err.starts_with("authorizer.class.name: org.apache.kafka.metadata.authorizer.StandardAuthorizer cannot"),
            "{err}"
        );
        assert!(load(&[("authorizer.class.name", " ")]).is_ok());
        assert!(load(&[("super.users", "User:admin"), ("allow.everyone.if.no.acl.found", "true")]).is_ok());
    }

    #[test]
    fn ssl_and_sasl_keys_without_secured_listeners_are_accepted() {
        let c = load(&[
            ("ssl.client.auth", "required"),
            ("ssl.keystore.location", "/etc/kafka/keystore.jks"),
            ("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-256"),
            ("sasl.mechanism.inter.broker.protocol", "PLAIN"),
            ("listener.name.plaintext.plain.sasl.jaas.config", "x"),
        ]);
        assert_eq!(c.unwrap().listeners[0].security_protocol(), "PLAINTEXT");
    }

    #[test]
    fn retention_precedence_ms_minutes_hours() {
        assert_eq!(load(&[("log.retention.minutes", "2")]).unwrap().log.retention_ms, 120_000);
        let c = load(&[("log.retention.minutes", "2"), ("log.retention.ms", "5")]).unwrap();
        assert_eq!(c.log.retention_ms, 5);
    }

    #[test]
    fn bad_value_names_the_key() {
        let err = load(&[("num.partitions", "many")]).unwrap_err().to_string();
        assert!(err.contains("num.partitions"), "{err}");
        let err = load(&[("listeners", "127.0.0.1:9092")]).unwrap_err().to_string();
        assert!(err.contains("listeners"), "{err}");
        assert!(load(&[("auto.create.topics.enable", "yes")]).is_err());
        assert!(load(&[("log.segment.bytes", "0")]).is_err());
        for bad in ["0", "-1"] {
            let err = load(&[("num.io.threads", bad)]).unwrap_err().to_string();
            assert!(err.contains("num.io.threads") && err.contains("at least 1"), "{err}");
        }
        assert_eq!(load(&[]).unwrap().num_io_threads, 8);
        assert_eq!(load(&[("num.io.threads", "1")]).unwrap().num_io_threads, 1);
    }

    #[test]
    fn internal_topics_have_kafkas_shape_and_refuse_zero() {
        let c = load(&[]).unwrap();
        let want = InternalTopicConfig {
            num_partitions: 50,
            replication_factor: 3,
            segment_bytes: 104_857_600,
            min_isr: None,
        };
        assert_eq!(c.offsets_topic, want);
        assert_eq!(c.transaction_state_log, InternalTopicConfig { min_isr: Some(2), ..want });
        for key in ["offsets.topic.num.partitions", "offsets.topic.replication.factor", "transaction.state.log.min.isr"]
        {
            assert!(refusal(&[(key, "0")]).contains(key), "{key}");
        }
    }

    #[test]
    fn properties_syntax() {
        let p = parse_properties("# c\n! c\nbroker.id=3\nlog.dirs : /a,\\\n  /b\nnum.partitions 4\n");
        assert_eq!(p["broker.id"], "3");
        assert_eq!(p["log.dirs"], "/a,/b");
        assert_eq!(p["num.partitions"], "4");
    }

    #[test]
    fn toml_dotted_keys_flatten() {
        let t = parse_toml("broker.id = 2\n[log]\ndirs = [\"/x\", \"/y\"]\n\"retention.hours\" = 1\n").unwrap();
        assert_eq!(t["broker.id"], "2");
        assert_eq!(t["log.dirs"], "/x,/y");
        assert_eq!(t["log.retention.hours"], "1");
    }

    #[test]
    fn env_names_map_like_kafka_images() {
        assert_eq!(env_to_key("KAFKA_ADVERTISED_LISTENERS").as_deref(), Some("advertised.listeners"));
        assert_eq!(env_to_key("KAFKA_BROKER_ID").as_deref(), Some("broker.id"));
        assert_eq!(env_to_key("KAFKA_HEAP_OPTS"), None);
        assert_eq!(env_to_key("KAFKA_JMX_PORT"), None);
        assert_eq!(env_to_key("KAFKA_CFG_ZOOKEEPER_CONNECT").as_deref(), Some("zookeeper.connect"));
        assert_eq!(
            env_to_key("KAFKA_CFG_LISTENER_NAME_INTERNAL_SSL_KEY___PASSWORD").as_deref(),
            Some("listener.name.internal.ssl.key-password")
        );
        assert_eq!(env_to_key("PATH"), None);
    }

    #[test]
    fn precedence_file_env_override() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s.properties");
        std::fs::write(&f, "broker.id=1\nnum.partitions=2\nlog.dirs=/tmp/x\n").unwrap();
        let env = vec![("KAFKA_NUM_PARTITIONS".to_string(), "5".to_string())];
        let c = BrokerConfig::load(Some(&f), &["log.dirs=/tmp/y".into()], env.into_iter()).unwrap();
        assert_eq!(c.broker_id, 1);
        assert_eq!(c.num_partitions, 5);
        assert_eq!(c.log_dirs, vec![PathBuf::from("/tmp/y")]);
    }
}
