//! The embedded znode store used when no `zookeeper.connect` is configured.
//!
//! It keeps the same tree Kafka keeps in ZooKeeper, under the first log dir: a snapshot of the
//! tree plus a journal of the changes since, each change appended and fsynced before it is
//! acknowledged, so a crash loses nothing acknowledged and costs at most a torn last line.
//! Ephemeral nodes live only in memory, as their ZooKeeper counterparts live only as long as
//! the session.

use std::collections::BTreeMap;
use std::io::{Seek, Write};
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::protocol::{ApiError, ErrorCode};
use crate::sync::MutexExt;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("znode {0} already exists")]
    NodeExists(String),
    #[error("znode {0} does not exist")]
    NoNode(String),
    #[error("znode {0} has children")]
    NotEmpty(String),
    #[error("metadata store I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("metadata store file is corrupt: {0}")]
    Corrupt(String),
    #[error("znode {0} changed concurrently")]
    BadVersion(String),
    #[error("ZooKeeper: {0}")]
    ZooKeeper(String),
    /// A fenced write found its guard (the controller epoch znode) changed: a newer
    /// controller was elected, and this one must not act.
    #[error("znode {0} changed: a newer controller was elected")]
    Fenced(String),
}

/// A store failure a request runs into is the broker's fault, not the client's: logged here,
/// answered UNKNOWN_SERVER_ERROR.
impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        tracing::error!(error = %e, "metadata store failure");
        ApiError::new(ErrorCode::UnknownServerError, e.to_string())
    }
}

/// The znode tree, kept by ZooKeeper or, standalone, by the embedded store. Both hold the
/// same paths and JSON.
pub enum ZnodeStore {
    Embedded(EmbeddedStore),
    ZooKeeper(super::zk_store::ZkStore),
}

impl ZnodeStore {
    pub fn is_zookeeper(&self) -> bool {
        matches!(self, ZnodeStore::ZooKeeper(_))
    }

    /// ZooKeeper: the next metadata pass re-reads `path`. The embedded store has no watches.
    pub fn mark_dirty(&self, path: &str) {
        if let ZnodeStore::ZooKeeper(z) = self {
            z.mark_dirty(path);
        }
    }

    pub fn create(&self, path: &str, data: &str, ephemeral: bool) -> Result<(), StoreError> {
        match self {
            ZnodeStore::Embedded(s) => s.create(path, data, ephemeral),
            ZnodeStore::ZooKeeper(z) => z.create(path, data, ephemeral),
        }
    }

    /// Creates a persistent sequential node `<prefix><10-digit counter>` (Kafka's change
    /// notifications). Standalone no other broker reads them, so none is kept.
    pub fn create_sequential(&self, prefix: &str, data: &str) -> Result<(), StoreError> {
        match self {
            ZnodeStore::Embedded(_) => Ok(()),
            ZnodeStore::ZooKeeper(z) => z.create_sequential(prefix, data),
        }
    }

    pub fn try_get(&self, path: &str) -> Result<Option<String>, StoreError> {
        match self {
            ZnodeStore::Embedded(s) => Ok(s.get(path)),
            ZnodeStore::ZooKeeper(z) => z.get(path),
        }
    }

    /// Like [`ZnodeStore::try_get`], for callers to whom an unreadable node is an absent one;
    /// the failure is logged.
    pub fn get(&self, path: &str) -> Option<String> {
        self.try_get(path).unwrap_or_else(|e| {
            tracing::warn!(%path, error = %e, "cannot read znode");
            None
        })
    }

    pub fn get_versioned(&self, path: &str) -> Result<Option<(String, i32)>, StoreError> {
        match self {
            ZnodeStore::Embedded(s) => Ok(s.get(path).map(|d| (d, 0))),
            ZnodeStore::ZooKeeper(z) => z.get_versioned(path),
        }
    }

    /// Data and the transaction id that created the node: for `/brokers/ids/<id>` that is
    /// Kafka's broker epoch. The embedded store has no transaction ids and answers 0.
    pub fn get_with_czxid(&self, path: &str) -> Result<Option<(String, i64)>, StoreError> {
        match self {
            ZnodeStore::Embedded(s) => Ok(s.get(path).map(|d| (d, 0))),
            ZnodeStore::ZooKeeper(z) => z.get_with_czxid(path),
        }
    }

    /// Many reads at once (pipelined in ZooKeeper mode).
    pub fn get_many_versioned(&self, paths: &[String]) -> Result<Vec<Option<(String, i32)>>, StoreError> {
        match self {
            ZnodeStore::Embedded(s) => Ok(paths.iter().map(|p| s.get(p).map(|d| (d, 0))).collect()),
            ZnodeStore::ZooKeeper(z) => z.get_many_versioned(paths),
        }
    }

    /// Creation times (ms) of nodes, pipelined; the embedded store keeps none (None each).
    pub fn created_times(&self, paths: &[String]) -> Result<Vec<Option<i64>>, StoreError> {
        match self {
            ZnodeStore::Embedded(_) => Ok(vec![None; paths.len()]),
            ZnodeStore::ZooKeeper(z) => z.created_times(paths),
        }
    }

    /// Many writes at once (pipelined in ZooKeeper mode): `Some(version)` compare-and-sets an
    /// existing node, `None` creates one. One result per write, in order.
    pub fn write_many(
        &self,
        writes: &[(String, String, Option<i32>)],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        match self {
            ZnodeStore::Embedded(s) => s.write_many(writes),
            ZnodeStore::ZooKeeper(z) => z.write_many(writes),
        }
    }

    /// Like [`ZnodeStore::write_many`], fenced by `guard` (path, version): in ZooKeeper mode the
    /// writes go in multi-op transactions that each check the guard first, and the call fails
    /// with [`StoreError::Fenced`] once the guard has moved on. The embedded store has one
    /// writer and needs no fence; it journals the batch in one append.
    pub fn write_many_guarded(
        &self,
        writes: &[(String, String, Option<i32>)],
        guard: (&str, i32),
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        match self {
            ZnodeStore::Embedded(s) => s.write_many(writes),
            ZnodeStore::ZooKeeper(z) => z.write_many_guarded(writes, guard),
        }
    }

    /// A compare-and-set on the node's version (the embedded store has one writer, so it
    /// always succeeds).
    pub fn set_if_version(&self, path: &str, data: &str, version: i32) -> Result<(), StoreError> {
        match self {
            ZnodeStore::Embedded(s) => s.set(path, data),
            ZnodeStore::ZooKeeper(z) => z.set_if_version(path, data, version).map(|_| ()),
        }
    }

    pub fn set(&self, path: &str, data: &str) -> Result<(), StoreError> {
        match self {
            ZnodeStore::Embedded(s) => s.set(path, data),
            ZnodeStore::ZooKeeper(z) => z.set(path, data),
        }
    }

    /// Creates or overwrites several nodes: one journal write standalone; in ZooKeeper mode,
    /// pipelined.
    pub fn set_many(&self, entries: &[(&str, &str)]) -> Result<(), StoreError> {
        match self {
            ZnodeStore::Embedded(s) => s.set_many(entries),
            ZnodeStore::ZooKeeper(z) => {
                // Pipelined creates (the usual case: new partitions), then overwrites of any
                // that existed.
                let writes: Vec<(String, String, Option<i32>)> =
                    entries.iter().map(|(p, d)| (p.to_string(), d.to_string(), None)).collect();
                for (result, (path, data)) in z.write_many(&writes)?.into_iter().zip(entries) {
                    match result {
                        Ok(()) => {}
                        Err(StoreError::NodeExists(_)) => z.set(path, data)?,
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
        }
    }

    /// Creates or overwrites many nodes that mostly exist already (offsets rewritten again and
    /// again): in ZooKeeper mode pipelined overwrites first, then pipelined creates of the
    /// missing ones.
    pub fn upsert_many(&self, entries: &[(String, String)]) -> Result<(), StoreError> {
        match self {
            ZnodeStore::Embedded(s) => {
                let refs: Vec<(&str, &str)> = entries.iter().map(|(p, d)| (p.as_str(), d.as_str())).collect();
                s.set_many(&refs)
            }
            ZnodeStore::ZooKeeper(z) => {
                let mut missing = Vec::new();
                for (result, (path, data)) in z.overwrite_many(entries)?.into_iter().zip(entries) {
                    match result {
                        Ok(()) => {}
                        Err(StoreError::NoNode(_)) => missing.push((path.clone(), data.clone(), None)),
                        Err(e) => return Err(e),
                    }
                }
                for (result, (path, data, _)) in z.write_many(&missing)?.into_iter().zip(&missing) {
                    match result {
                        Ok(()) => {}
                        Err(StoreError::NodeExists(_)) => z.set(path, data)?,
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
        }
    }

    pub fn put_ephemeral(&self, path: &str, data: &str) -> Result<(), StoreError> {
        match self {
            ZnodeStore::Embedded(s) => s.put_ephemeral(path, data),
            ZnodeStore::ZooKeeper(z) => z.put_ephemeral(path, data),
        }
    }

    /// A compare-and-delete of a leaf on the node's version (standalone: a plain delete).
    pub fn delete_if_version(&self, path: &str, version: i32) -> Result<(), StoreError> {
        match self {
            ZnodeStore::Embedded(s) => s.delete_recursive(path),
            ZnodeStore::ZooKeeper(z) => z.delete_if_version(path, version),
        }
    }

    pub fn delete_recursive(&self, path: &str) -> Result<(), StoreError> {
        match self {
            ZnodeStore::Embedded(s) => s.delete_recursive(path),
            ZnodeStore::ZooKeeper(z) => z.delete_recursive(path),
        }
    }

    /// Deletes the ephemeral nodes at and below `path` that this broker's session holds
    /// (standalone, every node there is this broker's).
    pub fn delete_own_ephemerals(&self, path: &str) -> Result<(), StoreError> {
        match self {
            ZnodeStore::Embedded(s) => s.delete_recursive(path),
            ZnodeStore::ZooKeeper(z) => z.delete_own_ephemerals(path),
        }
    }

    pub fn try_children(&self, path: &str) -> Result<Vec<String>, StoreError> {
        match self {
            ZnodeStore::Embedded(s) => Ok(s.children(path)),
            ZnodeStore::ZooKeeper(z) => z.children(path),
        }
    }

    pub fn children(&self, path: &str) -> Vec<String> {
        self.try_children(path).unwrap_or_else(|e| {
            tracing::warn!(%path, error = %e, "cannot list znode children");
            vec![]
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Znode {
    data: String,
    #[serde(skip)]
    ephemeral: bool,
}

/// One durable change, a line of the journal. `Set` creates missing parents, as `create` does.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Change {
    Set { path: String, data: String },
    Delete { path: String },
}

/// The journal grows until it is this large and larger than the last snapshot, then the tree
/// is written out once and the journal starts again: each change costs one appended line, and
/// rewriting the tree is paid once per tree-sized run of changes.
const COMPACT_AT_BYTES: u64 = 4 << 20;

struct Journal {
    file: std::fs::File,
    len: u64,
    snapshot_len: u64,
}

/// The znode tree of a standalone broker: a snapshot (`<file>`, the whole tree as JSON) plus a
/// journal (`<file>.journal`, one JSON line per change since, each appended and fsynced before
/// the call returns). Readers take only the in-memory map's lock; writers serialize on the
/// journal's, so no reader waits for the disk.
pub struct EmbeddedStore {
    file: PathBuf,
    journal: Mutex<Journal>,
    nodes: Mutex<BTreeMap<String, Znode>>,
    appends: std::sync::atomic::AtomicU64,
}

fn journal_path(file: &std::path::Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".journal");
    PathBuf::from(name)
}

fn apply(nodes: &mut BTreeMap<String, Znode>, change: &Change, ephemeral: bool) {
    match change {
        Change::Set { path, data } => {
            for parent in parents(path) {
                nodes.entry(parent).or_insert(Znode { data: String::new(), ephemeral: false });
            }
            nodes.insert(path.clone(), Znode { data: data.clone(), ephemeral });
        }
        Change::Delete { path } => {
            let prefix = format!("{path}/");
            nodes.remove(path);
            let doomed: Vec<String> =
                nodes.range(prefix.clone()..).map(|(k, _)| k).take_while(|k| k.starts_with(&prefix)).cloned().collect();
            for k in doomed {
                nodes.remove(&k);
            }
        }
    }
}

/// Replays journal lines. Only the last line can be torn (each change is one append), so an
/// unreadable final line without its newline is dropped; one anywhere else is corruption.
/// Returns the length of the readable prefix.
fn replay(nodes: &mut BTreeMap<String, Znode>, bytes: &[u8], what: &std::path::Path) -> Result<u64, StoreError> {
    let mut good = 0usize;
    while good < bytes.len() {
        let rest = &bytes[good..];
        let Some(end) = rest.iter().position(|&b| b == b'\n') else {
            tracing::warn!(journal = %what.display(), bytes = rest.len(), "dropping a torn last journal entry");
            break;
        };
        let change: Change = serde_json::from_slice(&rest[..end])
            .map_err(|e| StoreError::Corrupt(format!("{} at byte {good}: {e}", what.display())))?;
        apply(nodes, &change, false);
        good += end + 1;
    }
    Ok(good as u64)
}

impl EmbeddedStore {
    pub fn open(file: PathBuf) -> Result<EmbeddedStore, StoreError> {
        let mut nodes: BTreeMap<String, Znode> = match std::fs::read(&file) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt(format!("{}: {e}", file.display())))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e.into()),
        };
        let jpath = journal_path(&file);
        match std::fs::read(&jpath) {
            Ok(bytes) => {
                replay(&mut nodes, &bytes, &jpath)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        // Start from a fresh snapshot, so the journal (and the next start's replay) holds only
        // what changes from now on.
        let snapshot_len = write_snapshot(&file, &nodes)?;
        let journal = std::fs::OpenOptions::new().create(true).write(true).truncate(true).open(&jpath)?;
        journal.sync_all()?;
        Ok(EmbeddedStore {
            file,
            journal: Mutex::new(Journal { file: journal, len: 0, snapshot_len }),
            nodes: Mutex::new(nodes),
            appends: Default::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Znode>> {
        // A panic while holding the lock cannot leave the map half-updated (every mutation is a
        // single insert/remove), so a poisoned lock is still safe to use.
        self.nodes.lock_unpoisoned()
    }

    fn journal(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.journal.lock_unpoisoned()
    }

    /// Appends `changes` as one write and one fsync (taken with the journal lock held by the
    /// caller, after the map already shows them), compacting when the journal has grown large.
    fn persist(&self, journal: &mut Journal, changes: &[Change]) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for c in changes {
            serde_json::to_writer(&mut buf, c).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            buf.push(b'\n');
        }
        journal.file.write_all(&buf)?;
        journal.file.sync_data()?;
        self.appends.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        journal.len += buf.len() as u64;
        if journal.len >= COMPACT_AT_BYTES && journal.len > journal.snapshot_len {
            let durable: BTreeMap<String, Znode> =
                self.lock().iter().filter(|(_, n)| !n.ephemeral).map(|(k, n)| (k.clone(), n.clone())).collect();
            journal.snapshot_len = write_snapshot(&self.file, &durable)?;
            journal.file.set_len(0)?;
            // The file is not in append mode: without this the next change would be written
            // at the old length, behind a hole of zeros that no later start can replay.
            journal.file.seek(std::io::SeekFrom::Start(0))?;
            journal.file.sync_all()?;
            journal.len = 0;
        }
        Ok(())
    }

    /// Creates `path` and any missing parents (as Kafka's `createRecursive` does).
    pub fn create(&self, path: &str, data: &str, ephemeral: bool) -> Result<(), StoreError> {
        let mut journal = self.journal();
        let change = Change::Set { path: path.to_string(), data: data.to_string() };
        let mut new_parents = Vec::new();
        {
            let mut nodes = self.lock();
            if nodes.contains_key(path) {
                return Err(StoreError::NodeExists(path.to_string()));
            }
            if ephemeral {
                new_parents.extend(
                    parents(path)
                        .filter(|p| !nodes.contains_key(p))
                        .map(|p| Change::Set { path: p, data: String::new() }),
                );
            }
            apply(&mut nodes, &change, ephemeral);
        }
        if ephemeral {
            return self.persist(&mut journal, &new_parents);
        }
        self.persist(&mut journal, &[change])
    }

    pub fn get(&self, path: &str) -> Option<String> {
        self.lock().get(path).map(|n| n.data.clone())
    }

    /// Creates or overwrites.
    pub fn set(&self, path: &str, data: &str) -> Result<(), StoreError> {
        self.set_many(&[(path, data)])
    }

    /// Creates (`None`) or overwrites (`Some(_)`: one writer, so no version to check) several
    /// nodes with one journal write; a create of a node that exists fails alone.
    pub fn write_many(
        &self,
        writes: &[(String, String, Option<i32>)],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let mut journal = self.journal();
        let mut durable = Vec::with_capacity(writes.len());
        let mut results = Vec::with_capacity(writes.len());
        {
            let mut nodes = self.lock();
            for (path, data, version) in writes {
                if version.is_none() && nodes.contains_key(path) {
                    results.push(Err(StoreError::NodeExists(path.clone())));
                    continue;
                }
                let ephemeral = nodes.get(path).is_some_and(|n| n.ephemeral);
                let change = Change::Set { path: path.clone(), data: data.clone() };
                apply(&mut nodes, &change, ephemeral);
                if !ephemeral {
                    durable.push(change);
                }
                results.push(Ok(()));
            }
        }
        self.persist(&mut journal, &durable)?;
        Ok(results)
    }

    /// Journal appends since the store was opened: each is a write and an fsync, the
    /// embedded store's counterpart of a ZooKeeper round trip.
    pub fn appends(&self) -> u64 {
        self.appends.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Creates or overwrites several nodes with one journal write.
    pub fn set_many(&self, entries: &[(&str, &str)]) -> Result<(), StoreError> {
        let mut journal = self.journal();
        let mut durable = Vec::with_capacity(entries.len());
        {
            let mut nodes = self.lock();
            for &(path, data) in entries {
                let ephemeral = nodes.get(path).is_some_and(|n| n.ephemeral);
                let change = Change::Set { path: path.to_string(), data: data.to_string() };
                apply(&mut nodes, &change, ephemeral);
                if !ephemeral {
                    durable.push(change);
                }
            }
        }
        self.persist(&mut journal, &durable)
    }

    /// Creates or replaces an ephemeral node (and any missing parents). The parents are
    /// durable, as in ZooKeeper, and journaled when new.
    pub fn put_ephemeral(&self, path: &str, data: &str) -> Result<(), StoreError> {
        let mut journal = self.journal();
        let mut new_parents = Vec::new();
        {
            let mut nodes = self.lock();
            for parent in parents(path) {
                if !nodes.contains_key(&parent) {
                    new_parents.push(Change::Set { path: parent, data: String::new() });
                }
            }
            apply(&mut nodes, &Change::Set { path: path.to_string(), data: data.to_string() }, true);
        }
        self.persist(&mut journal, &new_parents)
    }

    /// Deletes `path` and everything below it.
    pub fn delete_recursive(&self, path: &str) -> Result<(), StoreError> {
        let mut journal = self.journal();
        let change = Change::Delete { path: path.to_string() };
        let durable_change = {
            let mut nodes = self.lock();
            let prefix = format!("{path}/");
            let durable = nodes.get(path).is_some_and(|n| !n.ephemeral)
                || nodes.range(prefix.clone()..).take_while(|(k, _)| k.starts_with(&prefix)).any(|(_, n)| !n.ephemeral);
            apply(&mut nodes, &change, false);
            durable
        };
        if durable_change {
            self.persist(&mut journal, &[change])?;
        }
        Ok(())
    }

    /// The names below `path`, in order; costs what is below `path`, not the whole tree.
    pub fn children(&self, path: &str) -> Vec<String> {
        let prefix = if path == "/" { "/".to_string() } else { format!("{path}/") };
        self.lock()
            .range(prefix.clone()..)
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(&prefix))
            .filter_map(|k| k.strip_prefix(&prefix))
            .filter(|rest| !rest.is_empty() && !rest.contains('/'))
            .map(str::to_string)
            .collect()
    }
}

/// Writes the durable part of the tree atomically (temp file, fsync, rename); returns its size.
fn write_snapshot(file: &std::path::Path, nodes: &BTreeMap<String, Znode>) -> Result<u64, StoreError> {
    let durable: BTreeMap<&String, &Znode> = nodes.iter().filter(|(_, n)| !n.ephemeral).collect();
    let bytes = serde_json::to_vec(&durable).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let tmp = file.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)?;
    if let Some(dir) = file.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(bytes.len() as u64)
}

/// `/a/b/c` -> `/a`, `/a/b`.
fn parents(path: &str) -> impl Iterator<Item = String> + '_ {
    path.match_indices('/').skip(1).map(move |(i, _)| path[..i].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_survives_reopen_but_ephemerals_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("meta.json");
        let s = EmbeddedStore::open(file.clone()).unwrap();
        s.create("/brokers/topics/a", "{}", false).unwrap();
        s.create("/brokers/ids/0", "{\"port\":1}", true).unwrap();
        assert!(matches!(s.create("/brokers/topics/a", "", false), Err(StoreError::NodeExists(_))));
        assert_eq!(s.children("/brokers"), vec!["ids".to_string(), "topics".to_string()]);
        s.set("/brokers/topics/a", "{\"v\":1}").unwrap();
        drop(s);
        let s = EmbeddedStore::open(file).unwrap();
        assert_eq!(s.get("/brokers/topics/a").as_deref(), Some("{\"v\":1}"));
        assert_eq!(s.get("/brokers/ids/0"), None);
        s.delete_recursive("/brokers/topics").unwrap();
        assert!(s.children("/brokers/topics").is_empty());
    }

    /// Past the compaction size the tree is written out and the journal starts again; the
    /// changes after that are in the journal from its first byte, and a restart replays them.
    #[test]
    fn changes_after_a_compaction_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("meta.json");
        let s = EmbeddedStore::open(file.clone()).unwrap();
        let value = "v".repeat(1000);
        let paths: Vec<String> = (0..200).map(|i| format!("/config/topics/t{i}")).collect();
        let entries: Vec<(&str, &str)> = paths.iter().map(|p| (p.as_str(), value.as_str())).collect();
        // About 200 KB a write: the journal passes the compaction size after some 20.
        for _ in 0..25 {
            s.set_many(&entries).unwrap();
        }
        s.set("/config/topics/last", "after").unwrap();
        let journal = std::fs::read(journal_path(&file)).unwrap();
        assert!((journal.len() as u64) < COMPACT_AT_BYTES, "the journal was compacted");
        assert_ne!(journal.first(), Some(&0), "the journal starts with a hole");
        drop(s);
        let s = EmbeddedStore::open(file).unwrap();
        assert_eq!(s.get("/config/topics/last").as_deref(), Some("after"));
        assert_eq!(s.children("/config/topics").len(), 201);
    }

    #[test]
    fn changes_are_journaled_not_rewritten_and_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("meta.json");
        let s = EmbeddedStore::open(file.clone()).unwrap();
        let snapshot = std::fs::read(&file).unwrap();
        for p in 0..200 {
            s.set(&format!("/brokers/topics/t/partitions/{p}/state"), &format!("{{\"leader\":{p}}}")).unwrap();
        }
        s.set_many(&[("/config/topics/t", "{}"), ("/config/topics/u", "{}")]).unwrap();
        s.delete_recursive("/brokers/topics/t/partitions/7").unwrap();
        s.create("/consumers/g/ids/m", "x", true).unwrap();
        // The snapshot is untouched: each change went to the journal.
        assert_eq!(std::fs::read(&file).unwrap(), snapshot);
        drop(s);
        let s = EmbeddedStore::open(file).unwrap();
        assert_eq!(s.children("/brokers/topics/t/partitions").len(), 199);
        assert_eq!(s.get("/brokers/topics/t/partitions/8/state").as_deref(), Some("{\"leader\":8}"));
        assert_eq!(s.get("/brokers/topics/t/partitions/7/state"), None);
        assert_eq!(s.children("/config/topics"), vec!["t".to_string(), "u".to_string()]);
        // The ephemeral is gone, its durable parent stays (as in ZooKeeper).
        assert_eq!(s.children("/consumers/g/ids"), Vec::<String>::new());
        assert_eq!(s.get("/consumers/g/ids").as_deref(), Some(""));
    }

    #[test]
    fn torn_last_journal_line_is_dropped_and_corruption_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("meta.json");
        let s = EmbeddedStore::open(file.clone()).unwrap();
        s.set("/a", "1").unwrap();
        drop(s);
        // A crash in the middle of the next append.
        let journal = journal_path(&file);
        let mut bytes = std::fs::read(&journal).unwrap();
        bytes.extend_from_slice(b"{\"op\":\"set\",\"path\":\"/b\",\"da");
        std::fs::write(&journal, &bytes).unwrap();
        let s = EmbeddedStore::open(file.clone()).unwrap();
        assert_eq!(s.get("/a").as_deref(), Some("1"));
        assert_eq!(s.get("/b"), None);
        s.set("/c", "3").unwrap();
        drop(s);
        let mut bytes = b"not json\n".to_vec();
        bytes.extend_from_slice(&std::fs::read(&journal).unwrap());
        std::fs::write(&journal, &bytes).unwrap();
        assert!(matches!(EmbeddedStore::open(file), Err(StoreError::Corrupt(_))));
    }
}
