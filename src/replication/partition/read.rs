//! Reading a partition: consumer and follower reads up to the high watermark, the stable
//! offset or the log end, and the lookups by timestamp.

use super::*;

/// Walks the records of an uncompressed batch for the first with timestamp >= `ts` at an
/// offset >= `min_offset`. None if the batch is compressed or malformed.
pub(super) fn first_record_at_or_after(batch: &[u8], ts: i64, min_offset: i64) -> Option<(i64, i64)> {
    use crate::log::batch::{read_varint, read_varlong};
    let h = crate::log::BatchHeader::parse(batch)?;
    if h.compression() != 0 || batch.len() < h.total_size() {
        return None;
    }
    let mut rest = &batch[crate::log::batch::HEADER_SIZE..h.total_size()];
    for _ in 0..h.records_count {
        let (len, n) = read_varint(rest)?;
        let record = rest.get(n..n + usize::try_from(len).ok()?)?;
        rest = &rest[n + len as usize..];
        let body = record.get(1..)?; // attributes
        let (ts_delta, n) = read_varlong(body)?;
        let (offset_delta, _) = read_varint(body.get(n..)?)?;
        let (offset, timestamp) = (h.base_offset + offset_delta as i64, h.base_timestamp + ts_delta);
        if timestamp >= ts && offset >= min_offset {
            return Some((offset, timestamp));
        }
    }
    None
}

impl Partition {
    /// A consumer's fetch: leader only, up to the high watermark (read_committed: up to the
    /// last stable offset, with the aborted transactions in what is returned).
    pub fn read(&self, offset: i64, max_bytes: usize, current_leader_epoch: i32, committed: bool) -> FetchResult {
        if !self.is_leader() {
            return FetchResult::error(ErrorCode::NotLeaderOrFollower.code());
        }
        if let Err(code) = self.check_epoch(current_leader_epoch) {
            return FetchResult::error(code);
        }
        self.read_isolated(offset, max_bytes, committed)
    }

    pub(super) fn read_isolated(&self, offset: i64, max_bytes: usize, committed: bool) -> FetchResult {
        if !committed {
            return self.read_up_to(offset, max_bytes, self.high_watermark());
        }
        let lso = self.last_stable_offset();
        let (mut r, end) = self.read_ranges_up_to(offset, max_bytes, lso);
        r.last_stable_offset = lso;
        if r.error_code == 0 {
            // The records returned end at the last batch's end; aborts that begin before
            // that and end at or after the fetch offset are the consumer's to skip.
            let upper = end.unwrap_or(offset);
            let aborted =
                if upper > offset { lock(&self.producers).aborted_between(offset, upper) } else { Vec::new() };
            r.aborted = Some(aborted);
        }
        r
    }

    /// A consumer's fetch from a follower (Fetch v11+, KIP-392): up to this replica's high
    /// watermark, with the leader epoch the client knows checked as a leader checks it.
    pub fn read_as_follower(
        &self,
        offset: i64,
        max_bytes: usize,
        current_leader_epoch: i32,
        committed: bool,
    ) -> FetchResult {
        if !matches!(self.role().0, Role::Follower { .. }) {
            return FetchResult::error(ErrorCode::NotLeaderOrFollower.code());
        }
        if let Err(code) = self.check_epoch(current_leader_epoch) {
            return FetchResult::error(code);
        }
        self.read_isolated(offset, max_bytes, committed)
    }

    /// Everything in the log, committed or not (the group coordinator replays its partition
    /// on taking it over, as Kafka does).
    pub fn read_to_log_end(&self, offset: i64, max_bytes: usize) -> FetchResult {
        self.read_up_to(offset, max_bytes, i64::MAX)
    }

    pub(super) fn read_up_to(&self, offset: i64, max_bytes: usize, limit: i64) -> FetchResult {
        self.read_ranges_up_to(offset, max_bytes, limit).0
    }

    /// Also the offset after the last batch returned. Large record sets become placeholders
    /// for their file ranges when a Fetch collects them for sendfile ([`zero_copy`]).
    pub(super) fn read_ranges_up_to(&self, offset: i64, max_bytes: usize, limit: i64) -> (FetchResult, Option<i64>) {
        let hw = self.high_watermark();
        let (ranges, start) = {
            let log = self.lock_log();
            let start = log.log_start_offset();
            match log.read(offset, max_bytes, Some(limit)) {
                Ok(r) => (r, start),
                Err(e) => {
                    let r = FetchResult {
                        error_code: e.kafka_code(),
                        high_watermark: hw,
                        log_start_offset: start,
                        records: Bytes::new(),
                        diverging: None,
                        last_stable_offset: hw,
                        aborted: None,
                    };
                    return (r, None);
                }
            }
        };
        let end = ranges.last().map(|r| r.end_offset);
        let records = match zero_copy::defer(&ranges) {
            Some(placeholder) => placeholder,
            None => {
                let mut out = bytes::BytesMut::with_capacity(ranges.iter().map(|r| r.len).sum());
                for r in &ranges {
                    if let Err(e) = FileRange::read_into_buf(r, &mut out) {
                        tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "read failed");
                        return (FetchResult::error(ErrorCode::KafkaStorageError.code()), None);
                    }
                }
                out.freeze()
            }
        };
        let r = FetchResult {
            error_code: 0,
            high_watermark: hw,
            log_start_offset: start,
            records,
            diverging: None,
            last_stable_offset: hw.min(self.first_unstable.load(Ordering::Acquire)),
            aborted: None,
        };
        (r, end)
    }

    /// ListOffsets by time: the first record whose timestamp is >= `ts`, and its timestamp.
    /// The log finds the batch; for an uncompressed batch the records' own timestamps give the
    /// exact record, as Kafka answers. A compressed batch answers with its first offset.
    pub fn offset_for_timestamp(&self, ts: i64) -> Result<Option<(i64, i64)>, LogError> {
        let (found, range) = {
            let log = self.lock_log();
            let Some(found) = log.offset_for_timestamp(ts)? else { return Ok(None) };
            let range = log.read(found.0, 1, None)?.into_iter().next();
            (found, range)
        };
        let Some(range) = range else { return Ok(Some(found)) };
        let mut batch = Vec::with_capacity(range.len);
        range.read_into(&mut batch)?;
        Ok(Some(first_record_at_or_after(&batch, ts, found.0).unwrap_or(found)))
    }

    /// ListOffsets v0 (Kafka's `legacyFetchOffsetsBefore`): up to `max` offsets, newest first,
    /// among the segments' first offsets (each dated by its file's mtime) and, when the active
    /// segment holds data, the log end (dated now). -1 (latest) starts from the newest, -2
    /// (earliest) takes the first only, a time takes the newest dated at or before it. A
    /// consumer never sees past the high watermark: offsets above it give way to it.
    pub fn legacy_offsets_before(&self, timestamp: i64, max: i32, from_consumer: bool) -> Vec<i64> {
        let mut dated: Vec<(i64, i64)> = {
            let log = self.lock_log();
            let start = log.log_start_offset();
            let mut v: Vec<(i64, i64)> =
                log.segments().map(|s| (s.base_offset().max(start), s.last_modified_ms())).collect();
            if log.segments().last().is_some_and(|s| s.size() > 0) {
                v.push((log.log_end_offset(), crate::log::now_ms()));
            }
            v
        };
        let newest = match timestamp {
            -1 => dated.len().checked_sub(1),
            -2 => (!dated.is_empty()).then_some(0),
            ts => dated.iter().rposition(|&(_, t)| t <= ts),
        };
        let Some(newest) = newest else { return Vec::new() };
        dated.truncate(newest + 1);
        let mut offsets: Vec<i64> = dated.iter().rev().take(max.max(0) as usize).map(|&(o, _)| o).collect();
        offsets.sort_unstable_by(|a, b| b.cmp(a));
        if from_consumer {
            let hw = self.high_watermark();
            if offsets.iter().any(|&o| o > hw) {
                offsets.retain(|&o| o <= hw);
                offsets.insert(0, hw);
            }
        }
        offsets
    }

    /// ListOffsets MAX_TIMESTAMP (KIP-734): the first record carrying the largest timestamp.
    pub fn offset_of_max_timestamp(&self) -> Result<Option<(i64, i64)>, LogError> {
        let max = self.lock_log().segments().map(|s| s.max_timestamp()).max();
        match max {
            Some(ts) if ts >= 0 => self.offset_for_timestamp(ts),
            _ => Ok(None),
        }
    }
}
