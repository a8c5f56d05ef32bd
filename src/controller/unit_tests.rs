//! The controller's steps on a controller of its own: the embedded store, a metadata cache
//! and a recording stand-in for the local broker, no `Broker` and no network.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use super::election::ElectionType;
use super::{Controller, LocalBroker, TopicRequest};
use crate::config::BrokerConfig;
use crate::log::{LogConfig, LogError};
use crate::metadata::zk_data::{self, PartitionState};
use crate::metadata::{BrokerInfo, EmbeddedStore, MetadataCache, PartitionInfo, TopicInfo, ZnodeStore};
use crate::protocol::inter_broker::{
    AlterPartitionPartitionData, AlterPartitionRequest, AlterPartitionTopicData, BrokerState, LeaderAndIsrRequest,
    LeaderAndIsrResponse, StopReplicaRequest,
};
use crate::protocol::ErrorCode;
use crate::security::client::InterBrokerClient;
use crate::sync::MutexExt;

const ME: i32 = 1;

/// What the controller asked of its broker.
#[derive(Default)]
struct Recorded {
    led: Vec<(String, i32)>,
    removed: Vec<(String, i32)>,
    deleted: Vec<(String, i32)>,
    epochs: Vec<i32>,
}

struct FakeBroker {
    config: Arc<BrokerConfig>,
    seen: Mutex<Recorded>,
}

impl FakeBroker {
    fn seen(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.seen.lock_unpoisoned()
    }
}

impl LocalBroker for FakeBroker {
    fn become_leader_or_follower(&self, _: &LeaderAndIsrRequest) -> LeaderAndIsrResponse {
        LeaderAndIsrResponse::default()
    }
    fn stop_replicas(&self, _: &StopReplicaRequest) {}
    fn make_leader(&self, topic: &str, partition: i32, _: &str, _: LogConfig) -> Result<(), LogError> {
        self.seen().led.push((topic.to_string(), partition));
        Ok(())
    }
    fn remove_partition(&self, topic: &str, partition: i32) -> Result<(), LogError> {
        self.seen().removed.push((topic.to_string(), partition));
        Ok(())
    }
    fn set_log_config(&self, _: &str, _: i32, _: LogConfig) {}
    fn on_partitions_deleted(&self, deleted: &[(String, i32)]) {
        self.seen().deleted.extend_from_slice(deleted);
    }
    fn effective_config(&self) -> Arc<BrokerConfig> {
        self.config.clone()
    }
    fn saw_controller_epoch(&self, epoch: i32) {
        self.seen().epochs.push(epoch);
    }
}

struct Fixture {
    controller: Arc<Controller>,
    local: Arc<FakeBroker>,
    _dir: tempfile::TempDir,
}

/// A controller elected on a fresh embedded store, with `brokers` (id, broker epoch) live.
fn fixture(brokers: &[(i32, i64)]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig::from_map(BTreeMap::from([("broker.id".to_string(), ME.to_string())])).unwrap();
    let store = Arc::new(ZnodeStore::Embedded(EmbeddedStore::open(dir.path().join("store.json")).unwrap()));
    let cache = Arc::new(MetadataCache::default());
    cache.update(|c| {
        c.brokers = brokers
            .iter()
            .map(|&(id, epoch)| BrokerInfo {
                id,
                host: "localhost".into(),
                port: 9092,
                rack: None,
                epoch,
                endpoints: Vec::new(),
            })
            .collect()
    });
    let inter_broker = Arc::new(InterBrokerClient::from_config(&config).unwrap());
    let local = Arc::new(FakeBroker { config: Arc::new(config.clone()), seen: Mutex::default() });
    let controller = Controller::new(config, store, cache, inter_broker).unwrap();
    let weak: std::sync::Weak<dyn LocalBroker> = Arc::downgrade(&local) as _;
    controller.attach(weak);
    assert!(controller.try_become_controller().unwrap());
    Fixture { controller, local, _dir: dir }
}

/// Puts a one-partition topic `t` in the image and its state in the store.
fn one_partition(c: &Controller, replicas: &[i32], leader: i32, leader_epoch: i32, isr: &[i32]) -> Uuid {
    let id = zk_data::new_kafka_uuid();
    let state = PartitionState { leader, leader_epoch, isr: isr.to_vec(), controller_epoch: 1 };
    c.store.set(&zk_data::partition_state_path("t", 0), &zk_data::partition_state_json(&state)).unwrap();
    let p = PartitionInfo {
        index: 0,
        leader,
        leader_epoch,
        replicas: replicas.to_vec(),
        isr: isr.to_vec(),
        partition_epoch: 0,
        adding_replicas: Vec::new(),
        removing_replicas: Vec::new(),
        offline_replicas: Vec::new(),
    };
    let info = Arc::new(TopicInfo { name: "t".into(), id, partitions: vec![p], configs: BTreeMap::new() });
    c.cache.update(|s| {
        s.topics.insert("t".into(), info);
    });
    id
}

fn propose(
    broker: i32,
    broker_epoch: i64,
    id: Uuid,
    leader_epoch: i32,
    partition_epoch: i32,
    isr: &[i32],
) -> AlterPartitionRequest {
    AlterPartitionRequest {
        broker_id: broker,
        broker_epoch,
        topics: vec![AlterPartitionTopicData {
            topic_name: String::new(),
            topic_id: id,
            partitions: vec![AlterPartitionPartitionData {
                partition_index: 0,
                leader_epoch,
                new_isr_with_epochs: isr.iter().map(|&broker_id| BrokerState { broker_id, broker_epoch: -1 }).collect(),
                leader_recovery_state: 0,
                partition_epoch,
            }],
        }],
    }
}

fn stored_state(c: &Controller) -> PartitionState {
    let data = c.store.get(&zk_data::partition_state_path("t", 0)).unwrap();
    zk_data::parse_partition_state(&data).unwrap()
}

fn cached(c: &Controller) -> PartitionInfo {
    c.cache.topic("t").unwrap().partitions[0].clone()
}

#[test]
fn election_bumps_the_epoch_and_tells_the_replica_side() {
    let f = fixture(&[(ME, 0)]);
    assert!(f.controller.is_controller());
    assert_eq!(f.controller.controller_epoch(), 1);
    assert_eq!(f.local.seen().epochs, vec![1]);
    assert_eq!(f.controller.store.get(zk_data::CONTROLLER_EPOCH).as_deref(), Some("1"));
    assert_eq!(f.controller.cache.snapshot().controller_id, ME);
    f.controller.resign_controller();
    assert!(!f.controller.is_controller());
    assert_eq!(f.controller.check_controller().map_err(|e| e.code), Ok(()), "standalone never refuses");
}

#[test]
fn an_isr_change_is_written_then_applied_to_the_image() {
    let f = fixture(&[(1, 10), (2, 20), (3, 30)]);
    let c = &f.controller;
    let id = one_partition(c, &[1, 2, 3], 1, 4, &[1, 2, 3]);
    let resp = c.handle_alter_partition(&propose(1, 10, id, 4, 0, &[1, 2]));
    assert_eq!(resp.error_code, 0);
    let r = &resp.topics[0].partitions[0];
    assert_eq!((r.error_code, r.isr.clone(), r.partition_epoch), (0, vec![1, 2], 1));
    let stored = stored_state(c);
    assert_eq!((stored.leader, stored.leader_epoch, stored.isr), (1, 4, vec![1, 2]));
    let p = cached(c);
    assert_eq!((p.isr, p.partition_epoch), (vec![1, 2], 1));
}

#[test]
fn an_isr_change_is_refused_as_kafka_refuses_it() {
    let f = fixture(&[(1, 10), (2, 20), (3, 30)]);
    let c = &f.controller;
    let id = one_partition(c, &[1, 2, 3], 1, 4, &[1, 2]);
    let code = |req: AlterPartitionRequest| {
        let resp = c.handle_alter_partition(&req);
        match resp.error_code {
            0 => resp.topics[0].partitions[0].error_code,
            top => top,
        }
    };
    assert_eq!(code(propose(1, 11, id, 4, 0, &[1])), ErrorCode::StaleBrokerEpoch.code());
    assert_eq!(code(propose(2, 20, id, 4, 0, &[2])), ErrorCode::NotLeaderOrFollower.code());
    assert_eq!(code(propose(1, 10, id, 3, 0, &[1])), ErrorCode::FencedLeaderEpoch.code());
    assert_eq!(code(propose(1, 10, id, 4, 7, &[1])), ErrorCode::InvalidUpdateVersion.code());
    assert_eq!(code(propose(1, 10, id, 4, 0, &[2, 3])), ErrorCode::IneligibleReplica.code(), "the leader stays");
    assert_eq!(code(propose(1, 10, Uuid::from_u128(7), 4, 0, &[1])), ErrorCode::UnknownTopicId.code());
    // A broker in controlled shutdown may not join the ISR.
    c.shutting_down_brokers.lock().unwrap().insert(3, 30);
    assert_eq!(code(propose(1, 10, id, 4, 0, &[1, 2, 3])), ErrorCode::IneligibleReplica.code());
    assert_eq!(stored_state(c).isr, vec![1, 2], "nothing refused was written");
    c.resign_controller();
    assert_eq!(code(propose(1, 10, id, 4, 0, &[1])), ErrorCode::NotController.code());
}

#[test]
fn a_dead_leader_is_replaced_from_the_isr() {
    let f = fixture(&[(1, 10), (2, 20), (3, 30)]);
    let c = &f.controller;
    one_partition(c, &[1, 2, 3], 1, 4, &[1, 2, 3]);
    c.controller_duties(&BTreeSet::from([2, 3]), None).unwrap();
    let s = stored_state(c);
    assert_eq!((s.leader, s.leader_epoch, s.isr, s.controller_epoch), (2, 5, vec![2, 3], 1));
}

#[test]
fn standalone_a_preferred_election_names_the_first_replica() {
    // Standalone the election is decided from the image and nothing is written.
    let f = fixture(&[(1, 10), (2, 20), (3, 30)]);
    let c = &f.controller;
    one_partition(c, &[1, 2, 3], 2, 4, &[1, 2, 3]);
    let elected = c.elect_leaders(ElectionType::Preferred, &[("t".to_string(), 0)]);
    assert_eq!(elected[0].as_ref().map_err(|e| e.code), Ok(&(1, 5)));
    let unclean = c.elect_leaders(ElectionType::Unclean, &[("t".to_string(), 0)]);
    assert_eq!(unclean[0].as_ref().map_err(|e| e.code).err(), Some(ErrorCode::ElectionNotNeeded.code()));
}

#[test]
fn standalone_topics_are_created_and_deleted_through_the_local_broker() {
    let f = fixture(&[(ME, 0)]);
    let c = &f.controller;
    let req = TopicRequest {
        name: "orders".into(),
        num_partitions: 3,
        replication_factor: 1,
        assignment: BTreeMap::new(),
        configs: BTreeMap::new(),
    };
    let planned = c.plan_topic(req).unwrap();
    let info = c.create_topic(planned).unwrap();
    assert_eq!(info.partitions.iter().map(|p| (p.index, p.leader)).collect::<Vec<_>>(), vec![(0, 1), (1, 1), (2, 1)]);
    assert!(c.store.get(&zk_data::topic_path("orders")).is_some());
    for p in 0..3 {
        let state =
            c.store.get(&zk_data::partition_state_path("orders", p)).map(|d| zk_data::parse_partition_state(&d));
        let state = state.flatten().map(|s| (s.leader, s.leader_epoch, s.isr));
        assert_eq!(state, Some((1, 0, vec![1])), "orders-{p}: its first state is written");
    }
    assert!(c.cache.topic("orders").is_some());
    let led: Vec<(String, i32)> = (0..3).map(|p| ("orders".to_string(), p)).collect();
    assert_eq!(f.local.seen().led, led);
    let again = TopicRequest {
        name: "orders".into(),
        num_partitions: 1,
        replication_factor: 1,
        assignment: BTreeMap::new(),
        configs: BTreeMap::new(),
    };
    assert_eq!(c.plan_topic(again).err().map(|e| e.code), Some(ErrorCode::TopicAlreadyExists.code()));

    assert_eq!(c.delete_topic("orders").unwrap(), info.id);
    assert!(c.cache.topic("orders").is_none());
    assert!(c.store.get(&zk_data::topic_path("orders")).is_none());
    assert_eq!(f.local.seen().removed, led);
    assert_eq!(f.local.seen().deleted, led, "the group coordinator hears of the deletion");
}

/// Puts the topic znode of `t` (one partition on `replicas`) in the store, as topic creation
/// writes it; a reassignment starts from it.
fn topic_znode(c: &Controller, id: Uuid, replicas: &[i32]) {
    let assignment = BTreeMap::from([(0, replicas.to_vec())]);
    c.store.set(&zk_data::topic_path("t"), &zk_data::topic_json_moving(&assignment, id, &BTreeMap::new())).unwrap();
}

/// The topic znode of `t`: partition 0's replicas, and who is joining and leaving.
fn stored_assignment(c: &Controller) -> (Vec<i32>, Option<zk_data::Moving>) {
    let data = c.store.get(&zk_data::topic_path("t")).unwrap();
    let (assignment, _, moving) = zk_data::parse_topic_json_moving(&data).unwrap();
    (assignment[&0].clone(), moving.get(&0).cloned())
}

#[test]
fn a_reassignment_adds_the_new_replica_then_finishes_once_it_is_in_the_isr() {
    let f = fixture(&[(1, 10), (2, 20), (3, 30)]);
    let c = &f.controller;
    let id = one_partition(c, &[1, 2], 1, 4, &[1, 2]);
    topic_znode(c, id, &[1, 2]);
    let results = c.alter_reassignments(&[("t".to_string(), 0, Some(vec![2, 3]))]);
    assert!(results.iter().all(Result::is_ok));
    // Started: the target first, then the leaving replica; the leader stays until the end.
    let (replicas, moving) = stored_assignment(c);
    assert_eq!(replicas, vec![2, 3, 1]);
    assert_eq!(moving, Some(zk_data::Moving { adding: vec![3], removing: vec![1] }));
    let s = stored_state(c);
    assert_eq!((s.leader, s.leader_epoch, s.isr), (1, 5, vec![1, 2]), "the epoch goes up so replicas hear of it");
    assert_eq!(c.list_reassignments(None).len(), 1);
    // Nothing to finish while the new replica has not caught up.
    c.reassignment_duties(&BTreeSet::from([1, 2, 3]), None).unwrap();
    assert_eq!(stored_assignment(c).0, vec![2, 3, 1]);
    // The leader reports it caught up; the next pass finishes the move.
    let joined = c.handle_alter_partition(&propose(1, 10, id, 5, cached(c).partition_epoch, &[1, 2, 3]));
    assert_eq!(joined.topics[0].partitions[0].error_code, 0);
    c.reassignment_duties(&BTreeSet::from([1, 2, 3]), None).unwrap();
    assert_eq!(stored_assignment(c), (vec![2, 3], None));
    let s = stored_state(c);
    assert_eq!((s.leader, s.leader_epoch, s.isr), (2, 6, vec![2, 3]), "the leaving leader hands over");
    assert!(c.list_reassignments(None).is_empty());
}

#[test]
fn controlled_shutdown_moves_leadership_away_and_takes_the_broker_out_of_the_isr() {
    let f = fixture(&[(1, 10), (2, 20), (3, 30)]);
    let c = f.controller.clone();
    one_partition(&c, &[2, 1, 3], 2, 4, &[2, 1, 3]);
    // The controller answers once the moves are in its image, which ZkSync brings there from
    // the watch events; standing in for it, copy the stored state into the image.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sync = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let s = stored_state(&c);
                c.cache.update(|snap| {
                    let mut t = (**snap.topics.get("t").unwrap()).clone();
                    let p = &mut t.partitions[0];
                    (p.leader, p.leader_epoch, p.isr) = (s.leader, s.leader_epoch, s.isr.clone());
                    snap.topics.insert("t".into(), Arc::new(t));
                });
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })
    };
    let stale = c.handle_controlled_shutdown(2, 19);
    assert_eq!(stale.error_code, ErrorCode::StaleBrokerEpoch.code());
    let resp = c.handle_controlled_shutdown(2, 20);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sync.join().unwrap();
    assert_eq!(resp.error_code, 0);
    assert!(resp.remaining_partitions.is_empty(), "{:?}", resp.remaining_partitions);
    let s = stored_state(&c);
    assert_eq!((s.leader, s.leader_epoch, s.isr), (1, 5, vec![1, 3]));
    // Until it registers again, the departing broker may not rejoin.
    assert!(!c.eligible_brokers(&c.cache.snapshot()).contains(&2));
    // It stopped and registered again before any pass saw it gone: a new registration is a
    // new broker, eligible at once.
    c.cache.update(|snap| {
        if let Some(b) = snap.brokers.iter_mut().find(|b| b.id == 2) {
            b.epoch = 21;
        }
    });
    assert!(c.eligible_brokers(&c.cache.snapshot()).contains(&2));
    assert!(c.eligible_of(&BTreeSet::from([1, 2, 3])).contains(&2));
}

/// Journal appends of the fixture's embedded store: its round trips.
fn appends(c: &Controller) -> u64 {
    match &*c.store {
        ZnodeStore::Embedded(s) => s.appends(),
        ZnodeStore::ZooKeeper(_) => unreachable!("the fixture's store is embedded"),
    }
}

fn new_topics(c: &Controller, count: usize, partitions: i32) -> Vec<TopicRequest> {
    (0..count)
        .map(|i| {
            c.plan_topic(TopicRequest {
                name: format!("t{i:03}"),
                num_partitions: partitions,
                replication_factor: 3,
                assignment: BTreeMap::new(),
                configs: BTreeMap::new(),
            })
            .unwrap()
        })
        .collect()
}

#[test]
fn a_hundred_new_topics_cost_two_batches_of_writes() {
    let f = fixture(&[(1, 10), (2, 20), (3, 30)]);
    let c = &f.controller;
    let reqs = new_topics(c, 100, 10);
    let before = appends(c);
    let created = c.create_topics(reqs);
    assert!(created.iter().all(Result::is_ok));
    // The topic and config znodes of all of them, then every partition's first state: not
    // a write per topic or per partition.
    assert_eq!(appends(c) - before, 2);
    for p in 0..10 {
        let state =
            c.store.get(&zk_data::partition_state_path("t099", p)).and_then(|d| zk_data::parse_partition_state(&d));
        assert_eq!(state.map(|s| (s.leader_epoch, s.isr.len())), Some((0, 3)), "t099-{p}");
    }
}

#[test]
fn a_failover_pass_writes_in_one_batch_and_puts_the_new_leaders_in_the_image() {
    let f = fixture(&[(1, 10), (2, 20), (3, 30)]);
    let c = &f.controller;
    for r in c.create_topics(new_topics(c, 100, 10)) {
        r.unwrap();
    }
    let led_by_2 = |c: &Controller| {
        c.cache.snapshot().topics.values().flat_map(|t| t.partitions.iter()).filter(|p| p.leader == 2).count()
    };
    assert_eq!(led_by_2(c), 300);
    let before = appends(c);
    c.controller_duties(&BTreeSet::from([1, 3]), None).unwrap();
    // 1,000 partitions leave broker 2's ISR and 300 of them need a new leader: one batch.
    assert_eq!(appends(c) - before, 1);
    // In the image at once, not when watch events bring the writes back.
    let snapshot = c.cache.snapshot();
    let parts: Vec<&PartitionInfo> = snapshot.topics.values().flat_map(|t| t.partitions.iter()).collect();
    assert_eq!(parts.len(), 1000);
    assert_eq!(led_by_2(c), 0);
    assert!(parts.iter().all(|p| p.isr.len() == 2 && !p.isr.contains(&2) && p.leader_epoch == 1));
    let stored =
        c.store.get(&zk_data::partition_state_path("t000", 1)).and_then(|d| zk_data::parse_partition_state(&d));
    assert_eq!(stored.map(|s| (s.leader, s.isr)), Some((3, vec![3, 1])));
}
