//! What a coordinator step leaves to do once the `groups` lock is released (Kafka's
//! `CoordinatorResult`): records to append to `__consumer_offsets`, membership to mirror into
//! the znode tree, SyncGroup answers that follow the group's record.
//!
//! A step queues its effects while it still holds `groups`, on its group's stripe, so a
//! stripe's queue is in the order the state changed. Whoever performs a stripe performs every
//! effect queued on it, one at a time and in that order, holding only the stripe's turn: two
//! steps on one group reach the log in the order they were taken (Kafka's guarantee: a group's
//! records are appended in the order of its state changes), a slow append keeps only the
//! groups of its stripe waiting, and a step's caller knows its own effects are done when
//! [`GroupCoordinator::perform`] returns, whoever performed them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::{subscribed_topics, CommittedOffset, Group, GroupCoordinator, GroupState, GroupStore, Member};
use super::{SyncResult, TopicPartition};
use crate::sync::MutexExt;

/// How a queued offsets write ended: Ok with the offsets it removed from memory (expiry), or
/// the Kafka error code of the append. Set before [`GroupCoordinator::perform`] returns.
pub type Outcome = Arc<OnceLock<Result<usize, i16>>>;

pub enum Effect {
    /// Offsets (None: tombstone) to append; `then` says what memory learns once they are in
    /// the log, so that memory changes in the log's order too.
    StoreOffsets {
        offsets: Vec<(TopicPartition, Option<CommittedOffset>)>,
        then: AfterStore,
        outcome: Option<Outcome>,
    },
    StoreGroup(GroupRecord),
    MemberJoined(MemberRegistration),
    MemberLeft(String),
    OwnersChanged(Vec<(String, i32, String)>),
    /// SyncGroup answers, sent once the group's record before them is appended, as Kafka does.
    Answer(Vec<(oneshot::Sender<SyncResult>, SyncResult)>),
}

pub enum AfterStore {
    Nothing,
    /// OffsetCommit: the values become the group's committed offsets.
    Commit,
    /// OffsetDelete: the partitions leave the group.
    Delete,
    /// Expiry: each (partition, commit timestamp) leaves unless a newer commit replaced it; a
    /// group left Empty without offsets dies.
    Expire(Vec<(TopicPartition, i64)>),
}

/// The effects of one step, each with its group.
#[derive(Default)]
pub struct Effects(Vec<(String, Effect)>);

impl Effects {
    pub(super) fn store_group(&mut self, group: &Group) {
        self.0.push((group.id.clone(), Effect::StoreGroup(GroupRecord::of(group))));
    }

    pub(super) fn store_record(&mut self, record: GroupRecord) {
        self.0.push((record.id.clone(), Effect::StoreGroup(record)));
    }

    pub(super) fn store_offsets(
        &mut self,
        group: &str,
        offsets: Vec<(TopicPartition, Option<CommittedOffset>)>,
        then: AfterStore,
    ) -> Outcome {
        let outcome = Outcome::default();
        let effect = Effect::StoreOffsets { offsets, then, outcome: Some(outcome.clone()) };
        self.0.push((group.to_string(), effect));
        outcome
    }

    pub(super) fn member_joined(&mut self, group: &str, member: &Member) {
        self.0.push((group.to_string(), Effect::MemberJoined(MemberRegistration::of(member))));
    }

    pub(super) fn member_left(&mut self, group: &str, member_id: &str) {
        self.0.push((group.to_string(), Effect::MemberLeft(member_id.to_string())));
    }

    pub(super) fn owners_changed(&mut self, group: &str, owners: Vec<(String, i32, String)>) {
        self.0.push((group.to_string(), Effect::OwnersChanged(owners)));
    }

    pub(super) fn answer(&mut self, group: &str, answers: Vec<(oneshot::Sender<SyncResult>, SyncResult)>) {
        if !answers.is_empty() {
            self.0.push((group.to_string(), Effect::Answer(answers)));
        }
    }
}

/// A group's metadata record as it goes to `__consumer_offsets`: a copy taken under the lock.
#[derive(Debug, Clone)]
pub struct GroupRecord {
    pub id: String,
    /// Dead: the record is a tombstone.
    pub state: GroupState,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: Option<String>,
    pub current_state_timestamp: Option<i64>,
    pub members: Vec<MemberRecord>,
}

#[derive(Debug, Clone)]
pub struct MemberRecord {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    /// The member's metadata for the group's protocol.
    pub subscription: Bytes,
    pub assignment: Bytes,
}

impl GroupRecord {
    pub(super) fn of(group: &Group) -> GroupRecord {
        let protocol = group.protocol_name.as_deref();
        GroupRecord {
            id: group.id.clone(),
            state: group.state,
            generation: group.generation,
            protocol_type: group.protocol_type.clone(),
            protocol_name: group.protocol_name.clone(),
            leader: group.leader.clone(),
            current_state_timestamp: group.current_state_timestamp(),
            members: group
                .members
                .values()
                .map(|m| MemberRecord {
                    id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout.as_millis() as i32,
                    session_timeout_ms: m.session_timeout.as_millis() as i32,
                    subscription: m
                        .protocols
                        .iter()
                        .find(|(n, _)| Some(n.as_str()) == protocol)
                        .map(|(_, b)| b.clone())
                        .unwrap_or_default(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }
}

/// What `/consumers/<group>/ids/<member>` says of a member.
#[derive(Debug, Clone)]
pub struct MemberRegistration {
    pub id: String,
    pub client_id: String,
    pub client_host: String,
    pub topics: Vec<String>,
}

impl MemberRegistration {
    fn of(member: &Member) -> MemberRegistration {
        MemberRegistration {
            id: member.id.clone(),
            client_id: member.client_id.clone(),
            client_host: member.client_host.clone(),
            topics: subscribed_topics(member, None),
        }
    }
}

const STRIPES: usize = 64;

struct Stripe {
    queue: Mutex<VecDeque<(String, Effect)>>,
    /// Held by whoever performs this stripe's queue.
    turn: Mutex<()>,
}

pub(super) struct EffectQueue {
    stripes: Vec<Stripe>,
}

impl EffectQueue {
    pub(super) fn new() -> EffectQueue {
        EffectQueue {
            stripes: (0..STRIPES)
                .map(|_| Stripe { queue: Mutex::new(VecDeque::new()), turn: Mutex::new(()) })
                .collect(),
        }
    }

    fn stripe_of(group: &str) -> usize {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        group.hash(&mut h);
        (h.finish() as usize) % STRIPES
    }

    /// Queues a step's effects; the stripes that now have work. Called holding `groups`.
    pub(super) fn enqueue(&self, effects: Effects) -> Vec<usize> {
        let mut touched = Vec::new();
        for (group, effect) in effects.0 {
            let s = Self::stripe_of(&group);
            self.stripes[s].queue.lock_unpoisoned().push_back((group, effect));
            if !touched.contains(&s) {
                touched.push(s);
            }
        }
        touched
    }

    fn pop(&self, s: usize) -> Option<(String, Effect)> {
        self.stripes[s].queue.lock_unpoisoned().pop_front()
    }
}

impl GroupCoordinator {
    /// Performs everything queued on `stripes`, in order. Never called holding `groups`.
    pub fn perform(&self, store: &dyn GroupStore, stripes: &[usize]) {
        for &s in stripes {
            let _turn = self.effects.stripes[s].turn.lock_unpoisoned();
            while let Some((group, effect)) = self.effects.pop(s) {
                self.perform_one(store, &group, effect);
            }
        }
    }

    fn perform_one(&self, store: &dyn GroupStore, group: &str, effect: Effect) {
        match effect {
            Effect::StoreOffsets { offsets, then, outcome } => {
                let result =
                    store.store_offsets(group, &offsets).map(|()| self.after_store(store, group, offsets, then));
                if let Some(outcome) = outcome {
                    let _ = outcome.set(result);
                }
            }
            Effect::StoreGroup(record) => {
                if let Err(code) = store.store_group(&record) {
                    tracing::warn!(group, code, "could not persist group metadata");
                }
            }
            Effect::MemberJoined(member) => store.member_joined(group, &member),
            Effect::MemberLeft(member_id) => store.member_left(group, &member_id),
            Effect::OwnersChanged(owners) => store.owners_changed(group, &owners),
            Effect::Answer(answers) => {
                for (waiter, result) in answers {
                    let _ = waiter.send(result);
                }
            }
        }
    }

    /// Memory follows the log: runs on the stripe's turn, right after the append.
    fn after_store(
        &self,
        store: &dyn GroupStore,
        group_id: &str,
        offsets: Vec<(TopicPartition, Option<CommittedOffset>)>,
        then: AfterStore,
    ) -> usize {
        match then {
            AfterStore::Nothing => 0,
            AfterStore::Commit => {
                // The group may have been emptied, deleted or expired meanwhile; what is in the
                // log now ends with this commit, and so does what is kept here.
                let mut groups = self.lock();
                let group = groups.entry(group_id.to_string()).or_insert_with(|| Group::new(group_id));
                for (tp, v) in offsets {
                    if let Some(v) = v {
                        group.offsets.insert(tp, v);
                    }
                }
                0
            }
            AfterStore::Delete => {
                if let Some(group) = self.lock().get_mut(group_id) {
                    for (tp, _) in offsets {
                        group.offsets.remove(&tp);
                    }
                }
                0
            }
            AfterStore::Expire(doomed) => {
                let mut expired = 0;
                let dead = {
                    let mut groups = self.lock();
                    let Some(g) = groups.get_mut(group_id) else { return 0 };
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
                        let record = GroupRecord::of(g);
                        groups.remove(group_id);
                        Some(record)
                    } else {
                        None
                    }
                };
                // Still this stripe's turn: the tombstone follows the offsets' in the log.
                if let Some(record) = dead {
                    if let Err(code) = store.store_group(&record) {
                        tracing::warn!(group = %group_id, code, "could not write an expired group's tombstone");
                    }
                }
                expired
            }
        }
    }
}
