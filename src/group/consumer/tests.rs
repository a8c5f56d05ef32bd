use std::collections::BTreeSet;
use std::sync::Mutex;

use super::*;

pub(super) struct Topics(Mutex<BTreeMap<String, (Uuid, i32)>>);

impl Topics {
    pub(super) fn new(topics: &[(&str, u8, i32)]) -> Arc<Topics> {
        Arc::new(Topics(Mutex::new(
            topics.iter().map(|(n, id, count)| (n.to_string(), (Uuid::from_bytes([*id; 16]), *count))).collect(),
        )))
    }
}

impl TopicsView for Topics {
    fn topic(&self, name: &str) -> Option<(Uuid, i32)> {
        self.0.lock().unwrap().get(name).copied()
    }

    fn name(&self, id: Uuid) -> Option<String> {
        self.0.lock().unwrap().iter().find(|(_, (i, _))| *i == id).map(|(n, _)| n.clone())
    }

    fn names(&self) -> Vec<String> {
        self.0.lock().unwrap().keys().cloned().collect()
    }
}

#[derive(Default)]
pub(super) struct Store {
    pub(super) records: Mutex<Vec<(Bytes, Option<Bytes>)>>,
    joined: Mutex<Vec<String>>,
    pub(super) left: Mutex<Vec<String>>,
    owners: Mutex<Vec<(String, i32, String)>>,
    pub(super) downgraded: Mutex<Vec<crate::group::coordinator::ClassicSnapshot>>,
}

impl ConsumerStore for Store {
    fn append(&self, _group: &str, records: Vec<(Bytes, Option<Bytes>)>) -> Result<(), i16> {
        self.records.lock().unwrap().extend(records);
        Ok(())
    }

    fn member_joined(&self, _group: &str, member: &MemberRegistration) {
        self.joined.lock().unwrap().push(member.id.clone());
    }

    fn member_left(&self, _group: &str, member_id: &str) {
        self.left.lock().unwrap().push(member_id.to_string());
    }

    fn owners_changed(&self, _group: &str, owners: &[(String, i32, String)]) {
        *self.owners.lock().unwrap() = owners.to_vec();
    }

    fn downgrade(&self, snapshot: crate::group::coordinator::ClassicSnapshot) {
        self.downgraded.lock().unwrap().push(snapshot);
    }
}

pub(super) fn t1() -> Uuid {
    Uuid::from_bytes([1; 16])
}

pub(super) fn config() -> ConsumerGroupConfig {
    ConsumerGroupConfig::default()
}

pub(super) fn coordinator(topics: Arc<Topics>) -> ConsumerGroupCoordinator {
    ConsumerGroupCoordinator::new(config(), topics)
}

pub(super) fn join(id: &str, topics: &[&str]) -> HeartbeatRequest {
    HeartbeatRequest {
        version: 1,
        group_id: "g".into(),
        member_id: id.into(),
        member_epoch: 0,
        rebalance_timeout_ms: 300_000,
        subscribed_topic_names: Some(topics.iter().map(|t| t.to_string()).collect()),
        owned: Some(Assignment::new()),
        client_id: format!("client-{id}"),
        client_host: "/127.0.0.1".into(),
        ..Default::default()
    }
}

pub(super) fn beat(id: &str, epoch: i32, owned: Option<&Assignment>) -> HeartbeatRequest {
    HeartbeatRequest {
        version: 1,
        group_id: "g".into(),
        member_id: id.into(),
        member_epoch: epoch,
        rebalance_timeout_ms: -1,
        owned: owned.cloned(),
        ..Default::default()
    }
}

pub(super) fn parts(a: &Assignment) -> BTreeSet<i32> {
    a.get(&t1()).cloned().unwrap_or_default()
}

/// A member as a client runs it: what it owns, and its epoch.
pub(super) struct Client {
    pub(super) id: String,
    pub(super) epoch: i32,
    pub(super) owned: Assignment,
}

impl Client {
    pub(super) fn join(c: &ConsumerGroupCoordinator, store: &Store, id: &str) -> Client {
        let r = c.heartbeat(store, join(id, &["t"]));
        assert_eq!(r.error_code, 0, "{r:?}");
        Client { id: id.into(), epoch: r.member_epoch, owned: r.assignment.unwrap_or_default() }
    }

    /// One heartbeat that reports what it owns; takes whatever it is given (revocation is
    /// immediate, as a client's revoke callback would do before the next heartbeat).
    pub(super) fn beat(&mut self, c: &ConsumerGroupCoordinator, store: &Store) -> HeartbeatResult {
        let r = c.heartbeat(store, beat(&self.id, self.epoch, Some(&self.owned)));
        assert_eq!(r.error_code, 0, "{r:?}");
        self.epoch = r.member_epoch;
        if let Some(a) = &r.assignment {
            self.owned = a.clone();
        }
        r
    }
}

fn no_partition_owned_twice(clients: &[&Client]) {
    let mut seen = BTreeSet::new();
    for c in clients {
        for p in parts(&c.owned) {
            assert!(seen.insert(p), "partition {p} owned twice");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn members_split_partitions_and_a_newcomer_waits_for_revocation() {
    let c = coordinator(Topics::new(&[("t", 1, 6)]));
    let store = Store::default();
    let mut a = Client::join(&c, &store, "a");
    assert_eq!(parts(&a.owned).len(), 6, "alone, a owns everything");
    let mut b = Client::join(&c, &store, "b");
    assert!(parts(&b.owned).is_empty(), "b must wait until a revokes");
    // a learns of the new target: its assignment shrinks, its epoch does not move yet.
    let before = a.epoch;
    a.beat(&c, &store);
    assert_eq!(parts(&a.owned).len(), 3);
    assert_eq!(a.epoch, before, "a keeps its epoch until it has revoked");
    no_partition_owned_twice(&[&a, &b]);
    // a reports the revocation: it moves to the group epoch, and b may now take them.
    a.beat(&c, &store);
    assert!(a.epoch > before);
    b.beat(&c, &store);
    assert_eq!(parts(&b.owned).len(), 3);
    no_partition_owned_twice(&[&a, &b]);
    assert_eq!(c.with_group("g", |g| g.state()), Some(ConsumerGroupState::Stable));
    // A third member: each gives up one partition, and only then does c get it.
    let mut m3 = Client::join(&c, &store, "c");
    assert!(parts(&m3.owned).is_empty());
    for _ in 0..2 {
        a.beat(&c, &store);
        b.beat(&c, &store);
        m3.beat(&c, &store);
        no_partition_owned_twice(&[&a, &b, &m3]);
    }
    assert_eq!([parts(&a.owned).len(), parts(&b.owned).len(), parts(&m3.owned).len()], [2, 2, 2]);
    assert_eq!(c.with_group("g", |g| g.state()), Some(ConsumerGroupState::Stable));
    // The mirror saw each member and the final owners.
    assert_eq!(store.joined.lock().unwrap().len(), 3);
    assert_eq!(store.owners.lock().unwrap().len(), 6);
}

#[tokio::test(start_paused = true)]
async fn a_leaving_member_frees_its_partitions_at_once() {
    let c = coordinator(Topics::new(&[("t", 1, 4)]));
    let store = Store::default();
    let mut a = Client::join(&c, &store, "a");
    let mut b = Client::join(&c, &store, "b");
    a.beat(&c, &store);
    a.beat(&c, &store);
    b.beat(&c, &store);
    assert_eq!(parts(&b.owned).len(), 2);
    let r = c.heartbeat(&store, beat("a", a.epoch, None).with_epoch(-1));
    assert_eq!((r.error_code, r.member_epoch), (0, -1));
    b.beat(&c, &store);
    assert_eq!(parts(&b.owned).len(), 4);
    assert_eq!(store.left.lock().unwrap().as_slice(), ["a".to_string()]);
}

impl HeartbeatRequest {
    fn with_epoch(mut self, epoch: i32) -> Self {
        self.member_epoch = epoch;
        self
    }
}

#[tokio::test(start_paused = true)]
async fn errors_as_kafka_answers_them_and_nothing_changes() {
    let c = ConsumerGroupCoordinator::new(ConsumerGroupConfig { max_size: 2, ..config() }, Topics::new(&[("t", 1, 2)]));
    let store = Store::default();
    let mut a = Client::join(&c, &store, "a");
    let code = |r: HeartbeatResult| r.error_code;
    assert_eq!(code(c.heartbeat(&store, beat("a", a.epoch + 1, None))), ErrorCode::FencedMemberEpoch.code());
    assert_eq!(code(c.heartbeat(&store, beat("zz", 3, None))), ErrorCode::UnknownMemberId.code());
    let mut other = beat("zz", 3, None);
    other.group_id = "nope".into();
    assert_eq!(code(c.heartbeat(&store, other)), ErrorCode::UnknownMemberId.code());
    let mut bad = join("b", &["t"]);
    bad.server_assignor = Some("sticky".into());
    assert_eq!(code(c.heartbeat(&store, bad)), ErrorCode::UnsupportedAssignor.code());
    let mut no_timeout = join("b", &["t"]);
    no_timeout.rebalance_timeout_ms = -1;
    assert_eq!(code(c.heartbeat(&store, no_timeout)), ErrorCode::InvalidRequest.code());
    let mut no_id = join("", &["t"]);
    assert_eq!(code(c.heartbeat(&store, no_id.clone())), ErrorCode::InvalidRequest.code(), "v1 needs a member id");
    no_id.version = 0;
    let r = c.heartbeat(&store, no_id);
    assert_eq!(r.error_code, 0, "v0: the coordinator names the member");
    assert!(r.member_id.is_some_and(|id| !id.is_empty()));
    assert_eq!(code(c.heartbeat(&store, join("d", &["t"]))), ErrorCode::GroupMaxSizeReached.code());
    let epoch = c.with_group("g", |g| g.epoch);
    let mut regex = join("e", &["t"]);
    regex.subscribed_topic_regex = Some("t(.*".into());
    assert_eq!(code(c.heartbeat(&store, regex)), ErrorCode::InvalidRegularExpression.code());
    assert_eq!(c.with_group("g", |g| g.epoch), epoch, "a refused heartbeat changes nothing");
    a.beat(&c, &store);
    // Offsets: the member's current epoch only.
    assert_eq!(c.validate_commit("g", "a", a.epoch), Some(Ok(())));
    assert_eq!(c.validate_commit("g", "a", a.epoch - 1), Some(Err(ErrorCode::StaleMemberEpoch.code())));
    assert_eq!(c.validate_commit("g", "x", 1), Some(Err(ErrorCode::UnknownMemberId.code())));
    assert_eq!(c.validate_commit("g", "", -1), Some(Err(ErrorCode::UnknownMemberId.code())), "group not empty");
    assert_eq!(c.validate_commit("classic", "m", 1), None);
    assert_eq!(c.validate_fetch("g", None, -1), Ok(()));
    assert_eq!(c.validate_fetch("g", Some("a"), a.epoch + 5), Err(ErrorCode::StaleMemberEpoch.code()));
}

#[tokio::test(start_paused = true)]
async fn a_silent_member_is_fenced_after_the_session_timeout() {
    let c = coordinator(Topics::new(&[("t", 1, 4)]));
    let store = Store::default();
    let mut a = Client::join(&c, &store, "a");
    let mut b = Client::join(&c, &store, "b");
    a.beat(&c, &store);
    a.beat(&c, &store);
    b.beat(&c, &store);
    // b keeps heartbeating, a goes silent.
    for _ in 0..9 {
        tokio::time::advance(Duration::from_secs(5)).await;
        b.beat(&c, &store);
        c.tick(&store);
    }
    assert!(c.with_group("g", |g| g.members.contains_key("a")) == Some(true), "45 s is not over yet");
    tokio::time::advance(Duration::from_secs(2)).await;
    c.tick(&store);
    assert_eq!(c.with_group("g", |g| g.members.contains_key("a")), Some(false));
    b.beat(&c, &store);
    assert_eq!(parts(&b.owned).len(), 4);
    // a's next heartbeat is refused; it rejoins with epoch 0.
    assert_eq!(c.heartbeat(&store, beat("a", a.epoch, Some(&a.owned))).error_code, ErrorCode::UnknownMemberId.code());
}

#[tokio::test(start_paused = true)]
async fn a_member_that_never_revokes_is_fenced_after_its_rebalance_timeout() {
    let c = coordinator(Topics::new(&[("t", 1, 4)]));
    let store = Store::default();
    let a = Client::join(&c, &store, "a");
    let mut b = Client::join(&c, &store, "b");
    // a heartbeats but keeps claiming all four partitions.
    let r = c.heartbeat(&store, beat("a", a.epoch, Some(&a.owned)));
    assert_eq!(parts(&r.assignment.unwrap()).len(), 2);
    for _ in 0..70 {
        tokio::time::advance(Duration::from_secs(5)).await;
        let _ = c.heartbeat(&store, beat("a", a.epoch, Some(&a.owned)));
        b.beat(&c, &store);
        c.tick(&store);
    }
    assert_eq!(c.with_group("g", |g| g.members.contains_key("a")), Some(false));
    b.beat(&c, &store);
    assert_eq!(parts(&b.owned).len(), 4);
}

#[tokio::test(start_paused = true)]
async fn new_partitions_bump_the_group_epoch_and_are_assigned() {
    let topics = Topics::new(&[("t", 1, 2)]);
    let c = coordinator(topics.clone());
    let store = Store::default();
    let mut a = Client::join(&c, &store, "a");
    let epoch = c.with_group("g", |g| g.epoch).unwrap();
    topics.0.lock().unwrap().insert("t".into(), (t1(), 5));
    a.beat(&c, &store);
    assert_eq!(c.with_group("g", |g| g.epoch), Some(epoch + 1));
    assert_eq!(parts(&a.owned).len(), 5);
}

#[tokio::test(start_paused = true)]
async fn the_records_bring_the_group_back_on_another_coordinator() {
    let c = coordinator(Topics::new(&[("t", 1, 6)]));
    let store = Store::default();
    let mut a = Client::join(&c, &store, "a");
    let mut b = Client::join(&c, &store, "b");
    a.beat(&c, &store);
    // a is mid-revocation when the coordinator goes.
    let records = store.records.lock().unwrap().clone();
    let other = coordinator(Topics::new(&[("t", 1, 6)]));
    let store2 = Store::default();
    for (k, v) in &records {
        other.replay(records::ConsumerRecord::decode(k, v.as_deref()).expect("our own records decode"));
    }
    other.finish_load(&store2, |_| true);
    let snapshot = |c: &ConsumerGroupCoordinator| {
        c.with_group("g", |g| {
            let members: Vec<_> = g
                .members
                .values()
                .map(|m| (m.id.clone(), m.epoch, m.state, m.assigned.clone(), m.pending_revocation.clone()))
                .collect();
            (g.epoch, g.assignment_epoch, g.target.clone(), members)
        })
    };
    assert_eq!(snapshot(&other), snapshot(&c));
    // The members carry on with the new coordinator, revocation first.
    b.beat(&other, &store2);
    assert!(parts(&b.owned).is_empty(), "a has not revoked yet");
    a.beat(&other, &store2);
    b.beat(&other, &store2);
    assert_eq!((parts(&a.owned).len(), parts(&b.owned).len()), (3, 3));
    no_partition_owned_twice(&[&a, &b]);
    // A member that left is gone after a replay too.
    let r = other.heartbeat(&store2, beat("b", b.epoch, None).with_epoch(-1));
    assert_eq!(r.error_code, 0);
    let third = coordinator(Topics::new(&[("t", 1, 6)]));
    let all: Vec<_> = records.iter().chain(store2.records.lock().unwrap().iter()).cloned().collect();
    for (k, v) in &all {
        third.replay(records::ConsumerRecord::decode(k, v.as_deref()).unwrap());
    }
    third.finish_load(&Store::default(), |_| true);
    assert_eq!(third.with_group("g", |g| g.members.keys().cloned().collect::<Vec<_>>()), Some(vec!["a".to_string()]));
}

#[tokio::test(start_paused = true)]
async fn the_previous_epoch_is_accepted_while_the_member_owns_no_more_than_its_assignment() {
    let c = coordinator(Topics::new(&[("t", 1, 4)]));
    let store = Store::default();
    let mut a = Client::join(&c, &store, "a");
    let _b = Client::join(&c, &store, "b");
    a.beat(&c, &store);
    let previous = a.epoch;
    a.beat(&c, &store);
    assert!(a.epoch > previous);
    // The answer with the new epoch was lost: a retries with the one it knew.
    let r = c.heartbeat(&store, beat("a", previous, Some(&a.owned)));
    assert_eq!((r.error_code, r.member_epoch), (0, a.epoch), "{r:?}");
    // Claiming a partition it no longer has is fenced.
    let mut more = a.owned.clone();
    more.entry(t1()).or_default().extend(0..4);
    let r = c.heartbeat(&store, beat("a", previous, Some(&more)));
    assert_eq!(r.error_code, ErrorCode::FencedMemberEpoch.code());
}

#[test]
fn member_ids_become_znode_names() {
    assert_eq!(znode_member_id("sZhRNQ81QEatqc7+J/lKFg"), "sZhRNQ81QEatqc7+J_lKFg");
    assert_eq!(znode_member_id("plain"), "plain");
    assert_eq!(znode_member_id(".."), "_..");
    assert_eq!(znode_member_id(""), "_");
}

#[tokio::test(start_paused = true)]
async fn a_regex_subscription_follows_the_topics_it_matches() {
    let topics = Topics::new(&[("orders-eu", 1, 2), ("orders-us", 2, 2), ("payments", 3, 2)]);
    let c = coordinator(topics.clone());
    let store = Store::default();
    let mut req = join("a", &[]);
    req.subscribed_topic_regex = Some("orders-.*".into());
    let r = c.heartbeat(&store, req);
    assert_eq!(r.error_code, 0, "{r:?}");
    let owned = r.assignment.unwrap_or_default();
    let ids = |names: &[u8]| names.iter().map(|i| Uuid::from_bytes([*i; 16])).collect::<BTreeSet<_>>();
    assert_eq!(owned.keys().copied().collect::<BTreeSet<_>>(), ids(&[1, 2]), "resolved when it is new");
    let mut a = Client { id: "a".into(), epoch: r.member_epoch, owned };
    // A new matching topic: picked up once the group's patterns are matched again.
    topics.0.lock().unwrap().insert("orders-asia".into(), (Uuid::from_bytes([4; 16]), 1));
    a.beat(&c, &store);
    assert!(!a.owned.contains_key(&Uuid::from_bytes([4; 16])), "not before the refresh interval");
    tokio::time::advance(topic_regex::REFRESH_INTERVAL).await;
    a.beat(&c, &store);
    assert_eq!(a.owned.keys().copied().collect::<BTreeSet<_>>(), ids(&[1, 2, 4]));
    assert_eq!(c.with_group("g", |g| g.members["a"].subscribed_topic_regex.clone()), Some(Some("orders-.*".into())));
    // An empty pattern clears it: the member keeps only its names (none).
    let mut clear = beat("a", a.epoch, Some(&a.owned));
    clear.subscribed_topic_regex = Some(String::new());
    let r = c.heartbeat(&store, clear);
    assert_eq!(r.error_code, 0, "{r:?}");
    assert!(r.assignment.is_some_and(|x| x.values().all(|ps| ps.is_empty())));
}
