//! Groups and transactions: the shape of `__consumer_offsets` and `__transaction_state`, the
//! offset-commit limits, and the group and transaction coordinators' settings.

use std::collections::BTreeMap;
use std::time::Duration;

use super::parse::{num, positive, value};
use super::{BrokerConfig, ConfigError};

/// The coordinators' broker-level settings, as parsed.
pub(super) struct Coordinators {
    pub offsets_topic: InternalTopicConfig,
    pub offsets_zk_mirror_interval: Option<Duration>,
    pub offsets_zk_mirror_max_writes: usize,
    pub transaction_state_log: InternalTopicConfig,
    pub share_state_topic: InternalTopicConfig,
    pub offset_metadata_max_bytes: usize,
    pub offsets_commit_timeout: Duration,
}

impl Coordinators {
    pub(super) fn parse(values: &BTreeMap<String, String>) -> Result<Coordinators, ConfigError> {
        let get = |k: &str| value(values, k);
        Ok(Coordinators {
            offsets_topic: InternalTopicConfig::parse("offsets.topic", &get)?,
            offsets_zk_mirror_interval: Some(num::<u64>(
                "gregor.offsets.zookeeper.mirror.interval.ms",
                get("gregor.offsets.zookeeper.mirror.interval.ms"),
            )?)
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis),
            offsets_zk_mirror_max_writes: positive::<usize>(
                "gregor.offsets.zookeeper.mirror.max.writes",
                get("gregor.offsets.zookeeper.mirror.max.writes"),
            )?,
            transaction_state_log: InternalTopicConfig::parse("transaction.state.log", &get)?,
            share_state_topic: InternalTopicConfig::parse("share.coordinator.state.topic", &get)?,
            offset_metadata_max_bytes: num::<usize>("offset.metadata.max.bytes", get("offset.metadata.max.bytes"))?,
            offsets_commit_timeout: Duration::from_millis(positive::<u64>(
                "offsets.commit.timeout.ms",
                get("offsets.commit.timeout.ms"),
            )?),
        })
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

/// The group coordinator's settings.
pub struct CoordinatorConfig {
    pub initial_rebalance_delay: Duration,
    pub min_session_timeout_ms: i32,
    pub max_session_timeout_ms: i32,
    /// offsets.retention.minutes, in ms.
    pub offsets_retention_ms: i64,
    /// offsets.retention.check.interval.ms
    pub offsets_retention_check_interval_ms: u64,
    /// offset.metadata.max.bytes
    pub offset_metadata_max_bytes: usize,
}

/// The transaction coordinator's settings.
#[derive(Debug, Clone)]
pub struct TxnConfig {
    /// `transaction.max.timeout.ms`
    pub max_timeout_ms: i32,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`
    pub abort_check_interval_ms: u64,
    /// `transaction.partition.verification.enable` (KIP-890 part 1)
    pub verify_partitions: bool,
}

/// The `group.*` and `offsets.retention.*` keys. Read when the broker starts, which reports a bad
/// value; the messages name the key as [`ConfigError`]'s do.
pub fn coordinator_config(config: &BrokerConfig) -> anyhow::Result<CoordinatorConfig> {
    let get = |k: &str| -> anyhow::Result<i64> {
        let v = config.values.get(k).map(String::as_str).unwrap_or("");
        v.parse::<i64>().map_err(|_| anyhow::anyhow!("invalid value {v:?} for configuration {k}: not a number"))
    };
    let positive = |k: &str| -> anyhow::Result<i64> {
        match get(k)? {
            n if n > 0 => Ok(n),
            n => Err(anyhow::anyhow!("invalid value {n:?} for configuration {k}: must be greater than 0")),
        }
    };
    Ok(CoordinatorConfig {
        initial_rebalance_delay: Duration::from_millis(get("group.initial.rebalance.delay.ms")?.max(0) as u64),
        min_session_timeout_ms: get("group.min.session.timeout.ms")? as i32,
        max_session_timeout_ms: get("group.max.session.timeout.ms")? as i32,
        offsets_retention_ms: positive("offsets.retention.minutes")?.saturating_mul(60_000),
        offsets_retention_check_interval_ms: positive("offsets.retention.check.interval.ms")? as u64,
        offset_metadata_max_bytes: config.offset_metadata_max_bytes,
    })
}

/// The new consumer group protocol's settings (KIP-848), Kafka 4.x's names and defaults.
#[derive(Debug, Clone)]
pub struct ConsumerGroupConfig {
    /// Whether `group.coordinator.rebalance.protocols` names `consumer`: without it the
    /// ConsumerGroupHeartbeat and ConsumerGroupDescribe APIs are not offered.
    pub enabled: bool,
    /// `group.consumer.session.timeout.ms`
    pub session_timeout_ms: i32,
    /// `group.consumer.heartbeat.interval.ms`
    pub heartbeat_interval_ms: i32,
    /// `group.consumer.max.size`
    pub max_size: usize,
    /// `group.consumer.assignors`, short names; the first is the default.
    pub assignors: Vec<String>,
    /// `group.consumer.migration.policy`
    pub migration: MigrationPolicy,
}

/// `group.consumer.migration.policy`: which way a live group may change protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationPolicy {
    Disabled,
    Upgrade,
    Downgrade,
    Bidirectional,
}

impl MigrationPolicy {
    /// A classic group becomes a consumer group when a consumer-protocol member joins it.
    pub fn upgrade(self) -> bool {
        matches!(self, MigrationPolicy::Upgrade | MigrationPolicy::Bidirectional)
    }

    /// A consumer group whose last consumer-protocol member left becomes a classic group.
    pub fn downgrade(self) -> bool {
        matches!(self, MigrationPolicy::Downgrade | MigrationPolicy::Bidirectional)
    }
}

impl Default for ConsumerGroupConfig {
    fn default() -> Self {
        ConsumerGroupConfig {
            enabled: true,
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            max_size: i32::MAX as usize,
            assignors: vec!["uniform".into(), "range".into()],
            migration: MigrationPolicy::Bidirectional,
        }
    }
}

/// The `group.consumer.*` keys and `group.coordinator.rebalance.protocols`, checked against
/// their bounds as Kafka checks them at startup.
pub fn consumer_group_config(config: &BrokerConfig) -> anyhow::Result<ConsumerGroupConfig> {
    let get = |k: &str, default: i64| -> anyhow::Result<i64> {
        match config.values.get(k) {
            None => Ok(default),
            Some(v) => match v.trim().parse::<i64>() {
                Ok(n) if n > 0 && n <= i32::MAX as i64 => Ok(n),
                _ => Err(anyhow::anyhow!("invalid value {v:?} for configuration {k}: must be a positive int")),
            },
        }
    };
    let session = get("group.consumer.session.timeout.ms", 45_000)?;
    let (min_session, max_session) =
        (get("group.consumer.min.session.timeout.ms", 45_000)?, get("group.consumer.max.session.timeout.ms", 60_000)?);
    let heartbeat = get("group.consumer.heartbeat.interval.ms", 5_000)?;
    let (min_heartbeat, max_heartbeat) = (
        get("group.consumer.min.heartbeat.interval.ms", 5_000)?,
        get("group.consumer.max.heartbeat.interval.ms", 15_000)?,
    );
    if !(min_session..=max_session).contains(&session) {
        anyhow::bail!(
            "group.consumer.session.timeout.ms {session} must be within group.consumer.min.session.timeout.ms \
             {min_session} and group.consumer.max.session.timeout.ms {max_session}"
        );
    }
    if !(min_heartbeat..=max_heartbeat).contains(&heartbeat) {
        anyhow::bail!(
            "group.consumer.heartbeat.interval.ms {heartbeat} must be within group.consumer.min.heartbeat.interval.ms \
             {min_heartbeat} and group.consumer.max.heartbeat.interval.ms {max_heartbeat}"
        );
    }
    if heartbeat >= session {
        anyhow::bail!("group.consumer.heartbeat.interval.ms must be less than group.consumer.session.timeout.ms");
    }
    let protocols = config.values.get("group.coordinator.rebalance.protocols").map(String::as_str);
    let protocols: Vec<String> = protocols
        .unwrap_or("classic,consumer")
        .split(',')
        .map(|p| p.trim().to_lowercase())
        .filter(|p| !p.is_empty())
        .collect();
    if let Some(bad) = protocols.iter().find(|p| !["classic", "consumer", "streams", "share"].contains(&p.as_str())) {
        anyhow::bail!("invalid value {bad:?} in group.coordinator.rebalance.protocols");
    }
    if !protocols.iter().any(|p| p == "classic") {
        anyhow::bail!("group.coordinator.rebalance.protocols must contain classic");
    }
    let migration = match config.values.get("group.consumer.migration.policy") {
        None => MigrationPolicy::Bidirectional,
        Some(v) => match v.trim().to_lowercase().as_str() {
            "disabled" => MigrationPolicy::Disabled,
            "upgrade" => MigrationPolicy::Upgrade,
            "downgrade" => MigrationPolicy::Downgrade,
            "bidirectional" => MigrationPolicy::Bidirectional,
            _ => anyhow::bail!(
                "invalid value {v:?} for configuration group.consumer.migration.policy: \
                 must be one of disabled, upgrade, downgrade, bidirectional"
            ),
        },
    };
    let assignors = config.values.get("group.consumer.assignors").map(String::as_str).unwrap_or("uniform,range");
    let mut names = Vec::new();
    for a in assignors.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        // Kafka accepts its classes' names as well as the short ones.
        let name = match a {
            "uniform" | "org.apache.kafka.coordinator.group.assignor.UniformAssignor" => "uniform",
            "range" | "org.apache.kafka.coordinator.group.assignor.RangeAssignor" => "range",
            other => {
                anyhow::bail!("invalid value {other:?} for configuration group.consumer.assignors: unknown assignor")
            }
        };
        names.push(name.to_string());
    }
    if names.is_empty() {
        anyhow::bail!("group.consumer.assignors must name at least one assignor");
    }
    let max_size = match config.values.get("group.consumer.max.size") {
        None => i32::MAX as usize,
        Some(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| anyhow::anyhow!("invalid value {v:?} for configuration group.consumer.max.size"))?,
    };
    Ok(ConsumerGroupConfig {
        enabled: protocols.iter().any(|p| p == "consumer"),
        session_timeout_ms: session as i32,
        heartbeat_interval_ms: heartbeat as i32,
        max_size,
        assignors: names,
        migration,
    })
}

/// Share groups' settings (KIP-932), Kafka 4.x's names, defaults and bounds.
#[derive(Debug, Clone)]
pub struct ShareGroupConfig {
    /// Whether `group.coordinator.rebalance.protocols` names `share` (Kafka 4.x's
    /// `share.version` feature): without it the share-group APIs are not offered.
    pub enabled: bool,
    /// `group.share.session.timeout.ms`
    pub session_timeout_ms: i32,
    /// `group.share.heartbeat.interval.ms`
    pub heartbeat_interval_ms: i32,
    /// `group.share.max.size`: members per share group.
    pub max_size: usize,
    /// `group.share.record.lock.duration.ms`: how long an acquired record stays locked.
    pub record_lock_duration_ms: i32,
    /// `group.share.delivery.count.limit`: deliveries before a record is archived.
    pub delivery_count_limit: i16,
    /// `group.share.partition.max.record.locks`: in-flight records per share-partition.
    pub partition_max_record_locks: usize,
    /// `group.share.max.share.sessions`: share sessions this broker keeps.
    pub max_share_sessions: usize,
    /// `share.coordinator.snapshot.update.records.per.snapshot`: ShareUpdate records written
    /// for a share-partition before the next is a ShareSnapshot.
    pub update_records_per_snapshot: u32,
    /// `group.share.{min,max}.session.timeout.ms`: what a group config may set.
    pub session_timeout_bounds_ms: (i32, i32),
    /// `group.share.{min,max}.heartbeat.interval.ms`
    pub heartbeat_interval_bounds_ms: (i32, i32),
    /// `group.share.{min,max}.record.lock.duration.ms`
    pub record_lock_duration_bounds_ms: (i32, i32),
}

impl Default for ShareGroupConfig {
    fn default() -> Self {
        ShareGroupConfig {
            enabled: false,
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            max_size: 200,
            record_lock_duration_ms: 30_000,
            delivery_count_limit: 5,
            partition_max_record_locks: 2_000,
            max_share_sessions: 2_000,
            update_records_per_snapshot: 500,
            session_timeout_bounds_ms: (45_000, 60_000),
            heartbeat_interval_bounds_ms: (5_000, 15_000),
            record_lock_duration_bounds_ms: (15_000, 60_000),
        }
    }
}

/// The `group.share.*` keys, checked against the bounds Kafka gives them (each value within
/// its `min`/`max` companion keys).
pub fn share_group_config(config: &BrokerConfig) -> anyhow::Result<ShareGroupConfig> {
    let get = |k: &str, default: i64| -> anyhow::Result<i64> {
        match config.values.get(k) {
            None => Ok(default),
            Some(v) => match v.trim().parse::<i64>() {
                Ok(n) if n > 0 && n <= i32::MAX as i64 => Ok(n),
                _ => Err(anyhow::anyhow!("invalid value {v:?} for configuration {k}: must be a positive int")),
            },
        }
    };
    let within = |k: &str,
                  default: i64,
                  min_key: &str,
                  min: i64,
                  max_key: &str,
                  max: i64|
     -> anyhow::Result<(i64, (i32, i32))> {
        let (v, lo, hi) = (get(k, default)?, get(min_key, min)?, get(max_key, max)?);
        if !(lo..=hi).contains(&v) {
            anyhow::bail!("{k} {v} must be within {min_key} {lo} and {max_key} {hi}");
        }
        Ok((v, (lo as i32, hi as i32)))
    };
    let (session, session_bounds) = within(
        "group.share.session.timeout.ms",
        45_000,
        "group.share.min.session.timeout.ms",
        45_000,
        "group.share.max.session.timeout.ms",
        60_000,
    )?;
    let (heartbeat, heartbeat_bounds) = within(
        "group.share.heartbeat.interval.ms",
        5_000,
        "group.share.min.heartbeat.interval.ms",
        5_000,
        "group.share.max.heartbeat.interval.ms",
        15_000,
    )?;
    if heartbeat >= session {
        anyhow::bail!("group.share.heartbeat.interval.ms must be less than group.share.session.timeout.ms");
    }
    let (lock, lock_bounds) = within(
        "group.share.record.lock.duration.ms",
        30_000,
        "group.share.min.record.lock.duration.ms",
        15_000,
        "group.share.max.record.lock.duration.ms",
        60_000,
    )?;
    let (deliveries, _) = within(
        "group.share.delivery.count.limit",
        5,
        "group.share.min.delivery.count.limit",
        2,
        "group.share.max.delivery.count.limit",
        10,
    )?;
    let locks = get("group.share.partition.max.record.locks", 2_000)?;
    if !(100..=10_000).contains(&locks) {
        anyhow::bail!("group.share.partition.max.record.locks {locks} must be within 100 and 10000");
    }
    let protocols = config.values.get("group.coordinator.rebalance.protocols").map(String::as_str);
    let enabled = protocols.unwrap_or("classic,consumer").split(',').any(|p| p.trim().eq_ignore_ascii_case("share"));
    Ok(ShareGroupConfig {
        enabled,
        session_timeout_ms: session as i32,
        heartbeat_interval_ms: heartbeat as i32,
        max_size: get("group.share.max.size", 200)? as usize,
        record_lock_duration_ms: lock as i32,
        delivery_count_limit: deliveries as i16,
        partition_max_record_locks: locks as usize,
        max_share_sessions: get("group.share.max.share.sessions", 2_000)? as usize,
        // Kafka's bounds: at least 0 (0 makes every write a snapshot), at most 500.
        update_records_per_snapshot: match config.values.get("share.coordinator.snapshot.update.records.per.snapshot") {
            None => 500,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if n <= 500 => n,
                _ => anyhow::bail!(
                    "invalid value {v:?} for configuration share.coordinator.snapshot.update.records.per.snapshot: must be within 0 and 500"
                ),
            },
        },
        session_timeout_bounds_ms: session_bounds,
        heartbeat_interval_bounds_ms: heartbeat_bounds,
        record_lock_duration_bounds_ms: lock_bounds,
    })
}

/// `transaction.max.timeout.ms` and `transaction.abort.timed.out.transaction.cleanup.interval.ms`,
/// Kafka's names and defaults.
pub fn txn_config(config: &BrokerConfig) -> anyhow::Result<TxnConfig> {
    let get = |k: &str, default: i64| -> anyhow::Result<i64> {
        match config.values.get(k) {
            None => Ok(default),
            Some(v) => match v.trim().parse::<i64>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(anyhow::anyhow!("invalid value {v:?} for configuration {k}: must be a number greater than 0")),
            },
        }
    };
    Ok(TxnConfig {
        max_timeout_ms: get("transaction.max.timeout.ms", 900_000)?.min(i32::MAX as i64) as i32,
        abort_check_interval_ms: get("transaction.abort.timed.out.transaction.cleanup.interval.ms", 10_000)? as u64,
        verify_partitions: match config.values.get("transaction.partition.verification.enable").map(|v| v.trim()) {
            None | Some("true") => true,
            Some("false") => false,
            Some(v) => {
                return Err(anyhow::anyhow!(
                    "invalid value {v:?} for configuration transaction.partition.verification.enable: must be true or false"
                ))
            }
        },
    })
}
