//! Committed offsets: OffsetCommit, OffsetFetch, OffsetDelete, DeleteGroups, expiry, deleted
//! partitions, and the offsets transactions hold until their markers.

use super::*;

impl GroupCoordinator {
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

    pub fn commit_offsets(
        &self,
        store: &dyn GroupStore,
        group_id: &str,
        generation: i32,
        member_id: &str,
        offsets: Vec<OffsetToCommit>,
    ) -> Vec<(TopicPartition, i16)> {
        let (results, stored) = self.step_and_perform(store, |groups, fx| {
            let all = |code: i16| (offsets.iter().map(|(tp, ..)| (tp.clone(), code)).collect::<Vec<_>>(), None);
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
                let Some(member) = group.members.get_mut(member_id) else {
                    return all(ErrorCode::UnknownMemberId.code());
                };
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
            // Memory takes the commit once it is in the log (see `AfterStore::Commit`).
            let stored = (!to_store.is_empty()).then(|| fx.store_offsets(group_id, to_store, AfterStore::Commit));
            (results, stored)
        });
        match stored.map(|o| outcome(&o)) {
            Some(Err(code)) => {
                results.into_iter().map(|(tp, c)| (tp, if c == ErrorCode::None.code() { code } else { c })).collect()
            }
            _ => results,
        }
    }

    /// Kafka's offsets expiry (2.1+, KIP-211): the offsets of an Empty group expire
    /// `retention_ms` after it became Empty (after their commit where that time is unknown, and
    /// always after their commit for a group that never had members). Expired offsets get
    /// tombstones in `__consumer_offsets`; a group left with none is removed (group tombstone).
    /// The log writes happen without the coordinator lock. Returns the offsets expired.
    pub fn expire_offsets(&self, store: &dyn GroupStore, now: i64, retention_ms: i64) -> usize {
        self.expire_offsets_except(store, now, retention_ms, &std::collections::HashSet::new())
    }

    /// [`Self::expire_offsets`], leaving alone the groups in `live`: consumer-protocol groups
    /// with members, whose offsets sit here in a group with no classic members.
    pub fn expire_offsets_except(
        &self,
        store: &dyn GroupStore,
        now: i64,
        retention_ms: i64,
        live: &std::collections::HashSet<String>,
    ) -> usize {
        type Doomed = Vec<((String, i32), i64)>;
        let (queued, stripes) = self.step(|groups, fx| {
            groups
                .values()
                .filter(|g| g.state == GroupState::Empty && g.members.is_empty() && !live.contains(&g.id))
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
                    if doomed.is_empty() {
                        return None;
                    }
                    let tombstones = doomed.iter().map(|(tp, _)| (tp.clone(), None)).collect();
                    // Memory loses them once their tombstones are in the log, unless a commit
                    // replaced them meanwhile (see `AfterStore::Expire`).
                    Some((g.id.clone(), fx.store_offsets(&g.id, tombstones, AfterStore::Expire(doomed))))
                })
                .collect::<Vec<_>>()
        });
        self.perform(store, &stripes);
        let mut expired = 0;
        for (group_id, queued) in queued {
            match outcome(&queued) {
                Ok(n) => expired += n,
                Err(code) => {
                    tracing::warn!(group = %group_id, error_code = code, "could not write expired offsets' tombstones")
                }
            }
        }
        expired
    }

    /// Kafka's `onPartitionsDeleted`: the committed offsets of deleted partitions leave every
    /// group here, with tombstones in `__consumer_offsets` so that they stay gone after a
    /// reload; a group left Empty without offsets is removed (group tombstone). Offsets leave
    /// memory under the lock (a join meanwhile starts a new group, as in Kafka) and their
    /// tombstones follow in the group's order. Returns the offsets removed.
    pub fn on_partitions_deleted(&self, store: &dyn GroupStore, deleted: &[TopicPartition]) -> usize {
        if deleted.is_empty() {
            return 0;
        }
        let deleted: std::collections::HashSet<&TopicPartition> = deleted.iter().collect();
        let (queued, stripes) = self.step(|groups, fx| {
            let affected: Vec<String> = groups
                .values()
                .filter(|g| g.offsets.keys().any(|tp| deleted.contains(tp)))
                .map(|g| g.id.clone())
                .collect();
            let mut queued = Vec::new();
            for group_id in affected {
                let Some(g) = groups.get_mut(&group_id) else { continue };
                let doomed: Vec<TopicPartition> = g.offsets.keys().filter(|tp| deleted.contains(tp)).cloned().collect();
                for tp in &doomed {
                    g.offsets.remove(tp);
                }
                let count = doomed.len();
                tracing::info!(group = %group_id, offsets = count, "removed offsets of deleted partitions");
                let tombstones = doomed.into_iter().map(|tp| (tp, None)).collect();
                queued.push((group_id.clone(), count, fx.store_offsets(&group_id, tombstones, AfterStore::Nothing)));
                if g.offsets.is_empty() && g.state == GroupState::Empty && g.members.is_empty() {
                    let mut dead = Group::new(&group_id);
                    dead.state = GroupState::Dead;
                    fx.store_group(&dead);
                    groups.remove(&group_id);
                }
            }
            queued
        });
        self.perform(store, &stripes);
        let mut removed = 0;
        for (group_id, count, queued) in queued {
            removed += count;
            // As in Kafka, a tombstone that cannot be written is not retried: this broker no
            // longer coordinates the group, and its new coordinator loads what the log says.
            if let Err(code) = outcome(&queued) {
                tracing::warn!(group = %group_id, error_code = code, "could not write deleted partitions' offset tombstones");
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
        let (results, stored) = self.step_and_perform(store, |groups, fx| {
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
            let stored = (!tombstones.is_empty()).then(|| fx.store_offsets(group_id, tombstones, AfterStore::Delete));
            Ok((results, stored))
        })?;
        if let Some(stored) = stored {
            outcome(&stored)?;
        }
        Ok(results)
    }

    /// DeleteGroups for one group. As in Kafka the group is Dead and gone from memory at once
    /// (a join meanwhile starts a new group); its tombstones follow in the group's order.
    pub fn delete_group(&self, store: &dyn GroupStore, group_id: &str) -> i16 {
        let stored = self.step_and_perform(store, |groups, fx| {
            let Some(group) = groups.get_mut(group_id) else { return Err(ErrorCode::GroupIdNotFound.code()) };
            if group.state != GroupState::Empty {
                return Err(ErrorCode::NonEmptyGroup.code());
            }
            let tombstones: Vec<((String, i32), Option<CommittedOffset>)> =
                group.offsets.keys().map(|tp| (tp.clone(), None)).collect();
            let stored = (!tombstones.is_empty()).then(|| fx.store_offsets(group_id, tombstones, AfterStore::Nothing));
            group.state = GroupState::Dead;
            fx.store_group(group);
            groups.remove(group_id);
            Ok(stored)
        });
        match stored {
            Err(code) => code,
            Ok(Some(stored)) => outcome(&stored).err().unwrap_or(ErrorCode::None.code()),
            Ok(None) => ErrorCode::None.code(),
        }
    }
}

/// What a queued write came to; [`GroupCoordinator::perform`] of its stripe has returned, so it
/// is set (unset would be a bug: reported as the coordinator being unavailable, not a panic).
fn outcome(o: &super::effects::Outcome) -> Result<usize, i16> {
    o.get().copied().unwrap_or(Err(ErrorCode::CoordinatorNotAvailable.code()))
}
