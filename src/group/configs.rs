//! Group configs (Kafka 4.x's `GroupConfig`, config resource type GROUP): a group's overrides
//! of the share-group settings. Kafka keeps them in KRaft metadata; on a ZooKeeper cluster they
//! live in `/config/groups/<group>` in the JSON shape of `/config/topics`, so every broker
//! reads the same and the metadata watch brings each change to all of them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use crate::config::ShareGroupConfig;
use crate::metadata::{zk_data, StoreError, ZnodeStore};
use crate::sync::RwLockExt;

pub const CONFIG_GROUPS: &str = "/config/groups";

pub const SHARE_SESSION_TIMEOUT_MS: &str = "share.session.timeout.ms";
pub const SHARE_HEARTBEAT_INTERVAL_MS: &str = "share.heartbeat.interval.ms";
pub const SHARE_RECORD_LOCK_DURATION_MS: &str = "share.record.lock.duration.ms";
pub const SHARE_AUTO_OFFSET_RESET: &str = "share.auto.offset.reset";
pub const SHARE_ISOLATION_LEVEL: &str = "share.isolation.level";

/// The group config names gregor honours, each with the broker key its default comes from
/// (None: a fixed default).
pub const NAMES: [(&str, Option<&str>); 5] = [
    (SHARE_AUTO_OFFSET_RESET, None),
    (SHARE_HEARTBEAT_INTERVAL_MS, Some("group.share.heartbeat.interval.ms")),
    (SHARE_ISOLATION_LEVEL, None),
    (SHARE_RECORD_LOCK_DURATION_MS, Some("group.share.record.lock.duration.ms")),
    (SHARE_SESSION_TIMEOUT_MS, Some("group.share.session.timeout.ms")),
];

/// `share.auto.offset.reset`: where a share-partition with no state starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetReset {
    Earliest,
    Latest,
    /// The first record at most this many milliseconds old.
    ByDuration(i64),
}

/// One share group's settings: its overrides over the broker's `group.share.*` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareSettings {
    pub session_timeout_ms: i32,
    pub heartbeat_interval_ms: i32,
    pub record_lock_duration_ms: i32,
    pub auto_offset_reset: OffsetReset,
    /// `share.isolation.level` = read_committed.
    pub read_committed: bool,
}

pub fn group_path(group: &str) -> String {
    format!("{CONFIG_GROUPS}/{}", crate::security::scram::sanitize(group))
}

pub struct GroupConfigs {
    store: Option<Arc<ZnodeStore>>,
    defaults: ShareGroupConfig,
    overrides: RwLock<HashMap<String, BTreeMap<String, String>>>,
}

impl GroupConfigs {
    pub fn new(store: Arc<ZnodeStore>, defaults: ShareGroupConfig) -> GroupConfigs {
        GroupConfigs { store: Some(store), ..GroupConfigs::in_memory(defaults) }
    }

    /// Defaults only, nothing stored (unit tests).
    pub fn in_memory(defaults: ShareGroupConfig) -> GroupConfigs {
        GroupConfigs { store: None, defaults, overrides: RwLock::default() }
    }

    pub fn defaults(&self) -> &ShareGroupConfig {
        &self.defaults
    }

    /// The group's overrides as stored.
    pub fn overrides(&self, group: &str) -> BTreeMap<String, String> {
        self.overrides.read_unpoisoned().get(group).cloned().unwrap_or_default()
    }

    /// The settings in force for `group`. Stored values were checked when written; one that
    /// no longer parses (another tool wrote it) gives way to the default.
    pub fn share(&self, group: &str) -> ShareSettings {
        let overrides = self.overrides.read_unpoisoned();
        match overrides.get(group) {
            None => self.settings_from(&BTreeMap::new()).unwrap_or_else(|_| self.fallback()),
            Some(o) => self.settings_from(o).unwrap_or_else(|_| self.fallback()),
        }
    }

    fn fallback(&self) -> ShareSettings {
        ShareSettings {
            session_timeout_ms: self.defaults.session_timeout_ms,
            heartbeat_interval_ms: self.defaults.heartbeat_interval_ms,
            record_lock_duration_ms: self.defaults.record_lock_duration_ms,
            auto_offset_reset: OffsetReset::Latest,
            read_committed: false,
        }
    }

    /// Every name's (value in force, whether the group overrides it, default) for
    /// DescribeConfigs.
    pub fn entries(&self, group: &str) -> Vec<(&'static str, String, bool, String)> {
        let overrides = self.overrides(group);
        let s = self.fallback();
        NAMES
            .iter()
            .map(|&(name, _)| {
                let default = match name {
                    SHARE_SESSION_TIMEOUT_MS => s.session_timeout_ms.to_string(),
                    SHARE_HEARTBEAT_INTERVAL_MS => s.heartbeat_interval_ms.to_string(),
                    SHARE_RECORD_LOCK_DURATION_MS => s.record_lock_duration_ms.to_string(),
                    SHARE_AUTO_OFFSET_RESET => "latest".to_string(),
                    _ => "read_uncommitted".to_string(),
                };
                match overrides.get(name) {
                    Some(v) => (name, v.clone(), true, default),
                    None => (name, default.clone(), false, default),
                }
            })
            .collect()
    }

    /// Checks a group's complete set of overrides as Kafka's `GroupConfig.validate` does:
    /// known names, parsable values within the broker's bounds, session above heartbeat.
    pub fn validate(&self, configs: &BTreeMap<String, String>) -> Result<ShareSettings, String> {
        if let Some(unknown) = configs.keys().find(|k| !NAMES.iter().any(|(n, _)| n == k)) {
            return Err(format!("Unknown group config name: {unknown}"));
        }
        self.settings_from(configs)
    }

    fn settings_from(&self, configs: &BTreeMap<String, String>) -> Result<ShareSettings, String> {
        let d = &self.defaults;
        let int = |name: &str, default: i32, (lo, hi): (i32, i32), min_key: &str, max_key: &str| {
            let Some(v) = configs.get(name) else { return Ok(default) };
            let n: i32 = v
                .trim()
                .parse()
                .map_err(|_| format!("Invalid value {v} for configuration {name}: Not a number of type INT"))?;
            if n < lo {
                return Err(format!("{name} must be greater than or equal to {min_key}"));
            }
            if n > hi {
                return Err(format!("{name} must be less than or equal to {max_key}"));
            }
            Ok(n)
        };
        let session = int(
            SHARE_SESSION_TIMEOUT_MS,
            d.session_timeout_ms,
            d.session_timeout_bounds_ms,
            "group.share.min.session.timeout.ms",
            "group.share.max.session.timeout.ms",
        )?;
        let heartbeat = int(
            SHARE_HEARTBEAT_INTERVAL_MS,
            d.heartbeat_interval_ms,
            d.heartbeat_interval_bounds_ms,
            "group.share.min.heartbeat.interval.ms",
            "group.share.max.heartbeat.interval.ms",
        )?;
        let lock = int(
            SHARE_RECORD_LOCK_DURATION_MS,
            d.record_lock_duration_ms,
            d.record_lock_duration_bounds_ms,
            "group.share.min.record.lock.duration.ms",
            "group.share.max.record.lock.duration.ms",
        )?;
        if session <= heartbeat {
            return Err(format!("{SHARE_SESSION_TIMEOUT_MS} must be greater than {SHARE_HEARTBEAT_INTERVAL_MS}"));
        }
        let reset = match configs.get(SHARE_AUTO_OFFSET_RESET) {
            None => OffsetReset::Latest,
            Some(v) => parse_reset(v).ok_or_else(|| {
                format!("Invalid value {v} for configuration {SHARE_AUTO_OFFSET_RESET}: must be earliest, latest or by_duration:<ISO-8601 duration>")
            })?,
        };
        let read_committed = match configs.get(SHARE_ISOLATION_LEVEL).map(|v| v.trim()) {
            None | Some("read_uncommitted") => false,
            Some("read_committed") => true,
            Some(v) => {
                return Err(format!(
                    "Invalid value {v} for configuration {SHARE_ISOLATION_LEVEL}: String must be one of: read_committed, read_uncommitted"
                ))
            }
        };
        Ok(ShareSettings {
            session_timeout_ms: session,
            heartbeat_interval_ms: heartbeat,
            record_lock_duration_ms: lock,
            auto_offset_reset: reset,
            read_committed,
        })
    }

    /// A read-modify-write of `group`'s overrides: `change` turns the stored ones into the
    /// new ones (or refuses), which are then written with a compare-and-set on the znode, so
    /// a concurrent writer's change is never lost (the step runs again on its result). They
    /// apply here at once; the other brokers follow through their metadata watch.
    pub fn update<E: From<StoreError>>(
        &self,
        group: &str,
        validate_only: bool,
        change: impl Fn(BTreeMap<String, String>) -> Result<BTreeMap<String, String>, E>,
    ) -> Result<(), E> {
        let Some(store) = &self.store else {
            let next = change(self.overrides(group))?;
            if !validate_only {
                self.apply(group, next);
            }
            return Ok(());
        };
        let path = group_path(group);
        // Each retry follows another writer's success: a bound only against a storm of them.
        for _ in 0..16 {
            let stored = store.get_versioned(&path)?;
            let version = stored.as_ref().map(|(_, v)| *v);
            let next = change(stored.map(|(d, _)| zk_data::parse_topic_config(&d)).unwrap_or_default())?;
            if validate_only {
                return Ok(());
            }
            let written = match (version, next.is_empty()) {
                (None, true) => Ok(()),
                (None, false) => store.create(&path, &zk_data::topic_config_json(&next), false),
                (Some(v), true) => store.delete_if_version(&path, v),
                (Some(v), false) => store.set_if_version(&path, &zk_data::topic_config_json(&next), v),
            };
            match written {
                Ok(()) => {
                    self.apply(group, next);
                    return Ok(());
                }
                Err(StoreError::BadVersion(_) | StoreError::NodeExists(_) | StoreError::NoNode(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(StoreError::BadVersion(path).into())
    }

    fn apply(&self, group: &str, configs: BTreeMap<String, String>) {
        let mut overrides = self.overrides.write_unpoisoned();
        if configs.is_empty() {
            overrides.remove(group);
        } else {
            overrides.insert(group.to_string(), configs);
        }
    }

    /// Reads the named groups' znodes again (sanitized names), or every group's (None).
    pub fn reload(&self, groups: Option<&BTreeSet<String>>) -> Result<(), StoreError> {
        let Some(store) = &self.store else { return Ok(()) };
        let names: Vec<String> = match groups {
            Some(g) => g.iter().cloned().collect(),
            None => store.try_children(CONFIG_GROUPS)?,
        };
        let mut read = Vec::with_capacity(names.len());
        for child in &names {
            let data = store.try_get(&format!("{CONFIG_GROUPS}/{child}"))?;
            let configs = data.map(|d| zk_data::parse_topic_config(&d)).unwrap_or_default();
            read.push((crate::security::scram::desanitize(child), configs));
        }
        // One swap: a reader never sees the groups between a clear and their refill.
        let mut overrides = self.overrides.write_unpoisoned();
        if groups.is_none() {
            overrides.clear();
        }
        for (group, configs) in read {
            if configs.is_empty() {
                overrides.remove(&group);
            } else {
                overrides.insert(group, configs);
            }
        }
        Ok(())
    }
}

impl crate::metadata::MetadataListener for GroupConfigs {
    fn on_group_configs_changed(&self, groups: Option<&BTreeSet<String>>) -> Result<(), StoreError> {
        self.reload(groups)
    }
}

/// `earliest`, `latest` or `by_duration:<ISO-8601 duration>` (Java's `Duration.parse` form,
/// not negative).
pub fn parse_reset(v: &str) -> Option<OffsetReset> {
    match v.trim() {
        "earliest" => Some(OffsetReset::Earliest),
        "latest" => Some(OffsetReset::Latest),
        other => parse_iso_duration_ms(other.strip_prefix("by_duration:")?).map(OffsetReset::ByDuration),
    }
}

/// `PnDTnHnMn.nS` (each part optional, at least one) in milliseconds.
fn parse_iso_duration_ms(s: &str) -> Option<i64> {
    let rest = s.strip_prefix('P').or_else(|| s.strip_prefix('p'))?;
    let (days, time) = match rest.find(['T', 't']) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let mut ms: i64 = 0;
    let mut parts = 0;
    if !days.is_empty() {
        let n: i64 = days.strip_suffix(['D', 'd'])?.parse().ok()?;
        ms = ms.checked_add(n.checked_mul(86_400_000)?)?;
        parts += 1;
    }
    if let Some(mut t) = time {
        if t.is_empty() {
            return None;
        }
        for (unit, scale) in [(['H', 'h'], 3_600_000i64), (['M', 'm'], 60_000)] {
            if let Some(i) = t.find(unit) {
                let n: i64 = t[..i].parse().ok()?;
                ms = ms.checked_add(n.checked_mul(scale)?)?;
                t = &t[i + 1..];
                parts += 1;
            }
        }
        if !t.is_empty() {
            let secs = t.strip_suffix(['S', 's'])?;
            let (whole, frac) = secs.split_once('.').unwrap_or((secs, ""));
            let n: i64 = whole.parse().ok()?;
            let frac_ms: i64 = match frac.len() {
                0 => 0,
                1..=9 if frac.bytes().all(|b| b.is_ascii_digit()) => format!("{frac:0<3}")[..3].parse().ok()?,
                _ => return None,
            };
            ms = ms.checked_add(n.checked_mul(1000)?)?.checked_add(frac_ms)?;
            parts += 1;
        }
    }
    (parts > 0 && ms >= 0).then_some(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_reset_values_parse_as_kafka_accepts_them() {
        assert_eq!(parse_reset("earliest"), Some(OffsetReset::Earliest));
        assert_eq!(parse_reset("latest"), Some(OffsetReset::Latest));
        assert_eq!(parse_reset("by_duration:PT1H"), Some(OffsetReset::ByDuration(3_600_000)));
        assert_eq!(parse_reset("by_duration:P1DT2M3.5S"), Some(OffsetReset::ByDuration(86_400_000 + 120_000 + 3_500)));
        for bad in
            ["", "none", "by_duration:", "by_duration:PT", "by_duration:1H", "by_duration:PT-1H", "by_duration:P"]
        {
            assert_eq!(parse_reset(bad), None, "{bad}");
        }
    }

    #[test]
    fn overrides_are_checked_against_the_broker_bounds() {
        let c = GroupConfigs::in_memory(ShareGroupConfig::default());
        let set = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let s =
            c.validate(&set(&[(SHARE_ISOLATION_LEVEL, "read_committed"), (SHARE_RECORD_LOCK_DURATION_MS, "20000")]));
        assert_eq!(s.map(|s| (s.read_committed, s.record_lock_duration_ms)), Ok((true, 20_000)));
        for bad in [
            vec![("share.unknown", "1")],
            vec![(SHARE_RECORD_LOCK_DURATION_MS, "1000")],
            vec![(SHARE_SESSION_TIMEOUT_MS, "x")],
            vec![(SHARE_HEARTBEAT_INTERVAL_MS, "16000")],
            vec![(SHARE_ISOLATION_LEVEL, "committed")],
            vec![(SHARE_AUTO_OFFSET_RESET, "by_duration:soon")],
        ] {
            assert!(c.validate(&set(&bad)).is_err(), "{bad:?}");
        }
        c.update("g", false, |_| Ok::<_, StoreError>(set(&[(SHARE_AUTO_OFFSET_RESET, "earliest")]))).unwrap();
        assert_eq!(c.share("g").auto_offset_reset, OffsetReset::Earliest);
        assert_eq!(c.share("other").auto_offset_reset, OffsetReset::Latest);
    }
}
