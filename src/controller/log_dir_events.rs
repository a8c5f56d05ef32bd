//! The controller's side of a log dir failure (Kafka's `KafkaController`
//! `processLogDirEventNotification`, `onBrokerLogDirFailure` and the KAFKA_STORAGE_ERROR
//! branch of `handleLeaderAndIsrResponse`, KIP-112).
//!
//! A broker whose log dir went offline writes `/log_dir_event_notification/log_dir_event_<seq>`.
//! The controller deletes the notifications and sends that broker LeaderAndIsr for all its
//! replicas; the broker answers KAFKA_STORAGE_ERROR for those in the offline dir. The
//! controller remembers them as offline replicas (per broker registration: a restarted broker
//! starts with none) and decides their partitions again as if those replicas' broker were
//! gone: leadership moves to another ISR member and the replica leaves the ISR.

use std::collections::{BTreeMap, BTreeSet};

use super::Controller;
use crate::metadata::store::{StoreError, ZnodeStore};
use crate::metadata::zk_data;
use crate::protocol::inter_broker::LeaderAndIsrPartitionError;
use crate::protocol::ErrorCode;
use crate::sync::MutexExt;

/// Per broker: the broker epoch its offline replicas were reported under, and the replicas.
pub type OfflineReplicas = BTreeMap<i32, (i64, BTreeSet<(String, i32)>)>;

impl Controller {
    fn offline_dirs(&self) -> std::sync::MutexGuard<'_, OfflineReplicas> {
        self.replicas_on_offline_dirs.lock_unpoisoned()
    }

    /// Reads and deletes the log dir event notifications, then asks each broker they name
    /// which of its replicas are offline (a LeaderAndIsr for all of them).
    pub fn process_log_dir_events(&self) -> Result<(), StoreError> {
        let children = self.store.try_children(zk_data::LOG_DIR_EVENT_NOTIFICATION)?;
        if children.is_empty() {
            return Ok(());
        }
        let paths: Vec<String> =
            children.iter().map(|c| format!("{}/{c}", zk_data::LOG_DIR_EVENT_NOTIFICATION)).collect();
        let data = self.store.get_many_versioned(&paths)?;
        let brokers: BTreeSet<i32> =
            data.iter().flatten().filter_map(|(d, _)| zk_data::parse_log_dir_event(d)).collect();
        for p in &paths {
            self.store.delete_recursive(p)?;
        }
        let live: BTreeSet<i32> = self.cache.snapshot().brokers.iter().map(|b| b.id).collect();
        for b in brokers.intersection(&live) {
            tracing::warn!(broker = b, "a log dir of the broker failed; asking it which replicas are offline");
            self.on_broker_log_dir_failure(*b);
        }
        Ok(())
    }

    fn on_broker_log_dir_failure(&self, broker: i32) {
        if broker != self.config.broker_id {
            // Its channel sends it the whole state: a LeaderAndIsr for every replica it holds.
            self.channels.resync(broker);
            return;
        }
        let Some(local) = self.local() else { return };
        for r in self.full_state_for(broker) {
            if let super::channel::ControlRequest::LeaderAndIsr(req) = r {
                let resp = local.become_leader_or_follower(&req);
                let storage = ErrorCode::KafkaStorageError.code();
                let offline = resp.partition_errors.into_iter().filter(|e| e.error_code == storage).collect();
                self.on_replicas_offline(broker, offline);
            }
        }
    }

    /// A LeaderAndIsr answer named replicas of `broker` KAFKA_STORAGE_ERROR: remembers them and
    /// has their partitions decided again in the next pass.
    pub fn on_replicas_offline(&self, broker: i32, errors: Vec<LeaderAndIsrPartitionError>) {
        if errors.is_empty() || !self.is_controller() {
            return;
        }
        let snapshot = self.cache.snapshot();
        let Some(epoch) = snapshot.brokers.iter().find(|b| b.id == broker).map(|b| b.epoch) else {
            return;
        };
        // LeaderAndIsr v5+ answers name topics by id only.
        let replicas: Vec<(String, i32)> = errors
            .into_iter()
            .filter_map(|e| {
                let name = match e.topic_name.is_empty() {
                    false => e.topic_name,
                    true => snapshot.topics.values().find(|t| t.id == e.topic_id)?.name.clone(),
                };
                Some((name, e.partition_index))
            })
            .collect();
        let fresh: Vec<(String, i32)> = {
            let mut all = self.offline_dirs();
            let entry = all.entry(broker).or_insert_with(|| (epoch, BTreeSet::new()));
            if entry.0 != epoch {
                *entry = (epoch, BTreeSet::new());
            }
            replicas.into_iter().filter(|r| entry.1.insert(r.clone())).collect()
        };
        if fresh.is_empty() {
            return;
        }
        tracing::warn!(broker, replicas = ?fresh, "replicas in an offline log dir; electing new leaders");
        if let ZnodeStore::ZooKeeper(zk) = &*self.store {
            zk.touch(fresh.iter().map(|(t, p)| zk_data::partition_state_path(t, *p)));
        }
    }

    /// A broker that left or registered again (restarted) has no offline replicas on record.
    pub fn forget_offline_replicas_of_gone_brokers(&self) {
        let live: BTreeMap<i32, i64> = self.cache.snapshot().brokers.iter().map(|b| (b.id, b.epoch)).collect();
        self.offline_dirs().retain(|b, (epoch, _)| live.get(b) == Some(epoch));
    }

    /// The replicas each partition has in offline log dirs, as the controller knows them.
    pub fn offline_replicas_by_partition(&self) -> BTreeMap<(String, i32), Vec<i32>> {
        let mut out: BTreeMap<(String, i32), Vec<i32>> = BTreeMap::new();
        for (b, (_, parts)) in self.offline_dirs().iter() {
            for p in parts {
                out.entry(p.clone()).or_default().push(*b);
            }
        }
        out
    }
}
