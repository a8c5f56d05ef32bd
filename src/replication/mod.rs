//! The replica manager (Kafka's `ReplicaManager`): the partitions this broker hosts, as leader
//! or follower, the follower fetchers that copy from leaders, and the ISR and high-watermark
//! rules that decide when a write is committed.
//!
//! Durability rests on three rules: a leader's high watermark is the smallest log end offset in
//! the ISR, acks=all answers only once the high watermark passes the write, and only the ISR
//! may become leader (unless unclean election is enabled).

pub mod alter_log_dirs;
pub mod alter_partition;
pub mod control;
pub mod fetch_session;
pub mod fetcher;
pub mod leader_epoch;
pub mod log_dir_failure;
mod metadata_listener;
pub mod partition;
pub mod quota;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use tokio::sync::Notify;

pub use partition::{FetchResult, FollowerPosition, Partition, ProduceResult, ReplicaCounts, Role};

use crate::config::BrokerConfig;
use crate::log::{LogConfig, LogError, LogManager};
use crate::metadata::{MetadataCache, ZnodeStore};
use crate::metrics::{BrokerTopicMetrics, IsrMetrics};
use crate::protocol::ErrorCode;
use crate::security::client::InterBrokerClient;
use crate::sync::{MutexExt, RwLockExt};

pub type TopicPartition = (String, i32);

/// What the replica side uses of the rest of the broker.
pub struct ReplicaHandles {
    /// The static configuration (what `replica.fetch.*` and the socket limits come from).
    pub config: Arc<BrokerConfig>,
    /// The configuration in force, with dynamic overrides (throttle rates, topic defaults).
    pub effective: Arc<dyn Fn() -> Arc<BrokerConfig> + Send + Sync>,
    pub cache: Arc<MetadataCache>,
    pub store: Arc<ZnodeStore>,
    /// How followers and the ISR writer reach other brokers.
    pub inter_broker: Arc<InterBrokerClient>,
}

impl ReplicaHandles {
    pub fn effective_config(&self) -> Arc<BrokerConfig> {
        (self.effective)()
    }
}

/// Told when this broker's leadership of a partition changes, so that the coordinators whose
/// state lives in `__consumer_offsets` and `__transaction_state` load or drop it. Called
/// under the replica state lock, in the order Kafka's `ReplicaManager` calls its callbacks.
pub trait LeadershipListener: Send + Sync {
    /// About to lead `tp`: state kept in it answers "loading" until
    /// [`LeadershipListener::on_become_leader`].
    fn before_become_leader(&self, _tp: &TopicPartition) {}
    /// Leads `tp`; `new_term` when leadership (or its epoch) is new, and state is to be loaded.
    fn on_become_leader(&self, _tp: &TopicPartition, _new_term: bool) {}
    /// A leader's term of `tp` ended or the replica stopped: what was verified for it goes.
    fn forget_partition(&self, _tp: &TopicPartition) {}
    /// No longer leads `tp` (it follows, or its log dir failed): state kept in it is dropped.
    fn on_resign(&self, _tp: &TopicPartition) {}
}

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
    handles: ReplicaHandles,
    pub fetchers: fetcher::FetcherManager,
    /// Leader side of the followers' fetch sessions.
    pub fetch_sessions: fetch_session::FetchSessions,
    /// Bytes sent to throttled followers and fetched for throttled replicas (KIP-73).
    pub leader_quota: quota::ReplicationQuota,
    pub follower_quota: quota::ReplicationQuota,
    /// The ISR changes this broker's leaders propose, on their way to the controller.
    pub alter_partition: alter_partition::AlterPartitionManager,
    /// Serializes the application of LeaderAndIsr and StopReplica (and a log dir failure).
    state_lock: std::sync::Mutex<()>,
    /// Set once controlled shutdown starts: this broker no longer follows anyone.
    shutting_down: AtomicBool,
    listener: OnceLock<Arc<dyn LeadershipListener>>,
    /// The highest controller epoch any controller request carried: older ones are fenced.
    known_controller_epoch: AtomicI32,
}

impl ReplicaManager {
    pub fn new(
        logs: LogManager,
        topic_metrics: Arc<BrokerTopicMetrics>,
        isr_metrics: IsrMetrics,
        handles: ReplicaHandles,
    ) -> ReplicaManager {
        let checkpointed_hw = logs.read_high_watermarks();
        let broker_id = handles.config.broker_id;
        ReplicaManager {
            fetchers: fetcher::FetcherManager::default(),
            fetch_sessions: fetch_session::FetchSessions::new(handles.config.max_incremental_fetch_session_cache_slots),
            leader_quota: Default::default(),
            follower_quota: Default::default(),
            alter_partition: alter_partition::AlterPartitionManager::new(handles.store.is_zookeeper()),
            state_lock: std::sync::Mutex::new(()),
            shutting_down: AtomicBool::new(false),
            listener: OnceLock::new(),
            known_controller_epoch: AtomicI32::new(0),
            handles,
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

    /// Wires the coordinators that follow leadership changes (once, at startup).
    pub fn set_leadership_listener(&self, listener: Arc<dyn LeadershipListener>) {
        let _ = self.listener.set(listener);
    }

    fn listener(&self) -> Option<&dyn LeadershipListener> {
        self.listener.get().map(|l| &**l)
    }

    pub fn handles(&self) -> &ReplicaHandles {
        &self.handles
    }

    /// Controlled shutdown has started: stop following, so this broker does not look like a
    /// caught-up follower while it leaves.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.fetchers.stop_all();
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Fencing of a controller request, as Kafka checks it: an older controller epoch than
    /// one already seen, or a broker epoch from before this broker's current registration
    /// (`current_broker_epoch`).
    pub fn check_controller_request(
        &self,
        controller_epoch: i32,
        broker_epoch: i64,
        current_broker_epoch: i64,
    ) -> Result<(), crate::protocol::ErrorCode> {
        if controller_epoch < self.known_controller_epoch.load(Ordering::Acquire) {
            return Err(ErrorCode::StaleControllerEpoch);
        }
        if broker_epoch != -1 && broker_epoch < current_broker_epoch {
            return Err(ErrorCode::StaleBrokerEpoch);
        }
        self.known_controller_epoch.fetch_max(controller_epoch, Ordering::AcqRel);
        Ok(())
    }

    /// This broker became controller at `epoch`: requests from older controllers are fenced.
    pub fn observe_controller_epoch(&self, epoch: i32) {
        self.known_controller_epoch.fetch_max(epoch, Ordering::AcqRel);
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

    /// The error a request for a partition not led here gets. As Kafka answers for a partition
    /// of an offline log dir, whoever leads it now: the client refreshes its metadata and finds
    /// the new leader.
    pub fn not_led_error(&self, topic: &str, partition: i32) -> i16 {
        if self.logs.is_offline_partition(topic, partition) {
            return ErrorCode::KafkaStorageError.code();
        }
        let exists = self.handles.cache.topic(topic).is_some_and(|t| t.partitions.iter().any(|p| p.index == partition));
        if exists {
            ErrorCode::NotLeaderOrFollower.code()
        } else {
            ErrorCode::UnknownTopicOrPartition.code()
        }
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
