//! Producer-state snapshots: `<offset, 20 digits>.snapshot` files in a partition directory,
//! in Kafka's format, each holding the producer state of every batch below its offset. A
//! restart loads the newest usable one and rescans only the log above it, so a transaction
//! opened many segments ago still holds back the last stable offset.
//!
//! Format (Kafka's `ProducerSnapshot` version 1, big-endian): version i16 (1), CRC32C u32 over
//! everything after it, then an array (i32 count) of entries: producer id i64, epoch i16,
//! last sequence i32, last offset i64, offset delta i32, timestamp i64, coordinator epoch
//! i32, first offset of the open transaction i64 (-1: none).
//!
//! A snapshot is an optimisation: one that is torn, corrupt or from the future is deleted and
//! the log is rescanned instead, never trusted and never fatal.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

pub const SNAPSHOT_VERSION: i16 = 1;
const CRC_OFFSET: usize = 2;
const ENTRIES_OFFSET: usize = 6;
pub const ENTRY_SIZE: usize = 46;
const SUFFIX: &str = ".snapshot";

/// How many snapshots a partition keeps: the newest is what a restart wants; older ones are
/// the fallback if it turns out damaged.
pub const SNAPSHOTS_KEPT: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotEntry {
    pub producer_id: i64,
    pub epoch: i16,
    pub last_sequence: i32,
    pub last_offset: i64,
    pub offset_delta: i32,
    pub timestamp: i64,
    pub coordinator_epoch: i32,
    pub current_txn_first_offset: i64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotError {
    #[error("snapshot is {0} bytes, too short")]
    Short(usize),
    #[error("unknown snapshot version {0}")]
    Version(i16),
    #[error("snapshot CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Crc { stored: u32, computed: u32 },
    #[error("snapshot claims {count} entries in {bytes} bytes")]
    Length { count: i32, bytes: usize },
}

pub fn encode(entries: &[SnapshotEntry]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(ENTRIES_OFFSET + 4 + entries.len() * ENTRY_SIZE);
    buf.extend_from_slice(&SNAPSHOT_VERSION.to_be_bytes());
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&(entries.len() as i32).to_be_bytes());
    for e in entries {
        buf.extend_from_slice(&e.producer_id.to_be_bytes());
        buf.extend_from_slice(&e.epoch.to_be_bytes());
        buf.extend_from_slice(&e.last_sequence.to_be_bytes());
        buf.extend_from_slice(&e.last_offset.to_be_bytes());
        buf.extend_from_slice(&e.offset_delta.to_be_bytes());
        buf.extend_from_slice(&e.timestamp.to_be_bytes());
        buf.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
        buf.extend_from_slice(&e.current_txn_first_offset.to_be_bytes());
    }
    let crc = crc32c::crc32c(&buf[ENTRIES_OFFSET..]);
    buf[CRC_OFFSET..ENTRIES_OFFSET].copy_from_slice(&crc.to_be_bytes());
    buf
}

pub fn decode(bytes: &[u8]) -> Result<Vec<SnapshotEntry>, SnapshotError> {
    if bytes.len() < ENTRIES_OFFSET + 4 {
        return Err(SnapshotError::Short(bytes.len()));
    }
    let version = i16::from_be_bytes([bytes[0], bytes[1]]);
    if version != SNAPSHOT_VERSION {
        return Err(SnapshotError::Version(version));
    }
    let stored = u32::from_be_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]);
    let computed = crc32c::crc32c(&bytes[ENTRIES_OFFSET..]);
    if stored != computed {
        return Err(SnapshotError::Crc { stored, computed });
    }
    let count = i32::from_be_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]);
    let body = &bytes[ENTRIES_OFFSET + 4..];
    if count < 0 || body.len() != count as usize * ENTRY_SIZE {
        return Err(SnapshotError::Length { count, bytes: bytes.len() });
    }
    Ok(body
        .chunks_exact(ENTRY_SIZE)
        .map(|e| {
            let i64_at = |o: usize| i64::from_be_bytes(e[o..o + 8].try_into().unwrap_or([0; 8]));
            let i32_at = |o: usize| i32::from_be_bytes(e[o..o + 4].try_into().unwrap_or([0; 4]));
            SnapshotEntry {
                producer_id: i64_at(0),
                epoch: i16::from_be_bytes([e[8], e[9]]),
                last_sequence: i32_at(10),
                last_offset: i64_at(14),
                offset_delta: i32_at(22),
                timestamp: i64_at(26),
                coordinator_epoch: i32_at(34),
                current_txn_first_offset: i64_at(38),
            }
        })
        .collect())
}

pub fn snapshot_path(dir: &Path, offset: i64) -> PathBuf {
    dir.join(format!("{}{SUFFIX}", crate::log::file_prefix(offset)))
}

/// The snapshots in `dir`, by offset, oldest first.
pub fn list(dir: &Path) -> Vec<(i64, PathBuf)> {
    let Ok(rd) = fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(i64, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let stem = name.strip_suffix(SUFFIX)?;
            if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some((stem.parse().ok()?, e.path()))
        })
        .collect();
    out.sort_by_key(|(o, _)| *o);
    out
}

fn remove(path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(file = %path.display(), error = %e, "cannot delete producer snapshot"),
    }
}

/// Writes the snapshot for `offset` (through a temporary file, so a crash leaves either the
/// whole file or a `.tmp` that the next start removes), then keeps only the newest few. Not
/// fsynced, to keep a roll's latency: after a power loss a snapshot may be renamed but empty,
/// which its CRC exposes, and the rebuild falls back to an older one or a rescan.
pub fn write(dir: &Path, offset: i64, bytes: &[u8]) -> io::Result<()> {
    let path = snapshot_path(dir, offset);
    let mut tmp = path.clone().into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
    }
    fs::rename(&tmp, &path)?;
    let all = list(dir);
    for (_, p) in all.iter().take(all.len().saturating_sub(SNAPSHOTS_KEPT)) {
        remove(p);
    }
    Ok(())
}

/// Deletes every snapshot above `offset`: they describe records the log no longer has.
pub fn delete_above(dir: &Path, offset: i64) {
    for (o, p) in list(dir) {
        if o > offset {
            remove(&p);
        }
    }
}

/// The newest snapshot at or below `max_offset` that decodes, with its offset. Ones that fail
/// to decode (torn by a crash, damaged) are deleted.
pub fn load_newest(dir: &Path, max_offset: i64) -> Option<(i64, Vec<SnapshotEntry>)> {
    let all = list(dir);
    for (offset, path) in all.into_iter().rev() {
        if offset > max_offset {
            continue;
        }
        let decoded = fs::read(&path).map_err(|e| e.to_string()).and_then(|b| decode(&b).map_err(|e| e.to_string()));
        match decoded {
            Ok(entries) => return Some((offset, entries)),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "ignoring unreadable producer snapshot; rescanning the log instead");
                remove(&path);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pid: i64, txn: i64) -> SnapshotEntry {
        SnapshotEntry {
            producer_id: pid,
            epoch: 3,
            last_sequence: 41,
            last_offset: 1_000 + pid,
            offset_delta: 9,
            timestamp: 1_700_000_000_000,
            coordinator_epoch: 2,
            current_txn_first_offset: txn,
        }
    }

    #[test]
    fn roundtrip_and_damage_is_detected() {
        let entries = vec![entry(7, -1), entry(8, 990)];
        let bytes = encode(&entries);
        assert_eq!(bytes.len(), 10 + 2 * ENTRY_SIZE);
        assert_eq!(decode(&bytes), Ok(entries));
        for i in 2..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(decode(&b).is_err(), "flipped byte {i} went unnoticed");
        }
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "torn at {n} went unnoticed");
        }
        let mut v0 = bytes.clone();
        v0[1] = 0;
        assert_eq!(decode(&v0), Err(SnapshotError::Version(0)));
    }

    #[test]
    fn files_are_kept_newest_first_and_bad_ones_dropped() {
        let dir = tempfile::tempdir().unwrap();
        for o in [10, 20, 30, 40] {
            write(dir.path(), o, &encode(&[entry(o, -1)])).unwrap();
        }
        assert_eq!(list(dir.path()).iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![20, 30, 40]);
        assert!(dir.path().join("00000000000000000040.snapshot").exists());
        // Above the limit: skipped; corrupt: deleted and the next older one used.
        fs::write(snapshot_path(dir.path(), 30), b"\x00\x01garbage").unwrap();
        let (o, e) = load_newest(dir.path(), 35).unwrap();
        assert_eq!((o, e[0].producer_id), (20, 20));
        assert_eq!(list(dir.path()).iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![20, 40]);
        delete_above(dir.path(), 35);
        assert_eq!(list(dir.path()).iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![20]);
        delete_above(dir.path(), 19);
        assert!(load_newest(dir.path(), i64::MAX).is_none());
    }
}
