//! The controller as a component of its own: the state only the controller keeps (its epoch,
//! whether it is the controller, its channels to the other brokers and what it told them, the
//! brokers shutting down, replicas in offline log dirs) and the narrow handles it works with.
//! `Broker` builds it and hands it the local replica side as a [`LocalBroker`]; the
//! controller never sees `Broker` itself.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::channel::ControllerChannels;
use super::events::EventQueue;
use super::log_dir_events::OfflineReplicas;
use super::propagate::Propagated;
use crate::config::BrokerConfig;
use crate::log::{LogConfig, LogError};
use crate::metadata::cache::ClusterSnapshot;
use crate::metadata::{zk_data, MetadataCache, StoreError, ZnodeStore};
use crate::protocol::inter_broker::{LeaderAndIsrRequest, LeaderAndIsrResponse, StopReplicaRequest};
use crate::security::client::InterBrokerClient;
use crate::sync::MutexExt;

/// What the controller needs of its own broker's replica side and services: applying its own
/// share of LeaderAndIsr and StopReplica (other brokers get them over their channels),
/// standalone log changes, and the hooks a deletion or a new controller epoch has there.
pub trait LocalBroker: Send + Sync {
    /// Applies a LeaderAndIsr the controller decided for this broker.
    fn become_leader_or_follower(&self, req: &LeaderAndIsrRequest) -> LeaderAndIsrResponse;
    /// Applies a StopReplica the controller decided for this broker.
    fn stop_replicas(&self, req: &StopReplicaRequest);
    /// Standalone: this broker is the only replica of the partition and leads it.
    fn make_leader(&self, topic: &str, partition: i32, topic_id: &str, config: LogConfig) -> Result<(), LogError>;
    /// Standalone: the partition's topic was deleted; its log goes.
    fn remove_partition(&self, topic: &str, partition: i32) -> Result<(), LogError>;
    /// A topic's overrides changed: the partition this broker leads takes them.
    fn set_log_config(&self, topic: &str, partition: i32, config: LogConfig);
    /// Partitions deleted: the group coordinator drops their offsets.
    fn on_partitions_deleted(&self, deleted: &[(String, i32)]);
    /// The configuration in force (static plus dynamic broker configs).
    fn effective_config(&self) -> Arc<BrokerConfig>;
    /// This broker became controller at `epoch`: requests of older controllers are fenced.
    fn saw_controller_epoch(&self, epoch: i32);
}

pub struct Controller {
    /// The static configuration (what is in force is [`Controller::effective_config`]).
    pub(super) config: BrokerConfig,
    pub(super) store: Arc<ZnodeStore>,
    pub(super) cache: Arc<MetadataCache>,
    /// How the channels connect to the other brokers.
    pub(super) inter_broker: Arc<InterBrokerClient>,
    controller_epoch: AtomicI32,
    /// The version of `/controller_epoch` this controller wrote when elected: its partition
    /// state writes check it, so ZooKeeper refuses them once a newer controller bumped it.
    epoch_zk_version: AtomicI32,
    is_controller: AtomicBool,
    /// Set by the leader-imbalance timer; the next controller pass moves leadership back to
    /// preferred replicas (auto.leader.rebalance.enable).
    preferred_election_due: AtomicBool,
    /// Runs topic creation, deletion, partition changes and reassignments one at a time.
    pub(super) events: Arc<EventQueue>,
    /// Its connections to the other brokers, and what it last told them.
    pub(super) channels: ControllerChannels,
    pub(super) propagated: Mutex<Propagated>,
    /// Brokers in controlled shutdown, which may neither lead nor join an ISR, each with the
    /// registration (broker epoch) that asked: a broker that stopped and registered again
    /// between two passes is back, though no pass saw it gone.
    pub(super) shutting_down_brokers: Mutex<BTreeMap<i32, i64>>,
    /// Replicas brokers reported in offline log dirs (KIP-112).
    pub(super) replicas_on_offline_dirs: Mutex<OfflineReplicas>,
    /// Topics the event thread is creating: their first states are its to write, not the
    /// watch pass's that reads their topic znodes back meanwhile.
    pub(super) creating: Mutex<BTreeSet<String>>,
    /// For the channels' tasks, which keep the controller only while it exists.
    me: Weak<Controller>,
    local: OnceLock<Weak<dyn LocalBroker>>,
}

impl Controller {
    pub fn new(
        config: BrokerConfig,
        store: Arc<ZnodeStore>,
        cache: Arc<MetadataCache>,
        inter_broker: Arc<InterBrokerClient>,
    ) -> std::io::Result<Arc<Controller>> {
        let events = EventQueue::start()?;
        Ok(Arc::new_cyclic(|me| Controller {
            config,
            store,
            cache,
            inter_broker,
            controller_epoch: AtomicI32::new(0),
            epoch_zk_version: AtomicI32::new(0),
            is_controller: AtomicBool::new(false),
            preferred_election_due: AtomicBool::new(false),
            events,
            channels: ControllerChannels::default(),
            propagated: Mutex::new(Propagated::default()),
            shutting_down_brokers: Mutex::new(Default::default()),
            replicas_on_offline_dirs: Mutex::new(Default::default()),
            creating: Mutex::default(),
            me: me.clone(),
            local: OnceLock::new(),
        }))
    }

    /// Wires the local broker in, once, before the controller is first used.
    pub fn attach(&self, local: Weak<dyn LocalBroker>) {
        let _ = self.local.set(local);
    }

    pub(super) fn local(&self) -> Option<Arc<dyn LocalBroker>> {
        self.local.get().and_then(Weak::upgrade)
    }

    pub(super) fn arc(&self) -> Option<Arc<Controller>> {
        self.me.upgrade()
    }

    /// The configuration in force; the static one once the broker is gone.
    pub fn effective_config(&self) -> Arc<BrokerConfig> {
        match self.local() {
            Some(l) => l.effective_config(),
            None => Arc::new(self.config.clone()),
        }
    }

    pub(super) fn on_partitions_deleted(&self, deleted: &[(String, i32)]) {
        if let Some(l) = self.local() {
            l.on_partitions_deleted(deleted);
        }
    }

    pub(super) fn stop_replicas(&self, req: &StopReplicaRequest) {
        if let Some(l) = self.local() {
            l.stop_replicas(req);
        }
    }

    pub fn is_controller(&self) -> bool {
        self.is_controller.load(Ordering::Acquire)
    }

    pub fn controller_epoch(&self) -> i32 {
        self.controller_epoch.load(Ordering::Acquire)
    }

    /// The guard of this controller's fenced writes: `/controller_epoch` at the version its
    /// election left it.
    pub(super) fn epoch_guard(&self) -> (&'static str, i32) {
        (zk_data::CONTROLLER_EPOCH, self.epoch_zk_version.load(Ordering::Acquire))
    }

    pub fn request_preferred_election(&self) {
        self.preferred_election_due.store(true, Ordering::Release);
    }

    pub fn take_preferred_election(&self) -> bool {
        let enabled = self.config.values.get("auto.leader.rebalance.enable").map(String::as_str) != Some("false");
        self.preferred_election_due.swap(false, Ordering::AcqRel) && enabled
    }

    pub fn resign_controller(&self) {
        self.is_controller.store(false, Ordering::Release);
        self.channels.clear();
        if let ZnodeStore::ZooKeeper(zk) = &*self.store {
            let _ = zk.set_controller_watches(false);
        }
    }

    /// Forgets brokers in controlled shutdown that are no longer registered.
    pub fn retain_shutting_down(&self, live: &BTreeSet<i32>) {
        let mut leaving = self.shutting_down_brokers.lock_unpoisoned();
        leaving.retain(|b, _| live.contains(b));
    }

    /// The brokers still in controlled shutdown: those registered in `snapshot` with the
    /// epoch they asked with. The others are forgotten.
    pub(super) fn leaving_brokers(&self, snapshot: &ClusterSnapshot) -> BTreeSet<i32> {
        let mut leaving = self.shutting_down_brokers.lock_unpoisoned();
        leaving.retain(|id, epoch| snapshot.brokers.iter().any(|b| b.id == *id && b.epoch == *epoch));
        leaving.keys().copied().collect()
    }

    /// The brokers of `live` that are not in controlled shutdown.
    pub fn eligible_of(&self, live: &BTreeSet<i32>) -> BTreeSet<i32> {
        let leaving = self.leaving_brokers(&self.cache.snapshot());
        live.difference(&leaving).copied().collect()
    }

    /// Controller election, as Kafka runs it: whoever creates the ephemeral `/controller`
    /// first is the controller, and bumps `/controller_epoch` so that writes stamped with an
    /// older epoch can be told apart.
    pub fn try_become_controller(&self) -> Result<bool, StoreError> {
        let id = self.config.broker_id;
        match self.store.create(zk_data::CONTROLLER, &zk_data::controller_json(id, now_ms()), true) {
            Ok(()) => {}
            Err(StoreError::NodeExists(_)) => return Ok(false),
            Err(e) => return Err(e),
        }
        if let ZnodeStore::ZooKeeper(zk) = &*self.store {
            // Before anything is read, so that no change goes unseen.
            if let Err(e) = zk.set_controller_watches(true) {
                let _ = self.store.delete_recursive(zk_data::CONTROLLER);
                return Err(e);
            }
        }
        let epoch = loop {
            let current = self.store.get_versioned(zk_data::CONTROLLER_EPOCH)?;
            let next = current.as_ref().and_then(|(d, _)| d.trim().parse::<i32>().ok()).unwrap_or(0) + 1;
            let (written, zk_version) = match current {
                Some((_, version)) => {
                    (self.store.set_if_version(zk_data::CONTROLLER_EPOCH, &next.to_string(), version), version + 1)
                }
                None => (self.store.create(zk_data::CONTROLLER_EPOCH, &next.to_string(), false), 0),
            };
            match written {
                Ok(()) => {
                    self.epoch_zk_version.store(zk_version, Ordering::Release);
                    break next;
                }
                Err(StoreError::BadVersion(_)) | Err(StoreError::NodeExists(_)) => continue,
                Err(e) => return Err(e),
            }
        };
        self.controller_epoch.store(epoch, Ordering::Release);
        if let Some(l) = self.local() {
            l.saw_controller_epoch(epoch);
        }
        if let Err(e) = self.setup_feature_versioning() {
            // Only ApiVersions' finalized-features epoch depends on it; the next election
            // tries again.
            tracing::warn!(error = %e, "cannot set up /feature");
        }
        self.reset_propagated();
        self.is_controller.store(true, Ordering::Release);
        self.cache.update(|c| c.controller_id = id);
        tracing::info!(broker_id = id, epoch, "became controller");
        Ok(true)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}
