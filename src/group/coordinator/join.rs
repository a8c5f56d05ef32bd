//! JoinGroup and the join phase of a rebalance: new, returning and static members, the
//! initial delay, and the end of the phase that starts a generation.

use super::*;

impl GroupCoordinator {
    pub async fn join(&self, store: &dyn GroupStore, req: JoinRequest) -> JoinResult {
        let rx = match self.step_and_perform(store, |groups, fx| self.join_locked(groups, fx, req)) {
            Ok(result) => return result,
            Err(rx) => rx,
        };
        rx.await.unwrap_or_else(|_| JoinResult { error_code: ErrorCode::UnknownMemberId.code(), ..Default::default() })
    }

    pub(super) fn join_locked(
        &self,
        groups: &mut HashMap<String, Group>,
        fx: &mut Effects,
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
                    return self.replace_static_member(fx, group, &old, new_id, req);
                }
                return self.add_member_and_rebalance(fx, group, new_id, req, now);
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
            return self.add_member_and_rebalance(fx, group, new_id, req, now);
        }

        if group.pending.remove(&req.member_id).is_some() {
            let id = req.member_id.clone();
            return self.add_member_and_rebalance(fx, group, id, req, now);
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
        self.maybe_complete_join(fx, group, now);
        Err(rx)
    }

    fn add_member_and_rebalance(
        &self,
        fx: &mut Effects,
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
        fx.member_joined(&group.id, &member);
        group.members.insert(id, member);
        if group.state == GroupState::PreparingRebalance {
            // Each new member during the initial delay pushes it out again, up to its cap.
            if let (Some(cap), Some(_)) = (group.initial_delay_cap, group.join_deadline) {
                group.join_deadline = Some((now + self.config.initial_rebalance_delay).min(cap));
            }
        } else {
            self.prepare_rebalance(group, now);
        }
        self.maybe_complete_join(fx, group, now);
        Err(rx)
    }

    fn replace_static_member(
        &self,
        fx: &mut Effects,
        group: &mut Group,
        old_id: &str,
        new_id: String,
        req: JoinRequest,
    ) -> Result<JoinResult, oneshot::Receiver<JoinResult>> {
        let Some(mut member) = group.members.remove(old_id) else {
            return Ok(JoinResult { error_code: ErrorCode::UnknownMemberId.code(), ..Default::default() });
        };
        fx.member_left(&group.id, old_id);
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
        fx.member_joined(&group.id, &member);
        group.members.insert(new_id.clone(), member);
        if group.state == GroupState::Stable && unchanged {
            // A static member restarting within its session keeps its assignment: no rebalance.
            fx.owners_changed(&group.id, owners_of(group));
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
        self.maybe_complete_join(fx, group, now);
        Err(rx)
    }

    pub(super) fn prepare_rebalance(&self, group: &mut Group, now: Instant) {
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

    pub(super) fn maybe_complete_join(&self, fx: &mut Effects, group: &mut Group, now: Instant) {
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
            fx.member_left(&group.id, &id);
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
            fx.store_group(group);
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
}
