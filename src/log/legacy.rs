//! Message formats v0 and v1 (magic 0 and 1, "message sets"), which Produce v0-v2 carry and
//! Fetch v0-v3 readers expect. The log holds record batches v2 only, as Kafka 3.x's does:
//!
//! * a produced message set is checked (CRC-32 of every message, inner messages of compressed
//!   wrappers included) and converted into one v2 batch before it is appended, keeping the
//!   timestamps and the codec (Kafka's LogValidator with `compression.type=producer`);
//! * an old reader's fetch converts the stored batches back, one legacy message per record of
//!   an uncompressed batch and one compressed wrapper per compressed batch, with timestamps
//!   (format v1) and codec kept, headers and control batches dropped, and no more output than
//!   the fetch asked for beyond the first batch (Kafka's down-conversion).
//!
//! Legacy message: `offset i64, size i32, crc u32 (CRC-32 of the rest), magic i8,
//! attributes i8 (codec bits 0-2, v1: bit 3 LogAppendTime), [v1: timestamp i64], key, value`
//! (int32-length bytes, -1 null). A wrapper's value is the compressed inner message set; in v1
//! the inner offsets are relative (0..n-1) and the wrapper carries the last one's absolute
//! offset, in v0 they are absolute.

use std::borrow::Cow;

use super::batch::{encode_batch, read_varint, read_varlong, BatchHeader, BatchOptions, SimpleRecord, HEADER_SIZE};
use super::compression::{self, NONE, ZSTD};
use super::LogError;

const LOG_OVERHEAD: usize = 12;
/// Where the magic byte sits in both a legacy message and a v2 batch.
pub const MAGIC_OFFSET: usize = 16;
const V0_MIN_SIZE: usize = 4 + 1 + 1 + 4 + 4;
const V1_MIN_SIZE: usize = V0_MIN_SIZE + 8;
const LOG_APPEND_TIME_BIT: u8 = 0x08;
const CODEC_MASK: u8 = 0x07;

/// The magic of the first entry of a record set, if it is long enough to have one.
pub fn first_magic(records: &[u8]) -> Option<i8> {
    records.get(MAGIC_OFFSET).map(|&m| m as i8)
}

struct Message<'a> {
    // Only the tests read it: the broker assigns offsets itself, ignoring the client's.
    #[cfg_attr(not(test), allow(dead_code))]
    offset: i64,
    magic: i8,
    attributes: u8,
    timestamp: i64,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
}

fn corrupt(why: impl Into<String>) -> LogError {
    LogError::CorruptMessage(why.into())
}

fn be_i32(b: &[u8]) -> i32 {
    i32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be_i64(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    i64::from_be_bytes(a)
}

/// int32-length bytes at `at` in `msg`; returns them and the position after.
fn legacy_bytes(msg: &[u8], at: usize) -> Result<(Option<&[u8]>, usize), LogError> {
    let len = msg.get(at..at + 4).map(be_i32).ok_or_else(|| corrupt("message ends inside a length"))?;
    if len < 0 {
        return Ok((None, at + 4));
    }
    let end = (at + 4).checked_add(len as usize).filter(|&e| e <= msg.len());
    let end = end.ok_or_else(|| corrupt("message key or value beyond its size"))?;
    Ok((Some(&msg[at + 4..end]), end))
}

/// Every message of a legacy set, each checked against its CRC.
fn parse_messages(set: &[u8]) -> Result<Vec<Message<'_>>, LogError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < set.len() {
        let rest = &set[pos..];
        if rest.len() < LOG_OVERHEAD {
            return Err(corrupt(format!("{} trailing bytes are too few for a message", rest.len())));
        }
        let offset = be_i64(rest);
        let size = be_i32(&rest[8..]);
        let size = usize::try_from(size).map_err(|_| corrupt("negative message size"))?;
        if size > rest.len() - LOG_OVERHEAD {
            return Err(corrupt(format!("message claims {size} bytes but only {} remain", rest.len() - LOG_OVERHEAD)));
        }
        let msg = &rest[LOG_OVERHEAD..LOG_OVERHEAD + size];
        let magic = *msg.get(4).ok_or_else(|| corrupt("message too short for its magic"))? as i8;
        if !(0..=1).contains(&magic) {
            return Err(LogError::InvalidRecord(format!("magic {magic} among messages of format v0/v1")));
        }
        if size < if magic == 0 { V0_MIN_SIZE } else { V1_MIN_SIZE } {
            return Err(corrupt(format!("message of {size} bytes is below the v{magic} minimum")));
        }
        if crc32fast::hash(&msg[4..]) != be_i32(msg) as u32 {
            return Err(corrupt("message CRC-32 mismatch"));
        }
        let attributes = msg[5];
        let (timestamp, at) = if magic == 1 { (be_i64(&msg[6..]), 14) } else { (-1, 6) };
        let (key, at) = legacy_bytes(msg, at)?;
        let (value, at) = legacy_bytes(msg, at)?;
        if at != msg.len() {
            return Err(corrupt(format!("{} bytes after the message value", msg.len() - at)));
        }
        out.push(Message { offset, magic, attributes, timestamp, key, value });
        pos += LOG_OVERHEAD + size;
    }
    Ok(out)
}

/// A produced message set as one v2 batch (offsets 0..n-1, to be assigned on append),
/// compressed with the codec its last entry used, as Kafka picks the source codec.
/// Decompressed inner sets may not exceed `decompress_limit` bytes in all.
pub fn to_record_batch(set: &[u8], decompress_limit: usize) -> Result<Vec<u8>, LogError> {
    let outer = parse_messages(set)?;
    let Some(last) = outer.last() else { return Err(LogError::InvalidRecord("no message in the set".into())) };
    let codec = last.attributes & CODEC_MASK;
    let mut budget = decompress_limit;
    // (timestamp, key, value); keys and values of compressed wrappers live in `inflated`.
    let mut inflated: Vec<Vec<u8>> = Vec::new();
    for m in &outer {
        let c = m.attributes & CODEC_MASK;
        if c == NONE {
            continue;
        }
        let value = m.value.ok_or_else(|| LogError::InvalidRecord("compressed message without a value".into()))?;
        let inner = compression::decompress(c, m.magic, value, budget)?;
        budget -= inner.len();
        inflated.push(inner);
    }
    let mut records: Vec<SimpleRecord<'_>> = Vec::with_capacity(outer.len());
    let mut inner_sets = inflated.iter();
    for m in &outer {
        if m.attributes & CODEC_MASK == NONE {
            records.push(SimpleRecord { timestamp: m.timestamp, key: m.key, value: m.value, headers: Vec::new() });
            continue;
        }
        let inner = inner_sets.next().ok_or_else(|| corrupt("compressed message lost its inner set"))?;
        let inner = parse_messages(inner)?;
        if inner.is_empty() {
            return Err(LogError::InvalidRecord("compressed message with no inner message".into()));
        }
        let wrapper_time = (m.magic == 1 && m.attributes & LOG_APPEND_TIME_BIT != 0).then_some(m.timestamp);
        for i in inner {
            if i.attributes & CODEC_MASK != NONE {
                return Err(LogError::InvalidRecord("compressed message inside a compressed message".into()));
            }
            if i.magic != m.magic {
                return Err(LogError::InvalidRecord(format!("inner magic {} in a v{} wrapper", i.magic, m.magic)));
            }
            let timestamp = wrapper_time.unwrap_or(i.timestamp);
            records.push(SimpleRecord { timestamp, key: i.key, value: i.value, headers: Vec::new() });
        }
    }
    if records.len() > i32::MAX as usize {
        return Err(LogError::InvalidRecord("too many messages for one batch".into()));
    }
    let batch = encode_batch(&BatchOptions::default(), &records);
    if codec == NONE {
        return Ok(batch);
    }
    compress_batch(batch, codec)
}

/// An uncompressed v2 batch with its records compressed by `codec` (header fixed up).
fn compress_batch(batch: Vec<u8>, codec: u8) -> Result<Vec<u8>, LogError> {
    use super::batch::{CRC_START, OFF_ATTRIBUTES, OFF_BATCH_LENGTH, OFF_CRC};
    let compressed = compression::compress(codec, &batch[HEADER_SIZE..])?;
    let mut out = Vec::with_capacity(HEADER_SIZE + compressed.len());
    out.extend_from_slice(&batch[..HEADER_SIZE]);
    out.extend_from_slice(&compressed);
    let attributes = i16::from_be_bytes([out[OFF_ATTRIBUTES], out[OFF_ATTRIBUTES + 1]]) | i16::from(codec);
    out[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    let len = (out.len() - LOG_OVERHEAD) as i32;
    out[OFF_BATCH_LENGTH..OFF_BATCH_LENGTH + 4].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&out[CRC_START..]);
    out[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

struct StoredRecord<'a> {
    offset: i64,
    timestamp: i64,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
}

/// v2 varint-length bytes at `at`.
fn v2_bytes(b: &[u8], at: usize) -> Result<(Option<&[u8]>, usize), LogError> {
    let (len, n) = read_varint(b.get(at..).unwrap_or_default()).ok_or_else(|| corrupt("bad record length"))?;
    let at = at + n;
    if len < 0 {
        return Ok((None, at));
    }
    let end = at.checked_add(len as usize).filter(|&e| e <= b.len()).ok_or_else(|| corrupt("record field too long"))?;
    Ok((Some(&b[at..end]), end))
}

/// The records of a stored v2 batch whose records section (decompressed) is `body`.
fn batch_records<'a>(h: &BatchHeader, body: &'a [u8]) -> Result<Vec<StoredRecord<'a>>, LogError> {
    let count = usize::try_from(h.records_count).unwrap_or(0);
    let mut out = Vec::with_capacity(count.min(body.len() / 7 + 1));
    let mut pos = 0usize;
    for _ in 0..count {
        let (len, n) = read_varint(body.get(pos..).unwrap_or_default()).ok_or_else(|| corrupt("bad record size"))?;
        pos += n;
        let end = usize::try_from(len).ok().and_then(|l| pos.checked_add(l)).filter(|&e| e <= body.len());
        let end = end.ok_or_else(|| corrupt("record beyond its batch"))?;
        let rec = &body[pos..end];
        let mut at = 1; // attributes: unused
        let (ts_delta, n) = read_varlong(rec.get(at..).unwrap_or_default()).ok_or_else(|| corrupt("bad timestamp"))?;
        at += n;
        let (offset_delta, n) =
            read_varint(rec.get(at..).unwrap_or_default()).ok_or_else(|| corrupt("bad offset delta"))?;
        at += n;
        let (key, at2) = v2_bytes(rec, at)?;
        let (value, _) = v2_bytes(rec, at2)?;
        out.push(StoredRecord {
            offset: h.base_offset.saturating_add(i64::from(offset_delta)),
            timestamp: if h.is_log_append_time() { h.max_timestamp } else { h.base_timestamp.saturating_add(ts_delta) },
            key,
            value,
        });
        pos = end;
    }
    Ok(out)
}

fn write_message(out: &mut Vec<u8>, offset: i64, magic: i8, attributes: u8, timestamp: i64, r: &StoredRecord<'_>) {
    write_message_parts(out, offset, magic, attributes, timestamp, r.key, r.value);
}

fn write_message_parts(
    out: &mut Vec<u8>,
    offset: i64,
    magic: i8,
    attributes: u8,
    timestamp: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) {
    out.extend_from_slice(&offset.to_be_bytes());
    let size_at = out.len();
    out.extend_from_slice(&[0; 8]); // size and CRC, filled in below
    out.push(magic as u8);
    out.push(attributes);
    if magic == 1 {
        out.extend_from_slice(&timestamp.to_be_bytes());
    }
    for field in [key, value] {
        match field {
            Some(b) => {
                out.extend_from_slice(&(b.len() as i32).to_be_bytes());
                out.extend_from_slice(b);
            }
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    let size = (out.len() - size_at - 4) as i32;
    out[size_at..size_at + 4].copy_from_slice(&size.to_be_bytes());
    let crc = crc32fast::hash(&out[size_at + 8..]);
    out[size_at + 4..size_at + 8].copy_from_slice(&crc.to_be_bytes());
}

/// Stored v2 batches as a message set of format `magic` (0 or 1) for a reader at
/// `fetch_offset`. Conversion stops once `max_bytes` are out, after the first batch at least
/// (so the reader always progresses); a trailing partial batch is left out. A zstd batch
/// cannot be expressed in v0/v1: UNSUPPORTED_COMPRESSION_TYPE, as Kafka answers such readers.
#[cfg(test)]
pub fn to_message_set(
    stored: &[u8],
    magic: i8,
    fetch_offset: i64,
    max_bytes: usize,
    decompress_limit: usize,
) -> Result<Vec<u8>, LogError> {
    to_message_set_counted(stored, magic, fetch_offset, max_bytes, decompress_limit).map(|(set, _)| set)
}

/// [`to_message_set`], with the number of records converted (Kafka's message conversions).
pub fn to_message_set_counted(
    stored: &[u8],
    magic: i8,
    fetch_offset: i64,
    max_bytes: usize,
    decompress_limit: usize,
) -> Result<(Vec<u8>, u64), LogError> {
    let mut converted = 0u64;
    let mut out = Vec::new();
    let mut pos = 0usize;
    while let Some(h) = BatchHeader::parse(&stored[pos..]) {
        let total = h.total_size();
        if h.batch_length < 0 || total > stored.len() - pos {
            break;
        }
        let batch = &stored[pos..pos + total];
        pos += total;
        if h.magic != 2 || h.is_control() || total < HEADER_SIZE {
            continue;
        }
        if !out.is_empty() && out.len() >= max_bytes {
            break;
        }
        let codec = h.compression();
        let body: Cow<'_, [u8]> = match codec {
            NONE => Cow::Borrowed(&batch[HEADER_SIZE..]),
            ZSTD => {
                return Err(LogError::UnsupportedCompression("zstd batches cannot be read in formats v0/v1".into()))
            }
            c => Cow::Owned(compression::decompress(c, 2, &batch[HEADER_SIZE..], decompress_limit)?),
        };
        let records = batch_records(&h, &body)?;
        let time_bit = if magic == 1 && h.is_log_append_time() { LOG_APPEND_TIME_BIT } else { 0 };
        if codec == NONE {
            for r in records.iter().filter(|r| r.offset >= fetch_offset) {
                write_message(&mut out, r.offset, magic, time_bit, r.timestamp, r);
                converted += 1;
            }
            continue;
        }
        let (Some(first), Some(last)) = (records.first(), records.last()) else { continue };
        let (first, last) = (first.offset, last.offset);
        let mut inner = Vec::new();
        for r in &records {
            let offset = if magic == 1 { r.offset - first } else { r.offset };
            write_message(&mut inner, offset, magic, 0, r.timestamp, r);
        }
        let compressed = compression::compress(codec, &inner)?;
        let wrapper_time = records.iter().map(|r| r.timestamp).max().unwrap_or(-1).max(h.max_timestamp);
        write_message_parts(&mut out, last, magic, codec | time_bit, wrapper_time, None, Some(&compressed));
        converted += records.len() as u64;
    }
    Ok((out, converted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::batch::validate_batches;
    use crate::log::compression::{GZIP, LZ4, SNAPPY};

    fn message(offset: i64, magic: i8, attributes: u8, ts: i64, key: Option<&[u8]>, value: Option<&[u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        write_message_parts(&mut out, offset, magic, attributes, ts, key, value);
        out
    }

    type Bytes = Option<Vec<u8>>;
    /// (key, value, timestamp) of one inner message.
    type Inner<'a> = (Option<&'a [u8]>, Option<&'a [u8]>, i64);

    fn wrapper(magic: i8, codec: u8, inner: &[Inner<'_>]) -> Vec<u8> {
        let mut set = Vec::new();
        for (i, (k, v, ts)) in inner.iter().enumerate() {
            set.extend(message(i as i64, magic, 0, *ts, *k, *v));
        }
        let c = compression::compress(codec, &set).unwrap();
        message(inner.len() as i64 - 1, magic, codec, 0, None, Some(&c))
    }

    /// (offset, timestamp, key, value) of a v2 batch's records.
    fn v2_records(batch: &[u8]) -> Vec<(i64, i64, Bytes, Bytes)> {
        let h = BatchHeader::parse(batch).unwrap();
        let body = match h.compression() {
            NONE => batch[HEADER_SIZE..].to_vec(),
            c => compression::decompress(c, 2, &batch[HEADER_SIZE..], 1 << 20).unwrap(),
        };
        batch_records(&h, &body)
            .unwrap()
            .into_iter()
            .map(|r| (r.offset, r.timestamp, r.key.map(<[u8]>::to_vec), r.value.map(<[u8]>::to_vec)))
            .collect()
    }

    /// (offset, magic, timestamp, key, value) of every message, inner ones of wrappers resolved.
    fn legacy_records(set: &[u8]) -> Vec<(i64, i8, i64, Bytes, Bytes)> {
        let mut out = Vec::new();
        for m in parse_messages(set).unwrap() {
            let c = m.attributes & CODEC_MASK;
            if c == NONE {
                out.push((m.offset, m.magic, m.timestamp, m.key.map(<[u8]>::to_vec), m.value.map(<[u8]>::to_vec)));
                continue;
            }
            let inner = compression::decompress(c, m.magic, m.value.unwrap(), 1 << 20).unwrap();
            let inner = parse_messages(&inner).unwrap();
            let last_rel = inner.last().unwrap().offset;
            for i in inner {
                let abs = if m.magic == 1 { m.offset - last_rel + i.offset } else { i.offset };
                out.push((abs, i.magic, i.timestamp, i.key.map(<[u8]>::to_vec), i.value.map(<[u8]>::to_vec)));
            }
        }
        out
    }

    #[test]
    fn uncompressed_v0_and_v1_become_one_valid_batch() {
        let mut set = message(0, 1, 0, 1000, Some(b"k1"), Some(b"v1"));
        set.extend(message(1, 1, 0, 1005, None, Some(b"v2")));
        let batch = to_record_batch(&set, 1 << 20).unwrap();
        assert_eq!(validate_batches(&batch, 1 << 20).unwrap().len(), 1);
        assert_eq!(
            v2_records(&batch),
            vec![(0, 1000, Some(b"k1".to_vec()), Some(b"v1".to_vec())), (1, 1005, None, Some(b"v2".to_vec()))]
        );
        let v0 = to_record_batch(&message(0, 0, 0, 0, Some(b"k"), None), 1 << 20).unwrap();
        assert_eq!(v2_records(&v0), vec![(0, -1, Some(b"k".to_vec()), None)]);
    }

    #[test]
    fn compressed_wrappers_keep_their_codec_and_inner_timestamps() {
        for codec in [GZIP, SNAPPY, LZ4] {
            for magic in [0i8, 1] {
                let set = wrapper(magic, codec, &[(Some(b"a"), Some(b"1"), 7), (None, Some(b"2"), 9)]);
                let batch = to_record_batch(&set, 1 << 20).unwrap();
                let h = validate_batches(&batch, 1 << 20).unwrap()[0];
                assert_eq!(h.compression(), codec);
                let ts = if magic == 1 { (7, 9) } else { (-1, -1) };
                assert_eq!(
                    v2_records(&batch),
                    vec![(0, ts.0, Some(b"a".to_vec()), Some(b"1".to_vec())), (1, ts.1, None, Some(b"2".to_vec()))],
                    "codec {codec} magic {magic}"
                );
            }
        }
    }

    #[test]
    fn bad_messages_are_refused() {
        let good = message(0, 1, 0, 5, None, Some(b"value"));
        let mut bad_crc = good.clone();
        let last = bad_crc.len() - 1;
        bad_crc[last] ^= 1;
        assert!(matches!(to_record_batch(&bad_crc, 1 << 20), Err(LogError::CorruptMessage(_))));
        assert!(matches!(to_record_batch(&good[..good.len() - 2], 1 << 20), Err(LogError::CorruptMessage(_))));
        let mut short = good.clone();
        short[8..12].copy_from_slice(&4i32.to_be_bytes());
        assert!(to_record_batch(&short, 1 << 20).is_err());
        let zstd = message(0, 1, ZSTD, 5, None, Some(b"x"));
        assert!(matches!(to_record_batch(&zstd, 1 << 20), Err(LogError::UnsupportedCompression(_))));
        let nested = {
            let inner = wrapper(1, GZIP, &[(None, Some(b"x"), 1)]);
            let c = compression::compress(GZIP, &inner).unwrap();
            message(0, 1, GZIP, 0, None, Some(&c))
        };
        assert!(matches!(to_record_batch(&nested, 1 << 20), Err(LogError::InvalidRecord(_))));
        let big = wrapper(1, GZIP, &[(None, Some(&[0u8; 10_000]), 1)]);
        assert!(to_record_batch(&big, 1000).is_err(), "decompression bound");
        assert!(to_record_batch(&[], 1 << 20).is_err());
    }

    fn stored(codec: u8, base: i64, values: &[&[u8]], ts: i64) -> Vec<u8> {
        let recs: Vec<SimpleRecord<'_>> = values
            .iter()
            .enumerate()
            .map(|(i, v)| SimpleRecord { timestamp: ts + i as i64, key: Some(b"key"), value: Some(v), headers: vec![] })
            .collect();
        let mut b = encode_batch(&BatchOptions { base_offset: base, ..Default::default() }, &recs);
        if codec != NONE {
            b = compress_batch(b, codec).unwrap();
        }
        b
    }

    #[test]
    fn stored_batches_read_back_the_same_in_both_old_formats() {
        for codec in [NONE, GZIP, SNAPPY, LZ4] {
            let mut log = stored(codec, 10, &[b"a", b"b", b"c"], 500);
            log.extend(stored(codec, 13, &[b"d"], 600));
            for magic in [0i8, 1] {
                let set = to_message_set(&log, magic, 10, 1 << 20, 1 << 20).unwrap();
                let got = legacy_records(&set);
                let ts = |t: i64| if magic == 1 { t } else { -1 };
                let want: Vec<_> = [(10, 500, "a"), (11, 501, "b"), (12, 502, "c"), (13, 600, "d")]
                    .iter()
                    .map(|&(o, t, v)| (o, magic, ts(t), Some(b"key".to_vec()), Some(v.as_bytes().to_vec())))
                    .collect();
                assert_eq!(got, want, "codec {codec} magic {magic}");
            }
        }
    }

    #[test]
    fn down_conversion_skips_what_the_reader_is_past_and_stops_at_max_bytes() {
        let mut log = stored(NONE, 0, &[b"a", b"b", b"c"], 1);
        log.extend(stored(NONE, 3, &[b"d"], 1));
        let set = to_message_set(&log, 1, 2, 1 << 20, 1 << 20).unwrap();
        assert_eq!(legacy_records(&set).iter().map(|r| r.0).collect::<Vec<_>>(), vec![2, 3]);
        // One byte allowed: the first batch still comes whole, the second not at all.
        let set = to_message_set(&log, 1, 0, 1, 1 << 20).unwrap();
        assert_eq!(legacy_records(&set).len(), 3);
        // A partial trailing batch is left out.
        let set = to_message_set(&log[..log.len() - 3], 0, 0, 1 << 20, 1 << 20).unwrap();
        assert_eq!(legacy_records(&set).len(), 3);
        let zstd = {
            let mut b = stored(NONE, 0, &[b"a"], 1);
            b[22] |= ZSTD;
            b
        };
        assert!(matches!(to_message_set(&zstd, 1, 0, 100, 100), Err(LogError::UnsupportedCompression(_))));
    }

    #[test]
    fn a_round_trip_through_the_old_formats_keeps_keys_values_and_timestamps() {
        let set = {
            let mut s = message(0, 1, 0, 42, Some(b"k"), Some(b"v"));
            s.extend(wrapper(1, SNAPPY, &[(None, Some(b"x"), 43), (Some(b"y"), None, 44)]));
            s
        };
        let batch = to_record_batch(&set, 1 << 20).unwrap();
        let back = to_message_set(&batch, 1, 0, 1 << 20, 1 << 20).unwrap();
        let got: Vec<_> = legacy_records(&back).into_iter().map(|r| (r.2, r.3, r.4)).collect();
        assert_eq!(
            got,
            vec![
                (42, Some(b"k".to_vec()), Some(b"v".to_vec())),
                (43, None, Some(b"x".to_vec())),
                (44, Some(b"y".to_vec()), None)
            ]
        );
    }
}
