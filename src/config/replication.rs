//! Replication and the cluster: ZooKeeper, the rack, followers' fetching and the ISR, the
//! replication throttles, controlled shutdown and requests to other brokers.

use std::collections::BTreeMap;
use std::time::Duration;

use super::parse::{num, positive, value};
use super::{invalid, ConfigError};

/// The replication and cluster settings, as parsed.
pub(super) struct Replication {
    pub zookeeper_connect: Option<String>,
    pub zookeeper_session_timeout_ms: u64,
    pub zookeeper_connection_timeout_ms: u64,
    pub rack: Option<String>,
    pub rack_aware_selector: bool,
    pub default_replication_factor: i16,
    pub min_insync_replicas: i32,
    pub replica_lag_time_max_ms: u64,
    pub replica_fetch_wait_max_ms: u64,
    pub max_incremental_fetch_session_cache_slots: usize,
    pub replica_fetch_max_bytes: i32,
    pub replica_fetch_response_max_bytes: i32,
    pub leader_replication_throttled_rate: u64,
    pub follower_replication_throttled_rate: u64,
    pub replica_alter_log_dirs_io_max_bytes_per_second: u64,
    pub replica_fetch_backoff: Duration,
    pub controlled_shutdown_max_retries: u32,
    pub controlled_shutdown_retry_backoff: Duration,
    pub request_timeout: Duration,
    pub controller_socket_timeout: Duration,
    /// How long a follower waits for its leader's answer to a fetch before reconnecting.
    pub replica_socket_timeout: Duration,
}

impl Replication {
    pub(super) fn parse(values: &BTreeMap<String, String>) -> Result<Replication, ConfigError> {
        let get = |k: &str| value(values, k);
        let zk = get("zookeeper.connect").trim().to_string();
        let session_ms = positive::<u64>("zookeeper.session.timeout.ms", get("zookeeper.session.timeout.ms"))?;
        let connection_ms = if get("zookeeper.connection.timeout.ms").is_empty() {
            session_ms
        } else {
            positive::<u64>("zookeeper.connection.timeout.ms", get("zookeeper.connection.timeout.ms"))?
        };
        let replica_fetch_wait_max_ms = num::<u64>("replica.fetch.wait.max.ms", get("replica.fetch.wait.max.ms"))?;
        let replica_socket_timeout_ms = positive::<u64>("replica.socket.timeout.ms", get("replica.socket.timeout.ms"))?;
        if replica_socket_timeout_ms < replica_fetch_wait_max_ms {
            // As Kafka refuses it: every long poll would end in a timeout and a reconnection.
            return Err(invalid(
                "replica.socket.timeout.ms",
                get("replica.socket.timeout.ms"),
                "must be at least replica.fetch.wait.max.ms",
            ));
        }
        Ok(Replication {
            zookeeper_connect: Some(zk).filter(|s| !s.is_empty()),
            zookeeper_session_timeout_ms: session_ms,
            zookeeper_connection_timeout_ms: connection_ms,
            rack: Some(get("broker.rack").to_string()).filter(|r| !r.is_empty()),
            rack_aware_selector: rack_aware_selector(get("replica.selector.class"))?,
            default_replication_factor: positive::<i16>(
                "default.replication.factor",
                get("default.replication.factor"),
            )?,
            min_insync_replicas: positive::<i32>("min.insync.replicas", get("min.insync.replicas"))?,
            replica_lag_time_max_ms: positive::<u64>("replica.lag.time.max.ms", get("replica.lag.time.max.ms"))?,
            replica_fetch_wait_max_ms,
            replica_socket_timeout: Duration::from_millis(replica_socket_timeout_ms),
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
            replica_fetch_backoff: Duration::from_millis(num::<u64>(
                "replica.fetch.backoff.ms",
                get("replica.fetch.backoff.ms"),
            )?),
            controlled_shutdown_max_retries: num::<u32>(
                "controlled.shutdown.max.retries",
                get("controlled.shutdown.max.retries"),
            )?,
            controlled_shutdown_retry_backoff: Duration::from_millis(num::<u64>(
                "controlled.shutdown.retry.backoff.ms",
                get("controlled.shutdown.retry.backoff.ms"),
            )?),
            request_timeout: Duration::from_millis(positive::<u64>("request.timeout.ms", get("request.timeout.ms"))?),
            controller_socket_timeout: Duration::from_millis(positive::<u64>(
                "controller.socket.timeout.ms",
                get("controller.socket.timeout.ms"),
            )?),
        })
    }
}

/// `replica.selector.class`: whether a leader sends consumers to a replica in their rack.
pub(super) fn rack_aware_selector(class: &str) -> Result<bool, ConfigError> {
    match class.trim() {
        "" | "org.apache.kafka.common.replica.LeaderSelector" => Ok(false),
        "org.apache.kafka.common.replica.RackAwareReplicaSelector" => Ok(true),
        other => Err(invalid(
            "replica.selector.class",
            other,
            "only org.apache.kafka.common.replica.RackAwareReplicaSelector (or LeaderSelector) is available",
        )),
    }
}
