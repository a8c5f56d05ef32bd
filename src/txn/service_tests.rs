//! The transaction service on one standalone broker's parts: the embedded store, a replica
//! manager over a temporary log dir, and stand-ins for the controller and group coordinator.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::coordinator::{TransactionCoordinator, TxnConfig};
use super::handles::{MarkerListener, TransactionTopicCreator};
use super::state::TxnState;
use super::txn_log::{self, TxnLogValue};
use super::{ProducerIdManager, TransactionHandles, TransactionService};
use crate::config::BrokerConfig;
use crate::log::batch::BatchHeader;
use crate::metadata::{EmbeddedStore, MetadataCache, PartitionInfo, TopicInfo, ZnodeStore};
use crate::protocol::internal_topics::TRANSACTION_STATE_TOPIC;
use crate::protocol::ErrorCode;
use crate::replication::{ReplicaHandles, ReplicaManager};

const ME: i32 = 0;
const DATA: &str = "data";

#[derive(Default)]
struct Markers(Mutex<Vec<(String, i32, i64, bool)>>);

impl MarkerListener for Markers {
    fn on_marker_written(&self, topic: &str, partition: i32, producer_id: i64, commit: bool) {
        self.0.lock().unwrap().push((topic.to_string(), partition, producer_id, commit));
    }
}

struct NoCreate;

impl TransactionTopicCreator for NoCreate {
    fn create_transaction_state_topic(&self) -> Result<bool, String> {
        Err("the test creates its topics itself".into())
    }
}

struct Fixture {
    service: Arc<TransactionService>,
    replicas: Arc<ReplicaManager>,
    markers: Arc<Markers>,
    cache: Arc<MetadataCache>,
}

fn topic(name: &str) -> Arc<TopicInfo> {
    Arc::new(TopicInfo {
        name: name.to_string(),
        id: Default::default(),
        partitions: vec![PartitionInfo {
            index: 0,
            leader: ME,
            leader_epoch: 0,
            replicas: vec![ME],
            isr: vec![ME],
            partition_epoch: 0,
            adding_replicas: vec![],
            removing_replicas: vec![],
            offline_replicas: vec![],
        }],
        configs: BTreeMap::new(),
    })
}

/// A broker's transaction service over `dir` (kept across "restarts"), leading one-partition
/// `__transaction_state` and `data`, and loaded as a standalone broker loads at startup.
fn start(dir: &Path, abort_check_interval_ms: u64) -> Fixture {
    start_with(dir, abort_check_interval_ms, &[])
}

/// As [`start`], with these broker configs besides.
fn start_with(dir: &Path, abort_check_interval_ms: u64, configs: &[(&str, &str)]) -> Fixture {
    let logs_dir = dir.join("logs");
    std::fs::create_dir_all(&logs_dir).unwrap();
    let mut given: BTreeMap<String, String> = configs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    given.insert("broker.id".to_string(), ME.to_string());
    given.insert("log.dirs".to_string(), logs_dir.display().to_string());
    let config = BrokerConfig::from_map(given).unwrap();
    let logs = crate::log::LogManager::open(vec![logs_dir], config.log.clone()).unwrap();
    let store = Arc::new(ZnodeStore::Embedded(EmbeddedStore::open(dir.join("metadata.json")).unwrap()));
    let metrics = crate::metrics::BrokerMetrics::new().unwrap();
    let cache = Arc::new(MetadataCache::default());
    cache.update(|c| {
        c.topics.insert(TRANSACTION_STATE_TOPIC.to_string(), topic(TRANSACTION_STATE_TOPIC));
        c.topics.insert(DATA.to_string(), topic(DATA));
    });
    let inter_broker = Arc::new(crate::security::client::InterBrokerClient::from_config(&config).unwrap());
    let config = Arc::new(config);
    let handles = ReplicaHandles {
        effective: {
            let c = config.clone();
            Arc::new(move || c.clone())
        },
        cache: cache.clone(),
        store: store.clone(),
        inter_broker: inter_broker.clone(),
        config: config.clone(),
    };
    let replicas = Arc::new(ReplicaManager::new(logs, metrics.topics.clone(), metrics.isr.clone(), handles));
    for name in [TRANSACTION_STATE_TOPIC, DATA] {
        replicas.make_leader(name, 0, "", config.log.clone()).unwrap();
    }
    let markers = Arc::new(Markers::default());
    let service = TransactionService::new(TransactionHandles {
        coordinator: TransactionCoordinator::new(TxnConfig {
            max_timeout_ms: 900_000,
            abort_check_interval_ms,
            verify_partitions: true,
        }),
        producer_ids: ProducerIdManager::new(ME, store.clone()),
        config,
        cache: cache.clone(),
        store,
        partitions: replicas.clone(),
        io: Arc::new(crate::io_pool::IoPool::new(2, 1, metrics.io_jobs.clone(), metrics.io_threads.clone())),
        inter_broker,
        topic_creator: Arc::new(NoCreate),
        markers: markers.clone(),
    });
    service.load_txns(None);
    Fixture { service, replicas, markers, cache }
}

/// The states `id` went through, as `__transaction_state` records them.
fn state_log(f: &Fixture, id: &str) -> Vec<TxnState> {
    let p = f.replicas.partition(TRANSACTION_STATE_TOPIC, 0).unwrap();
    let read = p.read_to_log_end(p.log_start_offset(), 1 << 20);
    let mut buf = &read.records[..];
    let mut out = Vec::new();
    while let Some(h) = BatchHeader::parse(buf) {
        let size = h.total_size();
        for kv in crate::group::offsets_log::batch_records(&buf[..size]) {
            if txn_log::decode_key(&kv.key).as_deref() == Some(id) {
                out.extend(kv.value.as_deref().and_then(TxnLogValue::decode).map(|v| v.state));
            }
        }
        buf = &buf[size..];
    }
    out
}

/// Waits (polling, bounded) until the state log of `id` ends with `state`.
async fn wait_for_state(f: &Fixture, id: &str, state: TxnState) {
    for _ in 0..500 {
        if state_log(f, id).last() == Some(&state) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{id} never reached {state:?}: {:?}", state_log(f, id));
}

fn data_tp() -> Vec<(String, i32)> {
    vec![(DATA.to_string(), 0)]
}

#[tokio::test(start_paused = true)]
async fn init_producer_id_allocates_then_bumps_the_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path(), 10_000);
    let (code, pid, epoch) = f.service.init_transactional_producer("a", 60_000, None).await;
    assert_eq!((code, epoch), (0, 0));
    let (code, again, bumped) = f.service.init_transactional_producer("a", 60_000, None).await;
    assert_eq!((code, again, bumped), (0, pid, 1));
    let (code, other, _) = f.service.init_transactional_producer("b", 60_000, None).await;
    assert_eq!(code, 0);
    assert_ne!(other, pid);
    assert_eq!(state_log(&f, "a"), vec![TxnState::Empty, TxnState::Empty]);
    assert_eq!(f.service.coordinator().get("a").map(|m| (m.producer_id, m.epoch)), Some((pid, 1)));
}

#[tokio::test(start_paused = true)]
async fn commit_writes_markers_then_complete_commit() {
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path(), 10_000);
    let (_, pid, epoch) = f.service.init_transactional_producer("t", 60_000, None).await;
    let data = f.replicas.partition(DATA, 0).unwrap();
    let before = data.log_end_offset();
    assert_eq!(f.service.add_partitions_to_txn("t", pid, epoch, &data_tp()).await, Ok(()));
    assert_eq!(f.service.end_txn("t", pid, epoch, true).await, 0);
    wait_for_state(&f, "t", TxnState::CompleteCommit).await;
    assert_eq!(
        state_log(&f, "t"),
        vec![TxnState::Empty, TxnState::Ongoing, TxnState::PrepareCommit, TxnState::CompleteCommit]
    );
    // One control batch on the data partition, and the group coordinator told of it.
    assert_eq!(data.log_end_offset(), before + 1);
    assert_eq!(*f.markers.0.lock().unwrap(), vec![(DATA.to_string(), 0, pid, true)]);
}

#[tokio::test(start_paused = true)]
async fn a_restarted_coordinator_aborts_an_ongoing_transaction_that_timed_out() {
    let dir = tempfile::tempdir().unwrap();
    let pid = {
        let f = start(dir.path(), 10_000);
        let (_, pid, epoch) = f.service.init_transactional_producer("x", 1, None).await;
        assert_eq!(f.service.add_partitions_to_txn("x", pid, epoch, &data_tp()).await, Ok(()));
        f.replicas.logs().shutdown().unwrap();
        pid
    };
    let f = start(dir.path(), 5);
    let loaded = f.service.coordinator().get("x").unwrap();
    assert_eq!((loaded.producer_id, loaded.state), (pid, TxnState::Ongoing));
    // The timeout is on the wall clock, which paused tokio time does not move.
    std::thread::sleep(Duration::from_millis(5));
    f.service.spawn_txn_timer();
    wait_for_state(&f, "x", TxnState::CompleteAbort).await;
    let states = state_log(&f, "x");
    assert_eq!(&states[states.len() - 2..], &[TxnState::PrepareAbort, TxnState::CompleteAbort]);
    assert_eq!(*f.markers.0.lock().unwrap(), vec![(DATA.to_string(), 0, pid, false)]);
}

#[tokio::test(start_paused = true)]
async fn a_state_write_waits_request_timeout_for_its_isr() {
    let dir = tempfile::tempdir().unwrap();
    let f = start_with(dir.path(), 10_000, &[("request.timeout.ms", "12345")]);
    // A follower that never fetches: the state partition's high watermark cannot move.
    let state = f.replicas.partition(TRANSACTION_STATE_TOPIC, 0).unwrap();
    state.become_leader(1, &[ME, 9], &[ME, 9]);
    let began = tokio::time::Instant::now();
    let (code, _, _) = f.service.init_transactional_producer("w", 60_000, None).await;
    assert_eq!(code, crate::protocol::ErrorCode::CoordinatorNotAvailable.code());
    let waited = began.elapsed();
    assert!(waited >= Duration::from_millis(12_345) && waited < Duration::from_millis(13_000), "waited {waited:?}");
}

#[tokio::test(start_paused = true)]
async fn a_marker_is_answered_only_once_the_isr_has_it() {
    const FOLLOWER: i32 = 1;
    let dir = tempfile::tempdir().unwrap();
    let f = start(dir.path(), 10_000);
    let data = f.replicas.partition(DATA, 0).unwrap();
    assert!(data.become_leader(1, &[ME, FOLLOWER], &[ME, FOLLOWER]));
    let marker = |commit| f.service.write_markers(7, 0, commit, 0, data_tp());

    // The follower never fetches: the marker is on the leader only, which is not an answer.
    let before = data.log_end_offset();
    assert_eq!(marker(true).await, vec![((DATA.to_string(), 0), ErrorCode::RequestTimedOut.code())]);
    assert_eq!(data.log_end_offset(), before + 1, "appended, but not acknowledged");

    // The follower fetches past it: acknowledged.
    let service = f.service.clone();
    let waiting = tokio::spawn(async move { service.write_markers(7, 0, false, 0, data_tp()).await });
    while data.log_end_offset() < before + 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (_, _, moved) = data.follower_fetch(FOLLOWER, data.log_end_offset(), -1, 1, 1 << 20);
    assert!(moved, "the follower's fetch moves the high watermark past the marker");
    data.wake();
    assert_eq!(waiting.await.unwrap(), vec![((DATA.to_string(), 0), ErrorCode::None.code())]);

    // An ISR below min.insync.replicas: refused before anything is written, as Kafka refuses
    // an acks=all append.
    data.set_isr(vec![ME]);
    f.cache.update(|c| {
        let mut t = (*topic(DATA)).clone();
        t.configs.insert("min.insync.replicas".into(), "2".into());
        c.topics.insert(DATA.to_string(), Arc::new(t));
    });
    let end = data.log_end_offset();
    assert_eq!(marker(true).await, vec![((DATA.to_string(), 0), ErrorCode::NotEnoughReplicas.code())]);
    assert_eq!(data.log_end_offset(), end, "nothing written");
}
