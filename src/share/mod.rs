//! Share-partitions (KIP-932) on their partition's leader: which records each share-group
//! member holds, and the share sessions ShareFetch and ShareAcknowledge run in.
//!
//! With a persister (`persister`), each share-partition is loaded from `__share_group_state`
//! before it is first served, and every change is written there: a restarted or new leader
//! goes on where the old one stopped. Without one (or while its state partition is led by
//! another broker) a share-partition lives in memory and starts again at the reset point.
//!
//! Locks: `partitions`, then the persister's queue; `sessions` is never held with it. The log
//! is read with neither held; a step re-checks what it read against the state it then finds.

pub mod isolation;
pub mod partition;
pub mod persister;
pub mod state_log;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::time::{Duration, Instant};
use uuid::Uuid;

pub use partition::{AckBatch, AcquiredRange, Limits, SharePartition};
pub use persister::{Loaded, LogPersister, PersisterHandles, RemoteHandles, RemoteWrite, StateTopic};

use crate::config::ShareGroupConfig;
use crate::group::configs::{GroupConfigs, OffsetReset};
use crate::log::BatchHeader;
use crate::protocol::ErrorCode;
use crate::sync::MutexExt;

/// A share-partition: (group, topic id, partition).
pub type SharePartitionKey = (String, Uuid, i32);

/// What a share-partition reads from its partition's log.
pub trait ShareLog {
    /// (log start, high watermark).
    fn bounds(&self) -> (i64, i64);
    /// Below it every transaction has ended (read_committed reads stop there).
    fn last_stable_offset(&self) -> i64;
    /// The partition's leader epoch, recorded with its share-partitions' state.
    fn leader_epoch(&self) -> i32;
    /// Whole batches from the one containing `offset`, about `max_bytes`, below the high
    /// watermark (read_committed: the last stable offset, with the aborted transactions as
    /// (producer id, first offset)); Err is a Kafka error code.
    fn read(&self, offset: i64, max_bytes: usize, committed: bool) -> Result<LogRead, i16>;
    /// The first offset whose record is at least as new as `timestamp_ms`, if any.
    fn offset_for_time(&self, timestamp_ms: i64) -> Option<i64>;
}

/// Records read for a share-partition.
pub struct LogRead {
    pub records: Bytes,
    pub aborted: Vec<(i64, i64)>,
}

impl ShareLog for crate::replication::partition::Partition {
    fn bounds(&self) -> (i64, i64) {
        (self.log_start_offset(), self.high_watermark())
    }

    fn last_stable_offset(&self) -> i64 {
        crate::replication::partition::Partition::last_stable_offset(self)
    }

    fn leader_epoch(&self) -> i32 {
        self.role().1
    }

    fn read(&self, offset: i64, max_bytes: usize, committed: bool) -> Result<LogRead, i16> {
        let r = crate::replication::partition::Partition::read(self, offset, max_bytes, -1, committed);
        match r.error_code {
            0 => Ok(LogRead { records: r.records, aborted: r.aborted.unwrap_or_default() }),
            code => Err(code),
        }
    }

    fn offset_for_time(&self, timestamp_ms: i64) -> Option<i64> {
        self.offset_for_timestamp(timestamp_ms).ok().flatten().map(|(offset, _)| offset)
    }
}

/// A member's share session on this broker (KIP-932's share fetch session).
struct ShareSession {
    /// The epoch the next request must carry.
    epoch: i32,
    partitions: BTreeSet<(Uuid, i32)>,
    last_used: Instant,
}

/// Records acquired from one partition by one ShareFetch.
pub struct Acquired {
    pub records: Bytes,
    pub ranges: Vec<AcquiredRange>,
}

pub struct ShareManager {
    config: ShareGroupConfig,
    partitions: Mutex<HashMap<SharePartitionKey, SharePartition>>,
    sessions: Mutex<HashMap<(String, String), ShareSession>>,
    persister: Option<Arc<LogPersister>>,
    /// Each group's lock duration, isolation level and reset point.
    group_configs: Arc<GroupConfigs>,
}

/// A session step's outcome: the partitions of the session, or a Kafka error code.
pub type SessionResult = Result<Vec<(Uuid, i32)>, i16>;

impl ShareManager {
    pub fn new(config: ShareGroupConfig, group_configs: Arc<GroupConfigs>) -> ShareManager {
        ShareManager {
            config,
            partitions: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            persister: None,
            group_configs,
        }
    }

    /// A manager whose share-partitions are durable through `persister`.
    pub fn with_persister(
        config: ShareGroupConfig,
        persister: Arc<LogPersister>,
        group_configs: Arc<GroupConfigs>,
    ) -> ShareManager {
        ShareManager { persister: Some(persister), ..ShareManager::new(config, group_configs) }
    }

    /// Where a share-partition of `group` with no state starts (`share.auto.offset.reset`).
    /// Reads the time index for by_duration, so never called with a lock held.
    fn reset_start(&self, group: &str, log: &dyn ShareLog) -> i64 {
        let (log_start, hw) = log.bounds();
        match self.group_configs.share(group).auto_offset_reset {
            OffsetReset::Earliest => log_start,
            OffsetReset::Latest => hw,
            OffsetReset::ByDuration(ms) => {
                let since = crate::log::now_ms().saturating_sub(ms);
                log.offset_for_time(since).map_or(hw, |o| o.clamp(log_start, hw))
            }
        }
    }

    /// The share coordinator of the state partitions led here (None in memory-only mode).
    pub fn persister(&self) -> Option<&Arc<LogPersister>> {
        self.persister.as_ref()
    }

    fn changed(&self, key: &SharePartitionKey, p: &mut SharePartition) {
        if let Some(persister) = &self.persister {
            persister.changed(key, p);
        }
    }

    /// Whether `key` must be loaded (ensure_loaded) before it is served.
    pub fn needs_load(&self, key: &SharePartitionKey) -> bool {
        self.persister.is_some() && !self.partitions.lock_unpoisoned().contains_key(key)
    }

    /// Makes `key` ready to serve on this leader: its state read back from the persister, or
    /// a new share-partition at the reset point. False while the state cannot be read yet (the
    /// state topic is being created): the share-partition hands out nothing meanwhile, as
    /// serving it from the reset point could deliver again what was acknowledged.
    pub async fn ensure_loaded(&self, key: &SharePartitionKey, log: &(dyn ShareLog + Sync)) -> bool {
        let Some(persister) = &self.persister else { return true };
        if self.partitions.lock_unpoisoned().contains_key(key) {
            return true;
        }
        let loaded = persister.load(key, log.leader_epoch()).await;
        let limits = self.limits(&key.0);
        let start = match loaded {
            Loaded::Durable(None) | Loaded::Memory => self.reset_start(&key.0, log),
            _ => 0,
        };
        let mut partitions = self.partitions.lock_unpoisoned();
        if partitions.contains_key(key) {
            return true;
        }
        let (p, write) = match loaded {
            Loaded::NotReady => return false,
            Loaded::Durable(Some(s)) => (SharePartition::from_persisted(s.start_offset, &s.offsets, &limits), false),
            // Written at once, so a restart before anything is acquired keeps this start.
            Loaded::Durable(None) => (SharePartition::new(start), true),
            Loaded::Memory => (SharePartition::new(start), false),
        };
        let p = partitions.entry(key.clone()).or_insert(p);
        if write {
            self.changed(key, p);
        }
        true
    }

    /// This broker no longer leads partition `index` of topic `topic_id`: its share-partitions
    /// go, so a later term here reads their state back instead of serving what it held.
    pub fn on_resign(&self, topic_id: Uuid, index: i32) {
        let mut partitions = self.partitions.lock_unpoisoned();
        let gone: Vec<SharePartitionKey> =
            partitions.keys().filter(|k| k.1 == topic_id && k.2 == index).cloned().collect();
        for k in &gone {
            partitions.remove(k);
        }
        drop(partitions);
        if let Some(p) = &self.persister {
            p.forget(&gone);
        }
    }

    /// This broker no longer leads `__share_group_state` partition `index`: the
    /// share-partitions whose state it held are loaded again before they are next served
    /// (from the new state leader's log, or in memory when that is another broker).
    pub fn on_state_resign(&self, index: i32) {
        let Some(p) = &self.persister else { return };
        let gone = p.forget_state_partition(index);
        let mut partitions = self.partitions.lock_unpoisoned();
        for k in &gone {
            partitions.remove(k);
        }
    }

    /// Makes what the steps changed durable; the request that made them answers after this.
    /// Err: a Kafka error code for the acknowledgements the request carried.
    pub async fn flush(&self) -> Result<(), i16> {
        match &self.persister {
            Some(p) => p.flush().await,
            None => Ok(()),
        }
    }

    pub fn config(&self) -> &ShareGroupConfig {
        &self.config
    }

    /// The record lock duration a member of `group` is told (ShareFetch's
    /// AcquisitionLockTimeoutMs).
    pub fn lock_duration_ms(&self, group: &str) -> i32 {
        self.group_configs.share(group).record_lock_duration_ms
    }

    pub fn limits(&self, group: &str) -> Limits {
        Limits {
            lock_duration: Duration::from_millis(self.lock_duration_ms(group).max(0) as u64),
            delivery_count_limit: self.config.delivery_count_limit,
            max_in_flight: self.config.partition_max_record_locks,
        }
    }

    /// ShareFetch's session step. Epoch 0 opens a session (replacing the member's previous
    /// one, whose records are released); -1 is the final request, which closes it after its
    /// acknowledgements; any other must be the session's next epoch. Returns the session's
    /// partitions after `added` and `forgotten`.
    pub fn fetch_session(
        &self,
        group: &str,
        member: &str,
        epoch: i32,
        added: &[(Uuid, i32)],
        forgotten: &[(Uuid, i32)],
    ) -> SessionResult {
        let key = (group.to_string(), member.to_string());
        let now = Instant::now();
        let mut sessions = self.sessions.lock_unpoisoned();
        match epoch {
            0 => {
                let replaced = sessions.remove(&key).is_some();
                if !replaced && sessions.len() >= self.config.max_share_sessions {
                    // Sessions idle for longer than a member's session timeout belong to
                    // members the coordinator has fenced.
                    let idle = Duration::from_millis(self.config.session_timeout_ms.max(0) as u64);
                    sessions.retain(|_, s| now.duration_since(s.last_used) < idle);
                    if sessions.len() >= self.config.max_share_sessions {
                        return Err(ErrorCode::ShareSessionLimitReached.code());
                    }
                }
                let partitions: BTreeSet<(Uuid, i32)> = added.iter().copied().collect();
                let list = partitions.iter().copied().collect();
                sessions.insert(key, ShareSession { epoch: 1, partitions, last_used: now });
                drop(sessions);
                if replaced {
                    self.release_member(group, member);
                }
                Ok(list)
            }
            _ => {
                let session = sessions.get_mut(&key).ok_or(ErrorCode::ShareSessionNotFound.code())?;
                if epoch != -1 && epoch != session.epoch {
                    return Err(ErrorCode::InvalidShareSessionEpoch.code());
                }
                session.partitions.extend(added.iter().copied());
                for f in forgotten {
                    session.partitions.remove(f);
                }
                session.epoch = session.epoch.checked_add(1).unwrap_or(1);
                session.last_used = now;
                Ok(session.partitions.iter().copied().collect())
            }
        }
    }

    /// ShareAcknowledge's session step: as ShareFetch's, but it never opens a session.
    pub fn acknowledge_session(&self, group: &str, member: &str, epoch: i32) -> Result<(), i16> {
        if epoch == 0 {
            return Err(ErrorCode::InvalidShareSessionEpoch.code());
        }
        self.fetch_session(group, member, epoch, &[], &[]).map(|_| ())
    }

    /// Ends a member's session (its final request was answered): what it holds is released.
    pub fn close_session(&self, group: &str, member: &str) {
        let removed = self.sessions.lock_unpoisoned().remove(&(group.to_string(), member.to_string())).is_some();
        if removed {
            self.release_member(group, member);
        }
    }

    fn release_member(&self, group: &str, member: &str) {
        let limits = self.limits(group);
        let mut partitions = self.partitions.lock_unpoisoned();
        for (key, p) in partitions.iter_mut().filter(|(k, _)| k.0 == group) {
            if p.release_member(member, &limits) > 0 {
                self.changed(key, p);
            }
        }
    }

    /// Applies a member's acknowledgements to one share-partition: all or none.
    pub fn acknowledge(&self, key: &SharePartitionKey, member: &str, batches: &[AckBatch]) -> Result<(), i16> {
        let limits = self.limits(&key.0);
        let now = Instant::now();
        let mut partitions = self.partitions.lock_unpoisoned();
        let p = partitions.get_mut(key).ok_or(ErrorCode::InvalidRecordState.code())?;
        p.expire_locks(now, &limits);
        let result = p.acknowledge(member, batches, now, &limits);
        // Locks that ran out changed state even when the acknowledgement is refused.
        self.changed(key, p);
        result?;
        Ok(())
    }

    /// Acquires for `member` records of one share-partition: first those available for
    /// redelivery, else new ones below the high watermark (read_committed: the last stable
    /// offset). None if there is nothing to hand out.
    pub fn acquire(
        &self,
        key: &SharePartitionKey,
        member: &str,
        log: &dyn ShareLog,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Option<Acquired>, i16> {
        let fresh_start = match &self.persister {
            None if !self.partitions.lock_unpoisoned().contains_key(key) => Some(self.reset_start(&key.0, log)),
            _ => None,
        };
        let committed = self.group_configs.share(&key.0).read_committed;
        // A read holding only markers or aborted records hands out nothing but moves the
        // window on: read again, a bounded number of times, rather than wait for new records.
        for _ in 0..8 {
            match self.acquire_once(key, member, log, (max_records, max_bytes), committed, fresh_start)? {
                Step::Acquired(a) => return Ok(Some(a)),
                Step::Nothing => return Ok(None),
                Step::Skipped => {}
            }
        }
        Ok(None)
    }

    fn acquire_once(
        &self,
        key: &SharePartitionKey,
        member: &str,
        log: &dyn ShareLog,
        (max_records, max_bytes): (usize, usize),
        committed: bool,
        fresh_start: Option<i64>,
    ) -> Result<Step, i16> {
        let limits = self.limits(&key.0);
        let (log_start, hw) = log.bounds();
        let end_limit = if committed { log.last_stable_offset().min(hw) } else { hw };
        // Which offset to read from, whether it is a redelivery, and how much to read.
        let (from, budget) = {
            let mut partitions = self.partitions.lock_unpoisoned();
            let p = match (partitions.contains_key(key), &self.persister) {
                (true, _) => partitions.get_mut(key),
                (false, None) => Some(
                    partitions.entry(key.clone()).or_insert_with(|| SharePartition::new(fresh_start.unwrap_or(hw))),
                ),
                // Not loaded yet (ensure_loaded said so): nothing to hand out.
                (false, Some(_)) => None,
            };
            let Some(p) = p else { return Ok(Step::Nothing) };
            p.move_start_to(log_start);
            p.expire_locks(Instant::now(), &limits);
            self.changed(key, p);
            let from = match p.first_available() {
                Some(o) => (o, true),
                None if p.next_offset() < end_limit && p.has_room(&limits) => (p.next_offset(), false),
                None => return Ok(Step::Nothing),
            };
            (from, read_budget(p.record_bytes(), max_records, max_bytes))
        };
        let read = log.read(from.0, budget, committed)?;
        let skip = isolation::unreadable_ranges(&read.records, &read.aborted, committed);
        let Some(end) = last_offset_in(&read.records).map(|e| e.min(end_limit - 1)) else { return Ok(Step::Nothing) };
        let now = Instant::now();
        let mut partitions = self.partitions.lock_unpoisoned();
        let Some(p) = partitions.get_mut(key) else { return Ok(Step::Nothing) };
        let before = p.next_offset();
        let ranges = match from {
            (o, true) => p.acquire_available(member, o, end, max_records, &skip, now, &limits),
            (o, false) => p.acquire_new(member, o, end, max_records, &skip, now, &limits),
        };
        let moved = p.next_offset() > before;
        self.changed(key, p);
        if ranges.is_empty() {
            return Ok(if moved || !skip.is_empty() { Step::Skipped } else { Step::Nothing });
        }
        let (Some(first), Some(last)) = (ranges.iter().map(|r| r.0).min(), ranges.iter().map(|r| r.1).max()) else {
            return Ok(Step::Nothing);
        };
        let records = batches_covering(read.records, first, last);
        p.note_record_bytes(records.len(), last - first + 1);
        Ok(Step::Acquired(Acquired { records, ranges }))
    }

    /// About how many bytes `member` could acquire from one share-partition now, counted up
    /// to `enough` (ShareFetch's MinBytes), without acquiring anything: records available
    /// again count as `enough` (they are ready at once), new ones by the size of their
    /// batches below the high watermark (read_committed: the last stable offset).
    pub fn fetchable_bytes(&self, key: &SharePartitionKey, log: &dyn ShareLog, enough: usize) -> usize {
        let limits = self.limits(&key.0);
        let committed = self.group_configs.share(&key.0).read_committed;
        let (_, hw) = log.bounds();
        let end_limit = if committed { log.last_stable_offset().min(hw) } else { hw };
        let next = {
            let partitions = self.partitions.lock_unpoisoned();
            let Some(p) = partitions.get(key) else { return 0 };
            if p.first_available().is_some() {
                return enough;
            }
            if p.next_offset() >= end_limit || !p.has_room(&limits) {
                return 0;
            }
            p.next_offset()
        };
        let Ok(read) = log.read(next, enough, committed) else { return 0 };
        bytes_below(&read.records, end_limit)
    }

    /// When the earliest lock among these share-partitions runs out: a waiting ShareFetch
    /// looks again then.
    pub fn next_lock_expiry(&self, keys: &[SharePartitionKey]) -> Option<Instant> {
        let partitions = self.partitions.lock_unpoisoned();
        keys.iter().filter_map(|k| partitions.get(k)).filter_map(SharePartition::next_lock_expiry).min()
    }
}

/// How many bytes to read from the log for one acquisition: about what `max_records` records
/// took when this share-partition last handed some out, plus a batch of slack, within the
/// request's `max_bytes`. Reading `max_bytes` (50 MB by default) for 500 records copied the
/// whole backlog into memory on every ShareFetch. Without a figure yet, 1 MiB.
fn read_budget(record_bytes: usize, max_records: usize, max_bytes: usize) -> usize {
    let want = match record_bytes {
        0 => 1 << 20,
        n => n.saturating_mul(max_records).saturating_add(16 << 10),
    };
    want.clamp(1, max_bytes.max(1))
}

/// The whole batches of `records` that hold any offset of [first, last]. The log is read
/// ahead of what is acquired; only acquired records go to the member, as Kafka slices its
/// share fetch response to the acquired batches.
fn batches_covering(records: Bytes, first: i64, last: i64) -> Bytes {
    let (mut start, mut end, mut at) = (None, 0, 0);
    while let Some(h) = records.get(at..).and_then(BatchHeader::parse) {
        let size = h.total_size();
        if size == 0 || at + size > records.len() || h.base_offset > last {
            break;
        }
        if start.is_none() && h.last_offset() >= first {
            start = Some(at);
        }
        at += size;
        end = at;
    }
    match start {
        Some(s) if s < end => records.slice(s..end),
        _ => records,
    }
}

/// One acquisition step's outcome.
enum Step {
    Acquired(Acquired),
    /// Only records never to be delivered were met (and archived): look again.
    Skipped,
    Nothing,
}

/// The size of the whole batches in `records` that begin below `end`.
fn bytes_below(records: &[u8], end: i64) -> usize {
    let mut rest = records;
    let mut total = 0;
    while let Some(h) = BatchHeader::parse(rest) {
        let size = h.total_size();
        if size > rest.len() || size == 0 || h.base_offset >= end {
            break;
        }
        total += size;
        rest = &rest[size..];
    }
    total
}

/// The last offset of the last whole batch in `records`.
fn last_offset_in(records: &[u8]) -> Option<i64> {
    let mut rest = records;
    let mut last = None;
    while let Some(h) = BatchHeader::parse(rest) {
        let size = h.total_size();
        if size > rest.len() || size == 0 {
            break;
        }
        last = Some(h.last_offset());
        rest = &rest[size..];
    }
    last
}

#[cfg(test)]
mod read_tests {
    use super::*;
    use crate::log::batch::simple_batch;

    /// Three batches of ten records at offsets 0, 10 and 20.
    fn three_batches() -> Bytes {
        let mut all = Vec::new();
        for base in [0i64, 10, 20] {
            let mut b = simple_batch(10, 10, 0);
            b[..8].copy_from_slice(&base.to_be_bytes());
            all.extend_from_slice(&b);
        }
        Bytes::from(all)
    }

    #[test]
    fn only_the_batches_holding_acquired_offsets_are_handed_out() {
        let all = three_batches();
        let one = all.len() / 3;
        assert_eq!(batches_covering(all.clone(), 0, 9), all.slice(..one));
        assert_eq!(batches_covering(all.clone(), 5, 12), all.slice(..2 * one));
        assert_eq!(batches_covering(all.clone(), 15, 15), all.slice(one..2 * one));
        assert_eq!(batches_covering(all.clone(), 12, 29), all.slice(one..));
        // A read that ends inside a batch hands out whole batches only.
        let torn = all.slice(..all.len() - 5);
        assert_eq!(batches_covering(torn, 0, 29), all.slice(..2 * one));
    }

    #[test]
    fn a_read_asks_for_about_what_max_records_took_last_time() {
        assert_eq!(read_budget(0, 500, 52_428_800), 1 << 20);
        assert_eq!(read_budget(0, 500, 1000), 1000);
        assert_eq!(read_budget(120, 500, 52_428_800), 120 * 500 + (16 << 10));
        assert_eq!(read_budget(1 << 20, 500, 52_428_800), 52_428_800);
    }
}
