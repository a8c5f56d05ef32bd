//! What a broker does with the controller's requests (Kafka's `ReplicaManager`
//! `becomeLeaderOrFollower` and `stopReplicas`). The fencing of stale controllers and broker
//! epochs ([`ReplicaManager::check_controller_request`]) happens before these are called; here
//! each partition is checked against its own leader epoch.

use std::collections::HashSet;
use std::sync::Arc;

use uuid::Uuid;

use super::ReplicaManager;
use crate::log::LogConfig;
use crate::metadata::zk_data;
use crate::protocol::inter_broker::{
    LeaderAndIsrPartitionError, LeaderAndIsrRequest, LeaderAndIsrResponse, StopReplicaPartitionError,
    StopReplicaRequest, StopReplicaResponse,
};
use crate::protocol::ErrorCode;

pub use crate::metadata::update_metadata::LEADER_DURING_DELETE;

use crate::sync::MutexExt;
/// LeaderAndIsr `type` (Kafka's `AbstractControlRequest.Type`): an increment, or every
/// partition the broker replicates.
pub const INCREMENTAL_STATE: i8 = 1;
pub const FULL_STATE: i8 = 2;

impl ReplicaManager {
    /// Makes this broker leader or follower of each partition in the request, points the
    /// follower fetchers at the leaders, and, for a full-state request, deletes hosted
    /// replicas the controller no longer assigns here.
    pub fn become_leader_or_follower(self: &Arc<Self>, req: &LeaderAndIsrRequest) -> LeaderAndIsrResponse {
        // One controller request at a time (Kafka's replica state change lock): two at once
        // would open or delete the same partition's files together. Client requests never
        // take this lock.
        let _serial = self.state_lock.lock_unpoisoned();
        let me = self.broker_id;
        let snapshot = self.handles.cache.snapshot();
        let mut errors = Vec::new();
        let mut listed: HashSet<(&str, i32)> = HashSet::new();
        let effective = self.handles.effective_config();
        let settings: Vec<(LogConfig, String)> = req
            .topics
            .iter()
            .map(|topic| {
                let configs = match snapshot.topics.get(&topic.topic_name) {
                    Some(t) => t.configs.clone(),
                    None => self.read_topic_config(&topic.topic_name),
                };
                let log_config = effective.log_config_for(&configs).unwrap_or_else(|e| {
                    tracing::warn!(topic = %topic.topic_name, error = %e, "invalid topic config; using broker defaults");
                    effective.log.clone()
                });
                (log_config, zk_data::uuid_to_kafka(topic.topic_id))
            })
            .collect();
        self.open_new_replicas(req, &settings);
        for (topic, (log_config, id)) in req.topics.iter().zip(&settings) {
            for p in &topic.partitions {
                listed.insert((topic.topic_name.as_str(), p.partition_index));
                let tp = (topic.topic_name.clone(), p.partition_index);
                if let Some(local) = self.hosted(&topic.topic_name, p.partition_index) {
                    let epoch = local.role().1;
                    if epoch > p.leader_epoch {
                        // Kafka answers an older leader epoch as a stale controller.
                        errors.push(partition_error(
                            &topic.topic_name,
                            topic.topic_id,
                            p.partition_index,
                            ErrorCode::StaleControllerEpoch.code(),
                        ));
                        continue;
                    }
                    if epoch == p.leader_epoch && local.partition_epoch() > p.partition_epoch {
                        // An ISR this broker already replaced: nothing to do.
                        errors.push(partition_error(&topic.topic_name, topic.topic_id, p.partition_index, 0));
                        continue;
                    }
                }
                if !p.replicas.contains(&me) {
                    errors.push(partition_error(&topic.topic_name, topic.topic_id, p.partition_index, 0));
                    continue;
                }
                let part = match self.open_replica(&topic.topic_name, p.partition_index, id, log_config.clone()) {
                    Ok(part) => part,
                    Err(e) => {
                        tracing::error!(topic = %topic.topic_name, partition = p.partition_index, error = %e, "cannot open partition");
                        errors.push(partition_error(
                            &topic.topic_name,
                            topic.topic_id,
                            p.partition_index,
                            ErrorCode::KafkaStorageError.code(),
                        ));
                        continue;
                    }
                };
                part.set_partition_epoch(p.partition_epoch);
                if p.leader == me {
                    self.fetchers.unfollow(&tp);
                    // Until its state is loaded, a new coordinator answers
                    // COORDINATOR_LOAD_IN_PROGRESS rather than "no offsets".
                    if let Some(l) = self.listener() {
                        l.before_become_leader(&tp);
                    }
                    let new_term = part.become_leader(p.leader_epoch, &p.replicas, &p.isr);
                    if new_term {
                        tracing::info!(topic = %topic.topic_name, partition = p.partition_index, epoch = p.leader_epoch, "became leader");
                    }
                    if let Some(l) = self.listener() {
                        if new_term {
                            l.forget_partition(&tp);
                        }
                        l.on_become_leader(&tp, new_term);
                    }
                } else {
                    let was_leader = part.is_leader();
                    // Verified transactional writes matter only to a leader; a later term
                    // here verifies again.
                    if let Some(l) = self.listener() {
                        l.forget_partition(&tp);
                    }
                    if part.become_follower(p.leader, p.leader_epoch, &p.replicas, &p.isr) {
                        tracing::info!(topic = %topic.topic_name, partition = p.partition_index, leader = p.leader, epoch = p.leader_epoch, "following");
                    }
                    if was_leader {
                        if let Some(l) = self.listener() {
                            l.on_resign(&tp);
                        }
                    }
                    if p.leader >= 0 && !self.is_shutting_down() {
                        self.fetchers.follow(self, p.leader, tp);
                    } else {
                        self.fetchers.unfollow(&tp);
                    }
                }
                errors.push(partition_error(&topic.topic_name, topic.topic_id, p.partition_index, 0));
            }
        }
        if req.request_type == FULL_STATE {
            for part in self.all_partitions() {
                if listed.contains(&(part.topic.as_str(), part.index)) {
                    continue;
                }
                tracing::info!(topic = %part.topic, partition = part.index, "not assigned here by the controller; deleting local log");
                self.fetchers.unfollow(&(part.topic.clone(), part.index));
                if let Err(e) = self.remove_partition(&part.topic, part.index) {
                    tracing::warn!(topic = %part.topic, partition = part.index, error = %e, "cannot delete partition log");
                }
            }
        }
        self.fetchers.start_added();
        self.notify_changed();
        LeaderAndIsrResponse { error_code: 0, partition_errors: errors }
    }

    /// Stops following the listed partitions, deleting their logs where asked.
    pub fn stop_replicas(&self, req: &StopReplicaRequest) -> StopReplicaResponse {
        let _serial = self.state_lock.lock_unpoisoned();
        let mut errors = Vec::new();
        for topic in &req.topics {
            for p in &topic.partitions {
                let tp = (topic.topic_name.clone(), p.partition_index);
                let local = self.hosted(&topic.topic_name, p.partition_index);
                // -2 marks a deletion, -1 a request without an epoch: both apply.
                if p.leader_epoch >= 0 && local.as_ref().is_some_and(|l| l.role().1 > p.leader_epoch) {
                    errors.push(StopReplicaPartitionError {
                        topic_name: topic.topic_name.clone(),
                        partition_index: p.partition_index,
                        error_code: ErrorCode::FencedLeaderEpoch.code(),
                    });
                    continue;
                }
                self.fetchers.unfollow(&tp);
                if let Some(l) = self.listener() {
                    l.forget_partition(&tp);
                }
                let mut error_code = 0;
                if p.delete_partition {
                    tracing::info!(topic = %topic.topic_name, partition = p.partition_index, "StopReplica: deleting local log");
                    if let Err(e) = self.remove_partition(&topic.topic_name, p.partition_index) {
                        tracing::warn!(topic = %topic.topic_name, partition = p.partition_index, error = %e, "cannot delete partition log");
                        error_code = ErrorCode::KafkaStorageError.code();
                    }
                }
                errors.push(StopReplicaPartitionError {
                    topic_name: topic.topic_name.clone(),
                    partition_index: p.partition_index,
                    error_code,
                });
            }
        }
        self.notify_changed();
        StopReplicaResponse { error_code: 0, partition_errors: errors }
    }
}

/// Threads that create new replicas' logs side by side. Creating a log is a few metadata
/// syscalls (directory, files, index preallocation) that mostly wait on the file system, so a
/// few threads overlap those waits even on few cores; more would only queue on the journal.
const OPEN_THREADS: usize = 4;
/// Below this many new logs one thread does it: starting threads would cost more.
const OPEN_IN_PARALLEL_FROM: usize = 8;

impl ReplicaManager {
    /// Creates the logs of the replicas `req` adds to this broker, on a few threads at once, so
    /// that a LeaderAndIsr for a hundred new partitions waits for the slowest few log creations
    /// rather than for all of them one after another. A failure here is left for the
    /// partition's own turn to report.
    fn open_new_replicas(self: &Arc<Self>, req: &LeaderAndIsrRequest, settings: &[(LogConfig, String)]) {
        let me = self.broker_id;
        let new: Vec<(&str, i32, &LogConfig, &str)> = req
            .topics
            .iter()
            .zip(settings)
            .flat_map(|(t, (config, id))| {
                t.partitions
                    .iter()
                    .filter(|p| p.replicas.contains(&me))
                    .map(move |p| (t.topic_name.as_str(), p.partition_index, config, id.as_str()))
            })
            .filter(|(t, p, _, _)| self.hosted(t, *p).is_none())
            .collect();
        if new.len() < OPEN_IN_PARALLEL_FROM {
            return;
        }
        let started = std::time::Instant::now();
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..OPEN_THREADS.min(new.len() / OPEN_IN_PARALLEL_FROM).max(1) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((topic, index, config, id)) = new.get(i) else { break };
                    let _ = self.open_replica(topic, *index, id, (*config).clone());
                });
            }
        });
        tracing::info!(logs = new.len(), took_ms = started.elapsed().as_millis() as u64, "created new replicas' logs");
    }

    fn read_topic_config(&self, name: &str) -> std::collections::BTreeMap<String, String> {
        let names = [name.to_string()];
        crate::metadata::update_metadata::read_topic_configs(&self.handles.store, &names)
            .remove(name)
            .unwrap_or_default()
    }
}

fn partition_error(topic: &str, id: Uuid, partition: i32, error_code: i16) -> LeaderAndIsrPartitionError {
    LeaderAndIsrPartitionError { topic_name: topic.to_string(), topic_id: id, partition_index: partition, error_code }
}

#[cfg(test)]
mod tests {
    //! LeaderAndIsr and StopReplica applied to a replica manager over a temporary log dir and
    //! the embedded store, with a listener that records what the coordinators would be told.

    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::config::BrokerConfig;
    use crate::metadata::{EmbeddedStore, MetadataCache, ZnodeStore};
    use crate::protocol::inter_broker::{
        LeaderAndIsrPartitionState, LeaderAndIsrTopicState, StopReplicaPartitionState, StopReplicaTopicState,
    };
    use crate::replication::{LeadershipListener, ReplicaHandles, Role, TopicPartition};

    const ME: i32 = 1;
    const OTHER: i32 = 2;
    const TOPIC: &str = "orders";

    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl Recorder {
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
        fn push(&self, what: &str, tp: &TopicPartition) {
            self.0.lock().unwrap().push(format!("{what} {}-{}", tp.0, tp.1));
        }
    }

    impl LeadershipListener for Recorder {
        fn before_become_leader(&self, tp: &TopicPartition) {
            self.push("loading", tp);
        }
        fn on_become_leader(&self, tp: &TopicPartition, new_term: bool) {
            self.push(if new_term { "load" } else { "loaded" }, tp);
        }
        fn forget_partition(&self, tp: &TopicPartition) {
            self.push("forget", tp);
        }
        fn on_resign(&self, tp: &TopicPartition) {
            self.push("unload", tp);
        }
    }

    struct Fixture {
        dir: tempfile::TempDir,
        replicas: Arc<ReplicaManager>,
        listener: Arc<Recorder>,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let logs_dir = dir.path().join("logs");
        std::fs::create_dir_all(&logs_dir).unwrap();
        let mut given = BTreeMap::new();
        given.insert("broker.id".to_string(), ME.to_string());
        given.insert("log.dirs".to_string(), logs_dir.display().to_string());
        let config = BrokerConfig::from_map(given).unwrap();
        let logs = crate::log::LogManager::open(vec![logs_dir], config.log.clone()).unwrap();
        let store = Arc::new(ZnodeStore::Embedded(EmbeddedStore::open(dir.path().join("metadata.json")).unwrap()));
        let metrics = crate::metrics::BrokerMetrics::new().unwrap();
        let handles = ReplicaHandles {
            effective: {
                let c = Arc::new(config.clone());
                Arc::new(move || c.clone())
            },
            cache: Arc::new(MetadataCache::default()),
            store,
            inter_broker: Arc::new(crate::security::client::InterBrokerClient::from_config(&config).unwrap()),
            config: Arc::new(config),
        };
        let replicas = Arc::new(ReplicaManager::new(logs, metrics.topics.clone(), metrics.isr.clone(), handles));
        let listener = Arc::new(Recorder::default());
        replicas.set_leadership_listener(listener.clone());
        Fixture { dir, replicas, listener }
    }

    fn leader_and_isr(request_type: i8, leader: i32, leader_epoch: i32) -> LeaderAndIsrRequest {
        LeaderAndIsrRequest {
            controller_id: OTHER,
            controller_epoch: 1,
            broker_epoch: -1,
            request_type,
            topics: vec![LeaderAndIsrTopicState {
                topic_name: TOPIC.to_string(),
                topic_id: Uuid::from_u128(7),
                partitions: vec![LeaderAndIsrPartitionState {
                    partition_index: 0,
                    controller_epoch: 1,
                    leader,
                    leader_epoch,
                    isr: vec![ME, OTHER],
                    partition_epoch: leader_epoch,
                    replicas: vec![ME, OTHER],
                    ..Default::default()
                }],
            }],
            ..Default::default()
        }
    }

    fn stop_replica(leader_epoch: i32, delete_partition: bool) -> StopReplicaRequest {
        StopReplicaRequest {
            controller_id: OTHER,
            controller_epoch: 1,
            broker_epoch: -1,
            topics: vec![StopReplicaTopicState {
                topic_name: TOPIC.to_string(),
                partitions: vec![StopReplicaPartitionState { partition_index: 0, leader_epoch, delete_partition }],
            }],
            ..Default::default()
        }
    }

    fn codes(resp: &LeaderAndIsrResponse) -> Vec<i16> {
        resp.partition_errors.iter().map(|e| e.error_code).collect()
    }

    fn tp() -> TopicPartition {
        (TOPIC.to_string(), 0)
    }

    #[tokio::test(start_paused = true)]
    async fn become_leader_opens_the_log_and_tells_the_listener() {
        let f = fixture();
        let resp = f.replicas.become_leader_or_follower(&leader_and_isr(INCREMENTAL_STATE, ME, 3));
        assert_eq!((resp.error_code, codes(&resp)), (0, vec![0]));
        let p = f.replicas.partition(TOPIC, 0).expect("led here");
        assert_eq!(p.role(), (Role::Leader, 3));
        assert_eq!(p.partition_epoch(), 3);
        assert!(f.replicas.logs().get(TOPIC, 0).is_some());
        assert_eq!(f.replicas.fetchers.leader_of(&tp()), None);
        assert_eq!(f.listener.take(), ["loading orders-0", "forget orders-0", "load orders-0"]);
        // The same state again is no new term: nothing to load.
        f.replicas.become_leader_or_follower(&leader_and_isr(INCREMENTAL_STATE, ME, 3));
        assert_eq!(f.listener.take(), ["loading orders-0", "loaded orders-0"]);
    }

    #[tokio::test(start_paused = true)]
    async fn become_follower_fetches_from_the_leader_and_resigns() {
        let f = fixture();
        f.replicas.become_leader_or_follower(&leader_and_isr(INCREMENTAL_STATE, ME, 3));
        f.listener.take();
        let resp = f.replicas.become_leader_or_follower(&leader_and_isr(INCREMENTAL_STATE, OTHER, 4));
        assert_eq!(codes(&resp), vec![0]);
        let p = f.replicas.hosted(TOPIC, 0).expect("hosted");
        assert_eq!(p.role(), (Role::Follower { leader: OTHER }, 4));
        assert!(f.replicas.partition(TOPIC, 0).is_none(), "client requests see no leader here");
        assert_eq!(f.replicas.fetchers.leader_of(&tp()), Some(OTHER));
        assert_eq!(f.listener.take(), ["forget orders-0", "unload orders-0"]);
        // Leading again stops the fetcher.
        f.replicas.become_leader_or_follower(&leader_and_isr(INCREMENTAL_STATE, ME, 5));
        assert_eq!(f.replicas.fetchers.leader_of(&tp()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_departing_broker_follows_no_one() {
        let f = fixture();
        f.replicas.begin_shutdown();
        f.replicas.become_leader_or_follower(&leader_and_isr(INCREMENTAL_STATE, OTHER, 4));
        assert_eq!(f.replicas.hosted(TOPIC, 0).map(|p| p.role()), Some((Role::Follower { leader: OTHER }, 4)));
        assert_eq!(f.replicas.fetchers.leader_of(&tp()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_older_leader_epoch_is_fenced() {
        let f = fixture();
        f.replicas.become_leader_or_follower(&leader_and_isr(INCREMENTAL_STATE, ME, 5));
        f.listener.take();
        let resp = f.replicas.become_leader_or_follower(&leader_and_isr(INCREMENTAL_STATE, OTHER, 3));
        assert_eq!(codes(&resp), vec![ErrorCode::StaleControllerEpoch.code()]);
        assert_eq!(f.replicas.hosted(TOPIC, 0).map(|p| p.role()), Some((Role::Leader, 5)));
        assert_eq!(f.replicas.fetchers.leader_of(&tp()), None);
        assert!(f.listener.take().is_empty(), "a fenced request changes nothing");
        // StopReplica for an older epoch is fenced too, and keeps the log.
        let resp = f.replicas.stop_replicas(&stop_replica(3, true));
        assert_eq!(resp.partition_errors[0].error_code, ErrorCode::FencedLeaderEpoch.code());
        assert!(f.replicas.hosted(TOPIC, 0).is_some());
        assert!(f.replicas.logs().get(TOPIC, 0).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_from_an_older_controller_or_registration_are_fenced() {
        let f = fixture();
        assert_eq!(f.replicas.check_controller_request(3, -1, 100), Ok(()));
        assert_eq!(f.replicas.check_controller_request(2, -1, 100), Err(ErrorCode::StaleControllerEpoch));
        assert_eq!(f.replicas.check_controller_request(3, 99, 100), Err(ErrorCode::StaleBrokerEpoch));
        assert_eq!(f.replicas.check_controller_request(3, 100, 100), Ok(()));
        f.replicas.observe_controller_epoch(5);
        assert_eq!(f.replicas.check_controller_request(4, 100, 100), Err(ErrorCode::StaleControllerEpoch));
    }

    #[tokio::test(start_paused = true)]
    async fn stop_replica_with_delete_removes_the_log() {
        let f = fixture();
        f.replicas.become_leader_or_follower(&leader_and_isr(INCREMENTAL_STATE, OTHER, 2));
        let dir = f.dir.path().join("logs").join(format!("{TOPIC}-0"));
        assert!(dir.exists());
        f.listener.take();
        // Without delete: no longer served, the log stays.
        let resp = f.replicas.stop_replicas(&stop_replica(2, false));
        assert_eq!(resp.partition_errors[0].error_code, 0);
        assert_eq!(f.replicas.fetchers.leader_of(&tp()), None);
        assert!(f.replicas.logs().get(TOPIC, 0).is_some());
        assert_eq!(f.listener.take(), ["forget orders-0"]);
        // -2: the topic is being deleted, whatever the epoch.
        let resp = f.replicas.stop_replicas(&stop_replica(-2, true));
        assert_eq!(resp.partition_errors[0].error_code, 0);
        assert!(f.replicas.hosted(TOPIC, 0).is_none());
        assert!(f.replicas.logs().get(TOPIC, 0).is_none());
        assert!(!dir.exists(), "log dir {} still there", dir.display());
    }

    #[tokio::test(start_paused = true)]
    async fn full_state_deletes_replicas_no_longer_assigned_here() {
        let f = fixture();
        let mut req = leader_and_isr(INCREMENTAL_STATE, ME, 1);
        req.topics[0].partitions.push(LeaderAndIsrPartitionState {
            partition_index: 1,
            leader: ME,
            leader_epoch: 1,
            isr: vec![ME],
            replicas: vec![ME],
            ..Default::default()
        });
        f.replicas.become_leader_or_follower(&req);
        assert!(f.replicas.hosted(TOPIC, 1).is_some());
        let resp = f.replicas.become_leader_or_follower(&leader_and_isr(FULL_STATE, ME, 1));
        assert_eq!(codes(&resp), vec![0]);
        assert!(f.replicas.hosted(TOPIC, 0).is_some());
        assert!(f.replicas.hosted(TOPIC, 1).is_none());
        assert!(f.replicas.logs().get(TOPIC, 1).is_none());
    }

    /// A controller that refuses every proposal as stale and answers with its own state.
    struct StaleRefusal(crate::protocol::inter_broker::AlterPartitionPartitionResult);

    impl crate::replication::alter_partition::ControllerGateway for StaleRefusal {
        fn broker_epoch(&self) -> i64 {
            -1
        }
        fn is_controller(&self) -> bool {
            true
        }
        fn handle_alter_partition(
            &self,
            req: &crate::protocol::inter_broker::AlterPartitionRequest,
        ) -> crate::protocol::inter_broker::AlterPartitionResponse {
            let t = &req.topics[0];
            crate::protocol::inter_broker::AlterPartitionResponse {
                throttle_time_ms: 0,
                error_code: 0,
                topics: vec![crate::protocol::inter_broker::AlterPartitionTopicResult {
                    topic_name: t.topic_name.clone(),
                    topic_id: t.topic_id,
                    partitions: vec![self.0.clone()],
                }],
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_refused_as_stale_adopts_the_controllers_newer_state() {
        let f = fixture();
        f.replicas.become_leader_or_follower(&leader_and_isr(INCREMENTAL_STATE, ME, 3));
        let p = f.replicas.partition(TOPIC, 0).unwrap();
        f.replicas.handles.cache.update(|c| {
            let info = crate::metadata::TopicInfo {
                name: TOPIC.into(),
                id: Uuid::from_u128(7),
                partitions: Vec::new(),
                configs: BTreeMap::new(),
            };
            c.topics.insert(TOPIC.into(), Arc::new(info));
        });
        let answer = |partition_epoch| crate::protocol::inter_broker::AlterPartitionPartitionResult {
            partition_index: 0,
            error_code: ErrorCode::InvalidUpdateVersion.code(),
            leader_id: ME,
            leader_epoch: 3,
            isr: vec![ME],
            partition_epoch,
            ..Default::default()
        };
        // An answer no newer than what the leader holds changes nothing.
        let gateway: Arc<dyn crate::replication::alter_partition::ControllerGateway> =
            Arc::new(StaleRefusal(answer(3)));
        f.replicas.send_alter_partition(&gateway, vec![(p.clone(), vec![ME])], &mut None, 1).await.unwrap();
        assert_eq!((p.partition_epoch(), p.isr()), (3, vec![ME, OTHER]));
        // A newer one is the state the leader missed: its next proposal is made against it.
        let gateway: Arc<dyn crate::replication::alter_partition::ControllerGateway> =
            Arc::new(StaleRefusal(answer(5)));
        f.replicas.send_alter_partition(&gateway, vec![(p.clone(), vec![ME])], &mut None, 2).await.unwrap();
        assert_eq!((p.partition_epoch(), p.isr()), (5, vec![ME]));
    }
}
