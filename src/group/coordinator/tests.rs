use super::*;
use std::sync::Arc;

/// Records what the coordinator asked of its storage.
#[derive(Default)]
struct Recorder {
    left: Mutex<Vec<String>>,
    groups_stored: Mutex<Vec<(GroupState, i32)>>,
    tombstones: Mutex<Vec<(String, TopicPartition)>>,
}

impl GroupStore for Recorder {
    fn store_offsets(&self, g: &str, offsets: &[((String, i32), Option<CommittedOffset>)]) -> Result<(), i16> {
        // As the log does: a batch without records is not a valid batch.
        if offsets.is_empty() {
            return Err(ErrorCode::InvalidRecord.code());
        }
        let mut tombstones = self.tombstones.lock().unwrap();
        tombstones.extend(offsets.iter().filter(|(_, v)| v.is_none()).map(|(tp, _)| (g.to_string(), tp.clone())));
        Ok(())
    }
    fn store_group(&self, group: &GroupRecord) -> Result<(), i16> {
        self.groups_stored.lock().unwrap().push((group.state, group.generation));
        Ok(())
    }
    fn topic_partition_exists(&self, _: &str, _: i32) -> bool {
        true
    }
    fn member_joined(&self, _: &str, _: &MemberRegistration) {}
    fn member_left(&self, _: &str, member_id: &str) {
        self.left.lock().unwrap().push(member_id.to_string());
    }
    fn owners_changed(&self, _: &str, _: &[(String, i32, String)]) {}
}

fn coordinator(initial_delay_ms: u64) -> Arc<GroupCoordinator> {
    Arc::new(GroupCoordinator::new(CoordinatorConfig {
        initial_rebalance_delay: Duration::from_millis(initial_delay_ms),
        min_session_timeout_ms: 6000,
        max_session_timeout_ms: 300000,
        offsets_retention_ms: 7 * 24 * 3_600_000,
        offsets_retention_check_interval_ms: 600_000,
        offset_metadata_max_bytes: 4096,
    }))
}

fn join_req(member_id: &str) -> JoinRequest {
    JoinRequest {
        group_id: "g".into(),
        member_id: member_id.into(),
        instance_id: None,
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: 10000,
        rebalance_timeout_ms: 30000,
        protocol_type: "consumer".into(),
        protocols: vec![("range".into(), Bytes::from_static(b"m"))],
        require_known_member_id: false,
    }
}

fn state(c: &GroupCoordinator) -> (GroupState, i32, usize) {
    c.with_group("g", |g| (g.state, g.generation, g.members.len())).unwrap()
}

/// Joins and completes the sync as leader: a Stable group of one.
async fn stable_single(c: &Arc<GroupCoordinator>, store: &Arc<Recorder>) -> JoinResult {
    let j = c.join(&**store, join_req("")).await;
    assert_eq!(j.error_code, ErrorCode::None.code());
    assert_eq!(j.leader, j.member_id);
    let s = c.sync(&**store, "g", j.generation_id, &j.member_id, None, vec![(j.member_id.clone(), "a".into())]);
    assert_eq!(s.await.assignment, Bytes::from_static(b"a"));
    j
}

#[tokio::test(start_paused = true)]
async fn a_silent_member_expires_after_its_session_timeout() {
    let (c, store) = (coordinator(0), Arc::new(Recorder::default()));
    let j = stable_single(&c, &store).await;
    assert_eq!(state(&c), (GroupState::Stable, 1, 1));
    tokio::time::advance(Duration::from_millis(9000)).await;
    assert_eq!(c.heartbeat("g", j.generation_id, &j.member_id, None), ErrorCode::None.code());
    // Heartbeats keep it: 9 s more since the last one is still inside 10 s.
    tokio::time::advance(Duration::from_millis(9000)).await;
    c.tick(&*store);
    assert_eq!(state(&c).2, 1);
    tokio::time::advance(Duration::from_millis(1001)).await;
    c.tick(&*store);
    assert_eq!(state(&c), (GroupState::Empty, 2, 0));
    assert_eq!(*store.left.lock().unwrap(), vec![j.member_id.clone()]);
    assert_eq!(c.heartbeat("g", j.generation_id, &j.member_id, None), ErrorCode::UnknownMemberId.code());
}

#[tokio::test(start_paused = true)]
async fn a_new_member_starts_a_rebalance_that_drops_whoever_does_not_rejoin() {
    let (c, store) = (coordinator(0), Arc::new(Recorder::default()));
    let first = stable_single(&c, &store).await;
    let (c2, s2) = (c.clone(), store.clone());
    let second = tokio::spawn(async move { c2.join(&*s2, join_req("")).await });
    tokio::task::yield_now().await;
    assert_eq!(state(&c).0, GroupState::PreparingRebalance);
    assert_eq!(c.heartbeat("g", first.generation_id, &first.member_id, None), ErrorCode::RebalanceInProgress.code());
    // The first member keeps heartbeating but never rejoins: the join phase ends at the
    // rebalance timeout (30 s), not at its session timeout.
    for _ in 0..29 {
        tokio::time::advance(Duration::from_millis(1000)).await;
        assert_eq!(
            c.heartbeat("g", first.generation_id, &first.member_id, None),
            ErrorCode::RebalanceInProgress.code()
        );
        c.tick(&*store);
    }
    assert_eq!(state(&c), (GroupState::PreparingRebalance, 1, 2));
    tokio::time::advance(Duration::from_millis(1001)).await;
    c.tick(&*store);
    let j = second.await.unwrap();
    assert_eq!((j.error_code, j.generation_id), (ErrorCode::None.code(), 2));
    assert_eq!(j.leader, j.member_id, "the only member left leads");
    assert_eq!(state(&c), (GroupState::CompletingRebalance, 2, 1));
    assert_eq!(*store.left.lock().unwrap(), vec![first.member_id.clone()]);
    assert_eq!(c.heartbeat("g", 1, &j.member_id, None), ErrorCode::IllegalGeneration.code());
}

/// A JoinGroup v4+ from a new member: MEMBER_ID_REQUIRED and the id it must come back with.
fn ask_for_member_id(c: &GroupCoordinator, store: &Recorder, session_timeout_ms: i32) -> String {
    let mut req = join_req("");
    req.require_known_member_id = true;
    req.session_timeout_ms = session_timeout_ms;
    let r = c
        .step_and_perform(store, |groups, fx| c.join_locked(groups, fx, req))
        .expect("MEMBER_ID_REQUIRED is answered at once");
    assert_eq!(r.error_code, ErrorCode::MemberIdRequired.code());
    r.member_id
}

#[tokio::test(start_paused = true)]
async fn a_pending_member_that_never_returns_holds_a_join_only_for_its_session_timeout() {
    let (c, store) = (coordinator(0), Arc::new(Recorder::default()));
    let first = stable_single(&c, &store).await;
    // The client drops the id it was given (librdkafka does when its subscription changes
    // mid-join) and never comes back with it.
    let dropped = ask_for_member_id(&c, &store, 10_000);
    let (c2, s2, id) = (c.clone(), store.clone(), first.member_id.clone());
    let rejoin = tokio::spawn(async move { c2.join(&*s2, join_req(&id)).await });
    tokio::task::yield_now().await;
    assert_eq!(state(&c).0, GroupState::PreparingRebalance);
    // The member's rebalance timeout is 30 s; the pending id lapses after its 10 s session.
    tokio::time::advance(Duration::from_millis(9900)).await;
    c.tick(&*store);
    assert_eq!(state(&c), (GroupState::PreparingRebalance, 1, 1), "waits for the pending member");
    tokio::time::advance(Duration::from_millis(200)).await;
    c.tick(&*store);
    assert_eq!(state(&c), (GroupState::CompletingRebalance, 2, 1));
    let j = rejoin.await.unwrap();
    assert_eq!((j.error_code, j.generation_id), (ErrorCode::None.code(), 2));
    // Too late: the id is forgotten.
    assert_eq!(c.join(&*store, join_req(&dropped)).await.error_code, ErrorCode::UnknownMemberId.code());
}

#[tokio::test(start_paused = true)]
async fn a_pending_member_survives_a_completed_join_and_leaving_releases_the_next() {
    let (c, store) = (coordinator(0), Arc::new(Recorder::default()));
    let first = stable_single(&c, &store).await;
    let pending = ask_for_member_id(&c, &store, 60_000);
    // The rebalance timeout (30 s) ends a join phase the pending member holds up.
    let (c2, s2, id) = (c.clone(), store.clone(), first.member_id.clone());
    let rejoin = tokio::spawn(async move { c2.join(&*s2, join_req(&id)).await });
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(30_001)).await;
    c.tick(&*store);
    let j = rejoin.await.unwrap();
    assert_eq!((j.error_code, j.generation_id), (ErrorCode::None.code(), 2));
    // Its id is still good, as in Kafka: a second member joins and leaves again.
    let (c2, s2, id) = (c.clone(), store.clone(), pending.clone());
    let second = tokio::spawn(async move { c2.join(&*s2, join_req(&id)).await });
    tokio::task::yield_now().await;
    assert_eq!(state(&c), (GroupState::PreparingRebalance, 2, 2));
    assert_eq!(c.leave(&*store, "g", &[(pending.clone(), None)]), Ok(vec![ErrorCode::None.code()]));
    assert_eq!(second.await.unwrap().error_code, ErrorCode::UnknownMemberId.code());
    // A fresh pending id, then the leader rejoins: the phase waits for the pending id
    // until it leaves, not until its session lapses.
    let another = ask_for_member_id(&c, &store, 60_000);
    let (c2, s2, id) = (c.clone(), store.clone(), first.member_id.clone());
    let rejoin = tokio::spawn(async move { c2.join(&*s2, join_req(&id)).await });
    tokio::task::yield_now().await;
    c.tick(&*store);
    assert_eq!(state(&c).0, GroupState::PreparingRebalance);
    assert_eq!(c.leave(&*store, "g", &[(another, None)]), Ok(vec![ErrorCode::None.code()]));
    let j = rejoin.await.unwrap();
    assert_eq!((j.error_code, j.generation_id), (ErrorCode::None.code(), 3));
}

#[tokio::test(start_paused = true)]
async fn the_initial_delay_gathers_members_before_the_first_generation() {
    let (c, store) = (coordinator(3000), Arc::new(Recorder::default()));
    let (c1, s1) = (c.clone(), store.clone());
    let a = tokio::spawn(async move { c1.join(&*s1, join_req("")).await });
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(2000)).await;
    let (c2, s2) = (c.clone(), store.clone());
    let b = tokio::spawn(async move { c2.join(&*s2, join_req("")).await });
    tokio::task::yield_now().await;
    // The second join pushed the deadline to 3 s after it: nothing completes at 3 s.
    tokio::time::advance(Duration::from_millis(1500)).await;
    c.tick(&*store);
    assert_eq!(state(&c), (GroupState::PreparingRebalance, 0, 2));
    tokio::time::advance(Duration::from_millis(1501)).await;
    c.tick(&*store);
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!((a.generation_id, b.generation_id), (1, 1));
    assert_eq!(a.leader, b.leader);
    let leader = if a.leader == a.member_id { &a } else { &b };
    assert_eq!(leader.members.len(), 2, "the leader sees every member's metadata");
    assert_eq!(state(&c), (GroupState::CompletingRebalance, 1, 2));
}

#[tokio::test(start_paused = true)]
async fn the_last_leave_empties_the_group_and_records_it() {
    let (c, store) = (coordinator(0), Arc::new(Recorder::default()));
    let j = stable_single(&c, &store).await;
    assert_eq!(c.leave(&*store, "g", &[("nobody".into(), None)]), Ok(vec![ErrorCode::UnknownMemberId.code()]));
    assert_eq!(c.leave(&*store, "g", &[(j.member_id.clone(), None)]), Ok(vec![ErrorCode::None.code()]));
    assert_eq!(state(&c), (GroupState::Empty, 2, 0));
    assert_eq!(store.groups_stored.lock().unwrap().last(), Some(&(GroupState::Empty, 2)));
}

#[tokio::test(start_paused = true)]
async fn a_group_without_offsets_is_deleted_without_writing_offset_tombstones() {
    let (c, store) = (coordinator(0), Arc::new(Recorder::default()));
    let j = stable_single(&c, &store).await;
    assert_eq!(c.delete_group(&*store, "g"), ErrorCode::NonEmptyGroup.code());
    assert_eq!(c.leave(&*store, "g", &[(j.member_id.clone(), None)]), Ok(vec![ErrorCode::None.code()]));
    assert_eq!(c.delete_group(&*store, "g"), ErrorCode::None.code());
    assert_eq!(store.groups_stored.lock().unwrap().last().map(|s| s.0), Some(GroupState::Dead));
    assert_eq!(c.delete_group(&*store, "g"), ErrorCode::GroupIdNotFound.code());
}

/// A store whose offset writes wait until released, as a stalled disk would.
struct StuckDisk {
    inner: Recorder,
    entered: std::sync::mpsc::Sender<()>,
    release: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl GroupStore for StuckDisk {
    fn store_offsets(&self, g: &str, offsets: &[((String, i32), Option<CommittedOffset>)]) -> Result<(), i16> {
        self.entered.send(()).unwrap();
        self.release.lock().unwrap().recv().unwrap();
        self.inner.store_offsets(g, offsets)
    }
    fn store_group(&self, group: &GroupRecord) -> Result<(), i16> {
        self.inner.store_group(group)
    }
    fn topic_partition_exists(&self, t: &str, p: i32) -> bool {
        self.inner.topic_partition_exists(t, p)
    }
    fn member_joined(&self, _: &str, _: &MemberRegistration) {}
    fn member_left(&self, _: &str, _: &str) {}
    fn owners_changed(&self, _: &str, _: &[(String, i32, String)]) {}
}

#[tokio::test]
async fn a_commit_waiting_on_the_disk_holds_up_no_other_group() {
    let c = coordinator(0);
    let store = Arc::new(Recorder::default());
    let j = stable_single(&c, &store).await;
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    let stuck =
        Arc::new(StuckDisk { inner: Recorder::default(), entered: entered_tx, release: Mutex::new(release_rx) });
    let committer = {
        let (c, stuck) = (c.clone(), stuck.clone());
        std::thread::spawn(move || c.commit_offsets(&*stuck, "other", -1, "", vec![(("t".into(), 0), 9, -1, None)]))
    };
    entered.recv().unwrap();
    // While that write hangs, the first group's heartbeat is answered.
    let (answered_tx, answered) = std::sync::mpsc::channel();
    let heartbeat = {
        let (c, member) = (c.clone(), j.member_id.clone());
        std::thread::spawn(move || answered_tx.send(c.heartbeat("g", j.generation_id, &member, None)))
    };
    let code = answered.recv_timeout(Duration::from_secs(10));
    release.send(()).unwrap();
    heartbeat.join().unwrap().unwrap_or_default();
    assert_eq!(code, Ok(ErrorCode::None.code()), "a heartbeat waited for another group's offset write");
    assert_eq!(committer.join().unwrap(), vec![(("t".to_string(), 0), ErrorCode::None.code())]);
    assert_eq!(c.with_group("other", |g| g.offsets.get(&("t".to_string(), 0)).map(|o| o.offset)), Some(Some(9)));
}

#[tokio::test(start_paused = true)]
async fn deleted_partitions_lose_their_offsets_in_every_group() {
    let (c, store) = (coordinator(0), Arc::new(Recorder::default()));
    let j = stable_single(&c, &store).await;
    let commits = vec![(("t".into(), 0), 5, -1, None), (("t".into(), 1), 6, -1, None), (("u".into(), 0), 7, -1, None)];
    let r = c.commit_offsets(&*store, "g", j.generation_id, &j.member_id, commits);
    assert!(r.iter().all(|(_, code)| *code == ErrorCode::None.code()));
    assert_eq!(
        c.commit_offsets(&*store, "simple", -1, "", vec![(("t".into(), 0), 9, -1, None)])[0].1,
        ErrorCode::None.code()
    );
    let deleted = [("t".to_string(), 0), ("t".to_string(), 1)];
    assert_eq!(c.on_partitions_deleted(&*store, &deleted), 3);
    let left: Vec<TopicPartition> = c.fetch_offsets("g", None).into_iter().map(|(tp, _)| tp).collect();
    assert_eq!(left, vec![("u".to_string(), 0)]);
    assert_eq!(c.fetch_offsets("g", Some(deleted.to_vec())).into_iter().filter_map(|(_, o)| o).count(), 0);
    assert_eq!(state(&c), (GroupState::Stable, 1, 1), "a group with members stays, whatever its offsets");
    // A memberless group left without offsets is gone, with a tombstone for it.
    assert!(c.with_group("simple", |_| ()).is_none());
    assert_eq!(store.groups_stored.lock().unwrap().last(), Some(&(GroupState::Dead, 0)));
    let mut tombstones = store.tombstones.lock().unwrap().clone();
    tombstones.sort();
    let expected: Vec<(String, TopicPartition)> =
        vec![("g".into(), ("t".into(), 0)), ("g".into(), ("t".into(), 1)), ("simple".into(), ("t".into(), 0))];
    assert_eq!(tombstones, expected);
    assert_eq!(c.on_partitions_deleted(&*store, &deleted), 0, "nothing more to remove");
}

#[tokio::test(start_paused = true)]
async fn offsets_of_an_empty_group_expire_from_when_it_became_empty() {
    let c = coordinator(0);
    let store = Arc::new(Recorder::default());
    let j = stable_single(&c, &store).await;
    let r = c.commit_offsets(&*store, "g", j.generation_id, &j.member_id, vec![(("t".into(), 0), 5, -1, None)]);
    assert_eq!(r[0].1, ErrorCode::None.code());
    // A stable group's offsets never expire.
    assert_eq!(c.expire_offsets(&*store, now_ms() + 1_000_000, 1000), 0);
    c.leave(&*store, "g", &[(j.member_id.clone(), None)]).unwrap();
    let empty_at = c.with_group("g", |g| g.empty_since_ms).flatten().unwrap();
    assert_eq!(c.expire_offsets(&*store, empty_at + 999, 1000), 0, "not yet");
    assert_eq!(c.expire_offsets(&*store, empty_at + 1000, 1000), 1);
    assert!(c.with_group("g", |_| ()).is_none(), "the group is gone with its last offset");
    // A simple (memberless) group's offsets expire from their commit.
    let r = c.commit_offsets(&*store, "simple", -1, "", vec![(("t".into(), 0), 7, -1, None)]);
    assert_eq!(r[0].1, ErrorCode::None.code());
    let ts = c.with_group("simple", |g| g.offsets[&("t".to_string(), 0)].commit_timestamp).unwrap();
    assert_eq!(c.expire_offsets(&*store, ts + 999, 1000), 0);
    assert_eq!(c.expire_offsets(&*store, ts + 1000, 1000), 1);
}

#[tokio::test(start_paused = true)]
async fn a_reloaded_group_counts_offsets_expiry_from_when_it_became_empty() {
    let c = coordinator(0);
    let store = Arc::new(Recorder::default());
    let header = |members, ts| GroupHeader {
        protocol_type: "consumer".into(),
        generation: 3,
        current_state_timestamp: ts,
        members,
    };
    let commit = CommittedOffset { offset: 5, leader_epoch: -1, metadata: String::new(), commit_timestamp: 1_000 };
    // Stored Empty at 50_000, long after its commit: expiry counts from 50_000.
    c.load_offset("g", ("t".into(), 0), Some(commit.clone()));
    assert!(!c.load_group("g", Some(header(0, Some(50_000))), 90_000));
    assert_eq!(c.expire_offsets(&*store, 50_000 + 999, 1000), 0, "the commit's age does not count");
    assert_eq!(c.expire_offsets(&*store, 50_000 + 1000, 1000), 1);
    // Stored with members: Empty from the load on, and stored so.
    c.load_offset("h", ("t".into(), 0), Some(commit.clone()));
    assert!(c.load_group("h", Some(header(2, Some(40_000))), 90_000));
    c.store_loaded_as_empty(&*store, &["h".to_string()]);
    assert_eq!(store.groups_stored.lock().unwrap().last(), Some(&(GroupState::Empty, 4)));
    assert_eq!(c.with_group("h", |g| g.current_state_timestamp()).flatten(), Some(90_000));
    assert_eq!(c.expire_offsets(&*store, 90_999, 1000), 0);
    assert_eq!(c.expire_offsets(&*store, 91_000, 1000), 1);
    // Unloading forgets exactly the selected groups.
    c.load_offset("a1", ("t".into(), 0), Some(commit.clone()));
    c.load_offset("b1", ("t".into(), 0), Some(commit));
    assert_eq!(c.unload_groups(&*store, |g| g.starts_with('a')), 1);
    assert!(c.with_group("a1", |_| ()).is_none());
    assert!(c.with_group("b1", |_| ()).is_some());
}

#[tokio::test(start_paused = true)]
async fn unloading_sends_waiting_members_to_the_new_coordinator() {
    let c = coordinator(3000);
    let store = Arc::new(Recorder::default());
    let c2 = c.clone();
    let s2 = store.clone();
    // The initial delay keeps the join parked.
    let pending = tokio::spawn(async move { c2.join(&*s2, join_req("")).await });
    tokio::task::yield_now().await;
    while c.with_group("g", |g| g.members.len()).unwrap_or(0) == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(c.unload_groups(&*store, |_| true), 1);
    assert_eq!(pending.await.unwrap().error_code, ErrorCode::NotCoordinator.code());
    assert_eq!(store.left.lock().unwrap().len(), 1);
}

/// A store that checks, at each effect it performs, that the coordinator's lock is free.
struct LockWatcher {
    coordinator: Arc<GroupCoordinator>,
    performed: Mutex<Vec<&'static str>>,
}

impl LockWatcher {
    fn saw(&self, what: &'static str) {
        assert!(self.coordinator.groups.try_lock().is_ok(), "{what} performed holding the groups lock");
        self.performed.lock().unwrap().push(what);
    }
}

impl GroupStore for LockWatcher {
    fn store_offsets(&self, _: &str, _: &[((String, i32), Option<CommittedOffset>)]) -> Result<(), i16> {
        self.saw("offsets");
        Ok(())
    }
    fn store_group(&self, _: &GroupRecord) -> Result<(), i16> {
        self.saw("group");
        Ok(())
    }
    fn topic_partition_exists(&self, _: &str, _: i32) -> bool {
        true
    }
    fn member_joined(&self, _: &str, _: &MemberRegistration) {
        self.saw("joined");
    }
    fn member_left(&self, _: &str, _: &str) {
        self.saw("left");
    }
    fn owners_changed(&self, _: &str, _: &[(String, i32, String)]) {
        self.saw("owners");
    }
}

#[tokio::test(start_paused = true)]
async fn no_effect_is_performed_while_the_lock_is_held() {
    let c = coordinator(0);
    let store = LockWatcher { coordinator: c.clone(), performed: Mutex::new(vec![]) };
    let j = c.join(&store, join_req("")).await;
    let s = c.sync(&store, "g", j.generation_id, &j.member_id, None, vec![(j.member_id.clone(), "a".into())]).await;
    assert_eq!(s.error_code, ErrorCode::None.code());
    let r = c.commit_offsets(&store, "g", j.generation_id, &j.member_id, vec![(("t".into(), 0), 1, -1, None)]);
    assert_eq!(r[0].1, ErrorCode::None.code());
    tokio::time::advance(Duration::from_millis(10_001)).await;
    c.tick(&store);
    assert_eq!(c.delete_group(&store, "g"), ErrorCode::None.code());
    // In the order the state changed: joined, Stable's record with its owners, the commit, the
    // expiry's leave and Empty record and owners, the deletion's tombstones.
    let performed = store.performed.lock().unwrap().clone();
    assert_eq!(performed, vec!["joined", "group", "owners", "offsets", "left", "group", "owners", "offsets", "group"]);
}

#[tokio::test(start_paused = true)]
async fn a_groups_effects_are_performed_in_the_order_its_steps_took() {
    // Two steps queue before anyone performs: whoever performs first performs both, in order.
    let c = coordinator(0);
    let store = Arc::new(Recorder::default());
    let ((), first) = c.step(|groups, fx| {
        let mut g = Group::new("g");
        g.generation = 7;
        fx.store_group(&g);
        groups.insert("g".into(), g);
    });
    let ((), second) = c.step(|groups, fx| {
        let g = groups.get_mut("g").unwrap();
        g.generation = 8;
        fx.store_group(g);
    });
    assert_eq!(first, second, "one group, one stripe");
    c.perform(&*store, &second);
    assert_eq!(*store.groups_stored.lock().unwrap(), vec![(GroupState::Empty, 7), (GroupState::Empty, 8)]);
    c.perform(&*store, &first);
    assert_eq!(store.groups_stored.lock().unwrap().len(), 2, "performed once");
}
