//! The `.txnindex` of each segment: the aborted transactions, as Kafka writes them, which
//! fetches at READ_COMMITTED and the cleaner read.

use super::*;

/// One `.txnindex` entry, as Kafka writes it: version i16 (0), producer id i64, first offset
/// i64, last offset i64, last stable offset i64.
pub(in crate::log) const TXN_INDEX_ENTRY_SIZE: usize = 34;

pub(super) fn encode_txn_entry(entry: &AbortedTxn) -> [u8; TXN_INDEX_ENTRY_SIZE] {
    let mut buf = [0u8; TXN_INDEX_ENTRY_SIZE];
    buf[0..2].copy_from_slice(&0i16.to_be_bytes());
    buf[2..10].copy_from_slice(&entry.producer_id.to_be_bytes());
    buf[10..18].copy_from_slice(&entry.first_offset.to_be_bytes());
    buf[18..26].copy_from_slice(&entry.last_offset.to_be_bytes());
    buf[26..34].copy_from_slice(&entry.last_stable_offset.to_be_bytes());
    buf
}

/// `e` is one whole entry (callers walk `chunks_exact`).
pub(in crate::log) fn decode_txn_entry(e: &[u8]) -> AbortedTxn {
    let i64_at = |o: usize| e.get(o..o + 8).and_then(|b| b.try_into().ok()).map_or(-1, i64::from_be_bytes);
    AbortedTxn {
        producer_id: i64_at(2),
        first_offset: i64_at(10),
        last_offset: i64_at(18),
        last_stable_offset: i64_at(26),
    }
}

impl Log {
    /// Records an aborted transaction in the `.txnindex` of the segment holding its marker,
    /// so read_committed fetches can still be told of it after a restart.
    pub fn append_aborted_txn(&mut self, entry: &AbortedTxn) -> Result<(), LogError> {
        use std::io::Write;
        self.check_live()?;
        let base = self.segments.range(..=entry.last_offset).next_back().map(|(b, _)| *b).unwrap_or(0);
        let buf = encode_txn_entry(entry);
        let mut f = fs::OpenOptions::new().create(true).append(true).open(txn_index_file_path(&self.dir, base))?;
        f.write_all(&buf)?;
        Ok(())
    }

    /// Every aborted transaction in the segments' `.txnindex` files whose marker is below
    /// `before`, oldest first. A torn last entry (a crash mid-write) is ignored.
    pub fn aborted_txns_before(&self, before: i64) -> Vec<AbortedTxn> {
        let mut out = Vec::new();
        for &base in self.segments.keys() {
            if base >= before {
                break;
            }
            let Ok(bytes) = fs::read(txn_index_file_path(&self.dir, base)) else { continue };
            for e in bytes.chunks_exact(TXN_INDEX_ENTRY_SIZE) {
                let entry = decode_txn_entry(e);
                if entry.last_offset < before && entry.last_offset >= self.log_start_offset {
                    out.push(entry);
                }
            }
        }
        out.sort_by_key(|a| a.last_offset);
        out
    }

    /// The base of the first segment whose `.txnindex` is damaged: torn, of an unknown
    /// version, or holding an entry that is not this segment's. Its entries (and everything
    /// after) can only be trusted again once rebuilt from the log.
    pub fn first_damaged_txn_index(&self) -> Option<i64> {
        let bases: Vec<i64> = self.segments.keys().copied().collect();
        for (i, &base) in bases.iter().enumerate() {
            let upper = bases.get(i + 1).copied().unwrap_or(i64::MAX);
            let bytes = match fs::read(txn_index_file_path(&self.dir, base)) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(_) => return Some(base),
            };
            if bytes.len() % TXN_INDEX_ENTRY_SIZE != 0 {
                return Some(base);
            }
            let mut prev_last = i64::MIN;
            for e in bytes.chunks_exact(TXN_INDEX_ENTRY_SIZE) {
                let a = decode_txn_entry(e);
                let version = i16::from_be_bytes([e[0], e[1]]);
                if version != 0
                    || a.last_offset < base
                    || a.last_offset >= upper
                    || a.first_offset > a.last_offset
                    || a.last_offset < prev_last
                {
                    return Some(base);
                }
                prev_last = a.last_offset;
            }
        }
        None
    }

    /// Makes the `.txnindex` files from the segment holding `from` on list exactly the
    /// aborted transactions a rescan of the log from `from` found (`found`, in marker order),
    /// keeping the entries below `from`: a file that is missing, torn, or lists aborts the log
    /// no longer holds (a truncation, a recovery cut) is rewritten. Files that already agree
    /// are left alone, so a normal start writes nothing.
    pub fn sync_aborted_txns(&mut self, from: i64, found: &[AbortedTxn]) -> Result<(), LogError> {
        self.check_live()?;
        let first = self.segments.range(..=from).next_back().map(|(b, _)| *b).unwrap_or(i64::MIN);
        let bases: Vec<i64> = self.segments.range(first..).map(|(b, _)| *b).collect();
        for (i, &base) in bases.iter().enumerate() {
            let upper = bases.get(i + 1).copied().unwrap_or(i64::MAX);
            let path = txn_index_file_path(&self.dir, base);
            let existing = match fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            let old: Vec<AbortedTxn> = existing.chunks_exact(TXN_INDEX_ENTRY_SIZE).map(decode_txn_entry).collect();
            let mut want: Vec<AbortedTxn> = old.iter().filter(|a| a.last_offset < from).copied().collect();
            for f in found.iter().filter(|a| a.last_offset >= base && a.last_offset < upper) {
                // The stable offset recorded when the abort happened is kept: a rescan cannot
                // know the high watermark of that moment.
                let same = old.iter().find(|o| {
                    (o.producer_id, o.first_offset, o.last_offset) == (f.producer_id, f.first_offset, f.last_offset)
                });
                want.push(*same.unwrap_or(f));
            }
            let mut bytes = Vec::with_capacity(want.len() * TXN_INDEX_ENTRY_SIZE);
            for a in &want {
                bytes.extend_from_slice(&encode_txn_entry(a));
            }
            if bytes == existing {
                continue;
            }
            tracing::info!(
                dir = %self.dir.display(),
                base,
                entries_before = old.len(),
                entries_after = want.len(),
                "rebuilt the aborted-transaction index from the log"
            );
            if want.is_empty() {
                fs::remove_file(&path)?;
            } else {
                write_atomic(&path, &bytes)?;
            }
        }
        Ok(())
    }

    /// Drops the active segment's `.txnindex` entries whose markers are no longer in the log
    /// (later segments' files went with them).
    pub(super) fn trim_txn_index(&mut self) -> Result<(), LogError> {
        let Some(base) = self.segments.keys().next_back().copied() else { return Ok(()) };
        let path = txn_index_file_path(&self.dir, base);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let end = self.log_end_offset;
        let keep: Vec<u8> = bytes
            .chunks_exact(TXN_INDEX_ENTRY_SIZE)
            .filter(|e| decode_txn_entry(e).last_offset < end)
            .flatten()
            .copied()
            .collect();
        if keep.len() == bytes.len() {
            return Ok(());
        }
        if keep.is_empty() {
            fs::remove_file(&path)?;
        } else {
            write_atomic(&path, &keep)?;
        }
        Ok(())
    }
}
