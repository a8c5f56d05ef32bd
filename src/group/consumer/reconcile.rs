//! Moving a member towards its target (Kafka's CurrentAssignmentBuilder), and the set
//! arithmetic on assignments it needs.

use super::*;

pub(super) fn rebalance_timeout(m: &ConsumerMember) -> Duration {
    Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64)
}

pub(super) fn is_subset(a: &Assignment, b: &Assignment) -> bool {
    a.iter().all(|(t, ps)| ps.is_empty() || b.get(t).is_some_and(|bs| ps.is_subset(bs)))
}

pub(super) fn intersects(a: &Assignment, b: &Assignment) -> bool {
    a.iter().any(|(t, ps)| b.get(t).is_some_and(|bs| !ps.is_disjoint(bs)))
}

pub(super) fn intersection(a: &Assignment, b: &Assignment) -> Assignment {
    a.iter()
        .filter_map(|(t, ps)| {
            let common: BTreeSet<i32> = ps.intersection(b.get(t)?).copied().collect();
            (!common.is_empty()).then_some((*t, common))
        })
        .collect()
}

pub(super) fn difference(a: &Assignment, b: &Assignment) -> Assignment {
    a.iter()
        .filter_map(|(t, ps)| {
            let rest: BTreeSet<i32> = match b.get(t) {
                Some(bs) => ps.difference(bs).copied().collect(),
                None => ps.clone(),
            };
            (!rest.is_empty()).then_some((*t, rest))
        })
        .collect()
}

/// Moves a member one step towards its target (Kafka's CurrentAssignmentBuilder): first it
/// revokes what it must give up, keeping its epoch; once it reports them gone (`owned` no
/// longer names them) it takes the assignment epoch and those of its new partitions nobody
/// holds, the rest following on later heartbeats as their owners release them. Returns
/// whether anything changed.
pub(crate) fn reconcile(group: &mut ConsumerGroup, member_id: &str, owned: Option<&Assignment>, now: Instant) -> bool {
    let target = group.target.get(member_id).cloned().unwrap_or_default();
    let epoch = group.assignment_epoch;
    let Some(m) = group.members.get(member_id) else { return false };
    match m.state {
        MemberState::Stable if m.epoch == epoch => return false,
        // Without a list of owned partitions the member has not said it let go of any.
        MemberState::UnrevokedPartitions if owned.is_none_or(|o| intersects(o, &m.pending_revocation)) => return false,
        _ => {}
    }
    let before = (m.epoch, m.state, m.assigned.clone(), m.pending_revocation.clone());
    let kept = intersection(&m.assigned, &target);
    let revoke = difference(&m.assigned, &target);
    let released: Vec<(Uuid, i32)> =
        m.pending_revocation.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p))).collect();
    for tp in released {
        if group.owners.get(&tp).is_some_and(|o| o == member_id) {
            group.owners.remove(&tp);
        }
    }
    let (new_epoch, state, assigned, pending) = if !revoke.is_empty() {
        (m.epoch, MemberState::UnrevokedPartitions, kept, revoke)
    } else {
        let wanted = difference(&target, &kept);
        let mut assigned = kept;
        let mut unreleased = false;
        for (t, ps) in &wanted {
            for p in ps {
                if group.owners.get(&(*t, *p)).is_none_or(|o| o == member_id) {
                    assigned.entry(*t).or_default().insert(*p);
                } else {
                    unreleased = true;
                }
            }
        }
        let state = if unreleased { MemberState::UnreleasedPartitions } else { MemberState::Stable };
        (epoch, state, assigned, Assignment::new())
    };
    for (t, ps) in assigned.iter().chain(pending.iter()) {
        for p in ps {
            group.owners.insert((*t, *p), member_id.to_string());
        }
    }
    let Some(m) = group.members.get_mut(member_id) else { return false };
    if new_epoch != m.epoch {
        m.previous_epoch = m.epoch;
        m.epoch = new_epoch;
    }
    m.revocation_deadline = match state {
        MemberState::UnrevokedPartitions if pending == before.3 => m.revocation_deadline,
        MemberState::UnrevokedPartitions => Some(now + rebalance_timeout(m)),
        _ => None,
    };
    m.state = state;
    m.assigned = assigned;
    m.pending_revocation = pending;
    let after = (m.epoch, m.state, m.assigned.clone(), m.pending_revocation.clone());
    before != after
}
