//! The ZooKeeper backend of the znode store (`zookeeper.connect`), over the `zookeeper-client`
//! crate. Like Kafka, it creates the chroot of `host:port/chroot` when it is missing.
//!
//! The broker's metadata paths are synchronous (they run inside request handlers and hold
//! short locks), so each call here blocks its thread on the async client with
//! `block_in_place`; the calls are rare (topic admin, group membership, leadership changes),
//! never on the produce or fetch path.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use zookeeper_client as zk;

use super::store::StoreError;

pub struct ZkStore {
    client: zk::Client,
    handle: tokio::runtime::Handle,
    /// Bumped on every change under the watched paths; the broker reloads its view on change.
    changes: watch::Receiver<u64>,
}

impl From<zk::Error> for StoreError {
    fn from(e: zk::Error) -> StoreError {
        match e {
            zk::Error::NodeExists => StoreError::NodeExists(String::new()),
            zk::Error::NoNode => StoreError::NoNode(String::new()),
            zk::Error::NotEmpty => StoreError::NotEmpty(String::new()),
            other => StoreError::ZooKeeper(other.to_string()),
        }
    }
}

fn block<F: Future>(handle: &tokio::runtime::Handle, f: F) -> F::Output {
    tokio::task::block_in_place(|| handle.block_on(f))
}

/// Paths whose changes matter to a broker: membership, topics, controller, admin requests,
/// topic configs.
const WATCHED: &[&str] = &["/brokers", "/controller", "/admin", "/config", "/isr_change_notification"];

impl ZkStore {
    /// Connects (retrying until `connection_timeout`), creating the chroot if needed, and
    /// starts the watches that feed [`ZkStore::changes`].
    pub async fn connect(
        connect: &str,
        session_timeout: Duration,
        connection_timeout: Duration,
    ) -> Result<ZkStore, StoreError> {
        let (hosts, chroot) = match connect.find('/') {
            Some(i) => (&connect[..i], Some(&connect[i..])),
            None => (connect, None),
        };
        let deadline = tokio::time::Instant::now() + connection_timeout;
        let client = loop {
            let attempt = zk::Client::connector()
                .with_session_timeout(session_timeout)
                .with_connection_timeout(connection_timeout.min(Duration::from_secs(5)))
                .connect(hosts)
                .await;
            match attempt {
                Ok(c) => break c,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(zookeeper = %hosts, error = %e, "cannot reach ZooKeeper yet; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => {
                    return Err(StoreError::ZooKeeper(format!(
                        "cannot connect to ZooKeeper at {hosts} within {} ms: {e}",
                        connection_timeout.as_millis()
                    )))
                }
            }
        };
        let client = match chroot.filter(|c| *c != "/") {
            Some(root) => {
                let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                client.mkdir(root, &options).await?;
                client.chroot(root.to_string()).map_err(|_| StoreError::ZooKeeper(format!("bad chroot {root}")))?
            }
            None => client,
        };
        let (tx, changes) = watch::channel(0u64);
        for path in WATCHED {
            let mut watcher = client.watch(path, zk::AddWatchMode::PersistentRecursive).await?;
            let tx = tx.clone();
            tokio::spawn(async move {
                loop {
                    let event = watcher.changed().await;
                    if event.event_type == zk::EventType::Session && event.session_state.is_terminated() {
                        break;
                    }
                    tx.send_modify(|n| *n += 1);
                }
            });
        }
        let mut state = client.state_watcher();
        let tx_state = tx.clone();
        tokio::spawn(async move {
            loop {
                let s = state.changed().await;
                tracing::info!(state = ?s, "ZooKeeper session state");
                tx_state.send_modify(|n| *n += 1);
                if s.is_terminated() {
                    // Kafka re-creates its session here; gregor stops, so that a supervisor
                    // restarts it into a clean registration rather than serve stale leadership.
                    tracing::error!("ZooKeeper session ended ({s:?}); shutting down");
                    std::process::exit(1);
                }
            }
        });
        Ok(ZkStore { client, handle: tokio::runtime::Handle::current(), changes })
    }

    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    pub fn create(&self, path: &str, data: &str, ephemeral: bool) -> Result<(), StoreError> {
        let mode = if ephemeral { zk::CreateMode::Ephemeral } else { zk::CreateMode::Persistent };
        let options = mode.with_acls(zk::Acls::anyone_all());
        block(&self.handle, async {
            match self.client.create(path, data.as_bytes(), &options).await {
                Err(zk::Error::NoNode) => {
                    if let Some(i) = path.rfind('/').filter(|i| *i > 0) {
                        let parent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                        self.client.mkdir(&path[..i], &parent).await?;
                    }
                    self.client.create(path, data.as_bytes(), &options).await.map(|_| ())
                }
                other => other.map(|_| ()),
            }
        })
        .map_err(|e| match StoreError::from(e) {
            StoreError::NodeExists(_) => StoreError::NodeExists(path.to_string()),
            other => other,
        })
    }

    pub fn get(&self, path: &str) -> Result<Option<String>, StoreError> {
        match block(&self.handle, self.client.get_data(path)) {
            Ok((data, _)) => Ok(Some(String::from_utf8_lossy(&data).into_owned())),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Data and version (for conditional writes).
    pub fn get_versioned(&self, path: &str) -> Result<Option<(String, i32)>, StoreError> {
        match block(&self.handle, self.client.get_data(path)) {
            Ok((data, stat)) => Ok(Some((String::from_utf8_lossy(&data).into_owned(), stat.version))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Creates or overwrites; a concurrent creator just means overwriting instead.
    pub fn set(&self, path: &str, data: &str) -> Result<(), StoreError> {
        loop {
            match block(&self.handle, self.client.set_data(path, data.as_bytes(), None)) {
                Ok(_) => return Ok(()),
                Err(zk::Error::NoNode) => match self.create(path, data, false) {
                    Err(StoreError::NodeExists(_)) => continue,
                    other => return other,
                },
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Writes only if the node is still at `version`; returns the new version.
    pub fn set_if_version(&self, path: &str, data: &str, version: i32) -> Result<i32, StoreError> {
        block(&self.handle, self.client.set_data(path, data.as_bytes(), Some(version)))
            .map(|stat| stat.version)
            .map_err(|e| match e {
                zk::Error::BadVersion => StoreError::BadVersion(path.to_string()),
                other => other.into(),
            })
    }

    pub fn put_ephemeral(&self, path: &str, data: &str) -> Result<(), StoreError> {
        match self.create(path, data, true) {
            Err(StoreError::NodeExists(_)) => {
                block(&self.handle, self.client.set_data(path, data.as_bytes(), None)).map(|_| ()).map_err(Into::into)
            }
            other => other,
        }
    }

    pub fn delete_recursive(&self, path: &str) -> Result<(), StoreError> {
        let children = match block(&self.handle, self.client.list_children(path)) {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        for child in children {
            self.delete_recursive(&format!("{path}/{child}"))?;
        }
        match block(&self.handle, self.client.delete(path, None)) {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    pub fn children(&self, path: &str) -> Result<Vec<String>, StoreError> {
        match block(&self.handle, self.client.list_children(path)) {
            Ok(mut c) => {
                c.sort();
                Ok(c)
            }
            Err(zk::Error::NoNode) => Ok(vec![]),
            Err(e) => Err(e.into()),
        }
    }
}
