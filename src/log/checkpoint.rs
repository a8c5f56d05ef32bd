//! Kafka's text checkpoint files (`CheckpointFile`) and `partition.metadata`.
//!
//! Offset checkpoint format: line 1 version `0`, line 2 entry count, then
//! `<topic> <partition> <offset>` per line. Every write goes to `<file>.tmp`,
//! is fsynced, then renamed over the target (and the directory fsynced), so
//! a crash leaves either the old or the new file, never a torn one.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use super::LogError;

pub const RECOVERY_POINT_CHECKPOINT: &str = "recovery-point-offset-checkpoint";
pub const LOG_START_OFFSET_CHECKPOINT: &str = "log-start-offset-checkpoint";
pub const REPLICATION_OFFSET_CHECKPOINT: &str = "replication-offset-checkpoint";
pub const CLEAN_SHUTDOWN_FILE: &str = ".kafka_cleanshutdown";
pub const PARTITION_METADATA_FILE: &str = "partition.metadata";

fn invalid(path: &Path, msg: &str) -> LogError {
    LogError::Io(io::Error::new(io::ErrorKind::InvalidData, format!("{}: {msg}", path.display())))
}

/// Writes `contents` to `path` atomically: tmp file, fsync, rename, fsync dir.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), LogError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    {
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

/// fsync a directory so renames/creates inside it are durable.
pub fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Makes every file of the file system holding `dir` durable (syncfs(2)): one call where a
/// broker closing or recovering thousands of logs would otherwise fsync each segment, which on
/// a disk with a few ms per fsync is minutes. Linux reports writeback errors through it since
/// 5.8.
pub fn sync_file_system(dir: &Path) -> Result<(), LogError> {
    use std::os::fd::AsRawFd;
    let d = File::open(dir)?;
    // SAFETY: syncfs(2) on a descriptor we own; it reads nothing from us.
    if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// Writes an offset checkpoint (entries are sorted for stable output).
pub fn write_offset_checkpoint(path: &Path, entries: &[((String, i32), i64)]) -> Result<(), LogError> {
    let mut sorted: Vec<&((String, i32), i64)> = entries.iter().collect();
    sorted.sort();
    let mut s = format!("0\n{}\n", sorted.len());
    for ((t, p), o) in sorted {
        s.push_str(&format!("{t} {p} {o}\n"));
    }
    write_atomic(path, s.as_bytes())
}

/// Reads an offset checkpoint; a missing file is empty. Anything malformed
/// (wrong version, count mismatch, bad numbers) is an `InvalidData` error.
pub fn read_offset_checkpoint(path: &Path) -> Result<HashMap<(String, i32), i64>, LogError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(e.into()),
    };
    let mut lines = text.lines();
    match lines.next().map(str::trim) {
        Some("0") => {}
        _ => return Err(invalid(path, "unsupported checkpoint version")),
    }
    let count: usize =
        lines.next().and_then(|l| l.trim().parse().ok()).ok_or_else(|| invalid(path, "bad entry count"))?;
    let mut out = HashMap::new();
    for line in lines {
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (t, p, o) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(t), Some(p), Some(o), None) => (t, p, o),
            _ => return Err(invalid(path, "malformed entry")),
        };
        let p: i32 = p.parse().map_err(|_| invalid(path, "bad partition"))?;
        let o: i64 = o.parse().map_err(|_| invalid(path, "bad offset"))?;
        out.insert((t.to_string(), p), o);
    }
    if out.len() != count {
        return Err(invalid(path, &format!("expected {count} entries, found {}", out.len())));
    }
    Ok(out)
}

/// `partition.metadata`: "version: 0\ntopic_id: <id>\n" (the caller supplies
/// the id string, normally Kafka's base64 UUID).
/// Not fsynced: the topic id is in ZooKeeper too, and a file lost or torn by a crash is
/// written again when the replica is next opened. Two fsyncs per new partition made creating
/// a hundred topics take most of a second on each broker.
pub fn write_partition_metadata(dir: &Path, topic_id: &str) -> Result<(), LogError> {
    let path = dir.join(PARTITION_METADATA_FILE);
    let tmp = dir.join(format!("{PARTITION_METADATA_FILE}.tmp"));
    fs::write(&tmp, format!("version: 0\ntopic_id: {topic_id}\n"))?;
    fs::rename(&tmp, &path)?;
    Ok(())
}

/// Returns the topic id, `None` if the file does not exist.
pub fn read_partition_metadata(dir: &Path) -> Result<Option<String>, LogError> {
    let path = dir.join(PARTITION_METADATA_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut version_ok = false;
    let mut id = None;
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(':') {
            match k.trim() {
                "version" => version_ok = v.trim() == "0",
                "topic_id" => id = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    match (version_ok, id) {
        (true, Some(id)) if !id.is_empty() => Ok(Some(id)),
        _ => Err(invalid(&path, "malformed partition metadata")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_checkpoint_format_and_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(RECOVERY_POINT_CHECKPOINT);
        let entries = vec![(("orders".to_string(), 1), 42i64), (("a-b.c".to_string(), 0), 7)];
        write_offset_checkpoint(&p, &entries).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "0\n2\na-b.c 0 7\norders 1 42\n");
        assert!(!d.path().join("recovery-point-offset-checkpoint.tmp").exists());
        let m = read_offset_checkpoint(&p).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[&("orders".to_string(), 1)], 42);
        // empty
        write_offset_checkpoint(&p, &[]).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "0\n0\n");
        assert!(read_offset_checkpoint(&p).unwrap().is_empty());
        // missing
        assert!(read_offset_checkpoint(&d.path().join("nope")).unwrap().is_empty());
    }

    #[test]
    fn malformed_checkpoints() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("cp");
        for bad in ["1\n0\n", "0\n2\nt 0 1\n", "0\nx\n", "0\n1\nt zero 1\n", "0\n1\nt 0 1 9\n", ""] {
            fs::write(&p, bad).unwrap();
            assert!(read_offset_checkpoint(&p).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn partition_metadata() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read_partition_metadata(d.path()).unwrap(), None);
        write_partition_metadata(d.path(), "q5hcYk1dQn-8QWZ7H8ql3A").unwrap();
        assert_eq!(
            fs::read_to_string(d.path().join("partition.metadata")).unwrap(),
            "version: 0\ntopic_id: q5hcYk1dQn-8QWZ7H8ql3A\n"
        );
        assert_eq!(read_partition_metadata(d.path()).unwrap().as_deref(), Some("q5hcYk1dQn-8QWZ7H8ql3A"));
        fs::write(d.path().join("partition.metadata"), "garbage").unwrap();
        assert!(read_partition_metadata(d.path()).is_err());
    }
}
