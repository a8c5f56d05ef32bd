//! Group state machine (Empty, PreparingRebalance, CompletingRebalance, Stable, Dead) and the
//! rules of JoinGroup, SyncGroup, Heartbeat, LeaveGroup and OffsetCommit, as Kafka 3.x runs
//! the classic protocol.
//!
//! All state sits behind one mutex that is never held across an await: a JoinGroup or
//! SyncGroup that must wait parks a oneshot sender in its member and the caller awaits the
//! receiver after the lock is released. Timeouts (session, rebalance, initial delay) are
//! checked by [`GroupCoordinator::tick`], driven by a timer task.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;

use super::offsets_log::GroupHeader;
use tokio::sync::oneshot;
// Tokio's clock, so tests can run the session and rebalance timeouts under paused time.
use tokio::time::Instant;

use crate::protocol::ErrorCode;
use crate::sync::MutexExt;

pub type TopicPartition = (String, i32);
/// (partition, offset, leader epoch, metadata) as OffsetCommit carries it.
pub type OffsetToCommit = (TopicPartition, i64, i32, Option<String>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl GroupState {
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct JoinResult {
    pub error_code: i16,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// (member id, group instance id, metadata): only for the leader.
    pub members: Vec<(String, Option<String>, Bytes)>,
}

#[derive(Debug, Clone, Default)]
pub struct SyncResult {
    pub error_code: i16,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

pub struct JoinRequest {
    pub group_id: String,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: an unknown member first gets an id and MEMBER_ID_REQUIRED.
    pub require_known_member_id: bool,
}

pub struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    last_heartbeat: Instant,
    join_waiter: Option<oneshot::Sender<JoinResult>>,
    sync_waiter: Option<oneshot::Sender<SyncResult>>,
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols.iter().find(|(n, _)| n == protocol).map(|(_, m)| m.clone()).unwrap_or_default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
}

pub struct Group {
    pub id: String,
    pub state: GroupState,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub generation: i32,
    pub leader: Option<String>,
    pub members: BTreeMap<String, Member>,
    /// Ids handed out with MEMBER_ID_REQUIRED whose holders have not joined yet, each with
    /// when it lapses: the session timeout of the JoinGroup that asked, as Kafka's pending
    /// member heartbeat. A join phase waits for them, so one a client dropped (librdkafka
    /// does when its subscription changes mid-join) must not outlive its session.
    pending: HashMap<String, Instant>,
    pub offsets: BTreeMap<(String, i32), CommittedOffset>,
    /// When the current join phase ends even if not every member has rejoined.
    join_deadline: Option<Instant>,
    /// The latest the initial delay may be extended to (group.initial.rebalance.delay.ms).
    initial_delay_cap: Option<Instant>,
    /// Wall-clock ms when the group last became Empty (None: not seen here, e.g. loaded from
    /// the log); offsets.retention.minutes counts from it (KIP-211).
    empty_since_ms: Option<i64>,
}

impl Group {
    /// Kafka's `current_state_timestamp` as far as gregor keeps it: when an Empty group became
    /// Empty (None otherwise, or when unknown).
    pub fn current_state_timestamp(&self) -> Option<i64> {
        self.empty_since_ms.filter(|_| self.state == GroupState::Empty)
    }

    fn new(id: &str) -> Group {
        Group {
            id: id.to_string(),
            state: GroupState::Empty,
            protocol_type: None,
            protocol_name: None,
            generation: 0,
            leader: None,
            members: BTreeMap::new(),
            pending: HashMap::new(),
            offsets: BTreeMap::new(),
            join_deadline: None,
            initial_delay_cap: None,
            empty_since_ms: None,
        }
    }

    /// The protocols every member supports, chosen by votes on each member's preference.
    fn select_protocol(&self) -> Option<String> {
        let first = self.members.values().next()?;
        let candidates: Vec<&String> = first
            .protocols
            .iter()
            .map(|(n, _)| n)
            .filter(|n| self.members.values().all(|m| m.protocols.iter().any(|(p, _)| p == *n)))
            .collect();
        let mut votes: Vec<(usize, &String)> = candidates.iter().map(|c| (0, *c)).collect();
        for m in self.members.values() {
            if let Some((name, _)) = m.protocols.iter().find(|(p, _)| candidates.contains(&p)) {
                if let Some(v) = votes.iter_mut().find(|(_, c)| *c == name) {
                    v.0 += 1;
                }
            }
        }
        // Most votes wins; ties go to the earlier candidate in the first member's order.
        let best = votes.iter().map(|(n, _)| *n).max()?;
        votes.iter().find(|(n, _)| *n == best).map(|(_, c)| (*c).clone())
    }

    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols.iter().any(|(p, _)| self.members.values().all(|m| m.protocols.iter().any(|(q, _)| q == p)))
    }

    fn max_rebalance_timeout(&self) -> Duration {
        self.members.values().map(|m| m.rebalance_timeout).max().unwrap_or(Duration::from_secs(300))
    }

    fn all_joined(&self) -> bool {
        self.pending.is_empty() && self.members.values().all(|m| m.join_waiter.is_some())
    }

    fn member_by_instance(&self, instance: &str) -> Option<&Member> {
        self.members.values().find(|m| m.instance_id.as_deref() == Some(instance))
    }
}

/// What the coordinator needs from the rest of the broker.
pub trait GroupStore: Sync {
    /// Persists offset commits (and deletions, as None) for a group; Err is a Kafka error code.
    fn store_offsets(&self, group: &str, offsets: &[((String, i32), Option<CommittedOffset>)]) -> Result<(), i16>;
    /// Persists the group's metadata record after a generation completes (None: tombstone).
    fn store_group(&self, group: &Group) -> Result<(), i16>;
    fn topic_partition_exists(&self, topic: &str, partition: i32) -> bool;
    /// Mirrors membership into `/consumers/<group>/...`.
    fn member_joined(&self, group: &str, member: &Member);
    fn member_left(&self, group: &str, member_id: &str);
    fn owners_changed(&self, group: &str, owners: &[(String, i32, String)]);
}

pub use crate::config::CoordinatorConfig;

pub struct GroupCoordinator {
    config: CoordinatorConfig,
    groups: Mutex<HashMap<String, Group>>,
    /// Orders the offset writes of each group (striped by group id): a commit validates under
    /// `groups`, appends to `__consumer_offsets` holding only its stripe, and applies under
    /// `groups` again, so the log's order is the order applied while the disk write keeps no
    /// other group's request waiting.
    offset_writes: Vec<Mutex<()>>,
    /// Offsets committed inside transactions (TxnOffsetCommit), by producer id and
    /// `__consumer_offsets` partition: in the log already, applied to their groups only when
    /// the transaction's COMMIT marker reaches that partition, dropped at ABORT.
    txn_offsets: Mutex<HashMap<(i64, i32), Vec<PendingTxnOffset>>>,
}

/// One offset a transaction committed to a group, waiting for the transaction's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingTxnOffset {
    pub group: String,
    pub tp: TopicPartition,
    pub offset: CommittedOffset,
}

const OFFSET_WRITE_STRIPES: usize = 64;

fn now_ms() -> i64 {
    crate::log::now_ms()
}

impl GroupCoordinator {
    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    pub fn new(config: CoordinatorConfig) -> GroupCoordinator {
        GroupCoordinator {
            config,
            groups: Mutex::new(HashMap::new()),
            offset_writes: (0..OFFSET_WRITE_STRIPES).map(|_| Mutex::new(())).collect(),
            txn_offsets: Mutex::new(HashMap::new()),
        }
    }

    fn offset_write_order(&self, group: &str) -> std::sync::MutexGuard<'_, ()> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        group.hash(&mut h);
        let stripe = &self.offset_writes[(h.finish() as usize) % OFFSET_WRITE_STRIPES];
        stripe.lock_unpoisoned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Group>> {
        // Every mutation below leaves the group in a valid state before any call that could
        // panic, so a poisoned lock still guards consistent data.
        self.groups.lock_unpoisoned()
    }

    /// Holds offsets a transaction committed (they are in `__consumer_offsets` already) until
    /// its marker settles them.
    pub fn add_txn_offsets(&self, producer_id: i64, partition: i32, offsets: Vec<PendingTxnOffset>) {
        let mut pending = self.txn_offsets.lock_unpoisoned();
        pending.entry((producer_id, partition)).or_default().extend(offsets);
    }

    /// A transaction's marker reached `__consumer_offsets` partition `partition`: its offsets
    /// there become the groups' committed offsets (COMMIT) or are forgotten (ABORT).
    pub fn complete_txn_offsets(&self, producer_id: i64, partition: i32, commit: bool) {
        let done = self.txn_offsets.lock_unpoisoned().remove(&(producer_id, partition));
        let Some(done) = done.filter(|_| commit) else { return };
        let mut groups = self.lock();
        for p in done {
            let g = groups.entry(p.group.clone()).or_insert_with(|| Group::new(&p.group));
            g.offsets.insert(p.tp, p.offset);
        }
    }

    /// Whether a transaction has offsets of `group` waiting (OffsetFetch's require_stable).
    pub fn has_pending_txn_offsets(&self, group: &str) -> bool {
        let pending = self.txn_offsets.lock_unpoisoned();
        pending.values().any(|v| v.iter().any(|o| o.group == group))
    }

    /// The partitions of `group` an open transaction holds offsets for: OffsetFetch with
    /// require_stable (KIP-447) answers UNSTABLE_OFFSET_COMMIT for them until the marker lands.
    pub fn pending_txn_partitions(&self, group: &str) -> std::collections::HashSet<(String, i32)> {
        let pending = self.txn_offsets.lock_unpoisoned();
        pending.values().flatten().filter(|o| o.group == group).map(|o| o.tp.clone()).collect()
    }

    /// Restores committed offsets (and generation) read back from `__consumer_offsets`.
    pub fn load_offset(&self, group: &str, tp: (String, i32), value: Option<CommittedOffset>) {
        let mut groups = self.lock();
        let g = groups.entry(group.to_string()).or_insert_with(|| Group::new(group));
        match value {
            Some(v) => {
                g.offsets.insert(tp, v);
            }
            None => {
                g.offsets.remove(&tp);
            }
        }
    }

    /// Restores a group metadata record read back from `__consumer_offsets` (None: tombstone).
    /// Members are not restored: a group stored with members is Empty from `now` on, as it
    /// becomes in Kafka once their sessions lapse; one stored Empty keeps the time it became
    /// so, which offsets expiry counts from. Returns whether the group must be stored again
    /// (it was stored with members, so the log should say it is Empty now).
    pub fn load_group(&self, group: &str, header: Option<GroupHeader>, now: i64) -> bool {
        let mut groups = self.lock();
        match header {
            Some(h) => {
                let g = groups.entry(group.to_string()).or_insert_with(|| Group::new(group));
                g.protocol_type = Some(h.protocol_type).filter(|p| !p.is_empty());
                g.generation = h.generation;
                g.state = GroupState::Empty;
                g.protocol_name = None;
                g.leader = None;
                if h.members > 0 {
                    g.empty_since_ms = Some(now);
                    true
                } else {
                    g.empty_since_ms = h.current_state_timestamp;
                    false
                }
            }
            None => {
                if groups.get(group).is_some_and(|g| g.offsets.is_empty()) {
                    groups.remove(group);
                }
                false
            }
        }
    }

    /// Writes the Empty state of groups that were stored with members (see [`Self::load_group`]),
    /// with a new generation as Kafka's rebalance to Empty has. The log writes happen without
    /// the coordinator lock.
    pub fn store_loaded_as_empty(&self, store: &dyn GroupStore, ids: &[String]) {
        for id in ids {
            let snapshot = {
                let mut groups = self.lock();
                let Some(g) = groups.get_mut(id) else { continue };
                if g.state != GroupState::Empty || !g.members.is_empty() {
                    continue;
                }
                g.generation += 1;
                // Memberless, so this copy is all the record holds.
                let mut copy = Group::new(id);
                copy.protocol_type = g.protocol_type.clone();
                copy.generation = g.generation;
                copy.empty_since_ms = g.empty_since_ms;
                copy
            };
            if let Err(code) = store.store_group(&snapshot) {
                tracing::warn!(group = %id, error_code = code, "could not store a reloaded group as Empty");
            }
        }
    }

    /// Forgets the groups `owned(group id)` selects, as Kafka does when this broker stops
    /// coordinating their `__consumer_offsets` partition (and before reloading one): what the
    /// log holds is the truth, and a tombstone this broker never saw (compacted away while
    /// another broker coordinated) must not leave a stale offset here. Members waiting on a
    /// join or sync are told NOT_COORDINATOR, which sends them to the new coordinator.
    pub fn unload_groups(&self, store: &dyn GroupStore, owned: impl Fn(&str) -> bool) -> usize {
        let removed: Vec<Group> = {
            let mut groups = self.lock();
            let ids: Vec<String> = groups.keys().filter(|id| owned(id)).cloned().collect();
            ids.iter().filter_map(|id| groups.remove(id)).collect()
        };
        let count = removed.len();
        for mut g in removed {
            for m in g.members.values_mut() {
                if let Some(w) = m.join_waiter.take() {
                    let _ = w.send(JoinResult { error_code: ErrorCode::NotCoordinator.code(), ..Default::default() });
                }
                if let Some(w) = m.sync_waiter.take() {
                    let _ = w.send(SyncResult { error_code: ErrorCode::NotCoordinator.code(), ..Default::default() });
                }
                store.member_left(&g.id, &m.id);
            }
        }
        count
    }

    pub async fn join(&self, store: &dyn GroupStore, req: JoinRequest) -> JoinResult {
        let rx = match self.join_locked(store, req) {
            Ok(result) => return result,
            Err(rx) => rx,
        };
        rx.await.unwrap_or_else(|_| JoinResult { error_code: ErrorCode::UnknownMemberId.code(), ..Default::default() })
    }

    fn join_locked(
        &self,
        store: &dyn GroupStore,
        req: JoinRequest,
    ) -> Result<JoinResult, oneshot::Receiver<JoinResult>> {
        let fail = |code: i16, member_id: &str| JoinResult {
            error_code: code,
            member_id: member_id.to_string(),
            generation_id: -1,
            ..Default::default()
        };
        if req.group_id.is_empty() {
            return Ok(fail(ErrorCode::InvalidGroupId.code(), &req.member_id));
        }
        if req.session_timeout_ms < self.config.min_session_timeout_ms
            || req.session_timeout_ms > self.config.max_session_timeout_ms
        {
            return Ok(fail(ErrorCode::InvalidSessionTimeout.code(), &req.member_id));
        }
        let mut groups = self.lock();
        if !req.member_id.is_empty() && !groups.contains_key(&req.group_id) {
            return Ok(fail(ErrorCode::UnknownMemberId.code(), &req.member_id));
        }
        let group = groups.entry(req.group_id.clone()).or_insert_with(|| Group::new(&req.group_id));
        if group.state == GroupState::Dead {
            return Ok(fail(ErrorCode::CoordinatorNotAvailable.code(), &req.member_id));
        }
        if !group.supports(&req.protocol_type, &req.protocols) {
            return Ok(fail(ErrorCode::InconsistentGroupProtocol.code(), &req.member_id));
        }
        let now = Instant::now();

        if req.member_id.is_empty() {
            if let Some(instance) = req.instance_id.clone() {
                // Static member (KIP-345): a known instance id takes over its old member id.
                let new_id = format!("{instance}-{}", uuid::Uuid::new_v4());
                if let Some(old) = group.member_by_instance(&instance).map(|m| m.id.clone()) {
                    return self.replace_static_member(store, group, &old, new_id, req);
                }
                return self.add_member_and_rebalance(store, group, new_id, req, now);
            }
            let new_id = format!("{}-{}", req.client_id, uuid::Uuid::new_v4());
            if req.require_known_member_id {
                let session = Duration::from_millis(req.session_timeout_ms.max(0) as u64);
                group.pending.insert(new_id.clone(), now + session);
                return Ok(JoinResult {
                    error_code: ErrorCode::MemberIdRequired.code(),
                    member_id: new_id,
                    generation_id: -1,
                    ..Default::default()
                });
            }
            return self.add_member_and_rebalance(store, group, new_id, req, now);
        }

        if group.pending.remove(&req.member_id).is_some() {
            let id = req.member_id.clone();
            return self.add_member_and_rebalance(store, group, id, req, now);
        }
        let Some(member) = group.members.get_mut(&req.member_id) else {
            return Ok(fail(ErrorCode::UnknownMemberId.code(), &req.member_id));
        };
        if let (Some(mine), Some(theirs)) = (&member.instance_id, &req.instance_id) {
            if mine != theirs {
                return Ok(fail(ErrorCode::FencedInstanceId.code(), &req.member_id));
            }
        }
        member.last_heartbeat = now;
        let changed = member.protocols != req.protocols;
        member.protocols = req.protocols.clone();
        member.session_timeout = Duration::from_millis(req.session_timeout_ms as u64);
        member.rebalance_timeout = Duration::from_millis(req.rebalance_timeout_ms.max(0) as u64);
        let is_leader = group.leader.as_deref() == Some(req.member_id.as_str());
        match group.state {
            GroupState::PreparingRebalance => {}
            GroupState::CompletingRebalance | GroupState::Stable if !changed && !is_leader => {
                // Nothing changed for a follower: answer with the current generation at once.
                let protocol = group.protocol_name.clone();
                return Ok(JoinResult {
                    error_code: ErrorCode::None.code(),
                    generation_id: group.generation,
                    protocol_type: group.protocol_type.clone(),
                    protocol_name: protocol,
                    leader: group.leader.clone().unwrap_or_default(),
                    member_id: req.member_id,
                    members: vec![],
                });
            }
            _ => self.prepare_rebalance(group, now),
        }
        let (tx, rx) = oneshot::channel();
        if let Some(m) = group.members.get_mut(&req.member_id) {
            m.join_waiter = Some(tx);
        }
        self.maybe_complete_join(store, group, now);
        Err(rx)
    }

    fn add_member_and_rebalance(
        &self,
        store: &dyn GroupStore,
        group: &mut Group,
        id: String,
        req: JoinRequest,
        now: Instant,
    ) -> Result<JoinResult, oneshot::Receiver<JoinResult>> {
        let (tx, rx) = oneshot::channel();
        let member = Member {
            id: id.clone(),
            instance_id: req.instance_id,
            client_id: req.client_id,
            client_host: req.client_host,
            session_timeout: Duration::from_millis(req.session_timeout_ms as u64),
            rebalance_timeout: Duration::from_millis(req.rebalance_timeout_ms.max(0) as u64),
            protocol_type: req.protocol_type.clone(),
            protocols: req.protocols,
            assignment: Bytes::new(),
            last_heartbeat: now,
            join_waiter: Some(tx),
            sync_waiter: None,
        };
        if group.members.is_empty() {
            group.protocol_type = Some(req.protocol_type);
        }
        store.member_joined(&group.id, &member);
        group.members.insert(id, member);
        if group.state == GroupState::PreparingRebalance {
            // Each new member during the initial delay pushes it out again, up to its cap.
            if let (Some(cap), Some(_)) = (group.initial_delay_cap, group.join_deadline) {
                group.join_deadline = Some((now + self.config.initial_rebalance_delay).min(cap));
            }
        } else {
            self.prepare_rebalance(group, now);
        }
        self.maybe_complete_join(store, group, now);
        Err(rx)
    }

    fn replace_static_member(
        &self,
        store: &dyn GroupStore,
        group: &mut Group,
        old_id: &str,
        new_id: String,
        req: JoinRequest,
    ) -> Result<JoinResult, oneshot::Receiver<JoinResult>> {
        let Some(mut member) = group.members.remove(old_id) else {
            return Ok(JoinResult { error_code: ErrorCode::UnknownMemberId.code(), ..Default::default() });
        };
        store.member_left(&group.id, old_id);
        // The old instance's parked requests learn that it has been fenced.
        if let Some(w) = member.join_waiter.take() {
            let _ = w.send(JoinResult {
                error_code: ErrorCode::FencedInstanceId.code(),
                member_id: old_id.to_string(),
                ..Default::default()
            });
        }
        if let Some(w) = member.sync_waiter.take() {
            let _ = w.send(SyncResult { error_code: ErrorCode::FencedInstanceId.code(), ..Default::default() });
        }
        let unchanged = member.protocols == req.protocols;
        member.id = new_id.clone();
        member.protocols = req.protocols.clone();
        member.client_id = req.client_id.clone();
        member.client_host = req.client_host.clone();
        member.last_heartbeat = Instant::now();
        if group.leader.as_deref() == Some(old_id) {
            group.leader = Some(new_id.clone());
        }
        store.member_joined(&group.id, &member);
        group.members.insert(new_id.clone(), member);
        if group.state == GroupState::Stable && unchanged {
            // A static member restarting within its session keeps its assignment: no rebalance.
            store.owners_changed(&group.id, &owners_of(group));
            return Ok(JoinResult {
                error_code: ErrorCode::None.code(),
                generation_id: group.generation,
                protocol_type: group.protocol_type.clone(),
                protocol_name: group.protocol_name.clone(),
                leader: group.leader.clone().unwrap_or_default(),
                member_id: new_id,
                members: vec![],
            });
        }
        let now = Instant::now();
        let (tx, rx) = oneshot::channel();
        if let Some(m) = group.members.get_mut(&new_id) {
            m.join_waiter = Some(tx);
        }
        if group.state != GroupState::PreparingRebalance {
            self.prepare_rebalance(group, now);
        }
        self.maybe_complete_join(store, group, now);
        Err(rx)
    }

    fn prepare_rebalance(&self, group: &mut Group, now: Instant) {
        // Members waiting in SyncGroup must rejoin.
        for m in group.members.values_mut() {
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send(SyncResult { error_code: ErrorCode::RebalanceInProgress.code(), ..Default::default() });
            }
        }
        let was_empty = group.state == GroupState::Empty;
        group.state = GroupState::PreparingRebalance;
        let timeout = group.max_rebalance_timeout();
        if was_empty && !self.config.initial_rebalance_delay.is_zero() {
            group.initial_delay_cap = Some(now + timeout);
            group.join_deadline = Some((now + self.config.initial_rebalance_delay).min(now + timeout));
        } else {
            group.initial_delay_cap = None;
            group.join_deadline = Some(now + timeout);
        }
    }

    fn maybe_complete_join(&self, store: &dyn GroupStore, group: &mut Group, now: Instant) {
        if group.state != GroupState::PreparingRebalance {
            return;
        }
        let deadline_passed = group.join_deadline.is_some_and(|d| now >= d);
        let in_initial_delay = group.initial_delay_cap.is_some() && !deadline_passed;
        if !(deadline_passed || (group.all_joined() && !in_initial_delay)) {
            return;
        }
        // Members that did not rejoin in time are dropped, as Kafka does.
        let laggards: Vec<String> =
            group.members.values().filter(|m| m.join_waiter.is_none()).map(|m| m.id.clone()).collect();
        for id in laggards {
            group.members.remove(&id);
            store.member_left(&group.id, &id);
        }
        // Pending ids stay until their holders join or their sessions lapse, as in Kafka: the
        // holder may be about to join with it.
        group.join_deadline = None;
        group.initial_delay_cap = None;
        group.generation += 1;
        if group.members.is_empty() {
            group.state = GroupState::Empty;
            group.empty_since_ms = Some(now_ms());
            group.protocol_name = None;
            group.leader = None;
            let _ = store.store_group(group);
            return;
        }
        group.state = GroupState::CompletingRebalance;
        group.protocol_name = group.select_protocol();
        if !group.leader.as_ref().is_some_and(|l| group.members.contains_key(l)) {
            group.leader = group.members.keys().next().cloned();
        }
        let protocol = group.protocol_name.clone().unwrap_or_default();
        let leader = group.leader.clone().unwrap_or_default();
        let all: Vec<(String, Option<String>, Bytes)> =
            group.members.values().map(|m| (m.id.clone(), m.instance_id.clone(), m.metadata_for(&protocol))).collect();
        for m in group.members.values_mut() {
            m.assignment = Bytes::new();
            m.last_heartbeat = now;
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(JoinResult {
                    error_code: ErrorCode::None.code(),
                    generation_id: group.generation,
                    protocol_type: group.protocol_type.clone(),
                    protocol_name: group.protocol_name.clone(),
                    leader: leader.clone(),
                    member_id: m.id.clone(),
                    members: if m.id == leader { all.clone() } else { vec![] },
                });
            }
        }
    }

    pub async fn sync(
        &self,
        store: &dyn GroupStore,
        group_id: &str,
        generation: i32,
        member_id: &str,
        instance_id: Option<&str>,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncResult {
        let rx = {
            let mut groups = self.lock();
            let fail = |code| SyncResult { error_code: code, ..Default::default() };
            let Some(group) = groups.get_mut(group_id) else { return fail(ErrorCode::UnknownMemberId.code()) };
            let Some(member) = group.members.get_mut(member_id) else {
                return fail(if instance_id.is_some_and(|i| group.member_by_instance(i).is_some()) {
                    ErrorCode::FencedInstanceId.code()
                } else {
                    ErrorCode::UnknownMemberId.code()
                });
            };
            if instance_id.is_some() && member.instance_id.as_deref() != instance_id {
                return fail(ErrorCode::FencedInstanceId.code());
            }
            if generation != group.generation {
                return fail(ErrorCode::IllegalGeneration.code());
            }
            member.last_heartbeat = Instant::now();
            match group.state {
                GroupState::PreparingRebalance => return fail(ErrorCode::RebalanceInProgress.code()),
                GroupState::Stable => {
                    return SyncResult {
                        error_code: ErrorCode::None.code(),
                        protocol_type: group.protocol_type.clone(),
                        protocol_name: group.protocol_name.clone(),
                        assignment: member.assignment.clone(),
                    }
                }
                GroupState::Empty | GroupState::Dead => return fail(ErrorCode::UnknownMemberId.code()),
                GroupState::CompletingRebalance => {}
            }
            let (tx, rx) = oneshot::channel();
            member.sync_waiter = Some(tx);
            if group.leader.as_deref() == Some(member_id) {
                let given: HashMap<String, Bytes> = assignments.into_iter().collect();
                for m in group.members.values_mut() {
                    m.assignment = given.get(&m.id).cloned().unwrap_or_default();
                }
                group.state = GroupState::Stable;
                if let Err(code) = store.store_group(group) {
                    tracing::warn!(group = %group.id, code, "could not persist group metadata");
                }
                let owners = owners_of(group);
                store.owners_changed(&group.id, &owners);
                for m in group.members.values_mut() {
                    if let Some(w) = m.sync_waiter.take() {
                        let _ = w.send(SyncResult {
                            error_code: ErrorCode::None.code(),
                            protocol_type: group.protocol_type.clone(),
                            protocol_name: group.protocol_name.clone(),
                            assignment: m.assignment.clone(),
                        });
                    }
                }
            }
            rx
        };
        rx.await.unwrap_or(SyncResult { error_code: ErrorCode::RebalanceInProgress.code(), ..Default::default() })
    }

    pub fn heartbeat(&self, group_id: &str, generation: i32, member_id: &str, instance_id: Option<&str>) -> i16 {
        let mut groups = self.lock();
        let Some(group) = groups.get_mut(group_id) else { return ErrorCode::UnknownMemberId.code() };
        let Some(member) = group.members.get_mut(member_id) else {
            return if instance_id.is_some_and(|i| group.member_by_instance(i).is_some()) {
                ErrorCode::FencedInstanceId.code()
            } else {
                ErrorCode::UnknownMemberId.code()
            };
        };
        member.last_heartbeat = Instant::now();
        if generation != group.generation {
            return ErrorCode::IllegalGeneration.code();
        }
        match group.state {
            GroupState::PreparingRebalance => ErrorCode::RebalanceInProgress.code(),
            GroupState::Stable | GroupState::CompletingRebalance => ErrorCode::None.code(),
            GroupState::Empty | GroupState::Dead => ErrorCode::UnknownMemberId.code(),
        }
    }

    /// Removes members; returns a per-member error code (in request order).
    pub fn leave(
        &self,
        store: &dyn GroupStore,
        group_id: &str,
        members: &[(String, Option<String>)],
    ) -> Result<Vec<i16>, i16> {
        let mut groups = self.lock();
        let Some(group) = groups.get_mut(group_id) else { return Err(ErrorCode::UnknownMemberId.code()) };
        let now = Instant::now();
        let mut codes = Vec::with_capacity(members.len());
        for (member_id, instance) in members {
            let id = if member_id.is_empty() {
                instance.as_deref().and_then(|i| group.member_by_instance(i)).map(|m| m.id.clone())
            } else {
                Some(member_id.clone())
            };
            if id.as_ref().is_some_and(|id| group.pending.remove(id).is_some()) {
                // A member leaving between MEMBER_ID_REQUIRED and its second JoinGroup: a join
                // phase waiting only for it can end now.
                self.maybe_complete_join(store, group, now);
                codes.push(ErrorCode::None.code());
                continue;
            }
            match id.and_then(|id| group.members.remove(&id)) {
                Some(m) => {
                    if instance.is_some() && m.instance_id != *instance {
                        codes.push(ErrorCode::FencedInstanceId.code());
                        group.members.insert(m.id.clone(), m);
                        continue;
                    }
                    store.member_left(&group.id, &m.id);
                    self.after_removal(store, group, m, now);
                    codes.push(ErrorCode::None.code());
                }
                None => codes.push(ErrorCode::UnknownMemberId.code()),
            }
        }
        Ok(codes)
    }

    fn after_removal(&self, store: &dyn GroupStore, group: &mut Group, mut removed: Member, now: Instant) {
        if let Some(w) = removed.join_waiter.take() {
            let _ = w.send(JoinResult { error_code: ErrorCode::UnknownMemberId.code(), ..Default::default() });
        }
        if let Some(w) = removed.sync_waiter.take() {
            let _ = w.send(SyncResult { error_code: ErrorCode::UnknownMemberId.code(), ..Default::default() });
        }
        if group.leader.as_deref() == Some(removed.id.as_str()) {
            group.leader = None;
        }
        match group.state {
            GroupState::PreparingRebalance => self.maybe_complete_join(store, group, now),
            GroupState::Stable | GroupState::CompletingRebalance => {
                if group.members.is_empty() {
                    group.state = GroupState::Empty;
                    group.empty_since_ms = Some(now_ms());
                    group.generation += 1;
                    group.protocol_name = None;
                    let _ = store.store_group(group);
                    store.owners_changed(&group.id, &[]);
                } else {
                    self.prepare_rebalance(group, now);
                    self.maybe_complete_join(store, group, now);
                }
            }
            GroupState::Empty | GroupState::Dead => {}
        }
    }

    /// Expires silent members and ends join phases whose time is up.
    pub fn tick(&self, store: &dyn GroupStore) {
        let now = Instant::now();
        let mut groups = self.lock();
        for group in groups.values_mut() {
            let expired: Vec<String> = group
                .members
                .values()
                .filter(|m| m.join_waiter.is_none() && m.sync_waiter.is_none())
                .filter(|m| now.duration_since(m.last_heartbeat) > m.session_timeout)
                .map(|m| m.id.clone())
                .collect();
            for id in expired {
                if let Some(m) = group.members.remove(&id) {
                    tracing::info!(group = %group.id, member = %id, "member session expired");
                    store.member_left(&group.id, &id);
                    self.after_removal(store, group, m, now);
                }
            }
            let before = group.pending.len();
            group.pending.retain(|_, lapses| now < *lapses);
            if group.pending.len() < before {
                tracing::info!(group = %group.id, expired = before - group.pending.len(), "pending members' sessions expired");
            }
            if group.state == GroupState::PreparingRebalance {
                self.maybe_complete_join(store, group, now);
            }
        }
    }

    pub fn commit_offsets(
        &self,
        store: &dyn GroupStore,
        group_id: &str,
        generation: i32,
        member_id: &str,
        offsets: Vec<OffsetToCommit>,
    ) -> Vec<(TopicPartition, i16)> {
        let _order = self.offset_write_order(group_id);
        let mut groups = self.lock();
        let all = |code: i16| offsets.iter().map(|(tp, ..)| (tp.clone(), code)).collect::<Vec<_>>();
        if group_id.is_empty() {
            return all(ErrorCode::InvalidGroupId.code());
        }
        let group = groups.entry(group_id.to_string()).or_insert_with(|| Group::new(group_id));
        let simple = generation < 0 && member_id.is_empty();
        if simple {
            if group.state != GroupState::Empty {
                return all(ErrorCode::UnknownMemberId.code());
            }
        } else {
            let Some(member) = group.members.get_mut(member_id) else { return all(ErrorCode::UnknownMemberId.code()) };
            member.last_heartbeat = Instant::now();
            if generation != group.generation {
                return all(ErrorCode::IllegalGeneration.code());
            }
            if group.state == GroupState::CompletingRebalance {
                return all(ErrorCode::RebalanceInProgress.code());
            }
        }
        let ts = now_ms();
        let mut results = Vec::with_capacity(offsets.len());
        let mut to_store = Vec::new();
        for (tp, offset, epoch, metadata) in offsets {
            let metadata = metadata.unwrap_or_default();
            if metadata.len() > self.config.offset_metadata_max_bytes {
                results.push((tp, ErrorCode::OffsetMetadataTooLarge.code()));
            } else if !store.topic_partition_exists(&tp.0, tp.1) {
                results.push((tp, ErrorCode::UnknownTopicOrPartition.code()));
            } else {
                let value = CommittedOffset { offset, leader_epoch: epoch, metadata, commit_timestamp: ts };
                to_store.push((tp.clone(), Some(value)));
                results.push((tp, ErrorCode::None.code()));
            }
        }
        drop(groups);
        if !to_store.is_empty() {
            if let Err(code) = store.store_offsets(group_id, &to_store) {
                return results
                    .into_iter()
                    .map(|(tp, c)| (tp, if c == ErrorCode::None.code() { code } else { c }))
                    .collect();
            }
            // The group may have been emptied, deleted or expired meanwhile; what is in the log
            // now ends with this commit, and so does what is kept here.
            let mut groups = self.lock();
            let group = groups.entry(group_id.to_string()).or_insert_with(|| Group::new(group_id));
            for (tp, v) in to_store {
                if let Some(v) = v {
                    group.offsets.insert(tp, v);
                }
            }
        }
        results
    }

    /// Kafka's offsets expiry (2.1+, KIP-211): the offsets of an Empty group expire
    /// `retention_ms` after it became Empty (after their commit where that time is unknown, and
    /// always after their commit for a group that never had members). Expired offsets get
    /// tombstones in `__consumer_offsets`; a group left with none is removed (group tombstone).
    /// The log writes happen without the coordinator lock. Returns the offsets expired.
    pub fn expire_offsets(&self, store: &dyn GroupStore, now: i64, retention_ms: i64) -> usize {
        type Doomed = Vec<((String, i32), i64)>;
        let plan: Vec<(String, Doomed)> = {
            let groups = self.lock();
            groups
                .values()
                .filter(|g| g.state == GroupState::Empty && g.members.is_empty())
                .filter_map(|g| {
                    let doomed: Doomed = g
                        .offsets
                        .iter()
                        .filter(|(_, o)| {
                            let base = match (g.protocol_type.is_some(), g.empty_since_ms) {
                                (true, Some(t)) => t,
                                _ => o.commit_timestamp,
                            };
                            base.saturating_add(retention_ms) <= now
                        })
                        .map(|(tp, o)| (tp.clone(), o.commit_timestamp))
                        .collect();
                    (!doomed.is_empty()).then(|| (g.id.clone(), doomed))
                })
                .collect()
        };
        let mut expired = 0;
        for (group_id, doomed) in plan {
            let _order = self.offset_write_order(&group_id);
            let tombstones: Vec<((String, i32), Option<CommittedOffset>)> =
                doomed.iter().map(|(tp, _)| (tp.clone(), None)).collect();
            if let Err(code) = store.store_offsets(&group_id, &tombstones) {
                tracing::warn!(group = %group_id, error_code = code, "could not write expired offsets' tombstones");
                continue;
            }
            let mut groups = self.lock();
            let Some(g) = groups.get_mut(&group_id) else { continue };
            for (tp, ts) in &doomed {
                // A commit that came in meanwhile is newer than the tombstone and stays.
                if g.offsets.get(tp).is_some_and(|o| o.commit_timestamp == *ts) {
                    g.offsets.remove(tp);
                    expired += 1;
                }
            }
            tracing::info!(group = %group_id, offsets = doomed.len(), "expired committed offsets");
            if g.offsets.is_empty() && g.state == GroupState::Empty && g.members.is_empty() {
                g.state = GroupState::Dead;
                let _ = store.store_group(g);
                groups.remove(&group_id);
            }
        }
        expired
    }

    /// Kafka's `onPartitionsDeleted`: the committed offsets of deleted partitions leave every
    /// group here, with tombstones in `__consumer_offsets` so that they stay gone after a
    /// reload; a group left Empty without offsets is removed (group tombstone). Each group's
    /// offsets leave memory under the lock and its tombstones are appended after it is
    /// released, holding only the group's write stripe, which keeps them in order with its
    /// commits. Returns the offsets removed.
    pub fn on_partitions_deleted(&self, store: &dyn GroupStore, deleted: &[TopicPartition]) -> usize {
        if deleted.is_empty() {
            return 0;
        }
        let deleted: std::collections::HashSet<&TopicPartition> = deleted.iter().collect();
        let affected: Vec<String> = {
            let groups = self.lock();
            groups.values().filter(|g| g.offsets.keys().any(|tp| deleted.contains(tp))).map(|g| g.id.clone()).collect()
        };
        let mut removed = 0;
        for group_id in affected {
            let _order = self.offset_write_order(&group_id);
            let (tombstones, dead) = {
                let mut groups = self.lock();
                let Some(g) = groups.get_mut(&group_id) else { continue };
                let doomed: Vec<TopicPartition> = g.offsets.keys().filter(|tp| deleted.contains(tp)).cloned().collect();
                for tp in &doomed {
                    g.offsets.remove(tp);
                }
                // Removed from memory before its tombstone is written, as Kafka does: a join
                // meanwhile starts a new group.
                let dead = (g.offsets.is_empty() && g.state == GroupState::Empty && g.members.is_empty()).then(|| {
                    let mut copy = Group::new(&group_id);
                    copy.state = GroupState::Dead;
                    copy
                });
                if dead.is_some() {
                    groups.remove(&group_id);
                }
                let tombstones: Vec<(TopicPartition, Option<CommittedOffset>)> =
                    doomed.into_iter().map(|tp| (tp, None)).collect();
                (tombstones, dead)
            };
            removed += tombstones.len();
            tracing::info!(group = %group_id, offsets = tombstones.len(), "removed offsets of deleted partitions");
            // As in Kafka, a tombstone that cannot be written is not retried: this broker no
            // longer coordinates the group, and its new coordinator loads what the log says.
            if !tombstones.is_empty() {
                if let Err(code) = store.store_offsets(&group_id, &tombstones) {
                    tracing::warn!(group = %group_id, error_code = code, "could not write deleted partitions' offset tombstones");
                }
            }
            if let Some(dead) = dead {
                if let Err(code) = store.store_group(&dead) {
                    tracing::warn!(group = %group_id, error_code = code, "could not write a removed group's tombstone");
                }
            }
        }
        removed
    }

    /// Committed offsets of a group; `None` for topics means all of them.
    pub fn fetch_offsets(
        &self,
        group_id: &str,
        wanted: Option<Vec<(String, i32)>>,
    ) -> Vec<((String, i32), Option<CommittedOffset>)> {
        let groups = self.lock();
        let group = groups.get(group_id);
        match wanted {
            None => group
                .map(|g| g.offsets.iter().map(|(tp, o)| (tp.clone(), Some(o.clone()))).collect())
                .unwrap_or_default(),
            Some(list) => list
                .into_iter()
                .map(|tp| {
                    let v = group.and_then(|g| g.offsets.get(&tp).cloned());
                    (tp, v)
                })
                .collect(),
        }
    }

    pub fn delete_offsets(
        &self,
        store: &dyn GroupStore,
        group_id: &str,
        tps: Vec<(String, i32)>,
        subscribed: impl Fn(&Group, &str) -> bool,
    ) -> Result<Vec<(TopicPartition, i16)>, i16> {
        let _order = self.offset_write_order(group_id);
        let mut groups = self.lock();
        let Some(group) = groups.get_mut(group_id) else { return Err(ErrorCode::GroupIdNotFound.code()) };
        let mut results = Vec::new();
        let mut tombstones = Vec::new();
        for tp in tps {
            if group.state != GroupState::Empty && subscribed(group, &tp.0) {
                results.push((tp, ErrorCode::GroupSubscribedToTopic.code()));
            } else {
                tombstones.push((tp.clone(), None));
                results.push((tp, ErrorCode::None.code()));
            }
        }
        drop(groups);
        if !tombstones.is_empty() {
            store.store_offsets(group_id, &tombstones)?;
            if let Some(group) = self.lock().get_mut(group_id) {
                for (tp, _) in tombstones {
                    group.offsets.remove(&tp);
                }
            }
        }
        Ok(results)
    }

    pub fn delete_group(&self, store: &dyn GroupStore, group_id: &str) -> i16 {
        // Still under `groups` for its writes (a member joining meanwhile would need the delete
        // undone); taking the stripe first keeps it in order with the group's commits.
        let _order = self.offset_write_order(group_id);
        let mut groups = self.lock();
        let Some(group) = groups.get_mut(group_id) else { return ErrorCode::GroupIdNotFound.code() };
        if group.state != GroupState::Empty {
            return ErrorCode::NonEmptyGroup.code();
        }
        let tombstones: Vec<((String, i32), Option<CommittedOffset>)> =
            group.offsets.keys().map(|tp| (tp.clone(), None)).collect();
        if !tombstones.is_empty() {
            if let Err(code) = store.store_offsets(group_id, &tombstones) {
                return code;
            }
        }
        group.state = GroupState::Dead;
        let _ = store.store_group(group);
        groups.remove(group_id);
        ErrorCode::None.code()
    }

    /// Runs `f` on a group, if it exists.
    pub fn with_group<R>(&self, group_id: &str, f: impl FnOnce(&Group) -> R) -> Option<R> {
        self.lock().get(group_id).map(f)
    }

    pub fn list(&self) -> Vec<(String, String, GroupState)> {
        self.lock().values().map(|g| (g.id.clone(), g.protocol_type.clone().unwrap_or_default(), g.state)).collect()
    }
}

/// (topic, partition, member) for every partition assigned in a "consumer" group.
fn owners_of(group: &Group) -> Vec<(String, i32, String)> {
    use kafka_protocol::messages::ConsumerProtocolAssignment;
    use kafka_protocol::protocol::Decodable;
    if group.protocol_type.as_deref() != Some("consumer") {
        return vec![];
    }
    let mut out = Vec::new();
    for m in group.members.values() {
        let mut buf = m.assignment.clone();
        if buf.len() < 2 {
            continue;
        }
        let version = i16::from_be_bytes([buf[0], buf[1]]);
        let _ = bytes::Buf::get_i16(&mut buf);
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ConsumerProtocolAssignment::decode(&mut buf, version.clamp(0, 3))
        }));
        if let Ok(Ok(a)) = decoded {
            for tp in a.assigned_partitions {
                for p in tp.partitions {
                    out.push((tp.topic.0.to_string(), p, m.id.clone()));
                }
            }
        }
    }
    out
}

/// Topics a "consumer" member subscribes to, from its JoinGroup metadata.
pub fn subscribed_topics(member: &Member, protocol: Option<&str>) -> Vec<String> {
    use kafka_protocol::messages::ConsumerProtocolSubscription;
    use kafka_protocol::protocol::Decodable;
    if member.protocol_type != "consumer" {
        return vec![];
    }
    let mut buf = match protocol {
        Some(p) => member.metadata_for(p),
        None => member.protocols.first().map(|(_, m)| m.clone()).unwrap_or_default(),
    };
    if buf.len() < 2 {
        return vec![];
    }
    let version = i16::from_be_bytes([buf[0], buf[1]]);
    let _ = bytes::Buf::get_i16(&mut buf);
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ConsumerProtocolSubscription::decode(&mut buf, version.clamp(0, 3))
    }));
    match decoded {
        Ok(Ok(s)) => s.topics.into_iter().map(|t| t.to_string()).collect(),
        _ => vec![],
    }
}

#[cfg(test)]
mod tests {
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
        fn store_group(&self, group: &Group) -> Result<(), i16> {
            self.groups_stored.lock().unwrap().push((group.state, group.generation));
            Ok(())
        }
        fn topic_partition_exists(&self, _: &str, _: i32) -> bool {
            true
        }
        fn member_joined(&self, _: &str, _: &Member) {}
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
        assert_eq!(
            c.heartbeat("g", first.generation_id, &first.member_id, None),
            ErrorCode::RebalanceInProgress.code()
        );
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
        let r = c.join_locked(store, req).expect("MEMBER_ID_REQUIRED is answered at once");
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
        fn store_group(&self, group: &Group) -> Result<(), i16> {
            self.inner.store_group(group)
        }
        fn topic_partition_exists(&self, t: &str, p: i32) -> bool {
            self.inner.topic_partition_exists(t, p)
        }
        fn member_joined(&self, _: &str, _: &Member) {}
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
        let commits =
            vec![(("t".into(), 0), 5, -1, None), (("t".into(), 1), 6, -1, None), (("u".into(), 0), 7, -1, None)];
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
}
