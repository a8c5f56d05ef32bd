//! Static membership in the consumer protocol (KIP-848): a member with an instance id may
//! leave for a while (epoch -2) and keep its partitions until its session times out; a new
//! member with the same instance id then takes its place, partitions and target included,
//! without moving the group epoch. Kafka's rules: the instance id can be taken over only after
//! such a leave (UNRELEASED_INSTANCE_ID otherwise), and a member whose instance id now belongs
//! to another member id is fenced (FENCED_INSTANCE_ID).

use super::*;

/// The member epoch of a static member that left for now.
pub const LEAVE_STATIC_EPOCH: i32 = -2;

impl ConsumerGroup {
    /// The member id holding `instance_id`.
    pub fn static_member(&self, instance_id: &str) -> Option<&str> {
        self.members.values().find(|m| m.instance_id.as_deref() == Some(instance_id)).map(|m| m.id.as_str())
    }
}

/// Kafka's check for a heartbeat (or leave) of a static member that already joined: its
/// instance id must be known, and held by the member id it sends.
pub(super) fn check_static_member(
    group: &ConsumerGroup,
    instance_id: &str,
    member_id: &str,
) -> Result<(), HeartbeatResult> {
    match group.static_member(instance_id) {
        None => {
            Err(HeartbeatResult::error(ErrorCode::UnknownMemberId, format!("Instance id {instance_id} is unknown.")))
        }
        Some(holder) if holder != member_id => Err(HeartbeatResult::error(
            ErrorCode::FencedInstanceId,
            format!("Static member {member_id} with instance id {instance_id} is fenced by existing member {holder}."),
        )),
        Some(_) => Ok(()),
    }
}

impl ConsumerGroupCoordinator {
    /// Epoch -2: the member stays, with what it was assigned, until it rejoins or its session
    /// (which keeps running from its last heartbeat) expires. What it was still to revoke is
    /// free at once: it will not report revoking it.
    pub(super) fn leave_static(&self, group: &mut ConsumerGroup, fx: &mut Effects, member_id: &str) {
        let Some(m) = group.members.get_mut(member_id) else { return };
        tracing::info!(group = %group.id, member = %member_id, "static consumer group member left for now");
        m.previous_epoch = m.epoch;
        m.epoch = LEAVE_STATIC_EPOCH;
        m.pending_revocation.clear();
        m.revocation_deadline = None;
        group.rebuild_owners();
        self.member_changed(group, fx, member_id);
    }

    /// A member joining (epoch 0) with the instance id of `old`, which left with epoch -2:
    /// it becomes that member under its own id, at epoch 0, with the same partitions and
    /// target. Records: the old member's tombstones, then the new one's.
    pub(super) fn replace_static(
        &self,
        group: &mut ConsumerGroup,
        fx: &mut Effects,
        old: &str,
        req: &HeartbeatRequest,
        member_id: &str,
    ) -> Result<(), HeartbeatResult> {
        let Some(previous) = group.members.get(old) else { return Ok(()) };
        if previous.epoch != LEAVE_STATIC_EPOCH {
            return Err(HeartbeatResult::error(
                ErrorCode::UnreleasedInstanceId,
                format!(
                    "Static member {member_id} with instance id {} cannot join the group {} since the instance id \
                     has not been released.",
                    req.instance_id.as_deref().unwrap_or_default(),
                    group.id
                ),
            ));
        }
        let Some(mut m) = group.members.remove(old) else { return Ok(()) };
        tracing::info!(group = %group.id, old = %old, new = %member_id, "static consumer group member replaced");
        m.id = member_id.to_string();
        m.epoch = 0;
        m.previous_epoch = 0;
        m.client_id = req.client_id.clone();
        m.client_host = req.client_host.clone();
        m.last_heartbeat = Instant::now();
        let target = group.target.remove(old);
        let g = group.id.clone();
        let mut records = vec![
            ConsumerRecord::Current { group: g.clone(), member: old.to_string(), value: None },
            ConsumerRecord::TargetMember { group: g.clone(), member: old.to_string(), value: None },
            ConsumerRecord::Member { group: g.clone(), member: old.to_string(), value: None },
            ConsumerRecord::Member { group: g.clone(), member: member_id.to_string(), value: Some(m.metadata()) },
        ];
        if let Some(t) = &target {
            records.push(ConsumerRecord::TargetMember {
                group: g.clone(),
                member: member_id.to_string(),
                value: Some(t.clone()),
            });
            group.target.insert(member_id.to_string(), t.clone());
        }
        records.push(ConsumerRecord::Current {
            group: g.clone(),
            member: member_id.to_string(),
            value: Some(m.current()),
        });
        fx.append(&g, records);
        fx.0.push((g.clone(), Effect::MemberLeft(znode_member_id(old))));
        fx.0.push((g.clone(), Effect::MemberJoined(m.registration())));
        group.members.insert(member_id.to_string(), m);
        group.rebuild_owners();
        fx.0.push((g, Effect::OwnersChanged(group.owners_by_name(&*self.topics))));
        Ok(())
    }
}
