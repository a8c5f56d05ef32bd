//! The records the transaction coordinator keeps in `__transaction_state`, in Kafka's schemas
//! (TransactionLogKey v0, TransactionLogValue v0), so Kafka's own tools can read the topic:
//!
//! key   = version i16 (0), transactional_id string
//! value = version i16 (0), producer_id i64, producer_epoch i16, transaction_timeout_ms i32,
//!         state i8, partitions nullable array of (topic string, partition ids array of i32),
//!         last_update_timestamp_ms i64, start_timestamp_ms i64
//!
//! A null value is a tombstone (the transactional id expired).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::state::TxnState;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnLogValue {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    /// Sorted by topic, then partition, as the coordinator keeps them.
    pub partitions: Vec<(String, i32)>,
    pub last_update_ms: i64,
    pub start_ms: i64,
}

pub fn encode_key(transactional_id: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + transactional_id.len());
    b.put_i16(0);
    put_str(&mut b, transactional_id);
    b.freeze()
}

pub fn decode_key(mut buf: &[u8]) -> Option<String> {
    if buf.remaining() < 2 {
        return None;
    }
    // Version 0 is the only key Kafka has written; a newer one is not ours to guess at.
    if buf.get_i16() != 0 {
        return None;
    }
    get_str(&mut buf)
}

fn put_str(b: &mut BytesMut, s: &str) {
    let bytes = s.as_bytes();
    let len = bytes.len().min(i16::MAX as usize);
    b.put_i16(len as i16);
    b.put_slice(&bytes[..len]);
}

fn get_str(buf: &mut &[u8]) -> Option<String> {
    if buf.remaining() < 2 {
        return None;
    }
    let len = buf.get_i16();
    if len < 0 || buf.remaining() < len as usize {
        return None;
    }
    let s = std::str::from_utf8(&buf[..len as usize]).ok()?.to_string();
    buf.advance(len as usize);
    Some(s)
}

impl TxnLogValue {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(64);
        b.put_i16(0);
        b.put_i64(self.producer_id);
        b.put_i16(self.producer_epoch);
        b.put_i32(self.timeout_ms);
        b.put_i8(self.state.code());
        // Grouped by topic, as Kafka writes them.
        let mut topics: Vec<(&str, Vec<i32>)> = Vec::new();
        for (t, p) in &self.partitions {
            match topics.last_mut() {
                Some((name, ps)) if *name == t.as_str() => ps.push(*p),
                _ => topics.push((t.as_str(), vec![*p])),
            }
        }
        b.put_i32(topics.len() as i32);
        for (t, ps) in topics {
            put_str(&mut b, t);
            b.put_i32(ps.len() as i32);
            for p in ps {
                b.put_i32(p);
            }
        }
        b.put_i64(self.last_update_ms);
        b.put_i64(self.start_ms);
        b.freeze()
    }

    /// Reads value version 0 (and the fields version 1 shares with it, ignoring its tagged
    /// fields, which only Kafka 4's transactions v2 writes).
    pub fn decode(mut buf: &[u8]) -> Option<TxnLogValue> {
        if buf.remaining() < 2 + 8 + 2 + 4 + 1 + 4 {
            return None;
        }
        let version = buf.get_i16();
        if version != 0 {
            return None;
        }
        let producer_id = buf.get_i64();
        let producer_epoch = buf.get_i16();
        let timeout_ms = buf.get_i32();
        let state = TxnState::from_code(buf.get_i8())?;
        let topics = buf.get_i32();
        let mut partitions = Vec::new();
        for _ in 0..topics.max(0) {
            let topic = get_str(&mut buf)?;
            if buf.remaining() < 4 {
                return None;
            }
            let n = buf.get_i32();
            if n < 0 || buf.remaining() < n as usize * 4 {
                return None;
            }
            for _ in 0..n {
                partitions.push((topic.clone(), buf.get_i32()));
            }
        }
        if buf.remaining() < 16 {
            return None;
        }
        let last_update_ms = buf.get_i64();
        let start_ms = buf.get_i64();
        partitions.sort();
        Some(TxnLogValue { producer_id, producer_epoch, timeout_ms, state, partitions, last_update_ms, start_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_bytes_are_kafkas() {
        assert_eq!(&encode_key("tx")[..], &[0, 0, 0, 2, b't', b'x']);
        assert_eq!(decode_key(&encode_key("tx")), Some("tx".to_string()));
        assert_eq!(decode_key(&[0, 1, 0, 0]), None);
    }

    #[test]
    fn values_roundtrip_and_match_kafkas_layout() {
        let v = TxnLogValue {
            producer_id: 7,
            producer_epoch: 2,
            timeout_ms: 60_000,
            state: TxnState::Ongoing,
            partitions: vec![("a".into(), 0), ("a".into(), 3), ("b".into(), 1)],
            last_update_ms: 11,
            start_ms: 10,
        };
        let bytes = v.encode();
        // version, pid, epoch, timeout, state, 2 topics: "a" [0, 3], "b" [1], two timestamps
        assert_eq!(bytes.len(), 2 + 8 + 2 + 4 + 1 + 4 + (2 + 1 + 4 + 8) + (2 + 1 + 4 + 4) + 16);
        assert_eq!(bytes[16], 1, "Ongoing is state 1");
        assert_eq!(TxnLogValue::decode(&bytes), Some(v.clone()));
        for cut in 0..bytes.len() {
            assert_eq!(TxnLogValue::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let empty = TxnLogValue { partitions: vec![], state: TxnState::Empty, ..v };
        assert_eq!(TxnLogValue::decode(&empty.encode()), Some(empty));
    }
}
