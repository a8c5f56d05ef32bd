//! The records of `__share_group_state` in Kafka 4.x's schemas, so Kafka's tools
//! (kafka-dump-log's share-group-state decoder) read what gregor writes, and the state a
//! share-partition is rebuilt from when its leader (re)loads it.
//!
//! Key: an int16 record type (0 ShareSnapshot, 1 ShareUpdate) then GroupId (string), TopicId
//! (uuid), Partition (int32), not flexible. Value: an int16 version (0) then a flexible body:
//! a snapshot holds the whole state (epochs, start offset, create and write timestamps, every
//! state batch); an update holds the start offset and the batches that changed, applied over
//! the snapshot before it and the updates between.

use std::collections::BTreeMap;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::SharePartitionKey;

pub const SNAPSHOT: i16 = 0;
pub const UPDATE: i16 = 1;

/// Kafka's persisted delivery states (its RecordState ids); an acquired record is written as
/// available, as it is once its owner is gone.
pub const AVAILABLE: i8 = 0;
pub const ACKNOWLEDGED: i8 = 2;
pub const ARCHIVED: i8 = 4;

/// Kafka's PersisterStateBatch: an inclusive offset range in one state with one delivery count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateBatch {
    pub first_offset: i64,
    pub last_offset: i64,
    pub delivery_state: i8,
    pub delivery_count: i16,
}

/// A ShareSnapshot or ShareUpdate value. An update has no state epoch nor timestamps, and
/// -1 as start offset when the start did not move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateValue {
    pub snapshot_epoch: i32,
    pub state_epoch: i32,
    pub leader_epoch: i32,
    pub start_offset: i64,
    pub create_timestamp: i64,
    pub write_timestamp: i64,
    pub batches: Vec<StateBatch>,
}

pub fn encode_key(record_type: i16, key: &SharePartitionKey) -> Bytes {
    let mut b = BytesMut::with_capacity(2 + 2 + key.0.len() + 16 + 4);
    b.put_i16(record_type);
    b.put_i16(key.0.len() as i16);
    b.put_slice(key.0.as_bytes());
    b.put_slice(key.1.as_bytes());
    b.put_i32(key.2);
    b.freeze()
}

/// (record type, key); None for another topic's record or a malformed one.
pub fn decode_key(mut buf: &[u8]) -> Option<(i16, SharePartitionKey)> {
    if buf.remaining() < 4 {
        return None;
    }
    let record_type = buf.get_i16();
    if record_type != SNAPSHOT && record_type != UPDATE {
        return None;
    }
    let len = usize::try_from(buf.get_i16()).ok()?;
    if buf.remaining() < len + 16 + 4 {
        return None;
    }
    let group = String::from_utf8(buf[..len].to_vec()).ok()?;
    buf.advance(len);
    let topic = Uuid::from_slice(&buf[..16]).ok()?;
    buf.advance(16);
    Some((record_type, (group, topic, buf.get_i32())))
}

fn put_uvarint(b: &mut BytesMut, mut v: u32) {
    while v >= 0x80 {
        b.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    b.put_u8(v as u8);
}

fn get_uvarint(buf: &mut &[u8]) -> Option<u32> {
    let mut v: u32 = 0;
    for shift in (0..35).step_by(7) {
        if !buf.has_remaining() {
            return None;
        }
        let byte = buf.get_u8();
        v |= u32::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Skips a flexible struct's tagged fields (Kafka 4.2's DeliveryCompleteCount is one).
fn skip_tagged(buf: &mut &[u8]) -> Option<()> {
    let n = get_uvarint(buf)?;
    for _ in 0..n {
        let _tag = get_uvarint(buf)?;
        let size = get_uvarint(buf)? as usize;
        if buf.remaining() < size {
            return None;
        }
        buf.advance(size);
    }
    Some(())
}

impl StateValue {
    pub fn encode(&self, record_type: i16) -> Bytes {
        let mut b = BytesMut::with_capacity(48 + self.batches.len() * 19);
        b.put_i16(0);
        b.put_i32(self.snapshot_epoch);
        if record_type == SNAPSHOT {
            b.put_i32(self.state_epoch);
        }
        b.put_i32(self.leader_epoch);
        b.put_i64(self.start_offset);
        if record_type == SNAPSHOT {
            b.put_i64(self.create_timestamp);
            b.put_i64(self.write_timestamp);
        }
        put_uvarint(&mut b, self.batches.len() as u32 + 1);
        for s in &self.batches {
            b.put_i64(s.first_offset);
            b.put_i64(s.last_offset);
            b.put_i8(s.delivery_state);
            b.put_i16(s.delivery_count);
            put_uvarint(&mut b, 0);
        }
        put_uvarint(&mut b, 0);
        b.freeze()
    }

    pub fn decode(record_type: i16, mut buf: &[u8]) -> Option<StateValue> {
        let b = &mut buf;
        if b.remaining() < 2 || b.get_i16() != 0 {
            return None;
        }
        let snapshot = record_type == SNAPSHOT;
        let fixed = if snapshot { 4 + 4 + 4 + 8 + 8 + 8 } else { 4 + 4 + 8 };
        if b.remaining() < fixed {
            return None;
        }
        let snapshot_epoch = b.get_i32();
        let state_epoch = if snapshot { b.get_i32() } else { -1 };
        let leader_epoch = b.get_i32();
        let start_offset = b.get_i64();
        let (create_timestamp, write_timestamp) = if snapshot { (b.get_i64(), b.get_i64()) } else { (-1, -1) };
        let n = (get_uvarint(b)? as usize).checked_sub(1)?;
        // Each batch takes 20 bytes at least: a count beyond what is left is malformed, and
        // refusing it before allocating keeps a corrupt record from claiming memory.
        if n > b.remaining() / 20 {
            return None;
        }
        let mut batches = Vec::with_capacity(n);
        for _ in 0..n {
            if b.remaining() < 19 {
                return None;
            }
            batches.push(StateBatch {
                first_offset: b.get_i64(),
                last_offset: b.get_i64(),
                delivery_state: b.get_i8(),
                delivery_count: b.get_i16(),
            });
            skip_tagged(b)?;
        }
        skip_tagged(b)?;
        Some(StateValue {
            snapshot_epoch,
            state_epoch,
            leader_epoch,
            start_offset,
            create_timestamp,
            write_timestamp,
            batches,
        })
    }
}

/// The most offsets a rebuilt share-partition holds in flight: Kafka's upper bound of
/// `group.share.partition.max.record.locks`, so whatever this broker wrote fits, and a
/// corrupt batch cannot make the load allocate without bound.
pub const MAX_WINDOW: i64 = 10_000;

/// One share-partition's state as the records so far make it: what a snapshot set, with the
/// updates since applied over it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayedState {
    pub snapshot_epoch: i32,
    pub state_epoch: i32,
    pub leader_epoch: i32,
    pub start_offset: i64,
    pub create_timestamp: i64,
    /// Per offset at or above the start: (delivery state, delivery count).
    pub offsets: BTreeMap<i64, (i8, i16)>,
    /// Updates applied since the snapshot (the next write is a snapshot past the limit).
    pub updates_since_snapshot: u32,
}

impl ReplayedState {
    /// Applies one record of this share-partition, in log order.
    pub fn apply(&mut self, record_type: i16, v: &StateValue) {
        if record_type == SNAPSHOT {
            *self = ReplayedState {
                snapshot_epoch: v.snapshot_epoch,
                state_epoch: v.state_epoch,
                leader_epoch: v.leader_epoch,
                start_offset: v.start_offset,
                create_timestamp: v.create_timestamp,
                offsets: BTreeMap::new(),
                updates_since_snapshot: 0,
            };
        } else {
            // An update written after a later snapshot than the one loaded cannot happen in one
            // log; an older one (a previous leader's late write) would be stale: Kafka's shard
            // drops updates whose snapshot epoch is not the current one.
            if v.snapshot_epoch != self.snapshot_epoch {
                return;
            }
            if v.start_offset >= 0 {
                self.start_offset = v.start_offset;
            }
            self.leader_epoch = v.leader_epoch.max(self.leader_epoch);
            self.updates_since_snapshot = self.updates_since_snapshot.saturating_add(1);
        }
        let start = self.start_offset;
        self.offsets = self.offsets.split_off(&start);
        for s in &v.batches {
            let first = s.first_offset.max(start);
            let last = s.last_offset.min(start.saturating_add(MAX_WINDOW - 1));
            for o in first..=last {
                self.offsets.insert(o, (s.delivery_state, s.delivery_count));
            }
        }
    }
}

/// Consecutive offsets with one state and count, as batches.
pub fn to_batches(offsets: impl IntoIterator<Item = (i64, (i8, i16))>) -> Vec<StateBatch> {
    let mut out: Vec<StateBatch> = Vec::new();
    for (o, (state, count)) in offsets {
        match out.last_mut() {
            Some(b) if b.last_offset + 1 == o && b.delivery_state == state && b.delivery_count == count => {
                b.last_offset = o
            }
            _ => out.push(StateBatch { first_offset: o, last_offset: o, delivery_state: state, delivery_count: count }),
        }
    }
    out
}

/// The `__share_group_state` partition of a share-partition: Kafka's share coordinator key
/// "group:topicId:partition" hashed as a group id is over `__consumer_offsets`.
pub fn coordinator_key(key: &SharePartitionKey) -> String {
    format!("{}:{}:{}", key.0, crate::metadata::zk_data::uuid_to_kafka(key.1), key.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SharePartitionKey {
        ("g".to_string(), Uuid::from_bytes([7; 16]), 3)
    }

    fn batch(first: i64, last: i64, state: i8, count: i16) -> StateBatch {
        StateBatch { first_offset: first, last_offset: last, delivery_state: state, delivery_count: count }
    }

    #[test]
    fn keys_and_values_round_trip() {
        for t in [SNAPSHOT, UPDATE] {
            assert_eq!(decode_key(&encode_key(t, &key())), Some((t, key())));
        }
        let v = StateValue {
            snapshot_epoch: 2,
            state_epoch: 1,
            leader_epoch: 5,
            start_offset: 10,
            create_timestamp: 111,
            write_timestamp: 222,
            batches: vec![batch(10, 12, ACKNOWLEDGED, 1), batch(13, 13, AVAILABLE, 2)],
        };
        assert_eq!(StateValue::decode(SNAPSHOT, &v.encode(SNAPSHOT)), Some(v.clone()));
        let u = StateValue { state_epoch: -1, create_timestamp: -1, write_timestamp: -1, ..v };
        assert_eq!(StateValue::decode(UPDATE, &u.encode(UPDATE)), Some(u));
    }

    /// Bytes as Kafka 4.x's ShareSnapshotKey/ShareSnapshotValue and ShareUpdateValue serialize
    /// (CoordinatorRecordSerde: version-prefixed, flexible value with empty tagged fields).
    #[test]
    fn bytes_match_kafkas_schemas() {
        let k = encode_key(SNAPSHOT, &key());
        let mut want = vec![0, 0, 0, 1, b'g'];
        want.extend([7; 16]);
        want.extend([0, 0, 0, 3]);
        assert_eq!(&k[..], &want[..]);
        assert_eq!(encode_key(UPDATE, &key())[..2], [0, 1]);
        let v = StateValue {
            snapshot_epoch: 1,
            state_epoch: 2,
            leader_epoch: 3,
            start_offset: 4,
            create_timestamp: 5,
            write_timestamp: 6,
            batches: vec![batch(4, 5, ARCHIVED, 7)],
        };
        #[rustfmt::skip]
        let snapshot: Vec<u8> = vec![
            0, 0, // version
            0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, // snapshot, state, leader epochs
            0, 0, 0, 0, 0, 0, 0, 4, // start offset
            0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 6, // create, write timestamps
            2, // one batch (compact array: n + 1)
            0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 5, 4, 0, 7, 0, // batch + its tags
            0, // tags
        ];
        assert_eq!(&v.encode(SNAPSHOT)[..], &snapshot[..]);
        #[rustfmt::skip]
        let update: Vec<u8> = vec![
            0, 0, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 4, 2,
            0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 5, 4, 0, 7, 0, 0,
        ];
        assert_eq!(&v.encode(UPDATE)[..], &update[..]);
        // Kafka 4.2 writes DeliveryCompleteCount as tag 0: read past it.
        let mut tagged = update.clone();
        let last = tagged.len() - 1;
        tagged.splice(last.., [1, 0, 4, 0, 0, 0, 9]);
        assert_eq!(StateValue::decode(UPDATE, &tagged).map(|v| v.batches), Some(vec![batch(4, 5, ARCHIVED, 7)]));
    }

    #[test]
    fn malformed_records_are_refused_without_panicking() {
        let v = StateValue {
            snapshot_epoch: 0,
            state_epoch: 0,
            leader_epoch: 0,
            start_offset: 0,
            create_timestamp: 0,
            write_timestamp: 0,
            batches: vec![batch(0, 1, AVAILABLE, 1)],
        }
        .encode(SNAPSHOT);
        for cut in 0..v.len() {
            assert_eq!(StateValue::decode(SNAPSHOT, &v[..cut]), None, "cut at {cut}");
        }
        let k = encode_key(UPDATE, &key());
        for cut in 0..k.len() {
            assert_eq!(decode_key(&k[..cut]), None, "key cut at {cut}");
        }
        // A huge batch count is refused before anything is allocated for it.
        let mut huge = v[..38].to_vec();
        huge.extend([0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(StateValue::decode(SNAPSHOT, &huge), None);
        assert_eq!(decode_key(&[0, 9, 0, 0]), None, "another record type");
    }

    #[test]
    fn a_snapshot_and_its_updates_give_the_state() {
        let mut s = ReplayedState::default();
        let snap = |epoch, start, batches| StateValue {
            snapshot_epoch: epoch,
            state_epoch: 0,
            leader_epoch: 0,
            start_offset: start,
            create_timestamp: 1,
            write_timestamp: 1,
            batches,
        };
        let upd = |epoch, start, batches| StateValue { state_epoch: -1, ..snap(epoch, start, batches) };
        s.apply(SNAPSHOT, &snap(0, 0, vec![batch(0, 3, AVAILABLE, 1)]));
        s.apply(UPDATE, &upd(0, -1, vec![batch(1, 2, ACKNOWLEDGED, 1)]));
        s.apply(UPDATE, &upd(0, 1, vec![batch(3, 5, AVAILABLE, 2)]));
        assert_eq!(s.start_offset, 1);
        assert_eq!(
            to_batches(s.offsets.clone()),
            vec![batch(1, 2, ACKNOWLEDGED, 1), batch(3, 5, AVAILABLE, 2)],
            "0 is below the start; 3 was overwritten"
        );
        assert_eq!(s.updates_since_snapshot, 2);
        // An update of an older snapshot is stale.
        s.apply(SNAPSHOT, &snap(1, 4, vec![batch(4, 4, ARCHIVED, 5)]));
        s.apply(UPDATE, &upd(0, 9, vec![]));
        assert_eq!((s.start_offset, s.snapshot_epoch, s.updates_since_snapshot), (4, 1, 0));
        assert_eq!(to_batches(s.offsets.clone()), vec![batch(4, 4, ARCHIVED, 5)]);
        // A corrupt range does not expand past the window.
        s.apply(UPDATE, &upd(1, -1, vec![batch(0, i64::MAX, AVAILABLE, 1)]));
        assert_eq!(s.offsets.len() as i64, MAX_WINDOW);
    }
}
