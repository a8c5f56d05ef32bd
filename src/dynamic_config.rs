//! Dynamic broker configs (Kafka's `DynamicBrokerConfig`): values kept in
//! `/config/brokers/<default>` (cluster-wide) and `/config/brokers/<id>` (this broker), over the
//! static configuration, changed by AlterConfigs/IncrementalAlterConfigs without a restart.
//!
//! Precedence, as Kafka's: this broker's dynamic value, then the cluster default, then the
//! static value, then the default. A writer stores the entity's znode and announces it under
//! `/config/changes`; every broker watches `/config`, re-reads both entities and re-applies
//! the topic defaults to its open logs, the connection limits to its listeners, the
//! `log.cleaner.*` values to its cleaner and `num.io.threads` to the I/O pool (the
//! replication throttles are read where used; the SASL keys are kept and described, see
//! [`crate::config::PER_BROKER_SASL_KEYS`]). The effective configuration is swapped whole, so a
//! reader never sees half of a change.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use crate::config::BrokerConfig;
use crate::metadata::{zk_data, StoreError, ZnodeStore};
use crate::sync::{MutexExt, RwLockExt};

/// The entity name of the cluster-wide defaults.
pub const DEFAULT_ENTITY: &str = "<default>";
pub const CONFIG_BROKERS: &str = "/config/brokers";

pub fn entity_path(entity: &str) -> String {
    format!("{CONFIG_BROKERS}/{entity}")
}

/// Where a broker config's effective value comes from (DescribeConfigs' `ConfigSource`).
pub const SOURCE_DYNAMIC_BROKER: i8 = 2;
pub const SOURCE_DYNAMIC_DEFAULT_BROKER: i8 = 3;
pub const SOURCE_STATIC_BROKER: i8 = 4;
pub const SOURCE_DEFAULT: i8 = 5;

#[derive(Default, Clone)]
pub struct DynamicValues {
    /// `/config/brokers/<default>`.
    pub cluster: BTreeMap<String, String>,
    /// `/config/brokers/<this broker's id>`.
    pub broker: BTreeMap<String, String>,
}

impl DynamicValues {
    fn merged(&self) -> BTreeMap<String, String> {
        let mut m = self.cluster.clone();
        m.extend(self.broker.iter().map(|(k, v)| (k.clone(), v.clone())));
        m
    }

    /// A broker key's value and source, then its lower-precedence synonyms (Kafka's order).
    pub fn sources(&self, config: &BrokerConfig, key: &str) -> Vec<(String, i8)> {
        let mut out = Vec::new();
        if let Some(v) = self.broker.get(key) {
            out.push((v.clone(), SOURCE_DYNAMIC_BROKER));
        }
        if let Some(v) = self.cluster.get(key) {
            out.push((v.clone(), SOURCE_DYNAMIC_DEFAULT_BROKER));
        }
        if let Some(v) = config.given.get(key) {
            out.push((v.clone(), SOURCE_STATIC_BROKER));
        }
        if let Some((_, v)) = crate::config::DEFAULTS.iter().find(|(k, _)| *k == key) {
            out.push((v.to_string(), SOURCE_DEFAULT));
        }
        out
    }
}

/// A component told of each change of the configuration in force (connection limits, the
/// cleaner, the I/O pool, the open logs' topic defaults).
type Subscriber = Box<dyn Fn(&Arc<BrokerConfig>) + Send + Sync>;

pub struct DynamicConfigs {
    store: Arc<ZnodeStore>,
    /// What the properties file and the environment gave: the values dynamic ones go over.
    static_config: BrokerConfig,
    state: RwLock<(DynamicValues, Arc<BrokerConfig>)>,
    subscribers: Mutex<Vec<Subscriber>>,
}

impl DynamicConfigs {
    pub fn new(config: &BrokerConfig, store: Arc<ZnodeStore>) -> DynamicConfigs {
        DynamicConfigs {
            store,
            static_config: config.clone(),
            state: RwLock::new((DynamicValues::default(), Arc::new(config.clone()))),
            subscribers: Mutex::default(),
        }
    }

    /// The configuration in force: static values with the dynamic ones over them.
    pub fn effective(&self) -> Arc<BrokerConfig> {
        self.state.read_unpoisoned().1.clone()
    }

    pub fn values(&self) -> DynamicValues {
        self.state.read_unpoisoned().0.clone()
    }

    /// Calls `f` with the configuration in force now and again after each change, so a
    /// component made after the first read misses no change.
    pub fn subscribe(&self, f: impl Fn(&Arc<BrokerConfig>) + Send + Sync + 'static) {
        let mut subscribers = self.subscribers.lock_unpoisoned();
        f(&self.effective());
        subscribers.push(Box::new(f));
    }

    /// Reads both dynamic entities, swaps in the effective configuration and tells the
    /// subscribers. A value the static configuration refuses is logged and the entity left
    /// out, as Kafka skips an invalid dynamic update.
    pub fn reload(&self) -> Result<(), StoreError> {
        let read = |entity: &str| -> Result<BTreeMap<String, String>, StoreError> {
            Ok(self.store.try_get(&entity_path(entity))?.map(|d| zk_data::parse_topic_config(&d)).unwrap_or_default())
        };
        let mut cluster = read(DEFAULT_ENTITY)?;
        // A per-broker-only key in the cluster-wide entity (another tool may have written it
        // there) would apply to every broker: it is left out, the rest of the entity kept.
        cluster.retain(|k, _| {
            let own = crate::config::is_per_broker_only(k);
            if own {
                tracing::warn!(key = %k, "per-broker config in the cluster-wide entity; ignored");
            }
            !own
        });
        let mut values = DynamicValues { cluster, broker: read(&self.static_config.broker_id.to_string())? };
        let effective = match self.static_config.with_dynamic(&values.merged()) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "invalid dynamic broker config; keeping the static values");
                values = DynamicValues::default();
                self.static_config.clone()
            }
        };
        let effective = Arc::new(effective);
        let changed = {
            let mut st = self.state.write_unpoisoned();
            let changed = st.0.merged() != values.merged();
            *st = (values, effective.clone());
            changed
        };
        if changed {
            tracing::info!("dynamic broker configs changed; applying them");
            for f in self.subscribers.lock_unpoisoned().iter() {
                f(&effective);
            }
        }
        Ok(())
    }

    /// Deletes the `/config/changes` notifications older than
    /// `gregor.config.change.expiration.ms` (15 minutes), as every Kafka broker does after
    /// processing notifications (ZkNodeChangeNotificationListener): every broker has read them
    /// by then, and a broker that starts later reads the entities themselves. Costs one
    /// pipelined stat per notification present. Returns how many were deleted.
    pub fn purge_obsolete_changes(&self) -> Result<usize, StoreError> {
        let children = self.store.try_children(zk_data::CONFIG_CHANGES)?;
        if children.is_empty() {
            return Ok(0);
        }
        let paths: Vec<String> = children.iter().map(|c| format!("{}/{c}", zk_data::CONFIG_CHANGES)).collect();
        let created = self.store.created_times(&paths)?;
        let expiration_ms = self.static_config.config_change_expiration_ms;
        let doomed = obsolete(&paths, &created, crate::log::now_ms(), expiration_ms);
        for p in &doomed {
            // Another broker may have deleted it first; that is the same outcome.
            self.store.delete_recursive(p)?;
        }
        if !doomed.is_empty() {
            tracing::debug!(purged = doomed.len(), "purged expired config change notifications");
        }
        Ok(doomed.len())
    }

    /// Stores a dynamic entity (`<default>` or a broker id) and announces it as Kafka does
    /// (`/config/changes/config_change_<seq>`), then applies it here at once.
    pub fn store(&self, entity: &str, configs: &BTreeMap<String, String>) -> Result<(), StoreError> {
        self.store.set(&entity_path(entity), &zk_data::topic_config_json(configs))?;
        let notice = serde_json::json!({"version": 2, "entity_path": format!("brokers/{entity}")}).to_string();
        self.store.create_sequential(&format!("{}/config_change_", zk_data::CONFIG_CHANGES), &notice)?;
        self.reload()
    }
}

/// The notifications created more than `expiration_ms` before `now_ms`.
fn obsolete<'a>(paths: &'a [String], created: &[Option<i64>], now_ms: i64, expiration_ms: i64) -> Vec<&'a String> {
    paths
        .iter()
        .zip(created)
        .filter(|(_, c)| c.is_some_and(|c| now_ms.saturating_sub(c) > expiration_ms))
        .map(|(p, _)| p)
        .collect()
}

/// Dynamic broker configs follow `/config/brokers` and the change notifications.
impl crate::metadata::MetadataListener for DynamicConfigs {
    fn on_broker_configs_changed(&self) -> Result<(), StoreError> {
        self.reload()
    }

    fn on_config_change_notification(&self) {
        if let Err(e) = self.purge_obsolete_changes() {
            // Old notifications cost space, never correctness: the next change tries again.
            tracing::warn!(error = %e, "cannot purge expired config change notifications");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_notifications_older_than_the_expiration_go() {
        let paths: Vec<String> = (0..4).map(|i| format!("/config/changes/config_change_000000000{i}")).collect();
        let created = [Some(1_000), Some(99_000), None, Some(100_000)];
        let gone = obsolete(&paths, &created, 100_000, 900);
        assert_eq!(gone, vec![&paths[0], &paths[1]]);
        assert!(obsolete(&paths, &created, 100_000, 1_000_000).is_empty());
    }
}
