//! One share-partition's state (KIP-932): the window of offsets between the share-partition
//! start offset and the next offset never handed out, and per in-flight record its state,
//! delivery count, owner and acquisition lock.
//!
//! Pure: time is passed in, the log is read by the caller, so the rules are tested alone and
//! a persister (phase 2, `__share_group_state`) can record what each step changed.

use std::collections::BTreeMap;

use tokio::time::{Duration, Instant};

use crate::protocol::ErrorCode;

/// Kafka's RecordState.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    Available,
    Acquired,
    Acknowledged,
    Archived,
}

#[derive(Debug, Clone)]
struct InFlight {
    state: RecordState,
    delivery_count: i16,
    owner: Option<String>,
    lock_until: Option<Instant>,
}

/// The limits a share-partition applies, from the group's configuration.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub lock_duration: Duration,
    pub delivery_count_limit: i16,
    pub max_in_flight: usize,
}

/// Kafka's AcknowledgeType codes.
pub const ACK_GAP: i8 = 0;
pub const ACK_ACCEPT: i8 = 1;
pub const ACK_RELEASE: i8 = 2;
pub const ACK_REJECT: i8 = 3;

/// One acknowledgement batch: an inclusive range with one type for all of it or one per offset.
#[derive(Debug, Clone)]
pub struct AckBatch {
    pub first_offset: i64,
    pub last_offset: i64,
    pub types: Vec<i8>,
}

impl AckBatch {
    fn type_at(&self, offset: i64) -> i8 {
        match self.types.len() {
            1 => self.types[0],
            _ => self.types[(offset - self.first_offset) as usize],
        }
    }
}

/// Acquired offsets, as ShareFetch's AcquiredRecords lists them: (first, last, delivery count).
pub type AcquiredRange = (i64, i64, i16);

#[derive(Debug, Clone)]
pub struct SharePartition {
    /// The share-partition start offset: everything below is acknowledged or archived.
    start: i64,
    /// The offset after the last one ever acquired: where new records are taken from.
    next: i64,
    /// Every offset of [start, next) that is not yet settled below `start`.
    in_flight: BTreeMap<i64, InFlight>,
    /// The offsets changed since the persister last took them: one range, as the changes of
    /// a step lie within the in-flight window anyway.
    dirty: Option<(i64, i64)>,
    /// Bytes per record in what was last handed out (0: nothing yet), which sizes the next
    /// read from the log.
    record_bytes: usize,
}

impl SharePartition {
    pub fn new(start_offset: i64) -> SharePartition {
        SharePartition {
            start: start_offset,
            next: start_offset,
            in_flight: BTreeMap::new(),
            dirty: None,
            record_bytes: 0,
        }
    }

    pub fn record_bytes(&self) -> usize {
        self.record_bytes
    }

    /// Remembers the size of what was handed out: `bytes` for `records` offsets.
    pub fn note_record_bytes(&mut self, bytes: usize, records: i64) {
        if let Ok(n) = usize::try_from(records) {
            if n > 0 {
                self.record_bytes = bytes.div_ceil(n).max(1);
            }
        }
    }

    /// A share-partition as its persisted state left it: each offset's (delivery state,
    /// delivery count) from `start` on, in Kafka's persisted state ids. A record acquired when
    /// the state was written has no owner now: it is available again (archived if it was
    /// delivered as often as the limit allows), its delivery count kept.
    pub fn from_persisted(start: i64, offsets: &BTreeMap<i64, (i8, i16)>, limits: &Limits) -> SharePartition {
        let mut p = SharePartition::new(start);
        for (&offset, &(state, count)) in offsets.range(start..) {
            // An offset never written between two that were had been acquired once at most
            // with nothing recorded: available, as if never delivered.
            for gap in p.next..offset {
                p.in_flight.insert(
                    gap,
                    InFlight { state: RecordState::Available, delivery_count: 0, owner: None, lock_until: None },
                );
            }
            let state = match state {
                super::state_log::ACKNOWLEDGED => RecordState::Acknowledged,
                super::state_log::ARCHIVED => RecordState::Archived,
                _ if count >= limits.delivery_count_limit => RecordState::Archived,
                _ => RecordState::Available,
            };
            p.in_flight.insert(offset, InFlight { state, delivery_count: count.max(0), owner: None, lock_until: None });
            p.next = offset + 1;
        }
        p.advance_start();
        p
    }

    /// Every in-flight offset as it is persisted: (offset, (delivery state, delivery count)).
    pub fn persisted(&self) -> impl Iterator<Item = (i64, (i8, i16))> + '_ {
        self.in_flight.iter().map(|(o, r)| (*o, persisted_state(r)))
    }

    /// The in-flight offsets changed since the last call, as they are persisted; the persister
    /// writes them with the start offset.
    pub fn take_changes(&mut self) -> Vec<(i64, (i8, i16))> {
        match self.dirty.take() {
            Some((first, last)) => self.in_flight.range(first..=last).map(|(o, r)| (*o, persisted_state(r))).collect(),
            None => Vec::new(),
        }
    }

    fn touch(&mut self, first: i64, last: i64) {
        self.dirty = Some(match self.dirty {
            Some((f, l)) => (f.min(first), l.max(last)),
            None => (first, last),
        });
    }

    pub fn start_offset(&self) -> i64 {
        self.start
    }

    pub fn next_offset(&self) -> i64 {
        self.next
    }

    pub fn state_of(&self, offset: i64) -> Option<(RecordState, i16)> {
        self.in_flight.get(&offset).map(|r| (r.state, r.delivery_count))
    }

    /// Records gone from the log (retention, DeleteRecords) leave the window.
    pub fn move_start_to(&mut self, log_start: i64) {
        if log_start > self.start {
            self.in_flight = self.in_flight.split_off(&log_start);
            self.start = log_start;
            self.next = self.next.max(log_start);
        }
    }

    /// Locks that ran out: the record is available again, or archived once delivered as often
    /// as the limit allows.
    pub fn expire_locks(&mut self, now: Instant, limits: &Limits) {
        let mut changed: Option<(i64, i64)> = None;
        for (o, r) in self.in_flight.iter_mut() {
            if r.state == RecordState::Acquired && r.lock_until.is_some_and(|t| t <= now) {
                release(r, limits);
                changed = Some(changed.map_or((*o, *o), |(f, _)| (f, *o)));
            }
        }
        if let Some((f, l)) = changed {
            self.touch(f, l);
        }
        self.advance_start();
    }

    /// The first available offset, which the caller reads the log from to redeliver.
    pub fn first_available(&self) -> Option<i64> {
        self.in_flight.iter().find(|(_, r)| r.state == RecordState::Available).map(|(o, _)| *o)
    }

    /// Acquires for `member` the available offsets in [from, to], at most `max`; those in
    /// `skip` (sorted inclusive ranges: markers, aborted records) are archived instead.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire_available(
        &mut self,
        member: &str,
        from: i64,
        to: i64,
        max: usize,
        skip: &[(i64, i64)],
        now: Instant,
        limits: &Limits,
    ) -> Vec<AcquiredRange> {
        let mut taken = Vec::new();
        let mut changed: Option<(i64, i64)> = None;
        for (offset, r) in self.in_flight.range_mut(from..=to) {
            if taken.len() >= max {
                break;
            }
            if r.state != RecordState::Available {
                continue;
            }
            if super::isolation::contains(skip, *offset) {
                settle(r, RecordState::Archived);
            } else {
                acquire(r, member, now, limits);
                taken.push((*offset, r.delivery_count));
            }
            changed = Some(changed.map_or((*offset, *offset), |(f, _)| (f, *offset)));
        }
        if let Some((first, last)) = changed {
            self.touch(first, last);
        }
        self.advance_start();
        ranges(&taken)
    }

    /// Acquires for `member` new offsets from `from` (which must still be the next offset:
    /// another member may have taken them meanwhile) up to `to`, within the in-flight bound
    /// and at most `max`; those in `skip` are archived as they are passed.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire_new(
        &mut self,
        member: &str,
        from: i64,
        to: i64,
        max: usize,
        skip: &[(i64, i64)],
        now: Instant,
        limits: &Limits,
    ) -> Vec<AcquiredRange> {
        if from != self.next || to < from {
            return Vec::new();
        }
        let room = limits.max_in_flight.saturating_sub(self.in_flight.len()).min(max);
        if room == 0 {
            return Vec::new();
        }
        let mut taken = Vec::new();
        let mut offset = from;
        while offset <= to && taken.len() < room {
            let mut r = InFlight { state: RecordState::Available, delivery_count: 0, owner: None, lock_until: None };
            if super::isolation::contains(skip, offset) {
                settle(&mut r, RecordState::Archived);
            } else {
                acquire(&mut r, member, now, limits);
                taken.push((offset, 1));
            }
            self.in_flight.insert(offset, r);
            offset += 1;
        }
        self.next = offset;
        self.touch(from, offset - 1);
        self.advance_start();
        ranges(&taken)
    }

    /// Whether new records may be acquired now (the in-flight bound leaves room).
    pub fn has_room(&self, limits: &Limits) -> bool {
        self.in_flight.len() < limits.max_in_flight
    }

    /// Applies `member`'s acknowledgements: all or nothing. Malformed batches are
    /// INVALID_REQUEST; offsets not acquired by the member (or whose lock ran out) are
    /// INVALID_RECORD_STATE.
    pub fn acknowledge(
        &mut self,
        member: &str,
        batches: &[AckBatch],
        now: Instant,
        limits: &Limits,
    ) -> Result<(), i16> {
        let mut previous_last: Option<i64> = None;
        for b in batches {
            let len = b.last_offset.checked_sub(b.first_offset).and_then(|d| d.checked_add(1)).unwrap_or(0);
            let types_ok = b.types.len() == 1 || (len > 0 && b.types.len() as i64 == len);
            if b.first_offset < 0
                || len <= 0
                || !types_ok
                || b.types.iter().any(|t| !(ACK_GAP..=ACK_REJECT).contains(t))
                || previous_last.is_some_and(|p| b.first_offset <= p)
            {
                return Err(ErrorCode::InvalidRequest.code());
            }
            previous_last = Some(b.last_offset);
            if b.first_offset < self.start || b.last_offset >= self.next {
                return Err(ErrorCode::InvalidRecordState.code());
            }
            for (_, r) in self.in_flight.range(b.first_offset..=b.last_offset) {
                let held = r.state == RecordState::Acquired
                    && r.owner.as_deref() == Some(member)
                    && r.lock_until.is_some_and(|t| t > now);
                if !held {
                    return Err(ErrorCode::InvalidRecordState.code());
                }
            }
            if self.in_flight.range(b.first_offset..=b.last_offset).count() as i64 != len {
                return Err(ErrorCode::InvalidRecordState.code());
            }
        }
        for b in batches {
            for offset in b.first_offset..=b.last_offset {
                let Some(r) = self.in_flight.get_mut(&offset) else { continue };
                match b.type_at(offset) {
                    ACK_ACCEPT => settle(r, RecordState::Acknowledged),
                    ACK_RELEASE => release(r, limits),
                    // A gap has no record to deliver; a rejected record is never delivered again.
                    _ => settle(r, RecordState::Archived),
                }
            }
            self.touch(b.first_offset, b.last_offset);
        }
        self.advance_start();
        Ok(())
    }

    /// Gives back everything `member` holds (its share session ended): available again
    /// without waiting for the locks, the delivery counts kept.
    pub fn release_member(&mut self, member: &str, limits: &Limits) -> usize {
        let mut n = 0;
        let mut changed: Option<(i64, i64)> = None;
        for (o, r) in self.in_flight.iter_mut() {
            if r.state == RecordState::Acquired && r.owner.as_deref() == Some(member) {
                release(r, limits);
                n += 1;
                changed = Some(changed.map_or((*o, *o), |(f, _)| (f, *o)));
            }
        }
        if let Some((f, l)) = changed {
            self.touch(f, l);
        }
        self.advance_start();
        n
    }

    /// The earliest lock deadline, for a waiting ShareFetch to look again.
    pub fn next_lock_expiry(&self) -> Option<Instant> {
        self.in_flight.values().filter(|r| r.state == RecordState::Acquired).filter_map(|r| r.lock_until).min()
    }

    fn advance_start(&mut self) {
        while let Some(entry) = self.in_flight.first_entry() {
            if !matches!(entry.get().state, RecordState::Acknowledged | RecordState::Archived) {
                break;
            }
            let offset = *entry.key();
            entry.remove();
            self.start = offset + 1;
        }
        if self.in_flight.is_empty() {
            self.start = self.next;
        }
    }
}

fn persisted_state(r: &InFlight) -> (i8, i16) {
    let state = match r.state {
        RecordState::Acknowledged => super::state_log::ACKNOWLEDGED,
        RecordState::Archived => super::state_log::ARCHIVED,
        RecordState::Available | RecordState::Acquired => super::state_log::AVAILABLE,
    };
    (state, r.delivery_count)
}

fn acquire(r: &mut InFlight, member: &str, now: Instant, limits: &Limits) {
    r.state = RecordState::Acquired;
    r.delivery_count = r.delivery_count.saturating_add(1);
    r.owner = Some(member.to_string());
    r.lock_until = Some(now + limits.lock_duration);
}

fn release(r: &mut InFlight, limits: &Limits) {
    let state = match r.delivery_count >= limits.delivery_count_limit {
        true => RecordState::Archived,
        false => RecordState::Available,
    };
    settle(r, state);
}

fn settle(r: &mut InFlight, state: RecordState) {
    r.state = state;
    r.owner = None;
    r.lock_until = None;
}

/// Consecutive offsets with one delivery count, as ranges.
fn ranges(taken: &[(i64, i16)]) -> Vec<AcquiredRange> {
    let mut out: Vec<AcquiredRange> = Vec::new();
    for &(offset, count) in taken {
        match out.last_mut() {
            Some((_, last, c)) if *last + 1 == offset && *c == count => *last = offset,
            _ => out.push((offset, offset, count)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits { lock_duration: Duration::from_secs(30), delivery_count_limit: 3, max_in_flight: 5 }
    }

    fn ack(first: i64, last: i64, types: &[i8]) -> AckBatch {
        AckBatch { first_offset: first, last_offset: last, types: types.to_vec() }
    }

    #[test]
    fn acquire_ack_release_reject_and_archive() {
        let (l, now) = (limits(), Instant::now());
        let mut p = SharePartition::new(10);
        assert_eq!(p.acquire_new("a", 10, 100, 100, &[], now, &l), vec![(10, 14, 1)], "bounded by in-flight records");
        assert!(p.acquire_new("b", 15, 20, 10, &[], now, &l).is_empty(), "no room left");
        assert!(p.acquire_new("b", 10, 20, 10, &[], now, &l).is_empty(), "10 is no longer next");
        // b holds nothing: its acknowledgement changes nothing.
        assert_eq!(p.acknowledge("b", &[ack(10, 10, &[1])], now, &l), Err(ErrorCode::InvalidRecordState.code()));
        // Malformed: overlapping, reversed, wrong type count, unknown type.
        for bad in [
            vec![ack(10, 11, &[1]), ack(11, 12, &[1])],
            vec![ack(12, 11, &[1])],
            vec![ack(10, 12, &[1, 1])],
            vec![ack(10, 10, &[4])],
        ] {
            assert_eq!(p.acknowledge("a", &bad, now, &l), Err(ErrorCode::InvalidRequest.code()), "{bad:?}");
        }
        assert_eq!(p.acknowledge("a", &[ack(10, 20, &[1])], now, &l), Err(ErrorCode::InvalidRecordState.code()));
        p.acknowledge("a", &[ack(10, 11, &[1]), ack(12, 14, &[2, 3, 1])], now, &l).unwrap();
        assert_eq!(p.start_offset(), 12, "12 is available again");
        assert_eq!(p.state_of(13), Some((RecordState::Archived, 1)));
        assert_eq!(p.first_available(), Some(12));
        // Redelivered with a higher count; past the limit it is archived.
        for round in 2..=3 {
            assert_eq!(p.acquire_available("b", 12, 14, 10, &[], now, &l), vec![(12, 12, round)]);
            p.acknowledge("b", &[ack(12, 12, &[2])], now, &l).unwrap();
        }
        assert_eq!(p.first_available(), None);
        assert_eq!(p.start_offset(), 15, "all of 10..=14 settled");
        assert_eq!(p.acquire_new("a", 15, 16, 10, &[], now, &l), vec![(15, 16, 1)]);
    }

    #[test]
    fn skipped_offsets_are_archived_never_handed_out() {
        let (l, now) = (limits(), Instant::now());
        let mut p = SharePartition::new(0);
        // 0..=1 an aborted transaction's records, 2 its marker, 3..=4 data.
        assert_eq!(p.acquire_new("a", 0, 4, 10, &[(0, 2)], now, &l), vec![(3, 4, 1)]);
        assert_eq!(p.start_offset(), 3, "skipped offsets settle at once");
        assert_eq!(p.acknowledge("a", &[ack(1, 1, &[1])], now, &l), Err(ErrorCode::InvalidRecordState.code()));
        // Records delivered before (e.g. under read_uncommitted) and released are archived as
        // a redelivery passes them.
        let mut q = SharePartition::new(0);
        q.acquire_new("a", 0, 3, 10, &[], now, &l);
        q.release_member("a", &l);
        assert_eq!(q.acquire_available("b", 0, 3, 10, &[(1, 1)], now, &l), vec![(0, 0, 2), (2, 3, 2)]);
        assert_eq!(q.state_of(1), Some((RecordState::Archived, 1)));
    }

    #[test]
    fn locks_expire_and_a_closed_session_releases() {
        let (l, now) = (limits(), Instant::now());
        let mut p = SharePartition::new(0);
        p.acquire_new("a", 0, 1, 10, &[], now, &l);
        p.acquire_new("b", 2, 2, 10, &[], now, &l);
        assert_eq!(p.release_member("a", &l), 2);
        assert_eq!(p.acquire_available("c", 0, 9, 10, &[], now, &l), vec![(0, 1, 2)]);
        let later = now + Duration::from_secs(31);
        assert_eq!(p.acknowledge("b", &[ack(2, 2, &[1])], later, &l), Err(ErrorCode::InvalidRecordState.code()));
        p.expire_locks(later, &l);
        assert_eq!(p.state_of(2), Some((RecordState::Available, 1)));
        assert_eq!(p.state_of(0), Some((RecordState::Available, 2)));
    }
}
