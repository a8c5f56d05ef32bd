//! The records the group coordinator keeps in `__consumer_offsets`, in Kafka's key/value
//! schemas, so that tools which read the topic directly (Burrow, the console consumer with
//! Kafka's OffsetsMessageFormatter) understand them.
//!
//! Offset commit: key v1 (group, topic, partition), value v3 (offset, leader epoch, metadata,
//! commit timestamp). Group metadata: key v2 (group), value v3. A null value is a tombstone.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::log::batch::{read_varint, read_varlong};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffsetsKey {
    Offset { group: String, topic: String, partition: i32 },
    Group { group: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetValue {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
}

fn put_str(buf: &mut BytesMut, s: &str) {
    buf.put_i16(s.len() as i16);
    buf.put_slice(s.as_bytes());
}

fn put_nullable_str(buf: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_str(buf, s),
        None => buf.put_i16(-1),
    }
}

fn put_bytes(buf: &mut BytesMut, b: &[u8]) {
    buf.put_i32(b.len() as i32);
    buf.put_slice(b);
}

fn get_str(buf: &mut &[u8]) -> Option<String> {
    if buf.remaining() < 2 {
        return None;
    }
    let len = buf.get_i16();
    if len < 0 {
        return Some(String::new());
    }
    let len = len as usize;
    if buf.remaining() < len {
        return None;
    }
    let s = String::from_utf8(buf[..len].to_vec()).ok()?;
    buf.advance(len);
    Some(s)
}

impl OffsetsKey {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            OffsetsKey::Offset { group, topic, partition } => {
                b.put_i16(1);
                put_str(&mut b, group);
                put_str(&mut b, topic);
                b.put_i32(*partition);
            }
            OffsetsKey::Group { group } => {
                b.put_i16(2);
                put_str(&mut b, group);
            }
        }
        b.freeze()
    }

    pub fn decode(mut buf: &[u8]) -> Option<OffsetsKey> {
        if buf.remaining() < 2 {
            return None;
        }
        match buf.get_i16() {
            0 | 1 => {
                let group = get_str(&mut buf)?;
                let topic = get_str(&mut buf)?;
                if buf.remaining() < 4 {
                    return None;
                }
                Some(OffsetsKey::Offset { group, topic, partition: buf.get_i32() })
            }
            2 => Some(OffsetsKey::Group { group: get_str(&mut buf)? }),
            _ => None,
        }
    }
}

impl OffsetValue {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(3);
        b.put_i64(self.offset);
        b.put_i32(self.leader_epoch);
        put_str(&mut b, &self.metadata);
        b.put_i64(self.commit_timestamp);
        b.freeze()
    }

    /// Reads value versions 0-3 (4 is the flexible form Kafka 4 writes; not produced here).
    pub fn decode(mut buf: &[u8]) -> Option<OffsetValue> {
        if buf.remaining() < 10 {
            return None;
        }
        let version = buf.get_i16();
        let offset = buf.get_i64();
        let leader_epoch = if version >= 3 {
            if buf.remaining() < 4 {
                return None;
            }
            buf.get_i32()
        } else {
            -1
        };
        let metadata = get_str(&mut buf)?;
        if buf.remaining() < 8 {
            return None;
        }
        let commit_timestamp = buf.get_i64();
        Some(OffsetValue { offset, leader_epoch, metadata, commit_timestamp })
    }
}

/// One member as stored in a group metadata record.
pub struct StoredMember<'a> {
    pub member_id: &'a str,
    pub instance_id: Option<&'a str>,
    pub client_id: &'a str,
    pub client_host: &'a str,
    pub rebalance_timeout: i32,
    pub session_timeout: i32,
    pub subscription: &'a [u8],
    pub assignment: &'a [u8],
}

pub fn encode_group_value(
    protocol_type: &str,
    generation: i32,
    protocol: Option<&str>,
    leader: Option<&str>,
    timestamp: i64,
    members: &[StoredMember<'_>],
) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(3);
    put_str(&mut b, protocol_type);
    b.put_i32(generation);
    put_nullable_str(&mut b, protocol);
    put_nullable_str(&mut b, leader);
    b.put_i64(timestamp);
    b.put_i32(members.len() as i32);
    for m in members {
        put_str(&mut b, m.member_id);
        put_nullable_str(&mut b, m.instance_id);
        put_str(&mut b, m.client_id);
        put_str(&mut b, m.client_host);
        b.put_i32(m.rebalance_timeout);
        b.put_i32(m.session_timeout);
        put_bytes(&mut b, m.subscription);
        put_bytes(&mut b, m.assignment);
    }
    b.freeze()
}

/// What the coordinator restores from a group metadata value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupHeader {
    pub protocol_type: String,
    pub generation: i32,
    /// When the group last changed state (value v2+; Kafka's `current_state_timestamp`, -1 or
    /// absent when unknown).
    pub current_state_timestamp: Option<i64>,
    pub members: i32,
}

/// Reads the fields before the member list of a group metadata value (versions 0-3).
pub fn decode_group_header(mut buf: &[u8]) -> Option<GroupHeader> {
    if buf.remaining() < 2 {
        return None;
    }
    let version = buf.get_i16();
    let protocol_type = get_str(&mut buf)?;
    if buf.remaining() < 4 {
        return None;
    }
    let generation = buf.get_i32();
    let _protocol = get_str(&mut buf)?;
    let _leader = get_str(&mut buf)?;
    let current_state_timestamp = if version >= 2 {
        if buf.remaining() < 8 {
            return None;
        }
        Some(buf.get_i64()).filter(|&t| t >= 0)
    } else {
        None
    };
    if buf.remaining() < 4 {
        return None;
    }
    Some(GroupHeader { protocol_type, generation, current_state_timestamp, members: buf.get_i32() })
}

/// A key/value pair from a stored batch; `value` None is a tombstone.
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
}

/// Reads the records of one uncompressed v2 batch (the coordinator writes only those). Anything
/// malformed ends the batch early rather than failing the load.
pub fn batch_records(batch: &[u8]) -> Vec<KeyValue> {
    const HEADER: usize = 61;
    let mut out = Vec::new();
    if batch.len() < HEADER {
        return out;
    }
    let attributes = i16::from_be_bytes([batch[21], batch[22]]);
    if attributes & 0x07 != 0 || attributes & 0x20 != 0 {
        return out;
    }
    let count = i32::from_be_bytes([batch[57], batch[58], batch[59], batch[60]]).max(0);
    let mut rest = &batch[HEADER..];
    for _ in 0..count {
        let Some((len, n)) = read_varint(rest) else { break };
        rest = &rest[n..];
        if len < 0 || len as usize > rest.len() {
            break;
        }
        let (record, tail) = rest.split_at(len as usize);
        rest = tail;
        if let Some(kv) = parse_record(record) {
            out.push(kv);
        }
    }
    out
}

fn parse_record(mut r: &[u8]) -> Option<KeyValue> {
    r = r.get(1..)?; // attributes
    let (_, n) = read_varlong(r)?; // timestamp delta
    r = &r[n..];
    let (_, n) = read_varint(r)?; // offset delta
    r = &r[n..];
    let (klen, n) = read_varint(r)?;
    r = &r[n..];
    if klen < 0 || klen as usize > r.len() {
        return None;
    }
    let key = r[..klen as usize].to_vec();
    r = &r[klen as usize..];
    let (vlen, n) = read_varint(r)?;
    r = &r[n..];
    let value = if vlen < 0 {
        None
    } else {
        if vlen as usize > r.len() {
            return None;
        }
        Some(r[..vlen as usize].to_vec())
    };
    Some(KeyValue { key, value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::batch::{encode_batch, BatchOptions, SimpleRecord};

    #[test]
    fn offset_records_roundtrip_through_a_batch() {
        let key = OffsetsKey::Offset { group: "g".into(), topic: "t".into(), partition: 3 };
        let value = OffsetValue { offset: 42, leader_epoch: -1, metadata: "m".into(), commit_timestamp: 7 };
        let (k, v) = (key.encode(), value.encode());
        let gk = OffsetsKey::Group { group: "g".into() }.encode();
        let batch = encode_batch(
            &BatchOptions::default(),
            &[
                SimpleRecord { timestamp: 1, key: Some(&k), value: Some(&v), headers: vec![] },
                SimpleRecord { timestamp: 1, key: Some(&gk), value: None, headers: vec![] },
            ],
        );
        let records = batch_records(&batch);
        assert_eq!(records.len(), 2);
        assert_eq!(OffsetsKey::decode(&records[0].key), Some(key));
        assert_eq!(OffsetValue::decode(records[0].value.as_deref().unwrap()), Some(value));
        assert_eq!(OffsetsKey::decode(&records[1].key), Some(OffsetsKey::Group { group: "g".into() }));
        assert!(records[1].value.is_none());
    }

    #[test]
    fn group_values_give_back_their_state_timestamp() {
        let m = StoredMember {
            member_id: "m",
            instance_id: None,
            client_id: "c",
            client_host: "/h",
            rebalance_timeout: 1,
            session_timeout: 2,
            subscription: b"s",
            assignment: b"a",
        };
        let v = encode_group_value("consumer", 4, Some("range"), Some("m"), 1234, &[m]);
        let h = decode_group_header(&v).unwrap();
        assert_eq!(
            h,
            GroupHeader {
                protocol_type: "consumer".into(),
                generation: 4,
                current_state_timestamp: Some(1234),
                members: 1
            }
        );
        let empty = encode_group_value("consumer", 5, None, None, 99, &[]);
        assert_eq!(decode_group_header(&empty).unwrap().current_state_timestamp, Some(99));
        assert_eq!(decode_group_header(&empty).unwrap().members, 0);
        for cut in 0..empty.len() {
            assert_eq!(decode_group_header(&empty[..cut]), None, "cut at {cut}");
        }
        // Version 1 (Kafka 0.10.1-2.0) has no timestamp.
        let mut v1 = BytesMut::new();
        v1.put_i16(1);
        put_str(&mut v1, "consumer");
        v1.put_i32(2);
        put_nullable_str(&mut v1, None);
        put_nullable_str(&mut v1, None);
        v1.put_i32(0);
        let h = decode_group_header(&v1).unwrap();
        assert_eq!((h.generation, h.current_state_timestamp, h.members), (2, None, 0));
    }

    #[test]
    fn kafka_key_bytes_are_as_specified() {
        let k = OffsetsKey::Offset { group: "g".into(), topic: "t".into(), partition: 1 }.encode();
        assert_eq!(&k[..], &[0, 1, 0, 1, b'g', 0, 1, b't', 0, 0, 0, 1]);
    }

    #[test]
    fn garbage_is_refused_without_panicking() {
        for n in 0..80 {
            // Starts 0x00 0x25: no schema version Kafka wrote, and no valid batch header.
            let junk: Vec<u8> = (0..n).map(|i| (i * 37 % 251) as u8).collect();
            assert!(batch_records(&junk).is_empty(), "{n} bytes of junk read as records");
            assert_eq!(OffsetsKey::decode(&junk), None, "{n} bytes of junk read as a key");
            assert_eq!(OffsetValue::decode(&junk), None, "{n} bytes of junk read as a value");
        }
        // A valid key cut short anywhere is refused too.
        let k = OffsetsKey::Offset { group: "g".into(), topic: "t".into(), partition: 1 }.encode();
        for cut in 0..k.len() {
            assert_eq!(OffsetsKey::decode(&k[..cut]), None, "key cut at {cut}");
        }
    }
}
