//! Members of a consumer group that speak the classic protocol, and the group's conversions
//! from and to a classic group, as Kafka 4.x runs them under `group.consumer.migration.policy`.
//!
//! A classic member counts like any other in the target assignment but moves towards its
//! target only when it rejoins: its Heartbeat answers REBALANCE_IN_PROGRESS when a rejoin is
//! due (Kafka's rule: its epoch is behind the group's, it has partitions to revoke, or the
//! partitions it waits for are free), its JoinGroup answers at once with its generation (its
//! member epoch), and SyncGroup hands out its reconciled partitions in the consumer protocol's
//! encoding. Nobody acts as leader: the coordinator assigns.

use bytes::{Buf, BufMut, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedPartitions;
use kafka_protocol::messages::{ConsumerProtocolAssignment, ConsumerProtocolSubscription, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use super::records::ClassicMemberMetadata;
use super::*;
use crate::group::coordinator::{ClassicMemberSnapshot, ClassicSnapshot, JoinRequest, JoinResult, SyncResult};

/// The protocol type of the consumer's embedded protocol, the only one a converted group speaks.
pub const CONSUMER_PROTOCOL_TYPE: &str = "consumer";

/// Topics by name with their partitions, as the embedded protocol names them.
type ByName = Vec<(String, Vec<i32>)>;

struct Subscription {
    topics: Vec<String>,
    owned: ByName,
}

/// The version prefix and the rest; the schemas read are clamped to the versions known.
fn versioned(bytes: &Bytes) -> Option<(i16, Bytes)> {
    if bytes.len() < 2 {
        return None;
    }
    let mut buf = bytes.clone();
    let version = buf.get_i16();
    Some((version.clamp(0, 3), buf))
}

fn decode_subscription(metadata: &Bytes) -> Option<Subscription> {
    let (version, mut buf) = versioned(metadata)?;
    let s = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ConsumerProtocolSubscription::decode(&mut buf, version)
    }))
    .ok()?
    .ok()?;
    Some(Subscription {
        topics: s.topics.iter().map(|t| t.to_string()).collect(),
        owned: s.owned_partitions.iter().map(|tp| (tp.topic.0.to_string(), tp.partitions.clone())).collect(),
    })
}

/// An empty assignment (a member that has not synced yet) is no partitions.
fn decode_assignment(bytes: &Bytes) -> Option<ByName> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let (version, mut buf) = versioned(bytes)?;
    let a = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ConsumerProtocolAssignment::decode(&mut buf, version)
    }))
    .ok()?
    .ok()?;
    Some(a.assigned_partitions.iter().map(|tp| (tp.topic.0.to_string(), tp.partitions.clone())).collect())
}

fn encode_assignment(parts: ByName) -> Bytes {
    let a = ConsumerProtocolAssignment::default().with_assigned_partitions(
        parts
            .into_iter()
            .map(|(t, ps)| {
                AssignedPartitions::default().with_topic(TopicName(StrBytes::from_string(t))).with_partitions(ps)
            })
            .collect(),
    );
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    match a.encode(&mut buf, 0) {
        Ok(()) => buf.freeze(),
        Err(_) => Bytes::new(),
    }
}

fn fail(code: ErrorCode, member_id: &str) -> JoinResult {
    JoinResult { error_code: code.code(), member_id: member_id.to_string(), generation_id: -1, ..Default::default() }
}

impl ConsumerGroupCoordinator {
    fn by_id(&self, parts: &ByName) -> Assignment {
        let mut a = Assignment::new();
        for (name, ps) in parts {
            if let Some((id, _)) = self.topics.topic(name) {
                a.entry(id).or_default().extend(ps.iter().copied());
            }
        }
        a.retain(|_, ps| !ps.is_empty());
        a
    }

    fn by_name(&self, a: &Assignment) -> ByName {
        a.iter().filter_map(|(id, ps)| Some((self.topics.name(*id)?, ps.iter().copied().collect()))).collect()
    }

    /// Online upgrade: the classic group's members become members of a consumer group at the
    /// classic generation, each keeping the partitions SyncGroup gave it (its current and its
    /// target assignment), so that the join that follows revokes only what must move. Runs
    /// under the classic coordinator's lock; Err leaves both sides as they were.
    pub fn adopt_classic(&self, snapshot: ClassicSnapshot) -> Result<(), String> {
        let group_id = snapshot.group.clone();
        if snapshot.members.len() > self.config.max_size {
            return Err(format!(
                "Cannot upgrade classic group {group_id} to consumer group because the group size exceeds the \
                 consumer group maximum size."
            ));
        }
        let malformed = || {
            format!(
                "Cannot upgrade classic group {group_id} to consumer group because the embedded consumer protocol \
                 is malformed."
            )
        };
        let mut decoded = Vec::new();
        for m in snapshot.members {
            let sub = m.protocols.first().and_then(|(_, md)| decode_subscription(md)).ok_or_else(malformed)?;
            let assigned = decode_assignment(&m.assignment).ok_or_else(malformed)?;
            decoded.push((m, sub, assigned));
        }
        self.step(|groups, fx| {
            if groups.get(&group_id).is_some_and(|g| !g.members.is_empty()) {
                return Err(format!("Group {group_id} is already a consumer group."));
            }
            let now = Instant::now();
            let epoch = snapshot.generation;
            let mut g = ConsumerGroup::new(&group_id, self.default_assignor());
            g.epoch = epoch;
            g.assignment_epoch = epoch;
            for (m, sub, assigned) in decoded {
                let mut cm = ConsumerMember::new(&m.id, now);
                cm.instance_id = m.instance_id;
                cm.client_id = m.client_id;
                cm.client_host = m.client_host;
                let mut names = sub.topics;
                names.sort();
                names.dedup();
                cm.subscribed_topic_names = names;
                cm.rebalance_timeout_ms = m.rebalance_timeout_ms;
                cm.classic =
                    Some(ClassicMemberMetadata { session_timeout_ms: m.session_timeout_ms, protocols: m.protocols });
                cm.epoch = epoch;
                cm.previous_epoch = epoch;
                cm.assigned = self.by_id(&assigned);
                g.target.insert(cm.id.clone(), cm.assigned.clone());
                g.members.insert(cm.id.clone(), cm);
            }
            g.rebuild_owners();
            g.subscribed_metadata = self.subscription_metadata(&g);
            let mut records: Vec<ConsumerRecord> = g
                .members
                .values()
                .map(|m| ConsumerRecord::Member {
                    group: g.id.clone(),
                    member: m.id.clone(),
                    value: Some(m.metadata()),
                })
                .collect();
            records.push(ConsumerRecord::GroupMetadata { group: g.id.clone(), epoch: Some(epoch) });
            records.extend(g.target.iter().map(|(member, a)| ConsumerRecord::TargetMember {
                group: g.id.clone(),
                member: member.clone(),
                value: Some(a.clone()),
            }));
            records.push(ConsumerRecord::TargetMetadata { group: g.id.clone(), epoch: Some(epoch) });
            records.extend(g.members.values().map(|m| ConsumerRecord::Current {
                group: g.id.clone(),
                member: m.id.clone(),
                value: Some(m.current()),
            }));
            fx.append(&g.id, records);
            for m in g.members.values() {
                fx.0.push((g.id.clone(), Effect::MemberJoined(m.registration())));
            }
            fx.0.push((g.id.clone(), Effect::OwnersChanged(g.owners_by_name(&*self.topics))));
            tracing::info!(group = %g.id, members = g.members.len(), "converted the classic group to a consumer group");
            groups.insert(group_id.clone(), g);
            Ok(())
        })
    }

    /// Online downgrade, once only classic members are left (Kafka checks it whenever members
    /// leave or are fenced): the group goes back to the classic coordinator at its epoch,
    /// with tombstones for every record of it here.
    pub(super) fn maybe_downgrade(&self, groups: &mut HashMap<String, ConsumerGroup>, fx: &mut Effects, id: &str) {
        if !self.config.migration.downgrade() {
            return;
        }
        let Some(g) = groups.get(id) else { return };
        if g.members.is_empty() || g.members.values().any(|m| m.classic.is_none()) {
            return;
        }
        let members = g
            .members
            .values()
            .map(|m| {
                let classic = m.classic.clone().unwrap_or_default();
                ClassicMemberSnapshot {
                    id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout_ms: classic.session_timeout_ms,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    protocols: classic.protocols,
                    assignment: encode_assignment(self.by_name(&m.assigned)),
                }
            })
            .collect();
        // The generation the members are at (the epoch before the leaver's removal moved the
        // group's): their heartbeats then hear REBALANCE_IN_PROGRESS, not ILLEGAL_GENERATION.
        let generation = g.members.values().map(|m| m.epoch).max().unwrap_or(g.epoch);
        let snapshot = ClassicSnapshot { group: g.id.clone(), generation, protocol_name: None, members };
        let mut tombstones = Vec::new();
        for m in g.members.keys() {
            let (group, member) = (g.id.clone(), m.clone());
            tombstones.push(ConsumerRecord::Current { group: group.clone(), member: member.clone(), value: None });
            tombstones.push(ConsumerRecord::TargetMember { group: group.clone(), member: member.clone(), value: None });
            tombstones.push(ConsumerRecord::Member { group, member, value: None });
        }
        tombstones.push(ConsumerRecord::TargetMetadata { group: g.id.clone(), epoch: None });
        tombstones.push(ConsumerRecord::GroupMetadata { group: g.id.clone(), epoch: None });
        tracing::info!(group = %id, members = g.members.len(), "converting the consumer group back to a classic group");
        // The classic coordinator takes the members before the tombstones are written, so
        // that their next requests find them there.
        fx.0.push((id.to_string(), Effect::Downgrade(snapshot)));
        fx.append(id, tombstones);
        groups.remove(id);
    }

    /// JoinGroup from a classic member of a consumer group that has members; None when the
    /// group is not one here (the classic coordinator answers).
    pub fn classic_join(&self, store: &dyn ConsumerStore, req: &JoinRequest) -> Option<JoinResult> {
        let outcome = Outcome::default();
        let result = self.step(|groups, fx| {
            let group = groups.get_mut(&req.group_id).filter(|g| !g.members.is_empty())?;
            let r = self.classic_join_locked(group, fx, req, Instant::now());
            if let Some((_, Effect::Append(_, o))) =
                fx.0.iter_mut().rev().find(|(_, e)| matches!(e, Effect::Append(..)))
            {
                *o = Some(outcome.clone());
            }
            Some(r)
        })?;
        self.perform(store);
        match outcome.get() {
            Some(Err(code)) => Some(JoinResult {
                error_code: *code,
                member_id: req.member_id.clone(),
                generation_id: -1,
                ..Default::default()
            }),
            _ => Some(result),
        }
    }

    fn classic_join_locked(
        &self,
        group: &mut ConsumerGroup,
        fx: &mut Effects,
        req: &JoinRequest,
        now: Instant,
    ) -> JoinResult {
        let Some(sub) = req
            .protocols
            .first()
            .filter(|_| req.protocol_type == CONSUMER_PROTOCOL_TYPE)
            .and_then(|(_, md)| decode_subscription(md))
        else {
            return fail(ErrorCode::InconsistentGroupProtocol, &req.member_id);
        };
        let mut member_id = req.member_id.clone();
        if member_id.is_empty() {
            member_id = format!("{}-{}", req.client_id, Uuid::new_v4());
            if req.require_known_member_id && req.instance_id.is_none() {
                return fail(ErrorCode::MemberIdRequired, &member_id);
            }
        }
        if let Some(instance) = req.instance_id.as_deref() {
            if let Some(old) = group.static_member(instance).filter(|o| *o != member_id).map(str::to_string) {
                if !req.member_id.is_empty() {
                    return fail(ErrorCode::FencedInstanceId, &req.member_id);
                }
                // A new instance of a static member takes its place.
                self.remove_member(group, fx, &old, "was replaced by a new instance of its static member");
            }
        }
        let before = match group.members.get(&member_id) {
            Some(m) if m.classic.is_none() => return fail(ErrorCode::UnknownMemberId, &req.member_id),
            Some(m) => Some(m.metadata()),
            None if group.members.len() >= self.config.max_size => {
                return fail(ErrorCode::GroupMaxSizeReached, &req.member_id)
            }
            // An id handed out with MEMBER_ID_REQUIRED is taken as new, as Kafka takes it.
            None => None,
        };
        let m = group.members.entry(member_id.clone()).or_insert_with(|| ConsumerMember::new(&member_id, now));
        m.last_heartbeat = now;
        m.client_id = req.client_id.clone();
        m.client_host = req.client_host.clone();
        m.instance_id = req.instance_id.clone();
        m.rebalance_timeout_ms = req.rebalance_timeout_ms;
        m.classic = Some(ClassicMemberMetadata {
            session_timeout_ms: req.session_timeout_ms,
            protocols: req.protocols.clone(),
        });
        let mut names = sub.topics;
        names.sort();
        names.dedup();
        let bump = before.as_ref().is_none_or(|b| b.subscribed_topic_names != names);
        m.subscribed_topic_names = names;
        let changed = before.as_ref() != Some(&m.metadata());
        self.member_updated(group, fx, &member_id, changed, bump, now);
        // A classic member owns at JoinGroup what its subscription lists (nothing after an
        // eager revocation): one step revokes what must move, and a second takes the new
        // epoch at once when none of that is still owned.
        let owned = self.by_id(&sub.owned);
        let first = reconcile(group, &member_id, Some(&owned), now);
        let second = reconcile(group, &member_id, Some(&owned), now);
        if first || second || before.is_none() {
            self.member_changed(group, fx, &member_id);
        }
        let Some(m) = group.members.get(&member_id) else { return fail(ErrorCode::UnknownMemberId, &member_id) };
        JoinResult {
            error_code: ErrorCode::None.code(),
            generation_id: m.epoch,
            protocol_type: Some(CONSUMER_PROTOCOL_TYPE.to_string()),
            protocol_name: req.protocols.first().map(|(n, _)| n.clone()),
            leader: String::new(),
            member_id,
            members: vec![],
        }
    }

    /// SyncGroup from a classic member: its reconciled partitions. None: not a group here.
    pub fn classic_sync(&self, group_id: &str, generation: i32, member_id: &str) -> Option<SyncResult> {
        let mut groups = self.groups.lock_unpoisoned();
        let g = groups.get_mut(group_id).filter(|g| !g.members.is_empty())?;
        let refused = |code: ErrorCode| Some(SyncResult { error_code: code.code(), ..Default::default() });
        let Some(m) = g.members.get_mut(member_id).filter(|m| m.classic.is_some()) else {
            return refused(ErrorCode::UnknownMemberId);
        };
        if generation != m.epoch {
            return refused(ErrorCode::IllegalGeneration);
        }
        m.last_heartbeat = Instant::now();
        let protocol = m.classic.as_ref().and_then(|c| c.protocols.first()).map(|(n, _)| n.clone());
        let assigned = m.assigned.clone();
        drop(groups);
        Some(SyncResult {
            error_code: ErrorCode::None.code(),
            protocol_type: Some(CONSUMER_PROTOCOL_TYPE.to_string()),
            protocol_name: protocol,
            assignment: encode_assignment(self.by_name(&assigned)),
        })
    }

    /// Heartbeat from a classic member: REBALANCE_IN_PROGRESS when it should rejoin to move
    /// towards its target. None: not a group here.
    pub fn classic_heartbeat(&self, group_id: &str, generation: i32, member_id: &str) -> Option<i16> {
        let mut groups = self.groups.lock_unpoisoned();
        let g = groups.get_mut(group_id).filter(|g| !g.members.is_empty())?;
        let Some(m) = g.members.get(member_id).filter(|m| m.classic.is_some()) else {
            return Some(ErrorCode::UnknownMemberId.code());
        };
        if generation != m.epoch {
            return Some(ErrorCode::IllegalGeneration.code());
        }
        let waiting = reconcile::difference(&g.target.get(member_id).cloned().unwrap_or_default(), &m.assigned);
        let all_free = waiting.iter().all(|(t, ps)| ps.iter().all(|p| !g.owners.contains_key(&(*t, *p))));
        let due = m.epoch < g.epoch
            || m.state == MemberState::UnrevokedPartitions
            || (m.state == MemberState::UnreleasedPartitions && all_free);
        if let Some(m) = g.members.get_mut(member_id) {
            m.last_heartbeat = Instant::now();
        }
        Some(if due { ErrorCode::RebalanceInProgress.code() } else { ErrorCode::None.code() })
    }

    /// LeaveGroup for classic members (by id, or by instance id for static ones); None: not a
    /// group here.
    pub fn classic_leave(
        &self,
        store: &dyn ConsumerStore,
        group_id: &str,
        members: &[(String, Option<String>)],
    ) -> Option<Vec<i16>> {
        let codes = self.step(|groups, fx| {
            let g = groups.get_mut(group_id).filter(|g| !g.members.is_empty())?;
            let mut codes = Vec::new();
            for (id, instance) in members {
                let id = match (id.is_empty(), instance.as_deref()) {
                    (true, Some(i)) => g.static_member(i).map(str::to_string),
                    _ => Some(id.clone()),
                };
                match id.filter(|id| g.members.get(id).is_some_and(|m| m.classic.is_some())) {
                    Some(id) => {
                        self.remove_member(g, fx, &id, "left the group");
                        codes.push(ErrorCode::None.code());
                    }
                    None => codes.push(ErrorCode::UnknownMemberId.code()),
                }
            }
            self.maybe_downgrade(groups, fx, group_id);
            Some(codes)
        });
        self.perform(store);
        codes
    }
}
