//! The service over real parts: the embedded znode store, a replica manager over a temporary
//! log dir, the wiring `broker.rs` uses. A "restart" is a new service over the same dir.

use super::*;
use crate::metadata::{EmbeddedStore, MetadataCache, PartitionInfo, TopicInfo, ZnodeStore};
use crate::replication::{ReplicaHandles, ReplicaManager};
use std::collections::BTreeMap;
use std::path::Path;

const ME: i32 = 1;

struct NoCreator;

impl OffsetsTopicCreator for NoCreator {
    fn create_offsets_topic(&self) -> Result<bool, (i16, String)> {
        Ok(false)
    }
}

fn topic(name: &str, partitions: i32) -> Arc<TopicInfo> {
    Arc::new(TopicInfo {
        name: name.to_string(),
        id: uuid::Uuid::from_u128(partitions as u128 + name.len() as u128),
        partitions: (0..partitions)
            .map(|index| PartitionInfo {
                index,
                leader: ME,
                leader_epoch: 0,
                replicas: vec![ME],
                isr: vec![ME],
                partition_epoch: 0,
                adding_replicas: vec![],
                removing_replicas: vec![],
                offline_replicas: vec![],
            })
            .collect(),
        configs: BTreeMap::new(),
    })
}

/// One broker's group coordinator over `dir`, leading the one `__consumer_offsets` partition.
struct Node {
    service: Arc<GroupCoordinatorService>,
    replicas: Arc<ReplicaManager>,
}

impl Node {
    fn start(dir: &Path) -> Node {
        Node::start_with(dir, Default::default())
    }

    fn start_with(dir: &Path, consumer: ConsumerGroupConfig) -> Node {
        let logs_dir = dir.join("logs");
        std::fs::create_dir_all(&logs_dir).unwrap();
        let mut given = BTreeMap::new();
        given.insert("broker.id".to_string(), ME.to_string());
        given.insert("log.dirs".to_string(), logs_dir.display().to_string());
        let config = crate::config::BrokerConfig::from_map(given).unwrap();
        let logs = crate::log::LogManager::open(vec![logs_dir], config.log.clone()).unwrap();
        let store = Arc::new(ZnodeStore::Embedded(EmbeddedStore::open(dir.join("metadata.json")).unwrap()));
        let cache = Arc::new(MetadataCache::default());
        cache.update(|c| {
            c.topics.insert(OFFSETS_TOPIC.to_string(), topic(OFFSETS_TOPIC, 1));
            c.topics.insert("t".to_string(), topic("t", 2));
        });
        let metrics = crate::metrics::BrokerMetrics::new().unwrap();
        let handles = ReplicaHandles {
            effective: {
                let c = Arc::new(config.clone());
                Arc::new(move || c.clone())
            },
            cache: cache.clone(),
            store: store.clone(),
            inter_broker: Arc::new(crate::security::client::InterBrokerClient::from_config(&config).unwrap()),
            config: Arc::new(config.clone()),
        };
        let replicas = Arc::new(ReplicaManager::new(logs, metrics.topics.clone(), metrics.isr.clone(), handles));
        replicas.make_leader(OFFSETS_TOPIC, 0, "offsets", config.log.clone()).unwrap();
        let service = Arc::new(GroupCoordinatorService::new(GroupServiceHandles {
            broker_id: ME,
            coordinator: CoordinatorConfig {
                initial_rebalance_delay: Duration::ZERO,
                min_session_timeout_ms: 6000,
                max_session_timeout_ms: 300_000,
                offsets_retention_ms: 7 * 24 * 3_600_000,
                offsets_retention_check_interval_ms: 600_000,
                offset_metadata_max_bytes: 4096,
            },
            partitions: replicas.clone(),
            creator: Arc::new(NoCreator),
            znodes: store,
            io: Arc::new(IoPool::new(1, 1, metrics.io_jobs.clone(), metrics.io_threads.clone())),
            offsets_zk_mirror_interval: None,
            offsets_zk_mirror_max_writes: 1,
            consumer,
            topics: cache,
            share: Default::default(),
            group_configs: Arc::new(crate::group::configs::GroupConfigs::in_memory(Default::default())),
        }));
        service.load_groups(None);
        Node { service, replicas }
    }

    fn stop(self) {
        self.replicas.logs().shutdown().unwrap();
    }

    fn group(&self) -> Option<(GroupState, i32, usize)> {
        self.service.with_group("g", |g| (g.state, g.generation, g.members.len()))
    }

    fn log_end(&self) -> i64 {
        self.replicas.partition(OFFSETS_TOPIC, 0).unwrap().log_end_offset()
    }
}

fn join_req() -> JoinRequest {
    JoinRequest {
        group_id: "g".into(),
        member_id: String::new(),
        instance_id: None,
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 30_000,
        protocol_type: "consumer".into(),
        protocols: vec![("range".into(), Bytes::from_static(b"m"))],
        require_known_member_id: false,
    }
}

/// A Stable group of one, its member id and generation.
async fn stable_single(s: &GroupCoordinatorService) -> (String, i32) {
    let j = s.join(join_req()).await;
    assert_eq!(j.error_code, ErrorCode::None.code());
    let a = s.sync("g", j.generation_id, &j.member_id, None, vec![(j.member_id.clone(), Bytes::from_static(b"a"))]);
    assert_eq!(a.await.assignment, Bytes::from_static(b"a"));
    (j.member_id, j.generation_id)
}

#[tokio::test(start_paused = true)]
async fn join_sync_and_commit_are_in_the_log_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let (member, generation) = stable_single(&node.service).await;
    let before = node.log_end();
    assert!(before >= 1, "the Stable group's record is appended");
    let r = node.service.commit_offsets("g", generation, &member, vec![(("t".into(), 1), 42, 3, Some("m".into()))]);
    assert_eq!(r, vec![(("t".to_string(), 1), ErrorCode::None.code())]);
    assert_eq!(node.log_end(), before + 1, "one batch for the commit");
    // Visible at once to OffsetFetch, once it is in the log.
    let fetched = node.service.fetch_offsets("g", Some(vec![("t".into(), 1)]));
    assert_eq!(fetched[0].1.as_ref().map(|o| o.offset), Some(42));
    // Not a known partition: refused, and nothing written.
    let r = node.service.commit_offsets("g", generation, &member, vec![(("t".into(), 7), 1, -1, None)]);
    assert_eq!(r[0].1, ErrorCode::UnknownTopicOrPartition.code());
    assert_eq!(node.log_end(), before + 1);
    node.stop();

    let node = Node::start(dir.path());
    let fetched = node.service.fetch_offsets("g", None);
    assert_eq!(fetched.len(), 1);
    let o = fetched[0].1.clone().unwrap();
    assert_eq!((o.offset, o.leader_epoch, o.metadata.as_str()), (42, 3, "m"));
    // Stored with a member, so Empty after the restart, a generation on, and stored so.
    assert_eq!(node.group(), Some((GroupState::Empty, 2, 0)));
    node.stop();
    let node = Node::start(dir.path());
    assert_eq!(node.group(), Some((GroupState::Empty, 2, 0)), "the Empty state was appended at the first load");
    node.stop();
}

#[tokio::test(start_paused = true)]
async fn a_session_expiry_rebalances_and_the_empty_group_is_appended() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let (member, generation) = stable_single(&node.service).await;
    let before = node.log_end();
    tokio::time::advance(Duration::from_millis(9_000)).await;
    assert_eq!(node.service.heartbeat("g", generation, &member, None), ErrorCode::None.code());
    tokio::time::advance(Duration::from_millis(10_001)).await;
    node.service.coordinator().tick(&*node.service);
    assert_eq!(node.group(), Some((GroupState::Empty, 2, 0)));
    assert_eq!(node.log_end(), before + 1, "the Empty group's record is appended");
    assert_eq!(node.service.heartbeat("g", generation, &member, None), ErrorCode::UnknownMemberId.code());
    node.stop();
    let node = Node::start(dir.path());
    assert_eq!(node.group(), Some((GroupState::Empty, 2, 0)));
    node.stop();
}

#[tokio::test(start_paused = true)]
async fn deleting_a_group_leaves_tombstones_a_restart_honours() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let (member, generation) = stable_single(&node.service).await;
    node.service.commit_offsets("g", generation, &member, vec![(("t".into(), 0), 5, -1, None)]);
    assert_eq!(node.service.delete_group("g"), ErrorCode::NonEmptyGroup.code());
    assert_eq!(node.service.leave("g", &[(member, None)]), Ok(vec![ErrorCode::None.code()]));
    assert_eq!(node.service.delete_group("g"), ErrorCode::None.code());
    assert_eq!(node.group(), None);
    node.stop();
    let node = Node::start(dir.path());
    assert_eq!(node.group(), None);
    assert!(node.service.fetch_offsets("g", None).is_empty());
    node.stop();
}

#[tokio::test]
async fn coordinator_lookups_follow_the_image_and_the_loading_set() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    assert_eq!(node.service.offsets_partition("g"), Some(0));
    assert_eq!(node.service.check_coordinator("g"), Ok(()));
    node.service.set_loading(0, true);
    assert_eq!(node.service.check_coordinator("g"), Err(ErrorCode::CoordinatorLoadInProgress.code()));
    node.service.set_loading(0, false);
    assert_eq!(node.service.ensure_offsets_topic(), Ok(()));
    node.stop();
}

fn consumer_join(member: &str) -> crate::group::consumer::HeartbeatRequest {
    crate::group::consumer::HeartbeatRequest {
        version: 1,
        group_id: "g".into(),
        member_id: member.into(),
        member_epoch: 0,
        rebalance_timeout_ms: 30_000,
        subscribed_topic_names: Some(vec!["t".into()]),
        owned: Some(Default::default()),
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_consumer_protocol_group_and_its_offsets_come_back_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let r = node.service.consumer_heartbeat(consumer_join("m1"));
    assert_eq!(r.error_code, ErrorCode::None.code(), "{r:?}");
    let epoch = r.member_epoch;
    assert_eq!(r.assignment.map(|a| a.values().map(|p| p.len()).sum::<usize>()), Some(2));
    // Offsets with the member's epoch; a stale epoch is refused.
    let stale = node.service.commit_offsets("g", epoch - 1, "m1", vec![(("t".into(), 0), 7, -1, None)]);
    assert_eq!(stale[0].1, ErrorCode::StaleMemberEpoch.code());
    let ok = node.service.commit_offsets("g", epoch, "m1", vec![(("t".into(), 0), 7, -1, None)]);
    assert_eq!(ok[0].1, ErrorCode::None.code());
    // A classic member may not join it meanwhile.
    assert_eq!(node.service.join(join_req()).await.error_code, ErrorCode::InconsistentGroupProtocol.code());
    node.stop();

    let node = Node::start(dir.path());
    let back = node.service.consumer_groups().with_group("g", |g| (g.epoch, g.members["m1"].epoch));
    assert_eq!(back, Some((epoch, epoch)), "the member and its epoch are in the log");
    assert_eq!(node.service.fetch_offsets("g", None)[0].1.as_ref().map(|o| o.offset), Some(7));
    let beat = crate::group::consumer::HeartbeatRequest {
        member_epoch: epoch,
        rebalance_timeout_ms: -1,
        subscribed_topic_names: None,
        owned: None,
        ..consumer_join("m1")
    };
    assert_eq!(node.service.consumer_heartbeat(beat.clone()).error_code, ErrorCode::None.code());
    // The member leaves; the group stays, Empty, and deletes with its offsets.
    let leave = crate::group::consumer::HeartbeatRequest { member_epoch: -1, ..beat };
    assert_eq!(node.service.consumer_heartbeat(leave).member_epoch, -1);
    assert_eq!(node.service.delete_group("g"), ErrorCode::None.code());
    node.stop();
    let node = Node::start(dir.path());
    assert!(!node.service.consumer_groups().contains("g"));
    assert!(node.service.fetch_offsets("g", None).is_empty());
    node.stop();
}

#[tokio::test(start_paused = true)]
async fn a_classic_group_with_members_keeps_its_id_from_the_consumer_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    stable_single(&node.service).await;
    // Its member's metadata is not the consumer's embedded protocol: no upgrade.
    let r = node.service.consumer_heartbeat(consumer_join("m1"));
    assert_eq!(r.error_code, ErrorCode::GroupIdNotFound.code());
    assert!(r.error_message.as_deref().is_some_and(|m| m.contains("malformed")), "{r:?}");
    assert!(!node.service.consumer_groups().contains("g"));
    node.stop();
}

/// ConsumerProtocolSubscription v1 for topic "t", owning `owned` of it.
fn subscription(owned: &[i32]) -> Bytes {
    use kafka_protocol::messages::consumer_protocol_subscription::TopicPartition;
    use kafka_protocol::messages::{ConsumerProtocolSubscription, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let s = ConsumerProtocolSubscription::default()
        .with_topics(vec![StrBytes::from_static_str("t")])
        .with_owned_partitions(vec![TopicPartition::default()
            .with_topic(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(owned.to_vec())]);
    let mut b = bytes::BytesMut::new();
    bytes::BufMut::put_i16(&mut b, 1);
    s.encode(&mut b, 1).unwrap();
    b.freeze()
}

fn assignment(parts: &[i32]) -> Bytes {
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
    use kafka_protocol::messages::{ConsumerProtocolAssignment, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let a = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![TopicPartition::default()
        .with_topic(TopicName(StrBytes::from_static_str("t")))
        .with_partitions(parts.to_vec())]);
    let mut b = bytes::BytesMut::new();
    bytes::BufMut::put_i16(&mut b, 0);
    a.encode(&mut b, 0).unwrap();
    b.freeze()
}

fn assigned_partitions(bytes: &Bytes) -> Vec<i32> {
    use kafka_protocol::messages::ConsumerProtocolAssignment;
    use kafka_protocol::protocol::Decodable;
    let mut buf = bytes.slice(2..);
    let a = ConsumerProtocolAssignment::decode(&mut buf, 0).unwrap();
    let mut out: Vec<i32> = a.assigned_partitions.iter().flat_map(|tp| tp.partitions.clone()).collect();
    out.sort();
    out
}

fn classic_join(member_id: &str, owned: &[i32]) -> JoinRequest {
    JoinRequest { member_id: member_id.into(), protocols: vec![("range".into(), subscription(owned))], ..join_req() }
}

/// A classic group of one member owning both partitions of "t": (member id, generation).
async fn classic_owning_t(s: &GroupCoordinatorService) -> (String, i32) {
    let j = s.join(classic_join("", &[])).await;
    assert_eq!(j.error_code, ErrorCode::None.code());
    let a = s.sync("g", j.generation_id, &j.member_id, None, vec![(j.member_id.clone(), assignment(&[0, 1]))]).await;
    assert_eq!(assigned_partitions(&a.assignment), vec![0, 1]);
    (j.member_id, j.generation_id)
}

#[tokio::test(start_paused = true)]
async fn a_classic_group_is_upgraded_online_and_downgraded_when_the_new_member_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let s = &node.service;
    let (c, generation) = classic_owning_t(s).await;
    s.commit_offsets("g", generation, &c, vec![(("t".into(), 0), 5, -1, None)]);
    // A heartbeat that is not a join converts nothing.
    let stray =
        s.consumer_heartbeat(crate::group::consumer::HeartbeatRequest { member_epoch: 3, ..consumer_join("m9") });
    assert_eq!(stray.error_code, ErrorCode::GroupIdNotFound.code());
    assert!(!s.consumer_groups().contains("g"));

    // Upgrade: the classic member is in the consumer group at its generation, owning what
    // SyncGroup gave it; the newcomer waits for a partition to be released.
    let r = s.consumer_heartbeat(consumer_join("m1"));
    assert_eq!(r.error_code, ErrorCode::None.code(), "{r:?}");
    assert_eq!(r.assignment.map(|a| a.values().map(|p| p.len()).sum::<usize>()), Some(0));
    let seen = s.consumer_groups().with_group("g", |g| {
        let m = &g.members[&c];
        (g.epoch, m.epoch, m.assigned.values().map(|p| p.len()).sum::<usize>(), m.classic.is_some())
    });
    assert_eq!(seen, Some((generation + 1, generation, 2, true)));
    assert!(s.is_consumer_group("g"));
    assert_eq!(node.group().map(|(state, _, members)| (state, members)), Some((GroupState::Empty, 0)));
    assert_eq!(s.fetch_offsets("g", None)[0].1.as_ref().map(|o| o.offset), Some(5), "offsets stay");

    // Its target changed: its heartbeat says rejoin; the rejoin (eager: owns nothing) gives up
    // one partition and takes the new generation; SyncGroup hands out the other.
    assert_eq!(s.heartbeat("g", generation, &c, None), ErrorCode::RebalanceInProgress.code());
    let j = s.join(classic_join(&c, &[])).await;
    assert_eq!((j.error_code, j.generation_id, j.leader.as_str()), (0, generation + 1, ""));
    let sync = s.sync("g", j.generation_id, &c, None, vec![]).await;
    assert_eq!(sync.error_code, ErrorCode::None.code());
    assert_eq!(assigned_partitions(&sync.assignment).len(), 1);
    assert_eq!(s.heartbeat("g", j.generation_id, &c, None), ErrorCode::None.code());
    assert_eq!(s.heartbeat("g", generation, &c, None), ErrorCode::IllegalGeneration.code());
    let stale = s.commit_offsets("g", generation, &c, vec![(("t".into(), 0), 6, -1, None)]);
    assert_eq!(stale[0].1, ErrorCode::IllegalGeneration.code());
    let beat = crate::group::consumer::HeartbeatRequest {
        member_epoch: r.member_epoch,
        rebalance_timeout_ms: -1,
        subscribed_topic_names: None,
        owned: Some(Default::default()),
        ..consumer_join("m1")
    };
    let r = s.consumer_heartbeat(beat.clone());
    assert_eq!(r.assignment.map(|a| a.values().map(|p| p.len()).sum::<usize>()), Some(1), "the released one");
    node.stop();

    // The converted group is in the log, classic member and all.
    let node = Node::start(dir.path());
    let s = &node.service;
    let back = s.consumer_groups().with_group("g", |g| {
        let m = &g.members[&c];
        (m.epoch, m.classic.as_ref().map(|c| c.session_timeout_ms), g.members.len())
    });
    assert_eq!(back, Some((generation + 1, Some(10_000), 2)));
    assert!(s.is_consumer_group("g"));

    // Downgrade: the last consumer-protocol member leaves; the classic group rebalances.
    let r = s.consumer_heartbeat(crate::group::consumer::HeartbeatRequest { member_epoch: -1, ..beat });
    assert_eq!(r.error_code, ErrorCode::None.code(), "{r:?}");
    assert!(!s.consumer_groups().contains("g"));
    assert_eq!(node.group(), Some((GroupState::PreparingRebalance, generation + 1, 1)));
    assert_eq!(s.heartbeat("g", generation + 1, &c, None), ErrorCode::RebalanceInProgress.code());
    let j = s.join(classic_join(&c, &[])).await;
    assert_eq!((j.error_code, j.generation_id, j.leader.as_str()), (0, generation + 2, c.as_str()));
    let a = s.sync("g", j.generation_id, &c, None, vec![(c.clone(), assignment(&[0, 1]))]).await;
    assert_eq!(assigned_partitions(&a.assignment), vec![0, 1]);
    assert_eq!(s.fetch_offsets("g", None)[0].1.as_ref().map(|o| o.offset), Some(5));
    node.stop();
    let node = Node::start(dir.path());
    assert!(!node.service.consumer_groups().contains("g"), "the consumer group's records are tombstoned");
    node.stop();
}

#[tokio::test(start_paused = true)]
async fn a_consumer_member_whose_session_lapses_downgrades_the_group_too() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let s = &node.service;
    let (c, generation) = classic_owning_t(s).await;
    assert_eq!(s.consumer_heartbeat(consumer_join("m1")).error_code, ErrorCode::None.code());
    // The classic member keeps its session; the other one falls silent.
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(s.heartbeat("g", generation, &c, None), ErrorCode::RebalanceInProgress.code());
        s.consumer_groups().tick(&**s);
        if !s.consumer_groups().contains("g") {
            break;
        }
    }
    assert!(!s.consumer_groups().contains("g"));
    assert_eq!(node.group().map(|(state, _, n)| (state, n)), Some((GroupState::PreparingRebalance, 1)));
    node.stop();
}

#[tokio::test(start_paused = true)]
async fn with_migration_disabled_neither_protocol_joins_the_others_group() {
    let dir = tempfile::tempdir().unwrap();
    let disabled = ConsumerGroupConfig { migration: crate::config::MigrationPolicy::Disabled, ..Default::default() };
    let node = Node::start_with(dir.path(), disabled);
    let s = &node.service;
    classic_owning_t(s).await;
    let r = s.consumer_heartbeat(consumer_join("m1"));
    assert_eq!(r.error_code, ErrorCode::GroupIdNotFound.code());
    assert!(!s.consumer_groups().contains("g"));
    node.stop();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with(
        dir.path(),
        ConsumerGroupConfig { migration: crate::config::MigrationPolicy::Disabled, ..Default::default() },
    );
    assert_eq!(node.service.consumer_heartbeat(consumer_join("m1")).error_code, ErrorCode::None.code());
    let j = node.service.join(classic_join("", &[])).await;
    assert_eq!(j.error_code, ErrorCode::InconsistentGroupProtocol.code());
    node.stop();
}
