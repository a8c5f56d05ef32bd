//! The embedded znode store used when no `zookeeper.connect` is configured.
//!
//! It keeps the same tree Kafka keeps in ZooKeeper, in one JSON file under the first log dir,
//! rewritten atomically (temp file, fsync, rename) on every change, so a crash leaves either
//! the old tree or the new one. Ephemeral nodes live only in memory, as their ZooKeeper
//! counterparts live only as long as the session.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

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

    pub fn create(&self, path: &str, data: &str, ephemeral: bool) -> Result<(), StoreError> {
        match self {
            ZnodeStore::Embedded(s) => s.create(path, data, ephemeral),
            ZnodeStore::ZooKeeper(z) => z.create(path, data, ephemeral),
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

    pub fn put_ephemeral(&self, path: &str, data: &str) -> Result<(), StoreError> {
        match self {
            ZnodeStore::Embedded(s) => s.put_ephemeral(path, data),
            ZnodeStore::ZooKeeper(z) => z.put_ephemeral(path, data),
        }
    }

    pub fn delete_recursive(&self, path: &str) -> Result<(), StoreError> {
        match self {
            ZnodeStore::Embedded(s) => s.delete_recursive(path),
            ZnodeStore::ZooKeeper(z) => z.delete_recursive(path),
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

pub struct EmbeddedStore {
    file: PathBuf,
    nodes: Mutex<BTreeMap<String, Znode>>,
}

impl EmbeddedStore {
    pub fn open(file: PathBuf) -> Result<EmbeddedStore, StoreError> {
        let nodes = match std::fs::read(&file) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt(format!("{}: {e}", file.display())))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e.into()),
        };
        Ok(EmbeddedStore { file, nodes: Mutex::new(nodes) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Znode>> {
        // A panic while holding the lock cannot leave the map half-updated (every mutation is a
        // single insert/remove), so a poisoned lock is still safe to use.
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn persist(&self, nodes: &BTreeMap<String, Znode>) -> Result<(), StoreError> {
        let durable: BTreeMap<&String, &Znode> = nodes.iter().filter(|(_, n)| !n.ephemeral).collect();
        let bytes = serde_json::to_vec_pretty(&durable).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let tmp = self.file.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.file)?;
        Ok(())
    }

    /// Creates `path` and any missing parents (as Kafka's `createRecursive` does).
    pub fn create(&self, path: &str, data: &str, ephemeral: bool) -> Result<(), StoreError> {
        let mut nodes = self.lock();
        if nodes.contains_key(path) {
            return Err(StoreError::NodeExists(path.to_string()));
        }
        let mut parent = String::new();
        for part in path
            .split('/')
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .split_last()
            .map(|(_, p)| p.to_vec())
            .unwrap_or_default()
        {
            parent.push('/');
            parent.push_str(part);
            nodes.entry(parent.clone()).or_insert(Znode { data: String::new(), ephemeral: false });
        }
        nodes.insert(path.to_string(), Znode { data: data.to_string(), ephemeral });
        if !ephemeral {
            self.persist(&nodes)?;
        }
        Ok(())
    }

    pub fn get(&self, path: &str) -> Option<String> {
        self.lock().get(path).map(|n| n.data.clone())
    }

    /// Creates or overwrites.
    pub fn set(&self, path: &str, data: &str) -> Result<(), StoreError> {
        let exists = self.lock().contains_key(path);
        if !exists {
            return self.create(path, data, false);
        }
        let mut nodes = self.lock();
        let ephemeral = match nodes.get_mut(path) {
            Some(n) => {
                n.data = data.to_string();
                n.ephemeral
            }
            None => return Err(StoreError::NoNode(path.to_string())),
        };
        if !ephemeral {
            self.persist(&nodes)?;
        }
        Ok(())
    }

    /// Creates or replaces an ephemeral node (and any missing parents).
    pub fn put_ephemeral(&self, path: &str, data: &str) -> Result<(), StoreError> {
        let created_parents = {
            let mut nodes = self.lock();
            let missing_parent = parents(path).any(|p| !nodes.contains_key(&p));
            if !missing_parent {
                nodes.insert(path.to_string(), Znode { data: data.to_string(), ephemeral: true });
                return Ok(());
            }
            nodes.remove(path);
            true
        };
        debug_assert!(created_parents);
        self.create(path, data, true)
    }

    /// Deletes `path` and everything below it.
    pub fn delete_recursive(&self, path: &str) -> Result<(), StoreError> {
        let mut nodes = self.lock();
        let prefix = format!("{path}/");
        let mut durable_change = false;
        nodes.retain(|k, n| {
            let doomed = k == path || k.starts_with(&prefix);
            durable_change |= doomed && !n.ephemeral;
            !doomed
        });
        if durable_change {
            self.persist(&nodes)?;
        }
        Ok(())
    }

    pub fn children(&self, path: &str) -> Vec<String> {
        let prefix = if path == "/" { "/".to_string() } else { format!("{path}/") };
        self.lock()
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .filter(|rest| !rest.is_empty() && !rest.contains('/'))
            .map(str::to_string)
            .collect()
    }
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
}
