//! The consumer protocol's records in `__consumer_offsets`, in Kafka 4.x's schemas so that a
//! Kafka coordinator (and Kafka's record formatters) read what gregor wrote and the reverse.
//!
//! A key starts with its record type as an int16 (3 group metadata, 5 member metadata, 6 target
//! assignment metadata, 7 target assignment member, 8 current member assignment; 4, the
//! partition metadata Kafka 4.1 stopped writing, is read and ignored) followed by the group id
//! and, for per-member records, the member id, as classic strings. Values are version 0 in the
//! flexible encoding (compact strings and arrays, tagged fields). A null value is a tombstone.

use bytes::{BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::assignor::Assignment;

pub const GROUP_METADATA: i16 = 3;
pub const PARTITION_METADATA: i16 = 4;
pub const MEMBER_METADATA: i16 = 5;
pub const TARGET_ASSIGNMENT_METADATA: i16 = 6;
pub const TARGET_ASSIGNMENT_MEMBER: i16 = 7;
pub const CURRENT_MEMBER_ASSIGNMENT: i16 = 8;

/// What ConsumerGroupMemberMetadataValue holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberMetadata {
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub server_assignor: Option<String>,
    /// Set for a member that speaks the classic protocol (tagged field 0).
    pub classic: Option<ClassicMemberMetadata>,
}

/// ConsumerGroupMemberMetadataValue's ClassicMemberMetadata: what a classic member sent in
/// its JoinGroup, kept so that the group can turn classic again.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClassicMemberMetadata {
    pub session_timeout_ms: i32,
    /// (protocol name, its metadata), in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
}

/// What ConsumerGroupCurrentMemberAssignmentValue holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CurrentAssignment {
    pub member_epoch: i32,
    pub previous_member_epoch: i32,
    /// Kafka's MemberState value: 0 stable, 1 unrevoked partitions, 2 unreleased partitions.
    pub state: i8,
    pub assigned: Assignment,
    pub pending_revocation: Assignment,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerRecord {
    GroupMetadata {
        group: String,
        epoch: Option<i32>,
    },
    Member {
        group: String,
        member: String,
        value: Option<MemberMetadata>,
    },
    TargetMetadata {
        group: String,
        epoch: Option<i32>,
    },
    TargetMember {
        group: String,
        member: String,
        value: Option<Assignment>,
    },
    Current {
        group: String,
        member: String,
        value: Option<CurrentAssignment>,
    },
    /// A record type of the consumer protocol that gregor does not keep.
    Ignored,
}

impl ConsumerRecord {
    /// The record's key and value (None: tombstone), as appended.
    pub fn encode(&self) -> (Bytes, Option<Bytes>) {
        match self {
            ConsumerRecord::GroupMetadata { group, epoch } => {
                (key(GROUP_METADATA, group, None), epoch.map(epoch_value))
            }
            ConsumerRecord::Member { group, member, value } => {
                (key(MEMBER_METADATA, group, Some(member)), value.as_ref().map(member_value))
            }
            ConsumerRecord::TargetMetadata { group, epoch } => {
                (key(TARGET_ASSIGNMENT_METADATA, group, None), epoch.map(epoch_value))
            }
            ConsumerRecord::TargetMember { group, member, value } => {
                (key(TARGET_ASSIGNMENT_MEMBER, group, Some(member)), value.as_ref().map(target_value))
            }
            ConsumerRecord::Current { group, member, value } => {
                (key(CURRENT_MEMBER_ASSIGNMENT, group, Some(member)), value.as_ref().map(current_value))
            }
            ConsumerRecord::Ignored => (Bytes::new(), None),
        }
    }

    /// Reads a record of the consumer protocol; None for anything else (classic records, or
    /// bytes no schema explains).
    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Option<ConsumerRecord> {
        let mut k = Reader(key);
        let kind = k.i16()?;
        if !(GROUP_METADATA..=CURRENT_MEMBER_ASSIGNMENT).contains(&kind) {
            return None;
        }
        let group = k.string()?;
        let member = match kind {
            MEMBER_METADATA | TARGET_ASSIGNMENT_MEMBER | CURRENT_MEMBER_ASSIGNMENT => Some(k.string()?),
            _ => None,
        };
        let mut v = value.map(Reader);
        // Every value is version 0 of a flexible schema; a newer version is not ours to guess.
        if let Some(r) = v.as_mut() {
            if r.i16()? != 0 {
                return None;
            }
        }
        Some(match (kind, member) {
            (GROUP_METADATA, _) => {
                ConsumerRecord::GroupMetadata { group, epoch: v.map(|mut r| r.epoch_value()).transpose_none()? }
            }
            (TARGET_ASSIGNMENT_METADATA, _) => {
                ConsumerRecord::TargetMetadata { group, epoch: v.map(|mut r| r.epoch_value()).transpose_none()? }
            }
            (MEMBER_METADATA, Some(member)) => {
                ConsumerRecord::Member { group, member, value: v.map(|mut r| r.member()).transpose_none()? }
            }
            (TARGET_ASSIGNMENT_MEMBER, Some(member)) => {
                ConsumerRecord::TargetMember { group, member, value: v.map(|mut r| r.target_value()).transpose_none()? }
            }
            (CURRENT_MEMBER_ASSIGNMENT, Some(member)) => {
                ConsumerRecord::Current { group, member, value: v.map(|mut r| r.current()).transpose_none()? }
            }
            _ => ConsumerRecord::Ignored,
        })
    }
}

/// `Option<Option<T>>` from "no value" (a tombstone, fine) and "a value that did not parse".
trait TransposeNone<T> {
    fn transpose_none(self) -> Option<Option<T>>;
}

impl<T> TransposeNone<T> for Option<Option<T>> {
    fn transpose_none(self) -> Option<Option<T>> {
        match self {
            None => Some(None),
            Some(None) => None,
            Some(Some(v)) => Some(Some(v)),
        }
    }
}

fn key(kind: i16, group: &str, member: Option<&str>) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(kind);
    put_classic_str(&mut b, group);
    if let Some(m) = member {
        put_classic_str(&mut b, m);
    }
    b.freeze()
}

fn put_classic_str(b: &mut BytesMut, s: &str) {
    b.put_i16(s.len().min(i16::MAX as usize) as i16);
    b.put_slice(&s.as_bytes()[..s.len().min(i16::MAX as usize)]);
}

fn put_uvarint(b: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        b.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    b.put_u8(v as u8);
}

fn put_compact_str(b: &mut BytesMut, s: &str) {
    put_uvarint(b, s.len() as u64 + 1);
    b.put_slice(s.as_bytes());
}

fn put_compact_nullable_str(b: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_compact_str(b, s),
        None => put_uvarint(b, 0),
    }
}

fn put_partitions(b: &mut BytesMut, a: &Assignment) {
    put_uvarint(b, a.len() as u64 + 1);
    for (topic, parts) in a {
        b.put_slice(topic.as_bytes());
        put_uvarint(b, parts.len() as u64 + 1);
        for p in parts {
            b.put_i32(*p);
        }
        put_uvarint(b, 0);
    }
}

fn epoch_value(epoch: i32) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    b.put_i32(epoch);
    put_uvarint(&mut b, 0);
    b.freeze()
}

fn member_value(m: &MemberMetadata) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    put_compact_nullable_str(&mut b, m.instance_id.as_deref());
    put_compact_nullable_str(&mut b, m.rack_id.as_deref());
    put_compact_str(&mut b, &m.client_id);
    put_compact_str(&mut b, &m.client_host);
    put_uvarint(&mut b, m.subscribed_topic_names.len() as u64 + 1);
    for t in &m.subscribed_topic_names {
        put_compact_str(&mut b, t);
    }
    put_compact_nullable_str(&mut b, m.subscribed_topic_regex.as_deref());
    b.put_i32(m.rebalance_timeout_ms);
    put_compact_nullable_str(&mut b, m.server_assignor.as_deref());
    match &m.classic {
        None => put_uvarint(&mut b, 0),
        Some(c) => {
            let mut f = BytesMut::new();
            f.put_i32(c.session_timeout_ms);
            put_uvarint(&mut f, c.protocols.len() as u64 + 1);
            for (name, metadata) in &c.protocols {
                put_compact_str(&mut f, name);
                put_uvarint(&mut f, metadata.len() as u64 + 1);
                f.put_slice(metadata);
                put_uvarint(&mut f, 0);
            }
            put_uvarint(&mut f, 0);
            put_uvarint(&mut b, 1);
            put_uvarint(&mut b, 0);
            put_uvarint(&mut b, f.len() as u64);
            b.put_slice(&f);
        }
    }
    b.freeze()
}

fn target_value(a: &Assignment) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    put_partitions(&mut b, a);
    put_uvarint(&mut b, 0);
    b.freeze()
}

fn current_value(c: &CurrentAssignment) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    b.put_i32(c.member_epoch);
    b.put_i32(c.previous_member_epoch);
    b.put_i8(c.state);
    put_partitions(&mut b, &c.assigned);
    put_partitions(&mut b, &c.pending_revocation);
    put_uvarint(&mut b, 0);
    b.freeze()
}

/// Bounds-checked reads: every getter answers None past the end instead of panicking.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn i8(&mut self) -> Option<i8> {
        Some(self.take(1)?[0] as i8)
    }

    fn i16(&mut self) -> Option<i16> {
        let b = self.take(2)?;
        Some(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Option<i32> {
        let b = self.take(4)?;
        Some(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn uvarint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn string(&mut self) -> Option<String> {
        let len = self.i16()?;
        let len = usize::try_from(len).ok()?;
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }

    fn compact_nullable_str(&mut self) -> Option<Option<String>> {
        let n = self.uvarint()?;
        if n == 0 {
            return Some(None);
        }
        let len = usize::try_from(n - 1).ok()?;
        Some(Some(String::from_utf8(self.take(len)?.to_vec()).ok()?))
    }

    fn compact_str(&mut self) -> Option<String> {
        self.compact_nullable_str()?
    }

    /// A compact array's length; a null array reads as empty.
    fn array_len(&mut self) -> Option<usize> {
        let n = self.uvarint()?;
        let len = usize::try_from(n.saturating_sub(1)).ok()?;
        // Each element is at least one byte: a length beyond what is left is garbage.
        (len <= self.0.len()).then_some(len)
    }

    fn skip_tagged(&mut self) -> Option<()> {
        let n = self.uvarint()?;
        for _ in 0..n {
            self.uvarint()?;
            let size = usize::try_from(self.uvarint()?).ok()?;
            self.take(size)?;
        }
        Some(())
    }

    fn partitions(&mut self) -> Option<Assignment> {
        let mut a = Assignment::new();
        for _ in 0..self.array_len()? {
            let id = Uuid::from_slice(self.take(16)?).ok()?;
            let n = self.array_len()?;
            let parts = a.entry(id).or_default();
            for _ in 0..n {
                parts.insert(self.i32()?);
            }
            self.skip_tagged()?;
        }
        Some(a)
    }

    fn member(&mut self) -> Option<MemberMetadata> {
        let instance_id = self.compact_nullable_str()?;
        let rack_id = self.compact_nullable_str()?;
        let client_id = self.compact_str()?;
        let client_host = self.compact_str()?;
        let mut subscribed_topic_names = Vec::new();
        for _ in 0..self.array_len()? {
            subscribed_topic_names.push(self.compact_str()?);
        }
        let subscribed_topic_regex = self.compact_nullable_str()?;
        let rebalance_timeout_ms = self.i32()?;
        let server_assignor = self.compact_nullable_str()?;
        let mut classic = None;
        for _ in 0..self.uvarint()? {
            let tag = self.uvarint()?;
            let size = usize::try_from(self.uvarint()?).ok()?;
            let mut field = Reader(self.take(size)?);
            if tag == 0 {
                classic = Some(field.classic()?);
            }
        }
        Some(MemberMetadata {
            instance_id,
            rack_id,
            client_id,
            client_host,
            subscribed_topic_names,
            subscribed_topic_regex,
            rebalance_timeout_ms,
            server_assignor,
            classic,
        })
    }

    fn classic(&mut self) -> Option<ClassicMemberMetadata> {
        let session_timeout_ms = self.i32()?;
        let mut protocols = Vec::new();
        for _ in 0..self.array_len()? {
            let name = self.compact_str()?;
            let len = usize::try_from(self.uvarint()?.checked_sub(1)?).ok()?;
            let metadata = Bytes::copy_from_slice(self.take(len)?);
            self.skip_tagged()?;
            protocols.push((name, metadata));
        }
        self.skip_tagged()?;
        Some(ClassicMemberMetadata { session_timeout_ms, protocols })
    }

    fn current(&mut self) -> Option<CurrentAssignment> {
        let c = CurrentAssignment {
            member_epoch: self.i32()?,
            previous_member_epoch: self.i32()?,
            state: self.i8()?,
            assigned: self.partitions()?,
            pending_revocation: self.partitions()?,
        };
        self.skip_tagged()?;
        Some(c)
    }

    fn epoch_value(&mut self) -> Option<i32> {
        let epoch = self.i32()?;
        self.skip_tagged()?;
        Some(epoch)
    }

    fn target_value(&mut self) -> Option<Assignment> {
        let a = self.partitions()?;
        self.skip_tagged()?;
        Some(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn roundtrip(r: ConsumerRecord) {
        let (k, v) = r.encode();
        assert_eq!(ConsumerRecord::decode(&k, v.as_deref()), Some(r.clone()));
        if let Some(v) = v {
            for cut in 0..v.len() {
                assert_eq!(ConsumerRecord::decode(&k, Some(&v[..cut])), None, "{r:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn records_roundtrip_and_refuse_truncation() {
        let t = Uuid::from_bytes([7; 16]);
        let a: Assignment = [(t, BTreeSet::from([0, 2, 5]))].into_iter().collect();
        roundtrip(ConsumerRecord::GroupMetadata { group: "g".into(), epoch: Some(4) });
        roundtrip(ConsumerRecord::GroupMetadata { group: "g".into(), epoch: None });
        roundtrip(ConsumerRecord::TargetMetadata { group: "g".into(), epoch: Some(4) });
        roundtrip(ConsumerRecord::TargetMember { group: "g".into(), member: "m".into(), value: Some(a.clone()) });
        roundtrip(ConsumerRecord::Member {
            group: "g".into(),
            member: "m".into(),
            value: Some(MemberMetadata {
                instance_id: None,
                rack_id: Some("r1".into()),
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
                subscribed_topic_names: vec!["a".into(), "b".into()],
                subscribed_topic_regex: None,
                rebalance_timeout_ms: 300_000,
                server_assignor: Some("range".into()),
                classic: None,
            }),
        });
        // A classic member's protocols ride in tagged field 0.
        roundtrip(ConsumerRecord::Member {
            group: "g".into(),
            member: "m".into(),
            value: Some(MemberMetadata {
                client_id: "c".into(),
                subscribed_topic_names: vec!["a".into()],
                rebalance_timeout_ms: 300_000,
                classic: Some(ClassicMemberMetadata {
                    session_timeout_ms: 10_000,
                    protocols: vec![
                        ("range".into(), Bytes::from_static(b"\0\x01x")),
                        ("roundrobin".into(), Bytes::new()),
                    ],
                }),
                ..Default::default()
            }),
        });
        roundtrip(ConsumerRecord::Current {
            group: "g".into(),
            member: "m".into(),
            value: Some(CurrentAssignment {
                member_epoch: 5,
                previous_member_epoch: 4,
                state: 1,
                assigned: a.clone(),
                pending_revocation: Assignment::new(),
            }),
        });
        roundtrip(ConsumerRecord::Current { group: "g".into(), member: "m".into(), value: None });
    }

    #[test]
    fn kafka_bytes_for_a_group_epoch() {
        let (k, v) = ConsumerRecord::GroupMetadata { group: "g".into(), epoch: Some(1) }.encode();
        assert_eq!(&k[..], &[0, 3, 0, 1, b'g']);
        assert_eq!(v.as_deref(), Some(&[0u8, 0, 0, 0, 0, 1, 0][..]));
    }

    #[test]
    fn classic_keys_and_junk_are_not_ours() {
        assert_eq!(ConsumerRecord::decode(&[0, 2, 0, 1, b'g'], None), None);
        assert_eq!(ConsumerRecord::decode(&[0, 1, 0, 1, b'g', 0, 1, b't', 0, 0, 0, 1], None), None);
        for n in 0..40 {
            let junk: Vec<u8> = (0..n).map(|i| (i * 37 % 251) as u8).collect();
            assert_eq!(ConsumerRecord::decode(&junk, Some(&junk)), None);
        }
        assert_eq!(ConsumerRecord::decode(&[0, 4, 0, 1, b'g'], Some(&[0, 0, 1, 0])), Some(ConsumerRecord::Ignored));
    }
}
