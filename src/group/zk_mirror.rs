//! The group coordinator's copies in ZooKeeper, written off the request path.
//!
//! * Committed offsets, in the old offsets tree `/consumers/<group>/offsets/<topic>/<partition>`
//!   (one decimal znode per partition), where the tools of ZooKeeper-era clusters read them:
//!   Burrow's `kafka_zk` module, CMAK, old offset checkers. `__consumer_offsets` stays the
//!   source of truth; the copy may lag by an interval. A background pass writes what commits
//!   marked once per interval, at most `max_writes` znodes per pass, so ZooKeeper's load is
//!   bounded by the configuration, never by how often groups commit.
//! * Membership, `/consumers/<group>/ids/<member>` and `/consumers/<group>/owners/...`, as the
//!   seed's layout has it: written as soon as possible, but never by the coordinator itself,
//!   which holds the lock every group request waits for; a stalled ZooKeeper must not stall
//!   heartbeats and joins.
//!
//! Both only mark what changed (latest wins per znode, no I/O) and are bounded by the number of
//! live partitions, members and groups, however long ZooKeeper is away.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use serde_json::json;

use super::coordinator::MemberRegistration;
use super::service::GroupCoordinatorService;
use crate::sync::MutexExt;

/// Where an old consumer (and Kafka 3.9's OffsetCommit v0) keeps a partition's offset.
pub fn offset_path(group: &str, topic: &str, partition: i32) -> String {
    format!("/consumers/{group}/offsets/{topic}/{partition}")
}

/// A name that is one znode: anything else would write elsewhere in the tree.
pub fn is_znode_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
}

/// A member id as `/consumers/<group>/ids` and `owners` name it: a client chooses the id, or
/// its prefix (the classic protocol's is the client id), and a '/' cannot be in a znode name.
/// It is written as '_', base64url's letter for it (Kafka's own KIP-848 ids are base64url).
pub fn znode_member_id(id: &str) -> String {
    match id.replace('/', "_") {
        s if s.is_empty() || s == "." || s == ".." => format!("_{s}"),
        s => s,
    }
}

/// Latest value per key, waiting to be written.
struct Pending<K, V>(Mutex<HashMap<K, V>>);

impl<K: Eq + Hash + Clone, V> Default for Pending<K, V> {
    fn default() -> Self {
        Pending(Mutex::new(HashMap::new()))
    }
}

impl<K: Eq + Hash + Clone, V> Pending<K, V> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, V>> {
        self.0.lock_unpoisoned()
    }

    fn insert(&self, k: K, v: V) {
        self.lock().insert(k, v);
    }

    fn take(&self, max: usize) -> Vec<(K, V)> {
        let mut pending = self.lock();
        if pending.len() <= max {
            return pending.drain().collect();
        }
        let keys: Vec<K> = pending.keys().take(max).cloned().collect();
        keys.into_iter().filter_map(|k| pending.remove_entry(&k)).collect()
    }

    /// Puts back what a failed pass took, unless a newer value was marked meanwhile.
    fn requeue(&self, entries: Vec<(K, V)>) {
        let mut pending = self.lock();
        for (k, v) in entries {
            pending.entry(k).or_insert(v);
        }
    }

    fn len(&self) -> usize {
        self.lock().len()
    }
}

type OffsetKey = (String, String, i32);

/// Committed offsets waiting to be copied: the latest per (group, topic, partition), None for
/// an offset that was deleted.
pub struct OffsetMirror {
    enabled: bool,
    pending: Pending<OffsetKey, Option<i64>>,
}

impl OffsetMirror {
    pub fn new(enabled: bool) -> OffsetMirror {
        OffsetMirror { enabled, pending: Pending::default() }
    }

    pub fn record(&self, group: &str, topic: &str, partition: i32, offset: Option<i64>) {
        if !self.enabled || !is_znode_name(group) || !is_znode_name(topic) {
            return;
        }
        self.pending.insert((group.to_string(), topic.to_string(), partition), offset);
    }

    fn take(&self, max: usize) -> Vec<(OffsetKey, Option<i64>)> {
        self.pending.take(max)
    }

    fn requeue(&self, entries: Vec<(OffsetKey, Option<i64>)>) {
        self.pending.requeue(entries)
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum MembershipKey {
    Member { group: String, member: String },
    Owners { group: String },
}

#[derive(Debug)]
enum MembershipWrite {
    /// The member's registration JSON, as Kafka's old consumers wrote it.
    Joined(String),
    Left,
    Owners(Vec<(String, i32, String)>),
}

/// Membership changes waiting to be written, and the wake-up of the task that writes them.
#[derive(Default)]
pub struct MembershipMirror {
    pending: Pending<MembershipKey, MembershipWrite>,
    wake: tokio::sync::Notify,
}

impl MembershipMirror {
    pub fn member_joined(&self, group: &str, member: &MemberRegistration) {
        let topics: std::collections::BTreeMap<String, i32> = member.topics.iter().map(|t| (t.clone(), 1)).collect();
        let data = json!({
            "version": 1,
            "subscription": topics,
            "pattern": "static",
            "timestamp": crate::log::now_ms().to_string(),
            "client_id": member.client_id,
            "host": member.client_host,
        })
        .to_string();
        self.mark(
            MembershipKey::Member { group: group.into(), member: znode_member_id(&member.id) },
            MembershipWrite::Joined(data),
        );
    }

    pub fn member_left(&self, group: &str, member_id: &str) {
        let member = znode_member_id(member_id);
        self.mark(MembershipKey::Member { group: group.into(), member }, MembershipWrite::Left);
    }

    pub fn owners_changed(&self, group: &str, owners: &[(String, i32, String)]) {
        let owners = owners.iter().map(|(t, p, m)| (t.clone(), *p, znode_member_id(m))).collect();
        self.mark(MembershipKey::Owners { group: group.into() }, MembershipWrite::Owners(owners));
    }

    fn mark(&self, key: MembershipKey, write: MembershipWrite) {
        // A group named with a '/' would land in another group's subtree: it is not mirrored,
        // as its offsets are not.
        let (MembershipKey::Member { group, .. } | MembershipKey::Owners { group }) = &key;
        if !is_znode_name(group) {
            return;
        }
        self.pending.insert(key, write);
        self.wake.notify_one();
    }
}

/// Copies marked offsets into ZooKeeper every interval (ZooKeeper mode only).
pub(super) fn spawn_offsets_mirror(service: Arc<GroupCoordinatorService>) {
    let (_, interval, max) = service.offsets_mirror();
    let Some(interval) = interval else { return };
    if !service.znodes().is_zookeeper() {
        return;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let batch = service.offsets_mirror().0.take(max);
            if batch.is_empty() {
                continue;
            }
            // ZooKeeper calls block their thread.
            let s = service.clone();
            let _ = tokio::task::spawn_blocking(move || write_offsets_to_zk(&s, batch)).await;
        }
    });
}

fn write_offsets_to_zk(service: &GroupCoordinatorService, batch: Vec<(OffsetKey, Option<i64>)>) {
    let store = service.znodes();
    let writes: Vec<(String, String)> =
        batch.iter().filter_map(|((g, t, p), o)| o.map(|o| (offset_path(g, t, *p), o.to_string()))).collect();
    let mut result = store.upsert_many(&writes);
    for ((g, t, p), _) in batch.iter().filter(|(_, o)| o.is_none()) {
        if result.is_err() {
            break;
        }
        result = store.delete_recursive(&offset_path(g, t, *p));
    }
    if let Err(e) = result {
        tracing::warn!(error = %e, znodes = batch.len(), "could not copy committed offsets to ZooKeeper; retrying");
        service.offsets_mirror().0.requeue(batch);
    }
}

/// Writes membership changes as they come (standalone too: the embedded store's journal is
/// disk I/O, which the coordinator's lock must not wait for either).
pub(super) fn spawn_membership_mirror(service: Arc<GroupCoordinatorService>) {
    tokio::spawn(async move {
        loop {
            service.membership_mirror().wake.notified().await;
            loop {
                let batch = service.membership_mirror().pending.take(usize::MAX);
                if batch.is_empty() {
                    break;
                }
                let s = service.clone();
                let failed = tokio::task::spawn_blocking(move || write_membership(s.znodes(), batch)).await;
                if !matches!(failed, Ok(None)) {
                    // ZooKeeper is away: try again in a second, without spinning.
                    if let Ok(Some(rest)) = failed {
                        service.membership_mirror().pending.requeue(rest);
                    }
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        }
    });
}

/// Applies `batch`; on a failure, what is left (from the failed write on) comes back.
fn write_membership(
    store: &dyn super::service::GroupZnodes,
    batch: Vec<(MembershipKey, MembershipWrite)>,
) -> Option<Vec<(MembershipKey, MembershipWrite)>> {
    let mut iter = batch.into_iter();
    while let Some((key, write)) = iter.next() {
        let result = match (&key, &write) {
            (MembershipKey::Member { group, member }, MembershipWrite::Joined(data)) => {
                store.put_ephemeral(&format!("/consumers/{group}/ids/{member}"), data)
            }
            // Only what this broker's session holds: a coordinator that lost the group
            // (after a session expiry, a leadership move) must not delete what the
            // group's new coordinator wrote.
            (MembershipKey::Member { group, member }, _) => {
                store.delete_own_ephemerals(&format!("/consumers/{group}/ids/{member}"))
            }
            (MembershipKey::Owners { group }, MembershipWrite::Owners(owners)) => {
                let root = format!("/consumers/{group}/owners");
                let mut result = store.delete_own_ephemerals(&root);
                for (topic, partition, member) in owners {
                    if result.is_err() {
                        break;
                    }
                    result = store.put_ephemeral(&format!("{root}/{topic}/{partition}"), member);
                }
                result
            }
            (MembershipKey::Owners { .. }, _) => Ok(()),
        };
        if let Err(e) = result {
            tracing::warn!(?key, error = %e, "could not record group membership in ZooKeeper; retrying");
            let mut rest = vec![(key, write)];
            rest.extend(iter);
            return Some(rest);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_commit_wins_and_takes_are_bounded() {
        let m = OffsetMirror::new(true);
        for o in 0..10 {
            m.record("g", "t", 0, Some(o));
        }
        m.record("g", "t", 1, Some(3));
        m.record("a/b", "t", 0, Some(1));
        assert_eq!(m.pending(), 2);
        let first = m.take(1);
        assert_eq!(first.len(), 1);
        let rest = m.take(10);
        let mut all: Vec<_> = first.into_iter().chain(rest).collect();
        all.sort();
        assert_eq!(all, vec![(("g".into(), "t".into(), 0), Some(9)), (("g".into(), "t".into(), 1), Some(3))]);
    }

    #[test]
    fn requeue_never_overwrites_a_newer_commit() {
        let m = OffsetMirror::new(true);
        m.record("g", "t", 0, Some(1));
        let taken = m.take(10);
        m.record("g", "t", 0, Some(2));
        m.requeue(taken);
        assert_eq!(m.take(10), vec![(("g".into(), "t".into(), 0), Some(2))]);
    }

    #[test]
    fn membership_keeps_the_latest_change_per_znode() {
        let m = MembershipMirror::default();
        m.owners_changed("g", &[("t".into(), 0, "a".into())]);
        m.member_left("g", "a");
        m.owners_changed("g", &[]);
        let mut taken = m.pending.take(usize::MAX);
        taken.sort_by_key(|(k, _)| format!("{k:?}"));
        assert_eq!(taken.len(), 2);
        assert!(matches!(&taken[0], (MembershipKey::Member { member, .. }, MembershipWrite::Left) if member == "a"));
        assert!(matches!(&taken[1], (MembershipKey::Owners { .. }, MembershipWrite::Owners(o)) if o.is_empty()));
    }

    #[test]
    fn member_ids_become_one_znode_and_groups_that_cannot_are_left_out() {
        let m = MembershipMirror::default();
        m.member_left("g", "client/1-abc");
        m.owners_changed("g", &[("t".into(), 0, "client/1-abc".into())]);
        m.member_left("a/ids", "x");
        m.owners_changed("..", &[]);
        let mut taken = m.pending.take(usize::MAX);
        taken.sort_by_key(|(k, _)| format!("{k:?}"));
        assert_eq!(taken.len(), 2, "{taken:?}");
        assert!(matches!(&taken[0], (MembershipKey::Member { member, .. }, _) if member == "client_1-abc"));
        assert!(matches!(&taken[1], (_, MembershipWrite::Owners(o)) if o[0].2 == "client_1-abc"));
        assert_eq!(znode_member_id("sZhRNQ81QEatqc7+J/lKFg"), "sZhRNQ81QEatqc7+J_lKFg");
        assert_eq!(znode_member_id(".."), "_..");
        assert_eq!(znode_member_id(""), "_");
    }

    #[test]
    fn disabled_records_nothing() {
        let m = OffsetMirror::new(false);
        m.record("g", "t", 0, Some(1));
        assert_eq!(m.pending(), 0);
    }
}
