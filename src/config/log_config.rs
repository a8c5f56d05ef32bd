//! The log: `log.dirs`, the `log.*` keys that give topics their defaults, the cleaner's
//! settings, and the topic-level keys (their broker defaults and their validation).

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::log::cleaner::CleanerConfig;
use crate::log::LogConfig;

use super::parse::{at_least, boolean, in_range, num, positive, value};
use super::{invalid, BrokerConfig, ConfigError};

/// `log.dirs` (or its alias `log.dir`): at least one directory.
pub(super) fn log_dirs(values: &BTreeMap<String, String>) -> Result<Vec<PathBuf>, ConfigError> {
    let get = |k: &str| value(values, k);
    let log_dirs: Vec<PathBuf> =
        get("log.dirs").split(',').map(str::trim).filter(|s| !s.is_empty()).map(PathBuf::from).collect();
    if log_dirs.is_empty() {
        return Err(invalid("log.dirs", get("log.dirs"), "at least one directory is required"));
    }
    Ok(log_dirs)
}

/// The topic-level defaults from the broker's `log.*` keys.
pub(super) fn log_defaults(values: &BTreeMap<String, String>) -> Result<LogConfig, ConfigError> {
    let get = |k: &str| value(values, k);
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
        flush_interval_messages: positive::<u64>("log.flush.interval.messages", get("log.flush.interval.messages"))?,
        flush_interval_ms,
        file_delete_delay_ms: num::<u64>("log.segment.delete.delay.ms", get("log.segment.delete.delay.ms"))?,
        message_downconversion_enable: boolean(
            "log.message.downconversion.enable",
            get("log.message.downconversion.enable"),
        )?,
        compact,
        delete,
        delete_retention_ms: at_least("log.cleaner.delete.retention.ms", get("log.cleaner.delete.retention.ms"), 0)?,
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
        min_cleanable_dirty_ratio: ratio("log.cleaner.min.cleanable.ratio", get("log.cleaner.min.cleanable.ratio"))?,
        log_append_time: timestamp_type("log.message.timestamp.type", get("log.message.timestamp.type"))?,
    };
    check_compaction_lags("log.cleaner.min.compaction.lag.ms", &log)?;
    Ok(log)
}

/// The `log.cleaner.*` settings.
pub(super) fn cleaner(values: &BTreeMap<String, String>) -> Result<CleanerConfig, ConfigError> {
    let get = |k: &str| value(values, k);
    Ok(CleanerConfig {
        enable: boolean("log.cleaner.enable", get("log.cleaner.enable"))?,
        threads: positive::<usize>("log.cleaner.threads", get("log.cleaner.threads"))?,
        dedupe_buffer_size: positive::<u64>("log.cleaner.dedupe.buffer.size", get("log.cleaner.dedupe.buffer.size"))?,
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
    })
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

/// CreateTime or LogAppendTime: whether the broker stamps batches with its own clock.
pub(super) fn timestamp_type(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value {
        "CreateTime" => Ok(false),
        "LogAppendTime" => Ok(true),
        other => Err(invalid(key, other, "expected CreateTime or LogAppendTime")),
    }
}

/// `cleanup.policy`: `delete`, `compact` or both, as (compact, delete).
pub(super) fn cleanup_policy(key: &str, value: &str) -> Result<(bool, bool), ConfigError> {
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

pub(super) fn ratio(key: &str, value: &str) -> Result<f64, ConfigError> {
    let r = num::<f64>(key, value)?;
    if !(0.0..=1.0).contains(&r) {
        return Err(invalid(key, value, "must be between 0 and 1"));
    }
    Ok(r)
}

/// Kafka's `log.cleaner.io.buffer.load.factor`: how full the offset map may get.
pub(super) fn load_factor(key: &str, value: &str) -> Result<f64, ConfigError> {
    let r = num::<f64>(key, value)?;
    if !(r > 0.0 && r <= 1.0) {
        return Err(invalid(key, value, "must be greater than 0 and at most 1"));
    }
    Ok(r)
}

pub(super) fn check_compaction_lags(key: &str, c: &LogConfig) -> Result<(), ConfigError> {
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
pub(super) fn throttled_replicas(key: &str, value: &str) -> Result<(), ConfigError> {
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
pub(super) fn message_format_version(key: &str, value: &str) -> Result<(), ConfigError> {
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
