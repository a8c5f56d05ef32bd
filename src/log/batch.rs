//! Record batch v2 (magic 2) header view, produce-side validation, and a small
//! encoder for uncompressed batches.
//!
//! The log never decodes records on the read path; it only looks at the fixed
//! 61-byte batch header. Validation of client-supplied data happens here, once,
//! before anything touches disk. Recovery uses [`check_stored_batch`], which is
//! looser (it must accept what Kafka itself may have written, e.g. empty
//! batches retained by compaction) but still rejects anything torn or corrupt.

use super::LogError;

/// Size of the fixed v2 batch header; records start here.
pub const HEADER_SIZE: usize = 61;
/// baseOffset (8) + batchLength (4): the part not counted by batchLength.
pub const LOG_OVERHEAD: usize = 12;
/// Smallest legal batchLength: a header with no records.
pub const MIN_BATCH_LENGTH: i32 = (HEADER_SIZE - LOG_OVERHEAD) as i32;
pub const MAGIC_V2: i8 = 2;
/// The CRC covers everything from the attributes field to the end, so the
/// broker can patch offset/leader epoch without recomputing it.
pub const CRC_START: usize = 21;

pub const OFF_BASE_OFFSET: usize = 0;
pub const OFF_BATCH_LENGTH: usize = 8;
pub const OFF_LEADER_EPOCH: usize = 12;
pub const OFF_MAGIC: usize = 16;
pub const OFF_CRC: usize = 17;
pub const OFF_ATTRIBUTES: usize = 21;
pub const OFF_LAST_OFFSET_DELTA: usize = 23;
pub const OFF_BASE_TIMESTAMP: usize = 27;
pub const OFF_MAX_TIMESTAMP: usize = 35;
pub const OFF_PRODUCER_ID: usize = 43;
pub const OFF_PRODUCER_EPOCH: usize = 51;
pub const OFF_BASE_SEQUENCE: usize = 53;
pub const OFF_RECORDS_COUNT: usize = 57;

pub const COMPRESSION_MASK: i16 = 0x07;
pub const TIMESTAMP_TYPE_BIT: i16 = 0x08;
pub const TRANSACTIONAL_BIT: i16 = 0x10;
pub const CONTROL_BIT: i16 = 0x20;
pub const DELETE_HORIZON_BIT: i16 = 0x40;

/// One batch header, parsed from the 61-byte header without touching records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    i32::from_be_bytes(a)
}
fn be_u32(b: &[u8], at: usize) -> u32 {
    be_i32(b, at) as u32
}
fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}

impl BatchHeader {
    /// Parses the fixed header. Returns `None` if fewer than 61 bytes are given;
    /// no field is checked (see [`BatchHeader::check_framing`]).
    pub fn parse(buf: &[u8]) -> Option<BatchHeader> {
        if buf.len() < HEADER_SIZE {
            return None;
        }
        Some(BatchHeader {
            base_offset: be_i64(buf, OFF_BASE_OFFSET),
            batch_length: be_i32(buf, OFF_BATCH_LENGTH),
            partition_leader_epoch: be_i32(buf, OFF_LEADER_EPOCH),
            magic: buf[OFF_MAGIC] as i8,
            crc: be_u32(buf, OFF_CRC),
            attributes: be_i16(buf, OFF_ATTRIBUTES),
            last_offset_delta: be_i32(buf, OFF_LAST_OFFSET_DELTA),
            base_timestamp: be_i64(buf, OFF_BASE_TIMESTAMP),
            max_timestamp: be_i64(buf, OFF_MAX_TIMESTAMP),
            producer_id: be_i64(buf, OFF_PRODUCER_ID),
            producer_epoch: be_i16(buf, OFF_PRODUCER_EPOCH),
            base_sequence: be_i32(buf, OFF_BASE_SEQUENCE),
            records_count: be_i32(buf, OFF_RECORDS_COUNT),
        })
    }

    /// Whole batch size on disk including baseOffset and batchLength.
    /// Only meaningful after framing was checked (batch_length >= 49).
    pub fn total_size(&self) -> usize {
        (self.batch_length.max(0) as usize) + LOG_OVERHEAD
    }
    pub fn last_offset_delta(&self) -> i32 {
        self.last_offset_delta
    }
    pub fn last_offset(&self) -> i64 {
        self.base_offset.saturating_add(i64::from(self.last_offset_delta.max(0)))
    }
    /// Next offset after this batch.
    pub fn next_offset(&self) -> i64 {
        self.last_offset().saturating_add(1)
    }
    pub fn compression(&self) -> u8 {
        (self.attributes & COMPRESSION_MASK) as u8
    }
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & TIMESTAMP_TYPE_BIT != 0
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_BIT != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_BIT != 0
    }

    /// Structural checks that need only the header: magic 2, a length that
    /// at least covers the header and fits in `available` bytes.
    pub fn check_framing(&self, available: usize) -> Result<(), LogError> {
        if self.magic != MAGIC_V2 {
            return Err(LogError::UnsupportedVersion(format!(
                "record batch magic {} (only magic 2 is supported)",
                self.magic
            )));
        }
        if self.batch_length < MIN_BATCH_LENGTH {
            return Err(LogError::CorruptMessage(format!(
                "batch length {} is smaller than the v2 header",
                self.batch_length
            )));
        }
        if self.total_size() > available {
            return Err(LogError::CorruptMessage(format!(
                "batch of {} bytes but only {} bytes left",
                self.total_size(),
                available
            )));
        }
        Ok(())
    }
}

/// CRC-32C over [21, end) compared with the stored field.
pub fn crc_matches(batch: &[u8]) -> bool {
    if batch.len() < HEADER_SIZE {
        return false;
    }
    crc32c::crc32c(&batch[CRC_START..]) == be_u32(batch, OFF_CRC)
}

/// Checks a batch read back from disk (recovery): framing, CRC, sane
/// offset delta. `batch` must be exactly one batch.
pub fn check_stored_batch(batch: &[u8]) -> Result<BatchHeader, LogError> {
    let h = BatchHeader::parse(batch).ok_or_else(|| LogError::CorruptMessage("short batch header".into()))?;
    h.check_framing(batch.len())?;
    if h.total_size() != batch.len() {
        return Err(LogError::CorruptMessage("batch length mismatch".into()));
    }
    if !crc_matches(batch) {
        return Err(LogError::CorruptMessage(format!("CRC mismatch in batch at offset {}", h.base_offset)));
    }
    if h.last_offset_delta < 0 || h.records_count < 0 || h.base_offset < 0 {
        return Err(LogError::CorruptMessage("negative offset delta/count".into()));
    }
    Ok(h)
}

/// Validate every batch in a produce payload: magic 2 only, lengths exactly
/// covering the buffer, CRC-32C, record count consistent with the offset
/// delta (and, for uncompressed batches, every record's offsetDelta), and
/// each batch no larger than `max_message_bytes`. Pure function.
pub fn validate_batches(records: &[u8], max_message_bytes: u32) -> Result<Vec<BatchHeader>, LogError> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < records.len() {
        let rest = &records[pos..];
        if rest.len() < LOG_OVERHEAD + 5 {
            return Err(LogError::CorruptMessage(format!("{} trailing bytes are too few for a batch", rest.len())));
        }
        let batch_length = be_i32(rest, OFF_BATCH_LENGTH);
        // Look at magic before the v2-specific minimum so that old-format
        // message sets get UNSUPPORTED_VERSION rather than CORRUPT_MESSAGE.
        if rest[OFF_MAGIC] as i8 != MAGIC_V2 {
            return Err(LogError::UnsupportedVersion(format!(
                "record batch magic {} (only magic 2 is supported)",
                rest[OFF_MAGIC] as i8
            )));
        }
        if batch_length < MIN_BATCH_LENGTH {
            return Err(LogError::CorruptMessage(format!("batch length {batch_length} is smaller than the v2 header")));
        }
        let total = batch_length as usize + LOG_OVERHEAD;
        if total > rest.len() {
            return Err(LogError::CorruptMessage(format!("batch claims {total} bytes but only {} remain", rest.len())));
        }
        if total > max_message_bytes as usize {
            return Err(LogError::MessageTooLarge);
        }
        let batch = &rest[..total];
        let h = match BatchHeader::parse(batch) {
            Some(h) => h,
            None => return Err(LogError::CorruptMessage("short batch header".into())),
        };
        if !crc_matches(batch) {
            return Err(LogError::CorruptMessage("record batch CRC-32C mismatch".into()));
        }
        if h.records_count <= 0 {
            return Err(LogError::InvalidRecord("batch has no records".into()));
        }
        if h.last_offset_delta < 0 {
            return Err(LogError::InvalidRecord("negative lastOffsetDelta".into()));
        }
        if h.compression() > 4 {
            return Err(LogError::InvalidRecord(format!("unknown compression codec {}", h.compression())));
        }
        if h.compression() == 0 {
            if i64::from(h.records_count) != i64::from(h.last_offset_delta) + 1 {
                return Err(LogError::InvalidRecord(format!(
                    "records count {} does not match lastOffsetDelta {}",
                    h.records_count, h.last_offset_delta
                )));
            }
            check_uncompressed_records(&batch[HEADER_SIZE..], h.records_count)?;
        }
        out.push(h);
        pos += total;
    }
    Ok(out)
}

/// Walks the records of an uncompressed batch: each length prefix must stay
/// inside the batch, offsetDelta must run 0..count, and the records must end
/// exactly at the batch end. This is what Kafka's validator insists on for
/// uncompressed data; it costs a few varint reads per record.
fn check_uncompressed_records(body: &[u8], count: i32) -> Result<(), LogError> {
    let corrupt = |m: &str| LogError::CorruptMessage(format!("record {m}"));
    let mut pos = 0usize;
    for i in 0..count {
        let (len, n) = read_varint(&body[pos..]).ok_or_else(|| corrupt("length is malformed"))?;
        pos += n;
        if len <= 0 || len as usize > body.len() - pos {
            return Err(corrupt("length out of range"));
        }
        let rec = &body[pos..pos + len as usize];
        // attributes (1 byte), timestampDelta (varlong), offsetDelta (varint)
        let mut p = 1usize;
        if rec.len() < p {
            return Err(corrupt("too short"));
        }
        let (_, n) = read_varlong(&rec[p..]).ok_or_else(|| corrupt("timestamp is malformed"))?;
        p += n;
        let (od, _) = read_varint(&rec[p..]).ok_or_else(|| corrupt("offset delta is malformed"))?;
        if od != i {
            return Err(LogError::InvalidRecord(format!("record offsetDelta {od} where {i} was expected")));
        }
        pos += len as usize;
    }
    if pos != body.len() {
        return Err(LogError::CorruptMessage(format!("{} bytes after the last record", body.len() - pos)));
    }
    Ok(())
}

/// Checks a payload of batches copied from a leader (replication): each
/// must be framed, CRC-valid and have sane offsets. Unlike
/// [`validate_batches`] it accepts what compaction may leave behind (empty
/// batches, offset gaps inside a batch) and ignores max.message.bytes.
pub fn validate_replicated_batches(records: &[u8]) -> Result<Vec<BatchHeader>, LogError> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos < records.len() {
        let rest = &records[pos..];
        let h = BatchHeader::parse(rest).ok_or_else(|| LogError::CorruptMessage("truncated batch header".into()))?;
        h.check_framing(rest.len())?;
        let h = check_stored_batch(&rest[..h.total_size()])?;
        pos += h.total_size();
        out.push(h);
    }
    Ok(out)
}

/// Zigzag varint (protobuf sint32) decode; `None` if truncated or too long.
pub fn read_varint(b: &[u8]) -> Option<(i32, usize)> {
    let (v, n) = read_raw_varint(b, 5)?;
    let v = v as u32;
    Some((((v >> 1) as i32) ^ -((v & 1) as i32), n))
}

/// Zigzag varlong (protobuf sint64) decode.
pub fn read_varlong(b: &[u8]) -> Option<(i64, usize)> {
    let (v, n) = read_raw_varint(b, 10)?;
    Some((((v >> 1) as i64) ^ -((v & 1) as i64), n))
}

fn read_raw_varint(b: &[u8], max_len: usize) -> Option<(u64, usize)> {
    let mut v: u64 = 0;
    for i in 0..max_len {
        let byte = *b.get(i)?;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

pub fn write_varint(out: &mut Vec<u8>, v: i32) {
    write_raw_varint(out, ((v << 1) ^ (v >> 31)) as u32 as u64);
}

pub fn write_varlong(out: &mut Vec<u8>, v: i64) {
    write_raw_varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn write_raw_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// One record of a v2 batch as stored, located but not copied.
#[derive(Clone, Copy, Debug)]
pub struct RecordView<'a> {
    /// The whole record, its length prefix included: what a rewrite copies when nothing in it
    /// changes.
    pub raw: &'a [u8],
    pub attributes: u8,
    pub timestamp_delta: i64,
    /// The record from its offsetDelta to its end: what a rewrite keeps when only the
    /// timestamp delta changes.
    pub tail: &'a [u8],
    pub offset_delta: i32,
    pub key: Option<&'a [u8]>,
    /// A null value: a tombstone on a compacted topic.
    pub value_is_null: bool,
}

fn read_nullable_len(b: &[u8], at: &mut usize) -> Option<Option<usize>> {
    let (len, n) = read_varint(b.get(*at..)?)?;
    *at += n;
    if len < 0 {
        return Some(None);
    }
    let len = len as usize;
    if len > b.len() - *at {
        return None;
    }
    Some(Some(len))
}

/// The records of an (uncompressed or already decompressed) records section holding `count`
/// records. Anything malformed is `CorruptMessage`: only data that passed produce validation
/// reaches the log, so a bad record here means damage.
pub fn parse_records(body: &[u8], count: i32) -> Result<Vec<RecordView<'_>>, LogError> {
    let corrupt = |m: &str| LogError::CorruptMessage(format!("record {m}"));
    let mut out = Vec::with_capacity(count.clamp(0, 1 << 16) as usize);
    let mut pos = 0usize;
    for _ in 0..count.max(0) {
        let (len, n) = read_varint(&body[pos..]).ok_or_else(|| corrupt("length is malformed"))?;
        if len <= 0 || len as usize > body.len() - pos - n {
            return Err(corrupt("length out of range"));
        }
        let raw = &body[pos..pos + n + len as usize];
        let rec = &raw[n..];
        let attributes = rec[0];
        let mut at = 1usize;
        let (timestamp_delta, k) = read_varlong(&rec[at..]).ok_or_else(|| corrupt("timestamp is malformed"))?;
        at += k;
        let tail = &rec[at..];
        let (offset_delta, k) = read_varint(&rec[at..]).ok_or_else(|| corrupt("offset delta is malformed"))?;
        at += k;
        let key = match read_nullable_len(rec, &mut at).ok_or_else(|| corrupt("key is malformed"))? {
            Some(l) => {
                let k = &rec[at..at + l];
                at += l;
                Some(k)
            }
            None => None,
        };
        let value_is_null = read_nullable_len(rec, &mut at).ok_or_else(|| corrupt("value is malformed"))?.is_none();
        out.push(RecordView { raw, attributes, timestamp_delta, tail, offset_delta, key, value_is_null });
        pos += raw.len();
    }
    if pos != body.len() {
        return Err(corrupt("section has bytes after the last record"));
    }
    Ok(out)
}

/// The records section of one whole batch, decompressed if the batch is (bounded by `limit`).
pub fn records_section<'a>(
    batch: &'a [u8],
    h: &BatchHeader,
    limit: usize,
) -> Result<std::borrow::Cow<'a, [u8]>, LogError> {
    let body = batch.get(HEADER_SIZE..h.total_size()).ok_or_else(|| LogError::CorruptMessage("short batch".into()))?;
    match h.compression() {
        0 => Ok(std::borrow::Cow::Borrowed(body)),
        codec => super::compression::decompress(codec, MAGIC_V2, body, limit).map(std::borrow::Cow::Owned),
    }
}

/// Kafka's LogAppendTime for a v2 batch kept as it was produced: the timestamp type bit set,
/// maxTimestamp the broker's `now`, the CRC recomputed (both fields are inside it). Record
/// timestamps stay; consumers read the batch's maxTimestamp for every record.
pub fn stamp_log_append_time(batch: &mut [u8], now: i64) {
    if batch.len() < HEADER_SIZE {
        return;
    }
    let attributes = i16::from_be_bytes([batch[OFF_ATTRIBUTES], batch[OFF_ATTRIBUTES + 1]]) | TIMESTAMP_TYPE_BIT;
    batch[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    batch[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8].copy_from_slice(&now.to_be_bytes());
    let crc = crc32c::crc32c(&batch[CRC_START..]);
    batch[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Appends `r` to `out` with its timestamp delta replaced (its length prefix recomputed).
pub fn write_record_with_timestamp_delta(out: &mut Vec<u8>, r: &RecordView<'_>, timestamp_delta: i64) {
    let mut head = Vec::with_capacity(11);
    head.push(r.attributes);
    write_varlong(&mut head, timestamp_delta);
    write_varint(out, (head.len() + r.tail.len()) as i32);
    out.extend_from_slice(&head);
    out.extend_from_slice(r.tail);
}

/// For each batch of a produce payload (already through [`validate_batches`]), the indexes of
/// its records that have no key: what a compacted topic refuses (Kafka's `batchIndex` counts
/// records within their batch).
pub fn keyless_records(records: &[u8], headers: &[BatchHeader], limit: usize) -> Result<Vec<i32>, LogError> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    for h in headers {
        let batch = records.get(pos..pos + h.total_size()).ok_or_else(|| LogError::CorruptMessage("short".into()))?;
        pos += h.total_size();
        if h.is_control() {
            continue;
        }
        let section = records_section(batch, h, limit)?;
        for (i, r) in parse_records(&section, h.records_count)?.iter().enumerate() {
            if r.key.is_none() {
                out.push(i as i32);
            }
        }
    }
    Ok(out)
}

/// One record for [`encode_batch`].
#[derive(Clone, Debug, Default)]
pub struct SimpleRecord<'a> {
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

/// Batch-level fields for [`encode_batch`]; defaults are what a
/// non-idempotent client sends.
#[derive(Clone, Copy, Debug)]
pub struct BatchOptions {
    pub base_offset: i64,
    pub partition_leader_epoch: i32,
    pub attributes: i16,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            base_offset: 0,
            partition_leader_epoch: -1,
            attributes: 0,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
        }
    }
}

/// Encodes an uncompressed v2 batch (compression bits in `attributes` are
/// cleared). Used by tests, the benchmark, and broker-internal writers
/// (e.g. control batches); `records` must not be empty.
pub fn encode_batch(opts: &BatchOptions, records: &[SimpleRecord<'_>]) -> Vec<u8> {
    let base_ts = records.first().map(|r| r.timestamp).unwrap_or(-1);
    let max_ts = records.iter().map(|r| r.timestamp).max().unwrap_or(-1);
    let mut out = Vec::with_capacity(HEADER_SIZE + records.len() * 16);
    out.extend_from_slice(&opts.base_offset.to_be_bytes());
    out.extend_from_slice(&0i32.to_be_bytes()); // length, patched below
    out.extend_from_slice(&opts.partition_leader_epoch.to_be_bytes());
    out.push(MAGIC_V2 as u8);
    out.extend_from_slice(&0u32.to_be_bytes()); // crc, patched below
    out.extend_from_slice(&(opts.attributes & !COMPRESSION_MASK).to_be_bytes());
    out.extend_from_slice(&((records.len() as i32) - 1).to_be_bytes());
    out.extend_from_slice(&base_ts.to_be_bytes());
    out.extend_from_slice(&max_ts.to_be_bytes());
    out.extend_from_slice(&opts.producer_id.to_be_bytes());
    out.extend_from_slice(&opts.producer_epoch.to_be_bytes());
    out.extend_from_slice(&opts.base_sequence.to_be_bytes());
    out.extend_from_slice(&(records.len() as i32).to_be_bytes());
    let mut rec = Vec::new();
    for (i, r) in records.iter().enumerate() {
        rec.clear();
        rec.push(0u8);
        write_varlong(&mut rec, r.timestamp - base_ts);
        write_varint(&mut rec, i as i32);
        write_bytes(&mut rec, r.key);
        write_bytes(&mut rec, r.value);
        write_varint(&mut rec, r.headers.len() as i32);
        for (k, v) in &r.headers {
            write_bytes(&mut rec, Some(k.as_bytes()));
            write_bytes(&mut rec, *v);
        }
        write_varint(&mut out, rec.len() as i32);
        out.extend_from_slice(&rec);
    }
    let len = (out.len() - LOG_OVERHEAD) as i32;
    out[OFF_BATCH_LENGTH..OFF_BATCH_LENGTH + 4].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&out[CRC_START..]);
    out[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    out
}

fn write_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => write_varint(out, -1),
        Some(b) => {
            write_varint(out, b.len() as i32);
            out.extend_from_slice(b);
        }
    }
}

/// A transaction marker (Kafka's `EndTransactionMarker`): a control batch of the producer
/// holding one record whose key is version 0 and the type (0 ABORT, 1 COMMIT) and whose value
/// is version 0 and the coordinator epoch.
pub fn encode_control_batch(producer_id: i64, epoch: i16, commit: bool, coordinator_epoch: i32, ts: i64) -> Vec<u8> {
    let mut key = Vec::with_capacity(4);
    key.extend_from_slice(&0i16.to_be_bytes());
    key.extend_from_slice(&(commit as i16).to_be_bytes());
    let mut value = Vec::with_capacity(6);
    value.extend_from_slice(&0i16.to_be_bytes());
    value.extend_from_slice(&coordinator_epoch.to_be_bytes());
    let opts = BatchOptions {
        attributes: CONTROL_BIT | TRANSACTIONAL_BIT,
        producer_id,
        producer_epoch: epoch,
        ..BatchOptions::default()
    };
    encode_batch(&opts, &[SimpleRecord { timestamp: ts, key: Some(&key), value: Some(&value), headers: vec![] }])
}

/// The marker type of a control batch (`batch` holds at least its first record): Some(true)
/// for COMMIT, Some(false) for ABORT, None if it is not an uncompressed marker.
pub fn control_marker(batch: &[u8]) -> Option<bool> {
    end_txn_marker(batch).map(|m| m.commit)
}

/// What a transaction marker says: which way the transaction went, and the epoch of the
/// coordinator that wrote it (producer state keeps it, DescribeProducers reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndTxnMarker {
    pub commit: bool,
    /// -1 when the value is missing or short: the marker still ends the transaction.
    pub coordinator_epoch: i32,
}

/// Reads the marker of an uncompressed control batch (`batch` holds at least its first
/// record). None if it is not one.
pub fn end_txn_marker(batch: &[u8]) -> Option<EndTxnMarker> {
    let h = BatchHeader::parse(batch)?;
    if !h.is_control() || h.compression() != 0 {
        return None;
    }
    let mut r = batch.get(HEADER_SIZE..)?;
    let (_, n) = read_varint(r)?; // record length
    r = r.get(n + 1..)?; // and attributes
    let (_, n) = read_varlong(r)?; // timestamp delta
    r = r.get(n..)?;
    let (_, n) = read_varint(r)?; // offset delta
    r = r.get(n..)?;
    let (klen, n) = read_varint(r)?;
    if klen < 4 {
        return None;
    }
    let key = r.get(n..n + 4)?;
    let commit = match i16::from_be_bytes([key[2], key[3]]) {
        0 => false,
        1 => true,
        _ => return None,
    };
    // The value: version (i16) then the coordinator epoch (i32).
    let coordinator_epoch = r
        .get(n + usize::try_from(klen).ok()?..)
        .and_then(|v| {
            let (vlen, m) = read_varint(v)?;
            if vlen < 6 {
                return None;
            }
            let e = v.get(m + 2..m + 6)?;
            Some(i32::from_be_bytes([e[0], e[1], e[2], e[3]]))
        })
        .unwrap_or(-1);
    Some(EndTxnMarker { commit, coordinator_epoch })
}

/// Test/bench convenience: a batch of `n` records with `value_len`-byte
/// values, all stamped `timestamp`.
pub fn simple_batch(n: usize, value_len: usize, timestamp: i64) -> Vec<u8> {
    let value = vec![b'v'; value_len];
    let recs: Vec<SimpleRecord<'_>> =
        (0..n).map(|_| SimpleRecord { timestamp, key: None, value: Some(&value), headers: Vec::new() }).collect();
    encode_batch(&BatchOptions::default(), &recs)
}

#[cfg(test)]
mod control_tests {
    use super::*;

    #[test]
    fn markers_are_control_batches_that_say_what_they_end() {
        for commit in [true, false] {
            let b = encode_control_batch(9, 3, commit, 5, 1000);
            let h = validate_batches(&b, u32::MAX).unwrap()[0];
            assert!(h.is_control() && h.is_transactional());
            assert_eq!((h.producer_id, h.producer_epoch, h.base_sequence), (9, 3, -1));
            assert_eq!(control_marker(&b), Some(commit));
            assert_eq!(end_txn_marker(&b), Some(EndTxnMarker { commit, coordinator_epoch: 5 }));
        }
        assert_eq!(control_marker(&simple_batch(1, 3, 0)), None);
        let b = encode_control_batch(9, 3, true, 5, 1000);
        for cut in 0..b.len() {
            let _ = end_txn_marker(&b[..cut]);
        }
    }
}

#[cfg(test)]
mod tests;
