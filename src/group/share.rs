//! Share groups' membership (KIP-932): ShareGroupHeartbeat's state machine.
//!
//! A share group hands records, not partitions, to its members, so no partition is ever
//! revoked: every member is assigned every partition of the topics it subscribes to (the
//! share-partition leader decides which records each one gets). That leaves the new protocol's
//! epochs and nothing of its reconciliation: the group epoch grows whenever membership, a
//! subscription or the subscribed topics' partitions change, and each heartbeat brings the
//! member to it with its assignment.
//!
//! Membership is kept in memory on the coordinator (as Kafka's share groups keep theirs in
//! `__consumer_offsets`, which is phase 2 here); a coordinator move makes members rejoin.
//! Time is tokio's, so tests run session expiry under paused time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::consumer::{Assignment, TopicsView};
use super::coordinator::MemberRegistration;
pub use crate::config::ShareGroupConfig;
use crate::protocol::ErrorCode;
use crate::sync::MutexExt;

#[derive(Debug, Clone)]
pub struct ShareMember {
    pub id: String,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// Sorted and without duplicates, so that a reordered list is no change.
    pub subscribed_topic_names: Vec<String>,
    /// The epoch the member was last told; the group's may be ahead until it heartbeats.
    pub epoch: i32,
    /// The one before, accepted too: the answer that told the member `epoch` may be lost.
    previous_epoch: i32,
    pub assigned: Assignment,
    last_heartbeat: Instant,
}

#[derive(Debug, Clone)]
pub struct ShareGroup {
    pub id: String,
    pub epoch: i32,
    pub members: BTreeMap<String, ShareMember>,
    /// What the assignment was computed from: (topic, partition count) of every subscribed
    /// topic, so a topic created or grown later bumps the epoch.
    subscribed: BTreeMap<String, Option<i32>>,
}

impl ShareGroup {
    /// Kafka's ShareGroupState names.
    pub fn state_name(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else {
            "Stable"
        }
    }
}

/// A ShareGroupHeartbeat, as the handler decoded it.
#[derive(Debug, Clone, Default)]
pub struct ShareHeartbeatRequest {
    pub group_id: String,
    pub member_id: String,
    pub member_epoch: i32,
    pub rack_id: Option<String>,
    pub subscribed_topic_names: Option<Vec<String>>,
    pub client_id: String,
    pub client_host: String,
}

#[derive(Debug, Clone, Default)]
pub struct ShareHeartbeatResult {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub member_id: Option<String>,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// None: unchanged since the member was last told.
    pub assignment: Option<Assignment>,
}

impl ShareHeartbeatResult {
    fn error(code: ErrorCode, message: impl Into<String>) -> ShareHeartbeatResult {
        ShareHeartbeatResult {
            error_code: code.code(),
            error_message: Some(message.into()),
            member_epoch: -1,
            ..Default::default()
        }
    }
}

/// Kafka's checks of a heartbeat's fields: INVALID_REQUEST before any state is looked at.
fn malformed(req: &ShareHeartbeatRequest) -> Option<ShareHeartbeatResult> {
    let message = if req.member_id.is_empty() {
        "MemberId can't be empty."
    } else if req.member_epoch < -1 {
        "MemberEpoch is invalid."
    } else if req.member_epoch == 0 && req.subscribed_topic_names.as_ref().is_none_or(|t| t.is_empty()) {
        "SubscribedTopicNames must be set in first request."
    } else {
        return None;
    };
    Some(ShareHeartbeatResult::error(ErrorCode::InvalidRequest, message))
}

/// A membership change for the `/consumers/<group>/ids` mirror, performed once the lock is
/// released.
pub enum MirrorChange {
    Joined(String, MemberRegistration),
    Left(String, String),
}

pub struct ShareGroupCoordinator {
    config: ShareGroupConfig,
    topics: Arc<dyn TopicsView>,
    /// Each group's own session timeout and heartbeat interval.
    group_configs: Arc<super::configs::GroupConfigs>,
    groups: Mutex<HashMap<String, ShareGroup>>,
}

impl ShareGroupCoordinator {
    pub fn new(
        config: ShareGroupConfig,
        topics: Arc<dyn TopicsView>,
        group_configs: Arc<super::configs::GroupConfigs>,
    ) -> ShareGroupCoordinator {
        ShareGroupCoordinator { config, topics, group_configs, groups: Mutex::new(HashMap::new()) }
    }

    pub fn config(&self) -> &ShareGroupConfig {
        &self.config
    }

    pub fn has_members(&self, group_id: &str) -> bool {
        self.groups.lock_unpoisoned().get(group_id).is_some_and(|g| !g.members.is_empty())
    }

    pub fn exists(&self, group_id: &str) -> bool {
        self.groups.lock_unpoisoned().contains_key(group_id)
    }

    pub fn with_group<R>(&self, group_id: &str, f: impl FnOnce(&ShareGroup) -> R) -> Option<R> {
        self.groups.lock_unpoisoned().get(group_id).map(f)
    }

    pub fn list(&self) -> Vec<(String, &'static str)> {
        self.groups.lock_unpoisoned().values().map(|g| (g.id.clone(), g.state_name())).collect()
    }

    /// Whether `member_id` is a member of `group_id` here.
    pub fn is_member(&self, group_id: &str, member_id: &str) -> bool {
        self.groups.lock_unpoisoned().get(group_id).is_some_and(|g| g.members.contains_key(member_id))
    }

    pub fn heartbeat(&self, req: ShareHeartbeatRequest, changes: &mut Vec<MirrorChange>) -> ShareHeartbeatResult {
        let now = Instant::now();
        let mut groups = self.groups.lock_unpoisoned();
        if let Some(refused) = malformed(&req) {
            return refused;
        }
        if req.member_epoch == -1 {
            return self.leave(&mut groups, &req, changes);
        }
        let group = groups.entry(req.group_id.clone()).or_insert_with(|| ShareGroup {
            id: req.group_id.clone(),
            epoch: 0,
            members: BTreeMap::new(),
            subscribed: BTreeMap::new(),
        });
        let mut changed = false;
        match group.members.get(&req.member_id) {
            None if req.member_epoch != 0 => {
                return ShareHeartbeatResult::error(
                    ErrorCode::UnknownMemberId,
                    format!("Member {} is not a member of group {}.", req.member_id, req.group_id),
                );
            }
            None => {
                if group.members.len() >= self.config.max_size {
                    return ShareHeartbeatResult::error(
                        ErrorCode::GroupMaxSizeReached,
                        format!(
                            "The share group has reached its maximum capacity of {} members.",
                            self.config.max_size
                        ),
                    );
                }
                group.members.insert(
                    req.member_id.clone(),
                    ShareMember {
                        id: req.member_id.clone(),
                        rack_id: None,
                        client_id: String::new(),
                        client_host: String::new(),
                        subscribed_topic_names: Vec::new(),
                        epoch: 0,
                        previous_epoch: 0,
                        assigned: Assignment::new(),
                        last_heartbeat: now,
                    },
                );
                changed = true;
            }
            Some(m) if req.member_epoch != 0 && req.member_epoch != m.epoch && req.member_epoch != m.previous_epoch => {
                return ShareHeartbeatResult::error(
                    ErrorCode::FencedMemberEpoch,
                    format!("The share group member has epoch {} but {} was given.", m.epoch, req.member_epoch),
                );
            }
            Some(_) => {}
        }
        let Some(member) = group.members.get_mut(&req.member_id) else {
            return ShareHeartbeatResult::error(ErrorCode::UnknownMemberId, "member vanished");
        };
        member.last_heartbeat = now;
        member.rack_id = req.rack_id.clone().or(member.rack_id.take());
        member.client_id = req.client_id.clone();
        member.client_host = req.client_host.clone();
        if let Some(mut topics) = req.subscribed_topic_names.clone() {
            topics.sort();
            topics.dedup();
            if topics != member.subscribed_topic_names {
                member.subscribed_topic_names = topics;
                changed = true;
            }
        }
        let told_epoch = req.member_epoch;
        if changed {
            let m = &group.members[&req.member_id];
            changes.push(MirrorChange::Joined(
                req.group_id.clone(),
                MemberRegistration {
                    id: m.id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    topics: m.subscribed_topic_names.clone(),
                },
            ));
        }
        self.refresh(group, changed);
        let group_epoch = group.epoch;
        let Some(member) = group.members.get_mut(&req.member_id) else {
            return ShareHeartbeatResult::error(ErrorCode::UnknownMemberId, "member vanished");
        };
        if member.epoch != group_epoch {
            member.previous_epoch = member.epoch;
            member.epoch = group_epoch;
        }
        ShareHeartbeatResult {
            member_id: Some(member.id.clone()),
            member_epoch: member.epoch,
            heartbeat_interval_ms: self.group_configs.share(&req.group_id).heartbeat_interval_ms,
            assignment: (told_epoch != member.epoch).then(|| member.assigned.clone()),
            ..Default::default()
        }
    }

    /// A member leaving with epoch -1: the others' assignments stay what they were.
    fn leave(
        &self,
        groups: &mut HashMap<String, ShareGroup>,
        req: &ShareHeartbeatRequest,
        changes: &mut Vec<MirrorChange>,
    ) -> ShareHeartbeatResult {
        let left = groups.get_mut(&req.group_id).and_then(|g| g.members.remove(&req.member_id).map(|_| g));
        match left {
            Some(group) => {
                changes.push(MirrorChange::Left(req.group_id.clone(), req.member_id.clone()));
                self.refresh(group, true);
                ShareHeartbeatResult { member_id: Some(req.member_id.clone()), member_epoch: -1, ..Default::default() }
            }
            None => ShareHeartbeatResult::error(
                ErrorCode::UnknownMemberId,
                format!("Member {} is not a member of group {}.", req.member_id, req.group_id),
            ),
        }
    }

    /// Recomputes the assignment if membership changed or a subscribed topic appeared, went
    /// or changed its partition count, bumping the group epoch; every member then moves to it.
    fn refresh(&self, group: &mut ShareGroup, membership_changed: bool) {
        let subscribed: BTreeMap<String, Option<i32>> = group
            .members
            .values()
            .flat_map(|m| m.subscribed_topic_names.iter())
            .map(|t| (t.clone(), self.topics.topic(t).map(|(_, n)| n)))
            .collect();
        if !membership_changed && subscribed == group.subscribed {
            return;
        }
        group.subscribed = subscribed;
        group.epoch += 1;
        for m in group.members.values_mut() {
            let mut a = Assignment::new();
            for t in &m.subscribed_topic_names {
                if let Some((id, n)) = self.topics.topic(t) {
                    a.insert(id, (0..n).collect());
                }
            }
            m.assigned = a;
        }
    }

    /// Fences members whose session expired and notices topic changes; the mirror changes
    /// are the caller's to perform.
    pub fn tick(&self, changes: &mut Vec<MirrorChange>) {
        let now = Instant::now();
        let mut groups = self.groups.lock_unpoisoned();
        for group in groups.values_mut() {
            let session_ms = self.group_configs.share(&group.id).session_timeout_ms;
            let session = Duration::from_millis(session_ms.max(0) as u64);
            let expired: Vec<String> = group
                .members
                .values()
                .filter(|m| now.duration_since(m.last_heartbeat) > session)
                .map(|m| m.id.clone())
                .collect();
            for id in &expired {
                tracing::info!(group = %group.id, member = %id, "share group member's session expired");
                group.members.remove(id);
                changes.push(MirrorChange::Left(group.id.clone(), id.clone()));
            }
            self.refresh(group, !expired.is_empty());
        }
    }

    /// Forgets the groups of an `__consumer_offsets` partition this broker no longer leads.
    pub fn unload(&self, owned_elsewhere: impl Fn(&str) -> bool) {
        self.groups.lock_unpoisoned().retain(|id, _| !owned_elsewhere(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    struct OneTopic(Uuid);
    impl TopicsView for OneTopic {
        fn topic(&self, name: &str) -> Option<(Uuid, i32)> {
            (name == "t").then_some((self.0, 2))
        }
        fn name(&self, id: Uuid) -> Option<String> {
            (id == self.0).then(|| "t".to_string())
        }
        fn names(&self) -> Vec<String> {
            vec!["t".to_string()]
        }
    }

    fn hb(member: &str, epoch: i32, topics: Option<&[&str]>) -> ShareHeartbeatRequest {
        ShareHeartbeatRequest {
            group_id: "g".into(),
            member_id: member.into(),
            member_epoch: epoch,
            subscribed_topic_names: topics.map(|t| t.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn members_share_every_partition_and_expire() {
        let id = Uuid::new_v4();
        let c = ShareGroupCoordinator::new(
            ShareGroupConfig { enabled: true, ..Default::default() },
            Arc::new(OneTopic(id)),
            Arc::new(crate::group::configs::GroupConfigs::in_memory(ShareGroupConfig::default())),
        );
        let mut fx = Vec::new();
        let a = c.heartbeat(hb("a", 0, Some(&["t"])), &mut fx);
        assert_eq!((a.error_code, a.member_epoch), (0, 1));
        assert_eq!(a.assignment.unwrap()[&id].len(), 2);
        let b = c.heartbeat(hb("b", 0, Some(&["t"])), &mut fx);
        assert_eq!(b.member_epoch, 2);
        assert_eq!(b.assignment.unwrap()[&id].len(), 2, "partitions are shared, not split");
        // The group moved on with b's join: a learns the new epoch on its next heartbeat, and
        // an epoch it was never told is fenced.
        assert_eq!(c.heartbeat(hb("a", 7, None), &mut fx).error_code, ErrorCode::FencedMemberEpoch.code());
        assert_eq!(c.heartbeat(hb("a", 1, None), &mut fx).member_epoch, 2);
        assert_eq!(c.heartbeat(hb("a", 2, None), &mut fx).assignment, None);
        assert_eq!(c.heartbeat(hb("x", 3, None), &mut fx).error_code, ErrorCode::UnknownMemberId.code());
        assert_eq!(c.heartbeat(hb("", 0, Some(&["t"])), &mut fx).error_code, ErrorCode::InvalidRequest.code());
        tokio::time::advance(Duration::from_millis(46_000)).await;
        c.heartbeat(hb("b", 2, None), &mut fx);
        fx.clear();
        c.tick(&mut fx);
        assert!(matches!(&fx[..], [MirrorChange::Left(_, m)] if m == "a"));
        let left = c.heartbeat(hb("b", -1, None), &mut fx);
        assert_eq!((left.error_code, left.member_epoch), (0, -1));
        assert!(!c.has_members("g"));
    }
}
