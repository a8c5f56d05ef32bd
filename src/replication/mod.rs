//! The replica manager (Kafka's `ReplicaManager`): the partitions this broker hosts, as leader
//! or follower, the follower fetchers that copy from leaders, and the ISR and high-watermark
//! rules that decide when a write is committed.
//!
//! Durability rests on three rules: a leader's high watermark is the smallest log end offset in
//! the ISR, acks=all answers only once the high watermark passes the write, and only the ISR
//! may become leader (unless unclean election is enabled).

pub mod alter_log_dirs;
pub mod control;
pub mod fetch_session;
pub mod fetcher;
pub mod leader_epoch;
pub mod log_dir_failure;
pub mod partition;
pub mod quota;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use tokio::sync::Notify;

pub use partition::{FetchResult, Partition, ProduceResult, ReplicaCounts, Role};

use crate::log::{LogConfig, LogError, LogManager};
use crate::metrics::{BrokerTopicMetrics, IsrMetrics};
use crate::sync::{MutexExt, RwLockExt};

pub type TopicPartition = (String, i32);

pub struct ReplicaManager {
    pub broker_id: i32,
    logs: Arc<LogManager>,
    /// By topic, then partition: a lookup by `&str` needs no allocated key (it runs for every
    /// partition of every fetch).
    partitions: RwLock<HashMap<String, HashMap<i32, Arc<Partition>>>>,
    /// High watermarks from `replication-offset-checkpoint`, read once at startup.
    checkpointed_hw: HashMap<TopicPartition, i64>,
    /// Woken on control-plane changes (leaders, ISRs, replicas stopped, metadata), which may
    /// concern any waiter. Appends and high-watermark moves wake only the waiters of their
    /// partition (`Partition::watch`).
    changed: Notify,
    topic_metrics: Arc<BrokerTopicMetrics>,
    isr_metrics: IsrMetrics,
    /// Wakes the log dir mover when a move starts.
    pub log_dir_moves: Notify,
}

impl ReplicaManager {
    pub fn new(
        broker_id: i32,
        logs: LogManager,
        topic_metrics: Arc<BrokerTopicMetrics>,
        isr_metrics: IsrMetrics,
    ) -> ReplicaManager {
        let checkpointed_hw = logs.read_high_watermarks();
        ReplicaManager {
            broker_id,
            logs: Arc::new(logs),
            partitions: RwLock::new(HashMap::new()),
            checkpointed_hw,
            changed: Notify::new(),
            topic_metrics,
            isr_metrics,
            log_dir_moves: Notify::new(),
        }
    }

    pub fn logs(&self) -> &LogManager {
        &self.logs
    }

    /// The log dirs (indexes in `log.dirs`) holding these partitions' logs, for the I/O pool
    /// to keep one slow dir from taking every thread.
    pub fn log_dirs_of<'a>(&self, partitions: impl IntoIterator<Item = &'a Partition>) -> Vec<usize> {
        let mut dirs: Vec<usize> =
            partitions.into_iter().filter_map(|p| self.logs.dirs_of(&(p.topic.clone(), p.index)).0).collect();
        dirs.sort_unstable();
        dirs.dedup();
        dirs
    }

    /// The log manager for a component that outlives a borrow (the log cleaner's threads).
    pub fn logs_handle(&self) -> Arc<LogManager> {
        self.logs.clone()
    }

    /// The partition if this broker leads it (what client requests need).
    pub fn partition(&self, topic: &str, index: i32) -> Option<Arc<Partition>> {
        self.hosted(topic, index).filter(|p| p.is_leader())
    }

    /// The partition if this broker hosts a replica of it, leader or follower.
    pub fn hosted(&self, topic: &str, index: i32) -> Option<Arc<Partition>> {
        self.partitions.read_unpoisoned().get(topic).and_then(|t| t.get(&index)).cloned()
    }

    /// Opens (creating if needed) the log of a partition replica this broker hosts.
    pub fn open_replica(
        &self,
        topic: &str,
        index: i32,
        topic_id: &str,
        config: LogConfig,
    ) -> Result<Arc<Partition>, LogError> {
        if let Some(p) = self.hosted(topic, index) {
            return Ok(p);
        }
        let log = self.logs.get_or_create(topic, index, config.clone())?;
        {
            let mut guard = log.lock_unpoisoned();
            // A log loaded at startup was opened with the broker defaults: the topic's own
            // settings (cleanup.policy, retention, segment size) apply from here on.
            if guard.config() != &config {
                guard.set_config(config);
            }
            let dir: PathBuf = guard.dir().to_path_buf();
            drop(guard);
            if !matches!(crate::log::read_partition_metadata(&dir), Ok(Some(_))) {
                crate::log::write_partition_metadata(&dir, topic_id)?;
            }
        }
        let key = (topic.to_string(), index);
        let hw = self.checkpointed_hw.get(&key).copied();
        let (metrics, isr_metrics) = (self.topic_metrics.topic(topic), self.isr_metrics.clone());
        let p = Arc::new(Partition::open(topic, index, self.broker_id, log, hw, metrics, isr_metrics));
        self.partitions.write_unpoisoned().entry(key.0).or_default().insert(index, p.clone());
        Ok(p)
    }

    /// Standalone: this broker is the only replica and leads at epoch 0.
    pub fn make_leader(
        &self,
        topic: &str,
        index: i32,
        topic_id: &str,
        config: LogConfig,
    ) -> Result<Arc<Partition>, LogError> {
        let p = self.open_replica(topic, index, topic_id, config)?;
        p.become_leader(0, &[self.broker_id], &[self.broker_id]);
        Ok(p)
    }

    /// Stops hosting a replica but keeps its log. Returns whether it was hosted.
    pub fn stop_serving(&self, topic: &str, index: i32) -> bool {
        self.forget(topic, index)
    }

    pub fn remove_partition(&self, topic: &str, index: i32) -> Result<(), LogError> {
        self.forget(topic, index);
        if !self.partitions.read_unpoisoned().contains_key(topic) {
            // The topic's last partition here is gone: its series go too, as in Kafka.
            self.topic_metrics.remove_topic(topic);
        }
        self.logs.delete_log(topic, index)
    }

    fn forget(&self, topic: &str, index: i32) -> bool {
        let mut all = self.partitions.write_unpoisoned();
        let Some(t) = all.get_mut(topic) else { return false };
        let removed = t.remove(&index);
        if t.is_empty() {
            all.remove(topic);
        }
        drop(all);
        // Its waiters answer now (the partition is no longer here), not at their timeout.
        removed.inspect(|p| p.wake()).is_some()
    }

    /// A control-plane change: every waiter, of every partition, checks again.
    pub fn notify_changed(&self) {
        self.changed.notify_waiters();
        for p in self.all_partitions() {
            p.wake();
        }
    }

    /// The metadata image changed: waiters on the image (not on a partition) check again.
    pub fn notify_metadata_changed(&self) {
        self.changed.notify_waiters();
    }

    /// A future that completes at the next control-plane change. Create it *before* checking
    /// the condition, so a change between the check and the wait is not missed.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    pub fn all_partitions(&self) -> Vec<Arc<Partition>> {
        self.partitions.read_unpoisoned().values().flat_map(|t| t.values().cloned()).collect()
    }

    /// Writes every hosted partition's high watermark to `replication-offset-checkpoint`.
    /// Also makes the leader-epoch checkpoints written since the last call durable.
    pub fn checkpoint_high_watermarks(&self) -> Result<(), LogError> {
        let partitions = self.all_partitions();
        for p in &partitions {
            if let Err(e) = p.sync_epoch_checkpoint() {
                tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "cannot sync leader epoch checkpoint");
            }
        }
        let hws: Vec<(TopicPartition, i64)> =
            partitions.iter().map(|p| ((p.topic.clone(), p.index), p.high_watermark())).collect();
        self.logs.write_high_watermarks(&hws)
    }
}
