// Over ~800 lines on purpose: the heartbeat steps below share the invariants stated here and are read together; reconciliation, assignors and records are apart.
//! Groups of the consumer protocol (KIP-848): ConsumerGroupHeartbeat's state machine, the
//! target assignment the coordinator computes itself, and the reconciliation that moves each
//! member towards it one heartbeat at a time.
//!
//! Invariants kept under the one `groups` lock:
//! - the group epoch grows whenever membership, a subscription, an assignor or the subscribed
//!   topics' partitions change, and the target assignment is recomputed in the same step, so
//!   the assignment epoch equals the group epoch whenever the lock is free;
//! - a partition is owned (assigned or pending revocation) by at most one member: it is given
//!   to a new member only once its previous owner has reported it revoked, left, or been
//!   fenced (`owners` says who holds what);
//! - a member's epoch reaches the assignment epoch only once it has nothing left to revoke.
//!
//! Steps queue their effects (records for `__consumer_offsets`, marks for the ZooKeeper
//! mirror) under the lock, in the order the state changed, and perform them after it, as the
//! classic coordinator does. Time is tokio's, so tests run session expiry under paused time.
//!
//! Static membership (instance ids) is in `static_members`, regular-expression subscriptions
//! in `topic_regex`, classic-protocol members and the online conversions from and to a
//! classic group in `classic`. Not in this slice: rack-aware assignment.

pub mod assignor;
mod classic;
mod reconcile;
pub mod records;
mod static_members;
mod topic_regex;
use reconcile::{is_subset, rebalance_timeout, reconcile};
pub use static_members::LEAVE_STATIC_EPOCH;
#[cfg(test)]
mod static_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use uuid::Uuid;

pub use assignor::Assignment;
pub use classic::CONSUMER_PROTOCOL_TYPE;
use records::{ClassicMemberMetadata, ConsumerRecord, CurrentAssignment, MemberMetadata};

use super::coordinator::{ClassicSnapshot, MemberRegistration};
use super::zk_mirror::znode_member_id;
pub use crate::config::ConsumerGroupConfig;
use crate::protocol::ErrorCode;
use crate::sync::MutexExt;

/// The topics as the metadata image shows them, for subscriptions (by name) and assignments
/// (by id).
pub trait TopicsView: Send + Sync {
    /// (topic id, partition count) of an existing topic.
    fn topic(&self, name: &str) -> Option<(Uuid, i32)>;
    fn name(&self, id: Uuid) -> Option<String>;
    /// Every topic's name, for regular-expression subscriptions.
    fn names(&self) -> Vec<String>;
}

/// Where a step's effects go once the lock is released.
pub trait ConsumerStore: Sync {
    /// Appends records (key, value; None a tombstone) to the group's offsets partition; Err is
    /// a Kafka error code.
    fn append(&self, group: &str, records: Vec<(Bytes, Option<Bytes>)>) -> Result<(), i16>;
    fn member_joined(&self, group: &str, member: &MemberRegistration);
    fn member_left(&self, group: &str, member_id: &str);
    fn owners_changed(&self, group: &str, owners: &[(String, i32, String)]);
    /// Hands a group whose members all speak the classic protocol back to the classic
    /// coordinator (online downgrade).
    fn downgrade(&self, snapshot: ClassicSnapshot);
}

/// Kafka's MemberState, with its record codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    Stable,
    /// Waiting for the member to give up `pending_revocation`.
    UnrevokedPartitions,
    /// At the assignment epoch, but partitions of its target are still held by others.
    UnreleasedPartitions,
}

impl MemberState {
    fn code(self) -> i8 {
        match self {
            MemberState::Stable => 0,
            MemberState::UnrevokedPartitions => 1,
            MemberState::UnreleasedPartitions => 2,
        }
    }

    fn from_code(code: i8) -> MemberState {
        match code {
            1 => MemberState::UnrevokedPartitions,
            2 => MemberState::UnreleasedPartitions,
            _ => MemberState::Stable,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ConsumerMember {
    pub id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// Sorted and without duplicates, so that a reordered list is no change.
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub epoch: i32,
    pub previous_epoch: i32,
    pub state: MemberState,
    pub assigned: Assignment,
    pub pending_revocation: Assignment,
    last_heartbeat: Instant,
    /// When a member that must revoke partitions is fenced if it has not (its rebalance timeout).
    revocation_deadline: Option<Instant>,
    /// Set for a member that joined with the classic protocol (JoinGroup): its session
    /// timeout and the protocols it supports.
    pub classic: Option<ClassicMemberMetadata>,
}

impl ConsumerMember {
    fn new(id: &str, now: Instant) -> ConsumerMember {
        ConsumerMember {
            id: id.to_string(),
            instance_id: None,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            subscribed_topic_names: Vec::new(),
            subscribed_topic_regex: None,
            server_assignor: None,
            rebalance_timeout_ms: -1,
            epoch: 0,
            previous_epoch: -1,
            state: MemberState::Stable,
            assigned: Assignment::new(),
            pending_revocation: Assignment::new(),
            last_heartbeat: now,
            revocation_deadline: None,
            classic: None,
        }
    }

    fn metadata(&self) -> MemberMetadata {
        MemberMetadata {
            instance_id: self.instance_id.clone(),
            rack_id: self.rack_id.clone(),
            client_id: self.client_id.clone(),
            client_host: self.client_host.clone(),
            subscribed_topic_names: self.subscribed_topic_names.clone(),
            subscribed_topic_regex: self.subscribed_topic_regex.clone(),
            rebalance_timeout_ms: self.rebalance_timeout_ms,
            server_assignor: self.server_assignor.clone(),
            classic: self.classic.clone(),
        }
    }

    fn current(&self) -> CurrentAssignment {
        CurrentAssignment {
            member_epoch: self.epoch,
            previous_member_epoch: self.previous_epoch,
            state: self.state.code(),
            assigned: self.assigned.clone(),
            pending_revocation: self.pending_revocation.clone(),
        }
    }

    fn registration(&self) -> MemberRegistration {
        MemberRegistration {
            id: znode_member_id(&self.id),
            client_id: self.client_id.clone(),
            client_host: self.client_host.clone(),
            topics: self.subscribed_topic_names.clone(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerGroupState {
    Empty,
    Assigning,
    Reconciling,
    Stable,
}

impl ConsumerGroupState {
    /// As ConsumerGroupDescribe and ListGroups name it.
    pub fn name(self) -> &'static str {
        match self {
            ConsumerGroupState::Empty => "Empty",
            ConsumerGroupState::Assigning => "Assigning",
            ConsumerGroupState::Reconciling => "Reconciling",
            ConsumerGroupState::Stable => "Stable",
        }
    }
}

pub struct ConsumerGroup {
    pub id: String,
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub members: BTreeMap<String, ConsumerMember>,
    /// The target assignment at `assignment_epoch`, by member.
    pub target: BTreeMap<String, Assignment>,
    /// The assignor the target was computed with.
    pub assignor: String,
    /// Who holds each partition: assigned to it, or still to be revoked by it.
    owners: HashMap<(Uuid, i32), String>,
    /// The subscribed topics the target was computed for: name -> (id, partitions).
    subscribed_metadata: BTreeMap<String, (Uuid, i32)>,
    /// What the members' patterns resolved to.
    regexes: topic_regex::Resolutions,
}

impl ConsumerGroup {
    fn new(id: &str, assignor: &str) -> ConsumerGroup {
        ConsumerGroup {
            id: id.to_string(),
            epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            assignor: assignor.to_string(),
            owners: HashMap::new(),
            subscribed_metadata: BTreeMap::new(),
            regexes: topic_regex::Resolutions::default(),
        }
    }

    /// The topics a member subscribes to: by name, and through its pattern.
    fn member_topics<'a>(&'a self, m: &'a ConsumerMember) -> impl Iterator<Item = &'a String> + 'a {
        let by_regex = m.subscribed_topic_regex.as_deref().map(|p| self.regexes.topics(p));
        m.subscribed_topic_names.iter().chain(by_regex.into_iter().flatten())
    }

    /// Matches the members' patterns against the topics when one is new or the last match
    /// is old; whether a pattern's topics changed.
    fn refresh_regexes(&mut self, topics: &dyn TopicsView, now: Instant) -> bool {
        let in_use = self.members.values().filter_map(|m| m.subscribed_topic_regex.as_deref());
        self.regexes.refresh(in_use, topics, now)
    }

    pub fn state(&self) -> ConsumerGroupState {
        if self.members.is_empty() {
            ConsumerGroupState::Empty
        } else if self.epoch != self.assignment_epoch {
            ConsumerGroupState::Assigning
        } else if self.members.values().any(|m| m.state != MemberState::Stable || m.epoch != self.assignment_epoch) {
            ConsumerGroupState::Reconciling
        } else {
            ConsumerGroupState::Stable
        }
    }

    fn rebuild_owners(&mut self) {
        self.owners.clear();
        for m in self.members.values() {
            for (t, ps) in m.assigned.iter().chain(m.pending_revocation.iter()) {
                for p in ps {
                    self.owners.insert((*t, *p), m.id.clone());
                }
            }
        }
    }

    /// Every owned partition by topic name, for `/consumers/<group>/owners`.
    fn owners_by_name(&self, topics: &dyn TopicsView) -> Vec<(String, i32, String)> {
        let mut names: HashMap<Uuid, Option<String>> = HashMap::new();
        let mut out: Vec<(String, i32, String)> = self
            .owners
            .iter()
            .filter_map(|((t, p), m)| {
                let name = names.entry(*t).or_insert_with(|| topics.name(*t)).clone()?;
                Some((name, *p, znode_member_id(m)))
            })
            .collect();
        out.sort();
        out
    }
}

/// ConsumerGroupHeartbeat as the coordinator takes it (null fields are "unchanged").
#[derive(Debug, Clone, Default)]
pub struct HeartbeatRequest {
    pub version: i16,
    pub group_id: String,
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Option<Vec<String>>,
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    pub owned: Option<Assignment>,
    pub client_id: String,
    pub client_host: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeartbeatResult {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub member_id: Option<String>,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The member's partitions, when it must hear them (see [`ConsumerGroupCoordinator::heartbeat`]).
    pub assignment: Option<Assignment>,
}

impl HeartbeatResult {
    fn error(code: ErrorCode, message: impl Into<String>) -> HeartbeatResult {
        HeartbeatResult { error_code: code.code(), error_message: Some(message.into()), ..Default::default() }
    }
}

type Outcome = Arc<OnceLock<Result<(), i16>>>;

enum Effect {
    Append(Vec<ConsumerRecord>, Option<Outcome>),
    MemberJoined(MemberRegistration),
    MemberLeft(String),
    OwnersChanged(Vec<(String, i32, String)>),
    Downgrade(ClassicSnapshot),
}

#[derive(Default)]
struct Effects(Vec<(String, Effect)>);

impl Effects {
    fn append(&mut self, group: &str, records: Vec<ConsumerRecord>) {
        if !records.is_empty() {
            self.0.push((group.to_string(), Effect::Append(records, None)));
        }
    }
}

pub struct ConsumerGroupCoordinator {
    config: ConsumerGroupConfig,
    topics: Arc<dyn TopicsView>,
    groups: Mutex<HashMap<String, ConsumerGroup>>,
    /// Effects in the order their steps took the lock; whoever holds `turn` performs them.
    queue: Mutex<VecDeque<(String, Effect)>>,
    turn: Mutex<()>,
}

impl ConsumerGroupCoordinator {
    pub fn new(config: ConsumerGroupConfig, topics: Arc<dyn TopicsView>) -> ConsumerGroupCoordinator {
        ConsumerGroupCoordinator {
            config,
            topics,
            groups: Mutex::new(HashMap::new()),
            queue: Mutex::new(VecDeque::new()),
            turn: Mutex::new(()),
        }
    }

    pub fn config(&self) -> &ConsumerGroupConfig {
        &self.config
    }

    fn default_assignor(&self) -> &str {
        self.config.assignors.first().map(String::as_str).unwrap_or(assignor::UNIFORM)
    }

    /// Runs a step under `groups` and queues its effects before the lock is released.
    fn step<R>(&self, f: impl FnOnce(&mut HashMap<String, ConsumerGroup>, &mut Effects) -> R) -> R {
        let mut groups = self.groups.lock_unpoisoned();
        let mut fx = Effects::default();
        let value = f(&mut groups, &mut fx);
        self.queue.lock_unpoisoned().extend(fx.0);
        drop(groups);
        value
    }

    /// Performs every queued effect, in order. Never called holding `groups`.
    pub fn perform(&self, store: &dyn ConsumerStore) {
        let _turn = self.turn.lock_unpoisoned();
        loop {
            let next = self.queue.lock_unpoisoned().pop_front();
            let Some((group, effect)) = next else { break };
            match effect {
                Effect::Append(records, outcome) => {
                    let result = store.append(&group, records.iter().map(ConsumerRecord::encode).collect());
                    if let Err(code) = result {
                        tracing::warn!(%group, code, "could not append consumer group records");
                    }
                    if let Some(o) = outcome {
                        let _ = o.set(result);
                    }
                }
                Effect::MemberJoined(m) => store.member_joined(&group, &m),
                Effect::MemberLeft(id) => store.member_left(&group, &id),
                Effect::OwnersChanged(owners) => store.owners_changed(&group, &owners),
                Effect::Downgrade(snapshot) => store.downgrade(snapshot),
            }
        }
    }

    /// Kafka's checks of a heartbeat's fields, before any state is looked at.
    fn validate(&self, req: &HeartbeatRequest) -> Result<(), HeartbeatResult> {
        let invalid = |m: &str| Err(HeartbeatResult::error(ErrorCode::InvalidRequest, m));
        if req.group_id.is_empty() {
            return invalid("GroupId can't be empty.");
        }
        if req.instance_id.as_deref() == Some("") {
            return invalid("InstanceId can't be empty.");
        }
        if req.rack_id.as_deref() == Some("") {
            return invalid("RackId can't be empty.");
        }
        if req.member_id.is_empty() && (req.version >= 1 || req.member_epoch != 0) {
            return invalid("MemberId can't be empty.");
        }
        match req.member_epoch {
            0 => {
                if req.rebalance_timeout_ms == -1 {
                    return invalid("RebalanceTimeoutMs must be provided in first request.");
                }
                if req.owned.as_ref().is_none_or(|o| o.values().any(|ps| !ps.is_empty())) {
                    return invalid("TopicPartitions must be empty when (re-)joining.");
                }
                if req.subscribed_topic_names.is_none() && req.subscribed_topic_regex.is_none() {
                    return invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.");
                }
            }
            -2 if req.instance_id.is_none() => return invalid("InstanceId can't be null."),
            e if e < -2 => return invalid(&format!("MemberEpoch {e} is invalid.")),
            _ => {}
        }
        if let Some(pattern) = req.subscribed_topic_regex.as_deref().filter(|r| !r.is_empty()) {
            if let Err(e) = topic_regex::compile(pattern) {
                return Err(HeartbeatResult::error(
                    ErrorCode::InvalidRegularExpression,
                    format!("SubscribedTopicRegex `{pattern}` is not a valid regular expression: {e}"),
                ));
            }
        }
        if let Some(a) = &req.server_assignor {
            if !self.config.assignors.iter().any(|n| n == a) {
                return Err(HeartbeatResult::error(
                    ErrorCode::UnsupportedAssignor,
                    format!(
                        "ServerAssignor {a} is not supported. Supported assignors: {}.",
                        self.config.assignors.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// One ConsumerGroupHeartbeat: join (epoch 0), leave (-1, or -2 for a static member), or
    /// a heartbeat that reconciles the member towards its target. Its records are appended
    /// before it returns; a failed append is its answer, so the member retries.
    pub fn heartbeat(&self, store: &dyn ConsumerStore, req: HeartbeatRequest) -> HeartbeatResult {
        if let Err(answer) = self.validate(&req) {
            return answer;
        }
        let outcome = Outcome::default();
        let result = self.step(|groups, fx| {
            let r = self.heartbeat_locked(groups, fx, req, Instant::now());
            if let Some((_, Effect::Append(_, o))) =
                fx.0.iter_mut().rev().find(|(_, e)| matches!(e, Effect::Append(..)))
            {
                *o = Some(outcome.clone());
            }
            r
        });
        self.perform(store);
        match outcome.get() {
            Some(Err(code)) => HeartbeatResult {
                error_code: *code,
                error_message: Some("The coordinator could not store the group's state.".into()),
                ..Default::default()
            },
            _ => result,
        }
    }

    fn heartbeat_locked(
        &self,
        groups: &mut HashMap<String, ConsumerGroup>,
        fx: &mut Effects,
        req: HeartbeatRequest,
        now: Instant,
    ) -> HeartbeatResult {
        let unknown = |id: &str| {
            HeartbeatResult::error(
                ErrorCode::UnknownMemberId,
                format!("Member {id} is not a member of group {}.", req.group_id),
            )
        };
        if req.member_epoch != 0 && !groups.contains_key(&req.group_id) {
            return unknown(&req.member_id);
        }
        let default_assignor = self.default_assignor().to_string();
        let group =
            groups.entry(req.group_id.clone()).or_insert_with(|| ConsumerGroup::new(&req.group_id, &default_assignor));
        let member_id = if req.member_id.is_empty() { new_member_id() } else { req.member_id.clone() };
        if req.member_epoch < 0 {
            if let Some(instance) = req.instance_id.as_deref() {
                if let Err(e) = static_members::check_static_member(group, instance, &member_id) {
                    return e;
                }
                if req.member_epoch == LEAVE_STATIC_EPOCH {
                    self.leave_static(group, fx, &member_id);
                    return HeartbeatResult {
                        member_id: Some(member_id),
                        member_epoch: req.member_epoch,
                        ..Default::default()
                    };
                }
            }
            if !group.members.contains_key(&member_id) {
                return unknown(&member_id);
            }
            self.remove_member(group, fx, &member_id, "left the group");
            self.maybe_downgrade(groups, fx, &req.group_id);
            return HeartbeatResult {
                member_id: Some(member_id),
                member_epoch: req.member_epoch,
                ..Default::default()
            };
        }
        let mut bump = false;
        let mut metadata_changed = false;
        let before = group.members.get(&member_id).map(|m| m.assigned.clone());
        let static_holder = req.instance_id.as_deref().and_then(|i| group.static_member(i)).map(str::to_string);
        if req.member_epoch == 0 && static_holder.is_some() {
            if let Some(old) = static_holder {
                if let Err(e) = self.replace_static(group, fx, &old, &req, &member_id) {
                    return e;
                }
            }
        } else if req.member_epoch == 0 {
            match group.members.get_mut(&member_id) {
                // A member that lost its state rejoins under its id: it owns nothing now, so
                // what it held is free for whoever its target gives it to.
                Some(m) => {
                    m.epoch = 0;
                    m.state = MemberState::Stable;
                    m.assigned.clear();
                    m.pending_revocation.clear();
                    m.revocation_deadline = None;
                    group.owners.retain(|_, owner| *owner != member_id);
                }
                None => {
                    if group.members.len() >= self.config.max_size {
                        return HeartbeatResult::error(
                            ErrorCode::GroupMaxSizeReached,
                            format!(
                                "The consumer group has reached its maximum capacity of {} members.",
                                self.config.max_size
                            ),
                        );
                    }
                    let mut m = ConsumerMember::new(&member_id, now);
                    m.client_id = req.client_id.clone();
                    m.client_host = req.client_host.clone();
                    group.members.insert(member_id.clone(), m);
                    bump = true;
                    metadata_changed = true;
                }
            }
        } else {
            if let Some(instance) = req.instance_id.as_deref() {
                if let Err(e) = static_members::check_static_member(group, instance, &member_id) {
                    return e;
                }
            }
            let Some(m) = group.members.get(&member_id) else { return unknown(&member_id) };
            if req.member_epoch > m.epoch {
                return HeartbeatResult::error(
                    ErrorCode::FencedMemberEpoch,
                    format!(
                        "The consumer group member has a greater member epoch ({}) than the one known by the group \
                         coordinator ({}). The member must abandon all its partitions and rejoin.",
                        req.member_epoch, m.epoch
                    ),
                );
            }
            if req.member_epoch < m.epoch {
                // The answer that carried the newer epoch may have been lost: the previous
                // epoch is still good while the member owns nothing it should not.
                let subset = req.owned.as_ref().is_some_and(|o| is_subset(o, &m.assigned));
                if req.member_epoch != m.previous_epoch || !subset {
                    return HeartbeatResult::error(
                        ErrorCode::FencedMemberEpoch,
                        format!(
                            "The consumer group member has a smaller member epoch ({}) than the one known by the group \
                             coordinator ({}). The member must abandon all its partitions and rejoin.",
                            req.member_epoch, m.epoch
                        ),
                    );
                }
            }
        }
        let Some(m) = group.members.get_mut(&member_id) else { return unknown(&member_id) };
        m.last_heartbeat = now;
        if let Some(mut names) = req.subscribed_topic_names.clone() {
            names.sort();
            names.dedup();
            if names != m.subscribed_topic_names {
                m.subscribed_topic_names = names;
                bump = true;
                metadata_changed = true;
            }
        }
        if let Some(pattern) = &req.subscribed_topic_regex {
            // An empty pattern is no pattern.
            let pattern = Some(pattern.clone()).filter(|p| !p.is_empty());
            if pattern != m.subscribed_topic_regex {
                m.subscribed_topic_regex = pattern;
                bump = true;
                metadata_changed = true;
            }
        }
        if req.server_assignor.is_some() && req.server_assignor != m.server_assignor {
            m.server_assignor = req.server_assignor.clone();
            bump = true;
            metadata_changed = true;
        }
        if req.rebalance_timeout_ms > 0 && req.rebalance_timeout_ms != m.rebalance_timeout_ms {
            m.rebalance_timeout_ms = req.rebalance_timeout_ms;
            metadata_changed = true;
        }
        if req.rack_id.is_some() && req.rack_id != m.rack_id {
            m.rack_id = req.rack_id.clone();
            metadata_changed = true;
        }
        if req.instance_id.is_some() && req.instance_id != m.instance_id {
            m.instance_id = req.instance_id.clone();
            metadata_changed = true;
        }
        self.member_updated(group, fx, &member_id, metadata_changed, bump, now);
        if reconcile(group, &member_id, req.owned.as_ref(), now) {
            self.member_changed(group, fx, &member_id);
        }
        let Some(m) = group.members.get(&member_id) else { return unknown(&member_id) };
        let full = req.rebalance_timeout_ms != -1 && req.subscribed_topic_names.is_some() && req.owned.is_some();
        let send_assignment = req.member_epoch == 0 || full || before.as_ref() != Some(&m.assigned);
        HeartbeatResult {
            error_code: 0,
            error_message: None,
            member_id: Some(member_id.clone()),
            member_epoch: m.epoch,
            heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            assignment: send_assignment.then(|| m.assigned.clone()),
        }
    }

    /// The subscribed topics that exist, with their ids and partition counts.
    fn subscription_metadata(&self, group: &ConsumerGroup) -> BTreeMap<String, (Uuid, i32)> {
        let names: BTreeSet<&String> = group.members.values().flat_map(|m| group.member_topics(m)).collect();
        names.into_iter().filter_map(|n| Some((n.clone(), self.topics.topic(n)?))).collect()
    }

    /// The target assignment at the group epoch, with records for what changed.
    /// What follows a member's join or update, whichever protocol it speaks: its record and
    /// membership effect when its metadata `changed`, the subscribed topics' metadata again, a
    /// new group epoch when that or the subscriptions moved (`bump`), and the target
    /// assignment for a new epoch.
    fn member_updated(
        &self,
        group: &mut ConsumerGroup,
        fx: &mut Effects,
        member_id: &str,
        changed: bool,
        mut bump: bool,
        now: Instant,
    ) {
        if let Some(m) = group.members.get(member_id).filter(|_| changed) {
            let record = ConsumerRecord::Member {
                group: group.id.clone(),
                member: member_id.to_string(),
                value: Some(m.metadata()),
            };
            let joined = m.registration();
            fx.append(&group.id, vec![record]);
            fx.0.push((group.id.clone(), Effect::MemberJoined(joined)));
        }
        group.refresh_regexes(&*self.topics, now);
        let metadata = self.subscription_metadata(group);
        if metadata != group.subscribed_metadata {
            group.subscribed_metadata = metadata;
            bump = true;
        }
        if bump {
            group.epoch += 1;
            fx.append(
                &group.id,
                vec![ConsumerRecord::GroupMetadata { group: group.id.clone(), epoch: Some(group.epoch) }],
            );
        }
        if group.epoch > group.assignment_epoch {
            self.compute_target(group, fx);
        }
    }

    fn compute_target(&self, group: &mut ConsumerGroup, fx: &mut Effects) {
        // The assignor most members ask for; Kafka's default when none asks.
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for a in group.members.values().filter_map(|m| m.server_assignor.as_deref()) {
            *votes.entry(a).or_default() += 1;
        }
        let position = |a: &String| self.config.assignors.iter().position(|b| b == a).unwrap_or(usize::MAX);
        let chosen = self
            .config
            .assignors
            .iter()
            .filter(|a| votes.contains_key(a.as_str()))
            .max_by(|a, b| votes[a.as_str()].cmp(&votes[b.as_str()]).then(position(b).cmp(&position(a))))
            .map(String::as_str)
            .unwrap_or(self.default_assignor())
            .to_string();
        let topics: BTreeMap<Uuid, i32> = group.subscribed_metadata.values().copied().collect();
        let specs: Vec<assignor::MemberSpec<'_>> = group
            .members
            .values()
            .map(|m| assignor::MemberSpec {
                id: &m.id,
                subscribed: group
                    .member_topics(m)
                    .filter_map(|n| group.subscribed_metadata.get(n))
                    .map(|(id, _)| *id)
                    .collect(),
                previous: group.target.get(&m.id),
            })
            .collect();
        let target = assignor::assign(&chosen, &specs, &topics);
        let mut records = Vec::new();
        for (member, a) in &target {
            if group.target.get(member) != Some(a) {
                records.push(ConsumerRecord::TargetMember {
                    group: group.id.clone(),
                    member: member.clone(),
                    value: Some(a.clone()),
                });
            }
        }
        records.push(ConsumerRecord::TargetMetadata { group: group.id.clone(), epoch: Some(group.epoch) });
        fx.append(&group.id, records);
        group.target = target;
        group.assignment_epoch = group.epoch;
        group.assignor = chosen;
    }

    /// A member's current assignment changed: its record, and the owners' mirror.
    fn member_changed(&self, group: &ConsumerGroup, fx: &mut Effects, member_id: &str) {
        let Some(m) = group.members.get(member_id) else { return };
        let record =
            ConsumerRecord::Current { group: group.id.clone(), member: m.id.clone(), value: Some(m.current()) };
        fx.append(&group.id, vec![record]);
        fx.0.push((group.id.clone(), Effect::OwnersChanged(group.owners_by_name(&*self.topics))));
    }

    /// Takes a member out (it left, or was fenced): its partitions are free at once, the
    /// group epoch moves and the others' target is recomputed.
    fn remove_member(&self, group: &mut ConsumerGroup, fx: &mut Effects, member_id: &str, why: &str) {
        if group.members.remove(member_id).is_none() {
            return;
        }
        tracing::info!(group = %group.id, member = %member_id, "consumer group member {why}");
        group.owners.retain(|_, owner| owner != member_id);
        group.target.remove(member_id);
        let (g, m) = (group.id.clone(), member_id.to_string());
        group.epoch += 1;
        fx.append(
            &group.id,
            vec![
                ConsumerRecord::Current { group: g.clone(), member: m.clone(), value: None },
                ConsumerRecord::TargetMember { group: g.clone(), member: m.clone(), value: None },
                ConsumerRecord::Member { group: g.clone(), member: m.clone(), value: None },
                ConsumerRecord::GroupMetadata { group: g.clone(), epoch: Some(group.epoch) },
            ],
        );
        fx.0.push((g.clone(), Effect::MemberLeft(znode_member_id(&m))));
        fx.0.push((g, Effect::OwnersChanged(group.owners_by_name(&*self.topics))));
        group.subscribed_metadata = self.subscription_metadata(group);
        self.compute_target(group, fx);
    }

    /// Fences members whose session lapsed or who did not revoke within their rebalance
    /// timeout; performs what that leaves to do.
    pub fn tick(&self, store: &dyn ConsumerStore) {
        if self.tick_step() {
            self.perform(store);
        }
    }

    /// The memory part of [`Self::tick`]: whether it queued effects for [`Self::perform`].
    pub fn tick_step(&self) -> bool {
        self.step(|groups, fx| {
            let now = Instant::now();
            let session = |m: &ConsumerMember| {
                // A classic member's session is the one its JoinGroup asked for.
                let ms = m.classic.as_ref().map_or(self.config.session_timeout_ms, |c| c.session_timeout_ms);
                Duration::from_millis(ms.max(0) as u64)
            };
            let mut any = false;
            let mut shrunk = Vec::new();
            for group in groups.values_mut() {
                let expired: Vec<(String, &str)> = group
                    .members
                    .values()
                    .filter_map(|m| {
                        if now.duration_since(m.last_heartbeat) > session(m) {
                            Some((m.id.clone(), "session expired"))
                        } else if m.revocation_deadline.is_some_and(|d| now > d) {
                            Some((m.id.clone(), "did not revoke its partitions within its rebalance timeout"))
                        } else {
                            None
                        }
                    })
                    .collect();
                for (id, why) in expired {
                    self.remove_member(group, fx, &id, why);
                    any = true;
                    shrunk.push(group.id.clone());
                }
            }
            for id in shrunk {
                self.maybe_downgrade(groups, fx, &id);
            }
            any
        })
    }

    /// Whether a ConsumerGroupHeartbeat or a commit has anything to do with this group id:
    /// the group exists here as a consumer-protocol group.
    pub fn contains(&self, group_id: &str) -> bool {
        self.groups.lock_unpoisoned().contains_key(group_id)
    }

    /// Whether the group exists here with members.
    pub fn has_members(&self, group_id: &str) -> bool {
        self.groups.lock_unpoisoned().get(group_id).is_some_and(|g| !g.members.is_empty())
    }

    pub fn with_group<R>(&self, group_id: &str, f: impl FnOnce(&ConsumerGroup) -> R) -> Option<R> {
        self.groups.lock_unpoisoned().get(group_id).map(f)
    }

    /// The ids of the groups with members, whose committed offsets do not expire.
    pub fn list_with_members(&self) -> std::collections::HashSet<String> {
        self.groups.lock_unpoisoned().values().filter(|g| !g.members.is_empty()).map(|g| g.id.clone()).collect()
    }

    pub fn list(&self) -> Vec<(String, ConsumerGroupState)> {
        self.groups.lock_unpoisoned().values().map(|g| (g.id.clone(), g.state())).collect()
    }

    /// OffsetCommit's check for a group of this protocol (None: the group is not one). A
    /// commit without a member (epoch < 0, no id) is allowed while the group has no members;
    /// otherwise the member must exist and name its current epoch.
    pub fn validate_commit(&self, group_id: &str, member_id: &str, member_epoch: i32) -> Option<Result<(), i16>> {
        let groups = self.groups.lock_unpoisoned();
        let g = groups.get(group_id)?;
        if member_epoch < 0 && g.members.is_empty() {
            return Some(Ok(()));
        }
        Some(match g.members.get(member_id) {
            None => Err(ErrorCode::UnknownMemberId.code()),
            // A classic member commits with its generation, which is its member epoch.
            Some(m) if m.epoch != member_epoch && m.classic.is_some() => Err(ErrorCode::IllegalGeneration.code()),
            Some(m) if m.epoch != member_epoch => Err(ErrorCode::StaleMemberEpoch.code()),
            Some(_) => Ok(()),
        })
    }

    /// OffsetFetch's check (v9+): a request without a member id and epoch (admin tools) is
    /// allowed; one that names them must name a member at its current epoch.
    pub fn validate_fetch(&self, group_id: &str, member_id: Option<&str>, member_epoch: i32) -> Result<(), i16> {
        let groups = self.groups.lock_unpoisoned();
        let Some(g) = groups.get(group_id) else { return Ok(()) };
        let Some(member_id) = member_id.filter(|_| member_epoch >= 0) else { return Ok(()) };
        match g.members.get(member_id) {
            None => Err(ErrorCode::UnknownMemberId.code()),
            Some(m) if m.epoch != member_epoch => Err(ErrorCode::StaleMemberEpoch.code()),
            Some(_) => Ok(()),
        }
    }

    /// DeleteGroups: an Empty group goes, with a tombstone for each of its records.
    pub fn delete_group(&self, store: &dyn ConsumerStore, group_id: &str) -> Option<i16> {
        let code = self.step(|groups, fx| {
            let g = groups.get(group_id)?;
            if !g.members.is_empty() {
                return Some(ErrorCode::NonEmptyGroup.code());
            }
            let id = g.id.clone();
            fx.append(
                &id,
                vec![
                    ConsumerRecord::TargetMetadata { group: id.clone(), epoch: None },
                    ConsumerRecord::GroupMetadata { group: id.clone(), epoch: None },
                ],
            );
            groups.remove(group_id);
            Some(ErrorCode::None.code())
        });
        self.perform(store);
        code
    }

    // ---- loading with leadership of an offsets partition ----

    /// Applies one record read back from `__consumer_offsets`, in log order.
    pub fn replay(&self, record: ConsumerRecord) {
        let mut groups = self.groups.lock_unpoisoned();
        let now = Instant::now();
        let default_assignor = self.default_assignor().to_string();
        fn group<'a>(
            groups: &'a mut HashMap<String, ConsumerGroup>,
            id: &str,
            assignor: &str,
        ) -> &'a mut ConsumerGroup {
            groups.entry(id.to_string()).or_insert_with(|| ConsumerGroup::new(id, assignor))
        }
        match record {
            ConsumerRecord::GroupMetadata { group: id, epoch: Some(e) } => {
                group(&mut groups, &id, &default_assignor).epoch = e
            }
            ConsumerRecord::GroupMetadata { group: id, epoch: None } => {
                groups.remove(&id);
            }
            ConsumerRecord::TargetMetadata { group: id, epoch } => {
                group(&mut groups, &id, &default_assignor).assignment_epoch = epoch.unwrap_or(0)
            }
            ConsumerRecord::Member { group: id, member, value: Some(v) } => {
                let g = group(&mut groups, &id, &default_assignor);
                let m = g.members.entry(member.clone()).or_insert_with(|| ConsumerMember::new(&member, now));
                m.instance_id = v.instance_id;
                m.rack_id = v.rack_id;
                m.client_id = v.client_id;
                m.client_host = v.client_host;
                m.subscribed_topic_names = v.subscribed_topic_names;
                m.subscribed_topic_regex = v.subscribed_topic_regex;
                m.rebalance_timeout_ms = v.rebalance_timeout_ms;
                m.server_assignor = v.server_assignor;
                m.classic = v.classic;
            }
            ConsumerRecord::Member { group: id, member, value: None } => {
                if let Some(g) = groups.get_mut(&id) {
                    g.members.remove(&member);
                }
            }
            ConsumerRecord::TargetMember { group: id, member, value } => {
                let g = group(&mut groups, &id, &default_assignor);
                match value {
                    Some(a) => g.target.insert(member, a),
                    None => g.target.remove(&member),
                };
            }
            ConsumerRecord::Current { group: id, member, value: Some(c) } => {
                let g = group(&mut groups, &id, &default_assignor);
                let m = g.members.entry(member.clone()).or_insert_with(|| ConsumerMember::new(&member, now));
                m.epoch = c.member_epoch;
                m.previous_epoch = c.previous_member_epoch;
                m.state = MemberState::from_code(c.state);
                m.assigned = c.assigned;
                m.pending_revocation = c.pending_revocation;
            }
            ConsumerRecord::Current { .. } | ConsumerRecord::Ignored => {}
        }
    }

    /// After a replay: who owns what, fresh sessions (as Kafka starts each loaded member's
    /// session timer), the subscribed topics as they are now, and the mirror's marks. A topic
    /// that changed while no broker coordinated the group moves its epoch on the next
    /// heartbeat.
    pub fn finish_load(&self, store: &dyn ConsumerStore, loaded: impl Fn(&str) -> bool) {
        self.step(|groups, fx| {
            let now = Instant::now();
            for g in groups.values_mut().filter(|g| loaded(&g.id)) {
                g.rebuild_owners();
                for m in g.members.values_mut() {
                    m.last_heartbeat = now;
                    if m.state == MemberState::UnrevokedPartitions {
                        m.revocation_deadline = Some(now + rebalance_timeout(m));
                    }
                    fx.0.push((g.id.clone(), Effect::MemberJoined(m.registration())));
                }
                let assigned: usize = g.target.values().flat_map(|a| a.values()).map(BTreeSet::len).sum();
                g.subscribed_metadata = self.subscription_metadata(g);
                let expected: i32 = g.subscribed_metadata.values().map(|(_, n)| *n).sum();
                if !g.members.is_empty() && assigned != expected.max(0) as usize {
                    // Forces a new target on the next heartbeat.
                    g.subscribed_metadata.clear();
                }
                fx.0.push((g.id.clone(), Effect::OwnersChanged(g.owners_by_name(&*self.topics))));
            }
        });
        self.perform(store);
    }

    /// Forgets the groups `owned` selects (this broker no longer coordinates them).
    pub fn unload(&self, store: &dyn ConsumerStore, owned: impl Fn(&str) -> bool) -> usize {
        let n = self.step(|groups, fx| {
            let ids: Vec<String> = groups.keys().filter(|id| owned(id)).cloned().collect();
            for id in &ids {
                if let Some(g) = groups.remove(id) {
                    for m in g.members.keys() {
                        fx.0.push((id.clone(), Effect::MemberLeft(znode_member_id(m))));
                    }
                }
            }
            ids.len()
        });
        self.perform(store);
        n
    }
}

/// The id a v0 member that sent none is given: Kafka's Uuid.randomUuid().toString(), URL-safe
/// base64 of 16 random bytes that never starts with '-' (so it cannot pass for an option on a
/// command line), which is what the Admin client and the tools print.
fn new_member_id() -> String {
    use base64::Engine;
    loop {
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Uuid::new_v4().as_bytes());
        if !id.starts_with('-') {
            return id;
        }
    }
}
