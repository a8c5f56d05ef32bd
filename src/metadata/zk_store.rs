//! The ZooKeeper backend of the znode store (`zookeeper.connect`), over the `zookeeper-client`
//! crate. Like Kafka, it creates the chroot of `host:port/chroot` when it is missing.
//!
//! The broker's metadata paths are synchronous (they run inside request handlers and hold
//! short locks), so each call here blocks its thread until the client, running on a runtime
//! of its own, answers; the calls are rare (topic admin, group membership, leadership
//! changes), never on the produce or fetch path.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use zookeeper_client as zk;

use super::store::StoreError;

pub struct ZkStore {
    client: zk::Client,
    /// The ZooKeeper client's own runtime. Callers block on its answers from request handlers
    /// that may hold locks other handlers wait for; on a runtime of its own the client's I/O
    /// never waits for a worker thread that is itself blocked on such a lock.
    runtime: Option<tokio::runtime::Runtime>,
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

/// Runs `fut` on `runtime` and waits for its output, giving up this thread's worker slot
/// (if it is a runtime worker) while waiting.
fn run_on<T, Fut>(runtime: &tokio::runtime::Runtime, fut: Fut) -> Result<T, StoreError>
where
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = tx.send(fut.await);
    });
    let wait = move || rx.recv().map_err(|_| StoreError::ZooKeeper("the ZooKeeper client stopped".into()));
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(wait),
        _ => wait(),
    }
}

/// Paths whose changes matter to a broker: membership, topics, controller, admin requests,
/// topic configs.
const WATCHED: &[&str] = &["/brokers", "/controller", "/admin", "/config", "/isr_change_notification"];

impl Drop for ZkStore {
    fn drop(&mut self) {
        // Dropping a runtime inside another one's async context would panic.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl ZkStore {
    /// Connects (retrying until `connection_timeout`), creating the chroot if needed, and
    /// starts the watches that feed [`ZkStore::changes`].
    pub fn connect(
        connect: &str,
        session_timeout: Duration,
        connection_timeout: Duration,
    ) -> Result<ZkStore, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("zookeeper")
            .enable_all()
            .build()
            .map_err(|e| StoreError::ZooKeeper(format!("cannot start the ZooKeeper client runtime: {e}")))?;
        let connect = connect.to_string();
        let (client, changes) = run_on(&runtime, Self::connect_async(connect, session_timeout, connection_timeout))??;
        Ok(ZkStore { client, runtime: Some(runtime), changes })
    }

    async fn connect_async(
        connect: String,
        session_timeout: Duration,
        connection_timeout: Duration,
    ) -> Result<(zk::Client, watch::Receiver<u64>), StoreError> {
        let (hosts, chroot) = match connect.find('/') {
            Some(i) => (&connect[..i], Some(&connect[i..])),
            None => (connect.as_str(), None),
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
        tokio::spawn(async move {
            loop {
                let s = state.changed().await;
                tracing::info!(state = ?s, "ZooKeeper session state");
                tx.send_modify(|n| *n += 1);
                if s.is_terminated() {
                    // Kafka re-creates its session here; gregor stops, so that a supervisor
                    // restarts it into a clean registration rather than serve stale leadership.
                    tracing::error!("ZooKeeper session ended ({s:?}); shutting down");
                    std::process::exit(1);
                }
            }
        });
        Ok((client, changes))
    }

    /// Runs one client call on the client's runtime and waits for it.
    fn call<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(zk::Client) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let runtime =
            self.runtime.as_ref().ok_or_else(|| StoreError::ZooKeeper("the ZooKeeper client stopped".into()))?;
        run_on(runtime, f(self.client.clone()))
    }

    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    pub fn create(&self, path: &str, data: &str, ephemeral: bool) -> Result<(), StoreError> {
        let (p, d) = (path.to_string(), data.as_bytes().to_vec());
        let result = self.call(move |c| async move {
            let mode = if ephemeral { zk::CreateMode::Ephemeral } else { zk::CreateMode::Persistent };
            let options = mode.with_acls(zk::Acls::anyone_all());
            match c.create(&p, &d, &options).await {
                Err(zk::Error::NoNode) => {
                    if let Some(i) = p.rfind('/').filter(|i| *i > 0) {
                        let parent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                        c.mkdir(&p[..i], &parent).await?;
                    }
                    c.create(&p, &d, &options).await.map(|_| ())
                }
                other => other.map(|_| ()),
            }
        })?;
        result.map_err(|e| match StoreError::from(e) {
            StoreError::NodeExists(_) => StoreError::NodeExists(path.to_string()),
            other => other,
        })
    }

    pub fn get(&self, path: &str) -> Result<Option<String>, StoreError> {
        Ok(self.get_versioned(path)?.map(|(d, _)| d))
    }

    /// Data and version (for conditional writes).
    pub fn get_versioned(&self, path: &str) -> Result<Option<(String, i32)>, StoreError> {
        let p = path.to_string();
        match self.call(move |c| async move { c.get_data(&p).await })? {
            Ok((data, stat)) => Ok(Some((String::from_utf8_lossy(&data).into_owned(), stat.version))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn set_data(&self, path: &str, data: &str, version: Option<i32>) -> Result<Result<i32, zk::Error>, StoreError> {
        let (p, d) = (path.to_string(), data.as_bytes().to_vec());
        self.call(move |c| async move { c.set_data(&p, &d, version).await.map(|stat| stat.version) })
    }

    /// Creates or overwrites; a concurrent creator just means overwriting instead.
    pub fn set(&self, path: &str, data: &str) -> Result<(), StoreError> {
        loop {
            match self.set_data(path, data, None)? {
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
        self.set_data(path, data, Some(version))?.map_err(|e| match e {
            zk::Error::BadVersion => StoreError::BadVersion(path.to_string()),
            other => other.into(),
        })
    }

    pub fn put_ephemeral(&self, path: &str, data: &str) -> Result<(), StoreError> {
        match self.create(path, data, true) {
            Err(StoreError::NodeExists(_)) => self.set_data(path, data, None)?.map(|_| ()).map_err(Into::into),
            other => other,
        }
    }

    pub fn delete_recursive(&self, path: &str) -> Result<(), StoreError> {
        let p = path.to_string();
        let children = match self.call(move |c| async move { c.list_children(&p).await })? {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        for child in children {
            self.delete_recursive(&format!("{path}/{child}"))?;
        }
        let p = path.to_string();
        match self.call(move |c| async move { c.delete(&p, None).await })? {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    pub fn children(&self, path: &str) -> Result<Vec<String>, StoreError> {
        let p = path.to_string();
        match self.call(move |c| async move { c.list_children(&p).await })? {
            Ok(mut c) => {
                c.sort();
                Ok(c)
            }
            Err(zk::Error::NoNode) => Ok(vec![]),
            Err(e) => Err(e.into()),
        }
    }
}
