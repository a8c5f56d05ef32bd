//! A classic group's members leaving for the consumer protocol's coordinator (online upgrade)
//! and coming back from it (online downgrade), as Kafka 4.x's `group.consumer.migration.policy`
//! allows. The consumer coordinator owns the other half; this side only hands members over.

use super::*;

/// A classic group's membership as it moves between the two coordinators.
#[derive(Debug, Clone)]
pub struct ClassicSnapshot {
    pub group: String,
    pub generation: i32,
    pub protocol_name: Option<String>,
    pub members: Vec<ClassicMemberSnapshot>,
}

#[derive(Debug, Clone)]
pub struct ClassicMemberSnapshot {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocols: Vec<(String, Bytes)>,
    /// The member's ConsumerProtocolAssignment, as SyncGroup handed it out.
    pub assignment: Bytes,
}

impl GroupCoordinator {
    /// Hands the members of a classic group to `adopt`, under this coordinator's lock so that
    /// no JoinGroup or Heartbeat sees the group half moved. None: the group has no members
    /// (nothing to convert). Err: why it may not convert; the group is then untouched.
    pub fn upgrade(
        &self,
        store: &dyn GroupStore,
        group_id: &str,
        adopt: impl FnOnce(ClassicSnapshot) -> Result<(), String>,
    ) -> Option<Result<(), String>> {
        self.step_and_perform(store, |groups, fx| {
            let group = groups.get_mut(group_id).filter(|g| !g.members.is_empty())?;
            // Only the consumer's embedded protocol says what each member subscribes to and owns.
            if group.protocol_type.as_deref() != Some("consumer")
                || group.members.values().any(|m| m.protocol_type != "consumer")
            {
                return Some(Err(format!(
                    "Cannot upgrade classic group {group_id} to consumer group because the group does not use the \
                     consumer embedded protocol."
                )));
            }
            let snapshot = ClassicSnapshot {
                group: group.id.clone(),
                generation: group.generation,
                protocol_name: group.protocol_name.clone(),
                members: group
                    .members
                    .values()
                    .map(|m| ClassicMemberSnapshot {
                        id: m.id.clone(),
                        instance_id: m.instance_id.clone(),
                        client_id: m.client_id.clone(),
                        client_host: m.client_host.clone(),
                        session_timeout_ms: m.session_timeout.as_millis().min(i32::MAX as u128) as i32,
                        rebalance_timeout_ms: m.rebalance_timeout.as_millis().min(i32::MAX as u128) as i32,
                        protocols: m.protocols.clone(),
                        assignment: m.assignment.clone(),
                    })
                    .collect(),
            };
            if let Err(e) = adopt(snapshot) {
                return Some(Err(e));
            }
            // Parked JoinGroup and SyncGroup calls rejoin, now into the consumer group.
            for m in group.members.values_mut() {
                if let Some(w) = m.join_waiter.take() {
                    let _ = w.send(JoinResult {
                        error_code: ErrorCode::RebalanceInProgress.code(),
                        member_id: m.id.clone(),
                        generation_id: -1,
                        ..Default::default()
                    });
                }
                if let Some(w) = m.sync_waiter.take() {
                    let _ =
                        w.send(SyncResult { error_code: ErrorCode::RebalanceInProgress.code(), ..Default::default() });
                }
            }
            // The members live on in the consumer group (and in the membership mirror under
            // the same ids); the committed offsets stay here, where they always are.
            group.members.clear();
            group.pending.clear();
            group.join_deadline = None;
            group.initial_delay_cap = None;
            group.protocol_name = None;
            group.leader = None;
            group.state = GroupState::Empty;
            group.empty_since_ms = Some(now_ms());
            // Kafka tombstones the classic group's record: the consumer group's records follow.
            let mut record = GroupRecord::of(group);
            record.state = GroupState::Dead;
            fx.store_record(record);
            Some(Ok(()))
        })
    }

    /// Takes back the classic members of a consumer group whose last consumer-protocol member
    /// left: a group of their generation that rebalances at once, so that each rejoins and the
    /// leader assigns again, as Kafka's downgrade does.
    pub fn downgrade(&self, store: &dyn GroupStore, snapshot: ClassicSnapshot) {
        self.step_and_perform(store, |groups, fx| {
            let now = Instant::now();
            let group = groups.entry(snapshot.group.clone()).or_insert_with(|| Group::new(&snapshot.group));
            group.members.clear();
            group.pending.clear();
            for m in snapshot.members {
                group.members.insert(
                    m.id.clone(),
                    Member {
                        id: m.id,
                        instance_id: m.instance_id,
                        client_id: m.client_id,
                        client_host: m.client_host,
                        session_timeout: Duration::from_millis(m.session_timeout_ms.max(0) as u64),
                        rebalance_timeout: Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64),
                        protocol_type: "consumer".to_string(),
                        protocols: m.protocols,
                        assignment: m.assignment,
                        last_heartbeat: now,
                        join_waiter: None,
                        sync_waiter: None,
                    },
                );
            }
            group.protocol_type = Some("consumer".to_string());
            group.generation = snapshot.generation;
            group.protocol_name = snapshot.protocol_name.or_else(|| group.select_protocol());
            group.leader = group.members.keys().next().cloned();
            group.state = GroupState::Stable;
            group.empty_since_ms = None;
            fx.store_group(group);
            fx.owners_changed(&group.id, owners_of(group));
            self.prepare_rebalance(group, now);
        });
    }
}
