//! Broker configuration, read the way Kafka reads it.
//!
//! Sources, lowest precedence first: Kafka's defaults, a `server.properties` (Java properties) or
//! `*.toml` file, `KAFKA_<KEY>` environment variables (as the common Kafka images map them), and
//! `--override key=value` arguments. Every key keeps Kafka's name. An unknown key is a warning;
//! a value that does not parse is an error naming the key, and the broker does not start.
//!
//! One file per concern: `listeners` (and security), `log_config`, `replication`, `limits`,
//! `coordinators` (groups and transactions), `keys` (defaults, dynamic keys), `parse` (value
//! parsers, file formats, environment names).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::log::LogConfig;

pub mod client_telemetry;
mod coordinators;
mod keys;
mod limits;
mod listeners;
mod log_config;
mod parse;
mod replication;
#[cfg(test)]
mod tests;

pub use coordinators::{
    consumer_group_config, coordinator_config, share_group_config, txn_config, ConsumerGroupConfig, CoordinatorConfig,
    InternalTopicConfig, MigrationPolicy, ShareGroupConfig, TxnConfig,
};
pub use keys::{
    is_dynamic_broker_config, is_dynamic_in_kafka_only, is_per_broker_only, DEFAULTS, PER_BROKER_SASL_KEYS,
};
pub use listeners::{parse_endpoints, Endpoint, ACL_AUTHORIZER_CLASSES};
pub use log_config::TOPIC_CONFIGS;
pub use parse::{parse_properties, parse_toml};

use keys::check_sasl_value;
use parse::env_to_key;

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
    /// `gregor.open.files.reserved`: of the open-file limit, what segment files may not take.
    pub open_files_reserved: u64,
    /// `gregor.log.segment.fd.cache.size`: segment files open at once; None: sized at start
    /// from the open-file limit.
    pub segment_fd_cache_size: Option<usize>,
    /// `gregor.log.index.mmap.cache.size`: index files mapped at once; None: sized at start
    /// from vm.max_map_count.
    pub index_mmap_cache_size: Option<usize>,
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
    /// Client telemetry (KIP-714): served or not, and its bounds.
    pub client_telemetry: client_telemetry::ClientTelemetryConfig,
    /// How `__transaction_state` is created.
    pub transaction_state_log: InternalTopicConfig,
    /// How `__share_group_state` is created (`share.coordinator.state.topic.*`).
    pub share_state_topic: InternalTopicConfig,
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
    /// `controller.socket.timeout.ms`: how long the controller's channel to a broker may take
    /// to connect (within `socket.connection.setup.timeout.ms`, which bounds every connect).
    pub controller_socket_timeout: std::time::Duration,
    /// `replica.socket.timeout.ms`: a follower's fetch unanswered this long is sent again on a
    /// new connection.
    pub replica_socket_timeout: std::time::Duration,
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
        keys::warn_unused(&given);
        let given_keys = given.clone();
        let values = keys::with_defaults(given);
        let get = |k: &str| parse::value(&values, k);
        let net = listeners::Listeners::parse(&values)?;
        let log_dirs = log_config::log_dirs(&values)?;
        let log = log_config::log_defaults(&values)?;
        let cleaner = log_config::cleaner(&values)?;
        let repl = replication::Replication::parse(&values)?;
        let limits = limits::Limits::parse(&values, &net.listeners)?;
        let metrics_address = listeners::metrics_address(get(listeners::METRICS_HOST), get(listeners::METRICS_PORT))?;
        let coord = coordinators::Coordinators::parse(&values)?;
        let config = BrokerConfig {
            broker_id: parse::num::<i32>("broker.id", get("broker.id"))?,
            rack: repl.rack,
            rack_aware_selector: repl.rack_aware_selector,
            listeners: net.listeners,
            advertised_listeners: net.advertised_listeners,
            inter_broker_listener: net.inter_broker_listener,
            log_dirs,
            num_partitions: parse::positive::<i32>("num.partitions", get("num.partitions"))?,
            max_request_partition_size_limit: limits.max_request_partition_size_limit,
            max_partitions_per_topic: limits.max_partitions_per_topic,
            max_partitions_per_request: limits.max_partitions_per_request,
            connection_log_interval: limits.connection_log_interval,
            open_files_reserved: limits.open_files_reserved,
            segment_fd_cache_size: limits.segment_fd_cache_size,
            index_mmap_cache_size: limits.index_mmap_cache_size,
            default_replication_factor: repl.default_replication_factor,
            auto_create_topics_enable: parse::boolean("auto.create.topics.enable", get("auto.create.topics.enable"))?,
            delete_topic_enable: parse::boolean("delete.topic.enable", get("delete.topic.enable"))?,
            socket_request_max_bytes: limits.socket_request_max_bytes,
            zookeeper_connect: repl.zookeeper_connect,
            zookeeper_session_timeout_ms: repl.zookeeper_session_timeout_ms,
            zookeeper_connection_timeout_ms: repl.zookeeper_connection_timeout_ms,
            log_retention_check_interval_ms: parse::positive::<u64>(
                "log.retention.check.interval.ms",
                get("log.retention.check.interval.ms"),
            )?,
            log_flush_scheduler_interval_ms: parse::positive::<u64>(
                "log.flush.scheduler.interval.ms",
                get("log.flush.scheduler.interval.ms"),
            )?,
            log_flush_offset_checkpoint_interval_ms: parse::positive::<u64>(
                "log.flush.offset.checkpoint.interval.ms",
                get("log.flush.offset.checkpoint.interval.ms"),
            )?,
            min_insync_replicas: repl.min_insync_replicas,
            replica_lag_time_max_ms: repl.replica_lag_time_max_ms,
            replica_fetch_wait_max_ms: repl.replica_fetch_wait_max_ms,
            max_incremental_fetch_session_cache_slots: repl.max_incremental_fetch_session_cache_slots,
            replica_fetch_max_bytes: repl.replica_fetch_max_bytes,
            replica_fetch_response_max_bytes: repl.replica_fetch_response_max_bytes,
            leader_replication_throttled_rate: repl.leader_replication_throttled_rate,
            follower_replication_throttled_rate: repl.follower_replication_throttled_rate,
            replica_alter_log_dirs_io_max_bytes_per_second: repl.replica_alter_log_dirs_io_max_bytes_per_second,
            metrics_address,
            max_connections: limits.max_connections,
            max_connections_per_ip: limits.max_connections_per_ip,
            max_connections_per_ip_overrides: limits.max_connections_per_ip_overrides,
            connections_max_idle: limits.connections_max_idle,
            listener_max_connections: limits.listener_max_connections,
            max_connection_creation_rate: limits.max_connection_creation_rate,
            listener_max_connection_creation_rate: limits.listener_max_connection_creation_rate,
            queued_max_request_bytes: limits.queued_max_request_bytes,
            queued_max_requests: limits.queued_max_requests,
            num_io_threads: limits.num_io_threads,
            max_decoded_bytes_per_request: limits.max_decoded_bytes_per_request,
            offsets_topic: coord.offsets_topic,
            offsets_zk_mirror_interval: coord.offsets_zk_mirror_interval,
            offsets_zk_mirror_max_writes: coord.offsets_zk_mirror_max_writes,
            config_change_expiration_ms: parse::positive::<i64>(
                "gregor.config.change.expiration.ms",
                get("gregor.config.change.expiration.ms"),
            )?,
            client_telemetry: client_telemetry::ClientTelemetryConfig::parse(&values)?,
            transaction_state_log: coord.transaction_state_log,
            share_state_topic: coord.share_state_topic,
            offset_metadata_max_bytes: coord.offset_metadata_max_bytes,
            offsets_commit_timeout: coord.offsets_commit_timeout,
            replica_fetch_backoff: repl.replica_fetch_backoff,
            controlled_shutdown_max_retries: repl.controlled_shutdown_max_retries,
            controlled_shutdown_retry_backoff: repl.controlled_shutdown_retry_backoff,
            request_timeout: repl.request_timeout,
            controller_socket_timeout: repl.controller_socket_timeout,
            replica_socket_timeout: repl.replica_socket_timeout,
            log,
            cleaner,
            values: values.clone(),
            given: given_keys,
        };
        config.check_consistency()
    }

    /// What no single key's parser can see: the booleans nothing else reads, and the
    /// partition count against its limit.
    fn check_consistency(self) -> Result<BrokerConfig, ConfigError> {
        let get = |k: &str| parse::value(&self.values, k);
        for key in ["log.cleaner.enable", "unclean.leader.election.enable", "controlled.shutdown.enable"] {
            parse::boolean(key, get(key))?;
        }
        if self.num_partitions > self.max_partitions_per_topic {
            return Err(invalid(
                "num.partitions",
                get("num.partitions"),
                format!("exceeds gregor.max.partitions.per.topic ({})", self.max_partitions_per_topic),
            ));
        }
        Ok(self)
    }

    /// The endpoint clients should use, matching the listener they connected to.
    pub fn advertised_for(&self, listener_name: &str) -> Option<&Endpoint> {
        self.advertised_listeners
            .iter()
            .find(|e| e.listener_name == listener_name)
            .or_else(|| self.advertised_listeners.first())
    }
}
