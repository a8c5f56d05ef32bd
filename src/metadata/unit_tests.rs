//! Unit tests of the ZooKeeper sync and of UpdateMetadata, on the embedded store: what the
//! tree and the controller say reaches the metadata cache, then the subscribers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::listener::{ControllerRole, MetadataListener};
use super::zk_sync::{Changes, ZkSync};
use super::{zk_data, EmbeddedStore, MetadataCache, StoreError, TopicInfo, ZnodeStore};
use crate::config::BrokerConfig;
use crate::protocol::inter_broker::{
    UpdateMetadataBroker, UpdateMetadataEndpoint, UpdateMetadataPartitionState, UpdateMetadataRequest,
    UpdateMetadataTopicState,
};

const ME: i32 = 1;

/// What a subscriber heard, in order.
#[derive(Default)]
struct Heard(Mutex<Vec<String>>);

impl Heard {
    fn push(&self, event: String) {
        self.0.lock().unwrap().push(event);
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl MetadataListener for Heard {
    fn on_broker_configs_changed(&self) -> Result<(), StoreError> {
        self.push("broker configs".into());
        Ok(())
    }

    fn on_client_quotas_changed(&self) -> Result<(), StoreError> {
        self.push("quotas".into());
        Ok(())
    }

    fn on_config_change_notification(&self) {
        self.push("notification".into());
    }

    fn on_topic_configs_changed(&self, topics: &[Arc<TopicInfo>]) {
        for t in topics {
            self.push(format!("configs of {}: {:?}", t.name, t.configs));
        }
    }

    fn on_metadata_updated(&self) {
        self.push("updated".into());
    }

    fn on_partitions_deleted(&self, deleted: &[(String, i32)]) {
        self.push(format!("deleted {deleted:?}"));
    }
}

/// A controller that is elected by creating `/controller` and records each pass's scope.
struct TestController {
    store: Arc<ZnodeStore>,
    active: AtomicBool,
    passes: Heard,
}

impl ControllerRole for TestController {
    fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    fn try_elect(&self) -> Result<bool, StoreError> {
        match self.store.create(zk_data::CONTROLLER, &zk_data::controller_json(ME, 0), true) {
            Ok(()) => {}
            Err(StoreError::NodeExists(_)) => return Ok(false),
            Err(e) => return Err(e),
        }
        self.active.store(true, Ordering::Release);
        Ok(true)
    }

    fn resign(&self) {
        self.active.store(false, Ordering::Release);
    }

    fn on_live_brokers(&self, _live: &BTreeSet<i32>) {}

    fn on_metadata_read(
        &self,
        _live: &BTreeSet<i32>,
        _brokers: bool,
        scope: Option<&Changes>,
    ) -> Result<(), StoreError> {
        self.passes.push(match scope {
            None => "everything".to_string(),
            Some(c) => format!("topics {:?}", c.topics),
        });
        Ok(())
    }

    fn request_preferred_election(&self) {}

    fn take_preferred_election(&self) -> bool {
        false
    }

    fn preferred_elections(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

fn sync_on(dir: &tempfile::TempDir) -> (Arc<ZkSync>, Arc<MetadataCache>, Arc<ZnodeStore>, Arc<Heard>) {
    let store = Arc::new(ZnodeStore::Embedded(EmbeddedStore::open(dir.path().join("store.json")).unwrap()));
    let config = BrokerConfig::from_map(BTreeMap::from([("broker.id".to_string(), ME.to_string())])).unwrap();
    let cache = Arc::new(MetadataCache::default());
    let sync = ZkSync::new(&config, store.clone(), cache.clone());
    let heard = Arc::new(Heard::default());
    sync.subscribe(heard.clone());
    (sync, cache, store, heard)
}

fn write_topic(store: &ZnodeStore, name: &str, partitions: i32) {
    let assignment: BTreeMap<i32, Vec<i32>> = (0..partitions).map(|p| (p, vec![ME])).collect();
    store.set(&zk_data::topic_path(name), &zk_data::topic_json(&assignment, zk_data::new_kafka_uuid())).unwrap();
    for p in 0..partitions {
        let state = zk_data::PartitionState { leader: ME, leader_epoch: 3, isr: vec![ME], controller_epoch: 1 };
        store.set(&zk_data::partition_state_path(name, p), &zk_data::partition_state_json(&state)).unwrap();
    }
}

fn paths(paths: &[&str]) -> Changes {
    let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
    Changes::from_paths(&paths)
}

#[test]
fn the_controllers_sync_reads_topics_into_the_cache_and_tells_of_config_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (sync, cache, store, heard) = sync_on(&dir);
    let controller =
        Arc::new(TestController { store: store.clone(), active: AtomicBool::new(false), passes: Heard::default() });
    sync.set_controller(controller.clone());
    write_topic(&store, "a", 2);
    sync.reconcile().unwrap();
    let snapshot = cache.snapshot();
    assert_eq!(snapshot.controller_id, ME);
    let a = &snapshot.topics["a"];
    assert_eq!(
        a.partitions.iter().map(|p| (p.index, p.leader, p.leader_epoch)).collect::<Vec<_>>(),
        [(0, ME, 3), (1, ME, 3)]
    );
    assert_eq!(controller.passes.take(), ["everything"]);
    heard.take();

    // A topic created later: only it is read, and the controller's pass is scoped to it.
    write_topic(&store, "b", 1);
    sync.reconcile_changes(Some(&paths(&["/brokers/topics/b"]))).unwrap();
    assert_eq!(cache.snapshot().topics["b"].partitions.len(), 1);
    assert_eq!(controller.passes.take(), [r#"topics {"b"}"#]);

    // Its overrides change: in the cache first, then the subscribers hear of it.
    let retention = BTreeMap::from([("retention.ms".to_string(), "1000".to_string())]);
    store.set(&zk_data::topic_config_path("a"), &zk_data::topic_config_json(&retention)).unwrap();
    sync.reconcile_changes(Some(&paths(&["/config/topics/a"]))).unwrap();
    assert_eq!(cache.snapshot().topics["a"].configs, retention);
    assert_eq!(heard.take(), [r#"configs of a: {"retention.ms": "1000"}"#]);

    // A deleted topic leaves the cache.
    store.delete_recursive(&zk_data::topic_path("b")).unwrap();
    sync.reconcile_changes(Some(&paths(&["/brokers/topics/b"]))).unwrap();
    assert!(!cache.snapshot().topics.contains_key("b"));
}

#[test]
fn a_config_change_notification_reaches_the_subscribers() {
    let dir = tempfile::tempdir().unwrap();
    let (sync, _cache, _store, heard) = sync_on(&dir);
    sync.reconcile_changes(Some(&paths(&["/config/changes/config_change_0000000001"]))).unwrap();
    assert_eq!(heard.take(), ["broker configs", "quotas", "notification"]);
    sync.reconcile_changes(Some(&paths(&["/config/users/alice"]))).unwrap();
    assert_eq!(heard.take(), ["quotas"]);
}

#[test]
fn update_metadata_fills_the_cache_and_a_broker_follows_topic_configs() {
    let dir = tempfile::tempdir().unwrap();
    let (sync, cache, store, heard) = sync_on(&dir);
    let retention = BTreeMap::from([("retention.ms".to_string(), "1000".to_string())]);
    store.set(&zk_data::topic_config_path("a"), &zk_data::topic_config_json(&retention)).unwrap();
    let partition = |index, leader| UpdateMetadataPartitionState {
        partition_index: index,
        leader,
        leader_epoch: 4,
        isr: vec![2, ME],
        zk_version: 7,
        replicas: vec![2, ME],
        ..Default::default()
    };
    let id = zk_data::new_kafka_uuid();
    let req = UpdateMetadataRequest {
        controller_id: 2,
        controller_epoch: 5,
        topics: vec![UpdateMetadataTopicState {
            topic_name: "a".into(),
            topic_id: id,
            partitions: vec![partition(1, 2), partition(0, ME)],
        }],
        live_brokers: vec![UpdateMetadataBroker {
            id: 2,
            endpoints: vec![UpdateMetadataEndpoint {
                port: 9093,
                host: "two".into(),
                listener: "PLAINTEXT".into(),
                security_protocol: 0,
            }],
            rack: None,
        }],
        ..Default::default()
    };
    assert_eq!(sync.update_metadata(&req).error_code, 0);
    let snapshot = cache.snapshot();
    assert_eq!(snapshot.controller_id, 2);
    assert_eq!(
        snapshot.brokers.iter().map(|b| (b.id, b.host.as_str(), b.port)).collect::<Vec<_>>(),
        [(2, "two", 9093)]
    );
    let a = &snapshot.topics["a"];
    assert_eq!(a.id, id);
    assert_eq!(a.configs, retention, "a topic's configs are read when it first appears");
    assert_eq!(
        a.partitions.iter().map(|p| (p.index, p.leader, p.partition_epoch)).collect::<Vec<_>>(),
        [(0, ME, 7), (1, 2, 7)]
    );
    assert_eq!(heard.take(), ["updated", "deleted []"]);

    // Not the controller: the sync follows who the controller is and the topic configs.
    store.set(&zk_data::topic_config_path("a"), &zk_data::topic_config_json(&BTreeMap::new())).unwrap();
    sync.reconcile_changes(Some(&paths(&["/config/topics/a"]))).unwrap();
    assert!(cache.snapshot().topics["a"].configs.is_empty());
    assert_eq!(heard.take(), ["configs of a: {}"]);
    assert_eq!(cache.snapshot().controller_id, 2);

    // The controller deletes it: leader -2 takes it out of the image.
    let deleting = UpdateMetadataRequest {
        topics: vec![UpdateMetadataTopicState {
            topic_name: "a".into(),
            topic_id: id,
            partitions: vec![partition(0, super::update_metadata::LEADER_DURING_DELETE)],
        }],
        ..req
    };
    sync.update_metadata(&deleting);
    assert!(!cache.snapshot().topics.contains_key("a"));
    assert_eq!(heard.take(), ["updated", r#"deleted [("a", 0)]"#]);
}
