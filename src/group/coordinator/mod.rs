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

/// What the coordinator needs from the rest of the broker. Only `topic_partition_exists` is
/// asked under the lock (a metadata image read); the rest performs effects, after it.
pub trait GroupStore: Sync {
    /// Persists offset commits (and deletions, as None) for a group; Err is a Kafka error code.
    fn store_offsets(&self, group: &str, offsets: &[((String, i32), Option<CommittedOffset>)]) -> Result<(), i16>;
    /// Persists the group's metadata record after a generation completes (Dead: tombstone).
    fn store_group(&self, group: &GroupRecord) -> Result<(), i16>;
    fn topic_partition_exists(&self, topic: &str, partition: i32) -> bool;
    /// Mirrors membership into `/consumers/<group>/...`.
    fn member_joined(&self, group: &str, member: &MemberRegistration);
    fn member_left(&self, group: &str, member_id: &str);
    fn owners_changed(&self, group: &str, owners: &[(String, i32, String)]);
}

pub use crate::config::CoordinatorConfig;

pub struct GroupCoordinator {
    config: CoordinatorConfig,
    groups: Mutex<HashMap<String, Group>>,
    /// What steps left to do after releasing `groups`, in each group's order (see `effects`).
    effects: EffectQueue,
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
            effects: EffectQueue::new(),
            txn_offsets: Mutex::new(HashMap::new()),
        }
    }

    /// Runs a step under `groups` and queues its effects before the lock is released: the
    /// stripes to perform once it is.
    fn step<R>(&self, f: impl FnOnce(&mut HashMap<String, Group>, &mut Effects) -> R) -> (R, Vec<usize>) {
        let mut groups = self.lock();
        let mut fx = Effects::default();
        let value = f(&mut groups, &mut fx);
        let stripes = self.effects.enqueue(fx);
        drop(groups);
        (value, stripes)
    }

    /// A step, then its effects (and whatever its stripes had queued before them).
    fn step_and_perform<R>(
        &self,
        store: &dyn GroupStore,
        f: impl FnOnce(&mut HashMap<String, Group>, &mut Effects) -> R,
    ) -> R {
        let (value, stripes) = self.step(f);
        self.perform(store, &stripes);
        value
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Group>> {
        // Every mutation below leaves the group in a valid state before any call that could
        // panic, so a poisoned lock still guards consistent data.
        self.groups.lock_unpoisoned()
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
            self.step_and_perform(store, |groups, fx| {
                let Some(g) = groups.get_mut(id) else { return };
                if g.state != GroupState::Empty || !g.members.is_empty() {
                    return;
                }
                g.generation += 1;
                fx.store_group(g);
            });
        }
    }

    /// Forgets the groups `owned(group id)` selects, as Kafka does when this broker stops
    /// coordinating their `__consumer_offsets` partition (and before reloading one): what the
    /// log holds is the truth, and a tombstone this broker never saw (compacted away while
    /// another broker coordinated) must not leave a stale offset here. Members waiting on a
    /// join or sync are told NOT_COORDINATOR, which sends them to the new coordinator.
    pub fn unload_groups(&self, store: &dyn GroupStore, owned: impl Fn(&str) -> bool) -> usize {
        self.step_and_perform(store, |groups, fx| {
            let ids: Vec<String> = groups.keys().filter(|id| owned(id)).cloned().collect();
            let removed: Vec<Group> = ids.iter().filter_map(|id| groups.remove(id)).collect();
            let count = removed.len();
            Self::release_unloaded(fx, removed);
            count
        })
    }

    fn release_unloaded(fx: &mut Effects, removed: Vec<Group>) {
        for mut g in removed {
            for m in g.members.values_mut() {
                if let Some(w) = m.join_waiter.take() {
                    let _ = w.send(JoinResult { error_code: ErrorCode::NotCoordinator.code(), ..Default::default() });
                }
                if let Some(w) = m.sync_waiter.take() {
                    let _ = w.send(SyncResult { error_code: ErrorCode::NotCoordinator.code(), ..Default::default() });
                }
                fx.member_left(&g.id, &m.id);
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
        let fail = |code| SyncResult { error_code: code, ..Default::default() };
        let rx = self.step_and_perform(store, |groups, fx| {
            let Some(group) = groups.get_mut(group_id) else { return Err(fail(ErrorCode::UnknownMemberId.code())) };
            let Some(member) = group.members.get_mut(member_id) else {
                return Err(fail(if instance_id.is_some_and(|i| group.member_by_instance(i).is_some()) {
                    ErrorCode::FencedInstanceId.code()
                } else {
                    ErrorCode::UnknownMemberId.code()
                }));
            };
            if instance_id.is_some() && member.instance_id.as_deref() != instance_id {
                return Err(fail(ErrorCode::FencedInstanceId.code()));
            }
            if generation != group.generation {
                return Err(fail(ErrorCode::IllegalGeneration.code()));
            }
            member.last_heartbeat = Instant::now();
            match group.state {
                GroupState::PreparingRebalance => return Err(fail(ErrorCode::RebalanceInProgress.code())),
                GroupState::Stable => {
                    return Err(SyncResult {
                        error_code: ErrorCode::None.code(),
                        protocol_type: group.protocol_type.clone(),
                        protocol_name: group.protocol_name.clone(),
                        assignment: member.assignment.clone(),
                    })
                }
                GroupState::Empty | GroupState::Dead => return Err(fail(ErrorCode::UnknownMemberId.code())),
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
                fx.store_group(group);
                fx.owners_changed(&group.id, owners_of(group));
                // Answered once the record is appended (queued after it).
                let mut answers = Vec::new();
                for m in group.members.values_mut() {
                    if let Some(w) = m.sync_waiter.take() {
                        let result = SyncResult {
                            error_code: ErrorCode::None.code(),
                            protocol_type: group.protocol_type.clone(),
                            protocol_name: group.protocol_name.clone(),
                            assignment: m.assignment.clone(),
                        };
                        answers.push((w, result));
                    }
                }
                fx.answer(&group.id, answers);
            }
            Ok(rx)
        });
        let rx = match rx {
            Ok(rx) => rx,
            Err(answer) => return answer,
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
        self.step_and_perform(store, |groups, fx| self.leave_locked(groups, fx, group_id, members))
    }

    fn leave_locked(
        &self,
        groups: &mut HashMap<String, Group>,
        fx: &mut Effects,
        group_id: &str,
        members: &[(String, Option<String>)],
    ) -> Result<Vec<i16>, i16> {
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
                self.maybe_complete_join(fx, group, now);
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
                    fx.member_left(&group.id, &m.id);
                    self.after_removal(fx, group, m, now);
                    codes.push(ErrorCode::None.code());
                }
                None => codes.push(ErrorCode::UnknownMemberId.code()),
            }
        }
        Ok(codes)
    }

    fn after_removal(&self, fx: &mut Effects, group: &mut Group, mut removed: Member, now: Instant) {
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
            GroupState::PreparingRebalance => self.maybe_complete_join(fx, group, now),
            GroupState::Stable | GroupState::CompletingRebalance => {
                if group.members.is_empty() {
                    group.state = GroupState::Empty;
                    group.empty_since_ms = Some(now_ms());
                    group.generation += 1;
                    group.protocol_name = None;
                    fx.store_group(group);
                    fx.owners_changed(&group.id, vec![]);
                } else {
                    self.prepare_rebalance(group, now);
                    self.maybe_complete_join(fx, group, now);
                }
            }
            GroupState::Empty | GroupState::Dead => {}
        }
    }

    /// Expires silent members and ends join phases whose time is up.
    pub fn tick(&self, store: &dyn GroupStore) {
        let stripes = self.tick_step();
        self.perform(store, &stripes);
    }

    /// The memory part of [`Self::tick`]: the stripes its effects wait on, for [`Self::perform`].
    pub fn tick_step(&self) -> Vec<usize> {
        self.step(|groups, fx| self.tick_locked(groups, fx)).1
    }

    fn tick_locked(&self, groups: &mut HashMap<String, Group>, fx: &mut Effects) {
        let now = Instant::now();
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
                    fx.member_left(&group.id, &id);
                    self.after_removal(fx, group, m, now);
                }
            }
            let before = group.pending.len();
            group.pending.retain(|_, lapses| now < *lapses);
            if group.pending.len() < before {
                tracing::info!(group = %group.id, expired = before - group.pending.len(), "pending members' sessions expired");
            }
            if group.state == GroupState::PreparingRebalance {
                self.maybe_complete_join(fx, group, now);
            }
        }
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

mod effects;
mod join;
mod migrate;
mod offsets;
#[cfg(test)]
mod tests;

use effects::{AfterStore, EffectQueue, Effects};
pub use effects::{GroupRecord, MemberRecord, MemberRegistration};
pub use migrate::{ClassicMemberSnapshot, ClassicSnapshot};
