//! What a cleaning pass keeps: segments grouped to fit one cleaned segment, and each batch
//! filtered (the latest record of each key, transactions' aborted data and finished markers
//! dropped, tombstones past their retention removed) and rewritten when anything went.

use super::*;

pub(super) fn key_hash(key: &[u8]) -> u128 {
    twox_hash::XxHash3_128::oneshot(key)
}

/// Consecutive segments that together fit one segment: by bytes (segment.bytes), by index
/// entries (segment.index.bytes) and by offsets (relative offsets are 32-bit).
pub(super) fn group_segments<'a>(segs: &[&'a SegmentView], view: &CleanerView) -> Vec<Vec<&'a SegmentView>> {
    let max_bytes = view.config.segment_bytes.min(i32::MAX as u64);
    let max_entries = view.config.max_index_size as usize / crate::log::index::OFFSET_ENTRY_SIZE;
    let mut groups: Vec<Vec<&SegmentView>> = Vec::new();
    let mut cur: Vec<&SegmentView> = Vec::new();
    let (mut bytes, mut entries) = (0u64, 0usize);
    for &s in segs {
        let fits = cur.first().is_some_and(|first| {
            bytes + s.size <= max_bytes
                && entries + s.index_entries < max_entries
                && s.next_offset - first.base_offset <= i64::from(i32::MAX)
        });
        if !cur.is_empty() && !fits {
            groups.push(std::mem::take(&mut cur));
            bytes = 0;
            entries = 0;
        }
        bytes += s.size;
        entries += s.index_entries;
        cur.push(s);
    }
    if !cur.is_empty() {
        groups.push(cur);
    }
    groups
}

/// What one pass learnt of the whole log before rewriting any of it.
pub(super) struct PassInputs<'a> {
    pub(super) map: &'a HashMap<u128, i64>,
    pub(super) last_batch_of_producer: &'a HashMap<i64, i64>,
    pub(super) aborted: &'a AbortedRanges,
}

pub(super) struct FilterContext<'a> {
    pub(super) map: &'a HashMap<u128, i64>,
    pub(super) now: i64,
    pub(super) delete_retention_ms: i64,
    pub(super) last_batch_of_producer: &'a HashMap<i64, i64>,
    pub(super) aborted: &'a AbortedRanges,
    pub(super) decompress_limit: usize,
}

/// Per producer id, the offset ranges (first offset, ABORT marker offset) of its aborted
/// transactions.
pub(super) type AbortedRanges = HashMap<i64, Vec<(i64, i64)>>;

/// The aborted transactions of every segment of the view, from their `.txnindex` files (read
/// without the log's lock: an entry being appended meanwhile is for a marker above the
/// cleanable range, and a torn one is skipped).
pub(super) fn aborted_ranges(view: &CleanerView) -> AbortedRanges {
    let mut out: AbortedRanges = HashMap::new();
    for s in view.inactive.iter().chain(std::iter::once(&view.active)) {
        let Ok(bytes) = std::fs::read(crate::log::txn_index_file_path(&view.dir, s.base_offset)) else { continue };
        for e in bytes.chunks_exact(crate::log::partition_log::TXN_INDEX_ENTRY_SIZE) {
            let a = crate::log::partition_log::decode_txn_entry(e);
            out.entry(a.producer_id).or_default().push((a.first_offset, a.last_offset));
        }
    }
    out
}

/// Whether `h` is data of an aborted transaction.
pub(super) fn is_aborted(aborted: &AbortedRanges, h: &BatchHeader) -> bool {
    h.producer_id >= 0
        && h.is_transactional()
        && !h.is_control()
        && aborted
            .get(&h.producer_id)
            .is_some_and(|r| r.iter().any(|&(first, last)| first <= h.base_offset && h.base_offset < last))
}

pub(super) enum Kept {
    Original,
    Rewritten(Vec<u8>),
    Nothing,
}

pub(super) struct Filtered {
    pub(super) kept: Kept,
    /// The delete horizon of the kept batch, if it keeps tombstones.
    pub(super) horizon: Option<i64>,
}

/// Kafka's retention rule for one batch: a record stays if no later record has its key, and
/// a tombstone also needs its delete horizon unpassed. Keyless records (from before the
/// topic was compacted) go. Control batches are kept as they are.
pub(super) fn filter_batch(
    ctx: &FilterContext<'_>,
    txn_data_seen: &mut HashSet<i64>,
    h: &BatchHeader,
    bytes: &[u8],
) -> Result<Filtered, LogError> {
    let last_of_producer = h.producer_id >= 0 && ctx.last_batch_of_producer.get(&h.producer_id) == Some(&h.base_offset);
    if h.is_control() {
        return filter_marker(ctx, txn_data_seen, h, bytes, last_of_producer);
    }
    if is_aborted(ctx.aborted, h) {
        // The producer's state is keyed on its last batch: that one stays, emptied.
        let kept = if last_of_producer { Kept::Rewritten(empty_batch(h)) } else { Kept::Nothing };
        return Ok(Filtered { kept, horizon: None });
    }
    if h.producer_id >= 0 && h.is_transactional() {
        txn_data_seen.insert(h.producer_id);
    }
    let horizon = (h.attributes & DELETE_HORIZON_BIT != 0).then_some(h.base_timestamp);
    let retain_deletes = horizon.is_none_or(|hz| ctx.now < hz);
    let section = batch::records_section(bytes, h, ctx.decompress_limit)?;
    let records = batch::parse_records(&section, h.records_count)?;
    let mut kept = Vec::with_capacity(records.len());
    let mut tombstones = false;
    for r in &records {
        let Some(k) = r.key else { continue };
        let offset = h.base_offset + i64::from(r.offset_delta);
        let latest = ctx.map.get(&key_hash(k)).is_none_or(|&o| offset >= o);
        if latest && (!r.value_is_null || retain_deletes) {
            tombstones |= r.value_is_null;
            kept.push(*r);
        }
    }
    let needs_horizon = tombstones && horizon.is_none();
    let new_horizon = if needs_horizon { Some(ctx.now.saturating_add(ctx.delete_retention_ms)) } else { horizon };
    let horizon_out = if tombstones { new_horizon } else { None };
    if kept.len() == records.len() && !needs_horizon {
        return Ok(Filtered { kept: Kept::Original, horizon: horizon_out });
    }
    if kept.is_empty() {
        if !last_of_producer {
            return Ok(Filtered { kept: Kept::Nothing, horizon: None });
        }
        return Ok(Filtered { kept: Kept::Rewritten(empty_batch(h)), horizon: None });
    }
    // With a horizon the base timestamp is the horizon and record deltas are relative to it.
    let base_ts = new_horizon.unwrap_or(h.base_timestamp);
    let mut body = Vec::with_capacity(section.len());
    let mut max_ts = i64::MIN;
    for r in &kept {
        let ts = h.base_timestamp.saturating_add(r.timestamp_delta);
        max_ts = max_ts.max(ts);
        if base_ts == h.base_timestamp {
            body.extend_from_slice(r.raw);
        } else {
            batch::write_record_with_timestamp_delta(&mut body, r, ts.saturating_sub(base_ts));
        }
    }
    if h.is_log_append_time() {
        max_ts = h.max_timestamp;
    }
    let codec = h.compression();
    let body = if codec == 0 { body } else { crate::log::compression::compress(codec, &body)? };
    let mut attributes = h.attributes;
    if new_horizon.is_some() {
        attributes |= DELETE_HORIZON_BIT;
    }
    let out = write_batch(h, attributes, base_ts, max_ts, kept.len() as i32, &body);
    Ok(Filtered { kept: Kept::Rewritten(out), horizon: horizon_out })
}

/// A transaction marker. A COMMIT whose transaction has no data left before it (none was
/// read in this pass) is first stamped with a delete horizon, then dropped by the first pass
/// after that horizon; one with data left, an ABORT (see the module comment), or the
/// producer's last batch is kept.
pub(super) fn filter_marker(
    ctx: &FilterContext<'_>,
    txn_data_seen: &mut HashSet<i64>,
    h: &BatchHeader,
    bytes: &[u8],
    last_of_producer: bool,
) -> Result<Filtered, LogError> {
    let had_data = txn_data_seen.remove(&h.producer_id);
    let keep = Filtered { kept: Kept::Original, horizon: None };
    if batch::control_marker(bytes) != Some(true) || had_data || last_of_producer {
        return Ok(keep);
    }
    if h.attributes & DELETE_HORIZON_BIT != 0 {
        if ctx.now >= h.base_timestamp {
            return Ok(Filtered { kept: Kept::Nothing, horizon: None });
        }
        return Ok(Filtered { kept: Kept::Original, horizon: Some(h.base_timestamp) });
    }
    let horizon = ctx.now.saturating_add(ctx.delete_retention_ms);
    let section = batch::records_section(bytes, h, ctx.decompress_limit)?;
    let records = batch::parse_records(&section, h.records_count)?;
    let mut body = Vec::with_capacity(section.len());
    for r in &records {
        let ts = h.base_timestamp.saturating_add(r.timestamp_delta);
        batch::write_record_with_timestamp_delta(&mut body, r, ts.saturating_sub(horizon));
    }
    let out = write_batch(h, h.attributes | DELETE_HORIZON_BIT, horizon, h.max_timestamp, h.records_count, &body);
    Ok(Filtered { kept: Kept::Rewritten(out), horizon: Some(horizon) })
}

/// A batch with the header fields of `h` (offsets, producer id/epoch/sequence, epoch) and the
/// given records section.
pub(super) fn write_batch(
    h: &BatchHeader,
    attributes: i16,
    base_ts: i64,
    max_ts: i64,
    count: i32,
    body: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_SIZE + body.len());
    out.extend_from_slice(&h.base_offset.to_be_bytes());
    out.extend_from_slice(&0i32.to_be_bytes());
    out.extend_from_slice(&h.partition_leader_epoch.to_be_bytes());
    out.push(batch::MAGIC_V2 as u8);
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&attributes.to_be_bytes());
    out.extend_from_slice(&h.last_offset_delta.to_be_bytes());
    out.extend_from_slice(&base_ts.to_be_bytes());
    out.extend_from_slice(&max_ts.to_be_bytes());
    out.extend_from_slice(&h.producer_id.to_be_bytes());
    out.extend_from_slice(&h.producer_epoch.to_be_bytes());
    out.extend_from_slice(&h.base_sequence.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    out.extend_from_slice(body);
    let len = (out.len() - LOG_OVERHEAD) as i32;
    out[OFF_BATCH_LENGTH..OFF_BATCH_LENGTH + 4].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&out[CRC_START..]);
    out[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    out
}

/// Kafka's empty batch: no records, uncompressed, both timestamps the batch's max.
pub(super) fn empty_batch(h: &BatchHeader) -> Vec<u8> {
    let attributes = h.attributes & !COMPRESSION_MASK & !DELETE_HORIZON_BIT;
    let mut e = *h;
    e.base_timestamp = h.max_timestamp;
    write_batch(&e, attributes, h.max_timestamp, h.max_timestamp, 0, &[])
}
