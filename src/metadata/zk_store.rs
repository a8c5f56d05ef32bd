//! The ZooKeeper backend of the znode store (`zookeeper.connect`), over the `zookeeper-client`
//! crate. Like Kafka, it creates the chroot of `host:port/chroot` when it is missing.
//!
//! The broker's metadata paths are synchronous (they run inside request handlers and hold
//! short locks), so each call here blocks its thread until the client, running on a runtime
//! of its own, answers; the calls are rare (topic admin, group membership, leadership
//! changes), never on the produce or fetch path.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use zookeeper_client as zk;

use super::store::StoreError;
use super::zk_data::CONTROLLER;
use crate::sync::{MutexExt, RwLockExt};

pub struct ZkStore {
    /// The current session's client. A session that ends (expiry after a ZooKeeper stall or a
    /// long pause of this process) is replaced by a new one; callers always use the newest.
    client: Arc<RwLock<zk::Client>>,
    /// The ZooKeeper client's own runtime. Callers block on its answers from request handlers
    /// that may hold locks other handlers wait for; on a runtime of its own the client's I/O
    /// never waits for a worker thread that is itself blocked on such a lock.
    runtime: Option<tokio::runtime::Runtime>,
    /// Bumped on every change under the watched paths; what changed is in `dirty`.
    changes: watch::Receiver<u64>,
    dirty: Arc<Mutex<Dirty>>,
    /// Session generations: see [`SessionEvent`].
    sessions: watch::Receiver<SessionEvent>,
    /// The ephemeral znodes this broker owns (path to data), re-created in each new session,
    /// as Kafka re-registers a broker after its session expired. `/controller` is not among
    /// them: after a lost session the controller is elected anew.
    ephemerals: Arc<Mutex<BTreeMap<String, String>>>,
    watches: Watches,
    /// The controller's watches while this broker is controller: the session generation
    /// they were set in, and the signal that removes them.
    controller_watches: Mutex<Option<(u64, watch::Sender<bool>)>>,
}

/// The znodes that changed since the broker last looked, from the watch events. `full` means
/// events may have been missed (a new session, a reconnect), so everything must be re-read.
#[derive(Debug, Default)]
pub struct Dirty {
    pub full: bool,
    pub paths: std::collections::BTreeSet<String>,
}

/// What the broker needs to know of the session: `generation` counts sessions opened since
/// start (1 is the first), `live` is false from the moment one ended until the next opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionEvent {
    pub generation: u64,
    pub live: bool,
}

/// Where and how to open sessions; kept so the supervisor can open the next one.
#[derive(Clone)]
struct SessionSpec {
    hosts: String,
    chroot: Option<String>,
    session_timeout: Duration,
    connection_timeout: Duration,
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
/// What every broker watches, whatever the size of the cluster: who the controller is, and
/// topic and broker configs.
/// And the ACL change notifications, which each broker's authorizer follows.
/// And `/feature`, whose version is the finalized-features epoch each broker reports.
const WATCHED: &[&str] = &["/controller", "/config", "/kafka-acl-changes", "/kafka-acl-extended-changes", "/feature"];
/// What the controller watches besides (Kafka's controller: broker registrations, topics and
/// their partition states, admin requests, ISR change and log dir event notifications).
const CONTROLLER_WATCHED: &[&str] = &["/brokers", "/admin", "/isr_change_notification", "/log_dir_event_notification"];

impl Drop for ZkStore {
    fn drop(&mut self) {
        // Dropping a runtime inside another one's async context would panic.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl ZkStore {
    /// Connects (retrying until `connection_timeout`), creating the chroot if needed, starts
    /// the watches that feed [`ZkStore::changes`], and keeps a session open from then on.
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
        let (hosts, chroot) = match connect.find('/') {
            Some(i) => (&connect[..i], Some(&connect[i..]).filter(|c| *c != "/")),
            None => (connect, None),
        };
        let spec = SessionSpec {
            hosts: hosts.to_string(),
            chroot: chroot.map(str::to_string),
            session_timeout,
            connection_timeout,
        };
        let (changes_tx, changes) = watch::channel(0u64);
        let dirty = Arc::new(Mutex::new(Dirty { full: true, paths: Default::default() }));
        let watches = Watches { changes: changes_tx, dirty: dirty.clone() };
        let first = {
            let (spec, w) = (spec.clone(), watches.clone());
            run_on(&runtime, async move {
                let deadline = tokio::time::Instant::now() + spec.connection_timeout;
                let client = open_session(&spec, Some(deadline)).await?;
                start_watches(&client, &w, WATCHED, None).await?;
                Ok::<_, StoreError>(client)
            })
        };
        let first = match first {
            Ok(Ok(client)) => client,
            Ok(Err(e)) | Err(e) => {
                // Dropping a runtime inside the caller's async context would panic.
                runtime.shutdown_background();
                return Err(e);
            }
        };
        let client = Arc::new(RwLock::new(first.clone()));
        let ephemerals = Arc::new(Mutex::new(BTreeMap::new()));
        let (sessions_tx, sessions) = watch::channel(SessionEvent { generation: 1, live: true });
        runtime.spawn(supervise(spec, first, client.clone(), ephemerals.clone(), watches.clone(), sessions_tx));
        Ok(ZkStore {
            client,
            runtime: Some(runtime),
            changes,
            dirty,
            sessions,
            ephemerals,
            watches,
            controller_watches: Mutex::new(None),
        })
    }

    /// Adds the controller's watches in the current session (`on`), or removes them. A new
    /// controller sets them before it reads the tree, so nothing changes unseen in between;
    /// they end with the session, as a controller's term does.
    pub fn set_controller_watches(&self, on: bool) -> Result<(), StoreError> {
        let generation = self.sessions.borrow().generation;
        let mut current = self.controller_watches.lock_unpoisoned();
        if !on {
            if let Some((_, stop)) = current.take() {
                let _ = stop.send(true);
            }
            return Ok(());
        }
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            return Ok(());
        }
        let (stop, stopped) = watch::channel(false);
        let w = self.watches.clone();
        self.call(move |c| async move { start_watches(&c, &w, CONTROLLER_WATCHED, Some(stopped)).await })??;
        *current = Some((generation, stop));
        Ok(())
    }

    /// Runs one client call on the client's runtime and waits for it.
    pub(super) fn call<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(zk::Client) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let runtime =
            self.runtime.as_ref().ok_or_else(|| StoreError::ZooKeeper("the ZooKeeper client stopped".into()))?;
        let client = self.client.read_unpoisoned().clone();
        run_on(runtime, f(client))
    }

    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// Takes what changed since the last call.
    pub fn take_dirty(&self) -> Dirty {
        std::mem::take(&mut *self.dirty.lock_unpoisoned())
    }

    /// Has the next pass read `paths` again as if their watches had fired (the controller
    /// learned by RPC, not from ZooKeeper, that those partitions need deciding again).
    pub fn touch(&self, paths: impl IntoIterator<Item = String>) {
        for p in paths {
            self.watches.touch(Some(p));
        }
    }

    /// Has the next pass re-read `path`, as if its watch had fired: for a change a component
    /// learned of another way (a broker's newer registration named in its request).
    pub fn mark_dirty(&self, path: &str) {
        self.watches.touch(Some(path.to_string()));
    }

    /// Makes the next [`ZkStore::take_dirty`] ask for a full re-read (after a failed pass).
    pub fn mark_all_dirty(&self) {
        self.dirty.lock_unpoisoned().full = true;
    }

    pub fn sessions(&self) -> watch::Receiver<SessionEvent> {
        self.sessions.clone()
    }

    /// Whether the current session is connected to a server (for the metrics), and how many
    /// sessions ended since start.
    pub fn session_status(&self) -> (bool, u64) {
        let state = self.client.read_unpoisoned().state();
        let connected = matches!(state, zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly);
        let event = *self.sessions.borrow();
        // `generation` sessions were opened; all but the current one have ended, and it too
        // once `live` turns false.
        let ended = event.generation.saturating_sub(1) + u64::from(!event.live);
        (connected && event.live, ended)
    }

    fn remember_ephemeral(&self, path: &str, data: &str) {
        if path != CONTROLLER {
            self.ephemerals.lock_unpoisoned().insert(path.to_string(), data.to_string());
        }
    }

    fn forget_ephemerals(&self, path: &str) {
        let prefix = format!("{path}/");
        self.ephemerals.lock_unpoisoned().retain(|k, _| k != path && !k.starts_with(&prefix));
    }

    pub fn create_sequential(&self, prefix: &str, data: &str) -> Result<(), StoreError> {
        let (p, d) = (prefix.to_string(), data.as_bytes().to_vec());
        let result = self.call(move |c| async move {
            let options = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all());
            c.create(&p, &d, &options).await.map(|_| ())
        })?;
        Ok(result?)
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
        })?;
        if ephemeral {
            self.remember_ephemeral(path, data);
        }
        Ok(())
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

    pub fn get_with_czxid(&self, path: &str) -> Result<Option<(String, i64)>, StoreError> {
        let p = path.to_string();
        match self.call(move |c| async move { c.get_data(&p).await })? {
            Ok((data, stat)) => Ok(Some((String::from_utf8_lossy(&data).into_owned(), stat.czxid))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn set_data(&self, path: &str, data: &str, version: Option<i32>) -> Result<Result<i32, zk::Error>, StoreError> {
        let (p, d) = (path.to_string(), data.as_bytes().to_vec());
        self.call(move |c| async move { c.set_data(&p, &d, version).await.map(|stat| stat.version) })
    }

    /// Reads many nodes with their versions, pipelined.
    pub fn get_many_versioned(&self, paths: &[String]) -> Result<Vec<Option<(String, i32)>>, StoreError> {
        let paths = paths.to_vec();
        let answers = self.call(move |c| pipelined(c, paths, |c, p: String| async move { c.get_data(&p).await }))?;
        answers
            .into_iter()
            .map(|a| match a {
                Some(Ok((data, stat))) => Ok(Some((String::from_utf8_lossy(&data).into_owned(), stat.version))),
                Some(Err(zk::Error::NoNode)) => Ok(None),
                Some(Err(e)) => Err(e.into()),
                None => Err(StoreError::ZooKeeper("a pipelined read was lost".into())),
            })
            .collect()
    }

    /// The creation time (ms, ZooKeeper's clock) of each node, None where it does not exist.
    pub fn created_times(&self, paths: &[String]) -> Result<Vec<Option<i64>>, StoreError> {
        let paths = paths.to_vec();
        let answers = self.call(move |c| pipelined(c, paths, |c, p: String| async move { c.check_stat(&p).await }))?;
        answers
            .into_iter()
            .map(|a| match a {
                Some(Ok(stat)) => Ok(stat.map(|s| s.ctime)),
                Some(Err(e)) => Err(e.into()),
                None => Err(StoreError::ZooKeeper("a pipelined read was lost".into())),
            })
            .collect()
    }

    /// Writes many nodes at once: `Some(version)` is a compare-and-set on an existing node,
    /// `None` creates one. One result per write, in order.
    pub fn write_many(
        &self,
        writes: &[(String, String, Option<i32>)],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let writes = writes.to_vec();
        let answers = self.call(move |c| {
            pipelined(c, writes, |c, (p, d, version): (String, String, Option<i32>)| async move {
                let r = match version {
                    Some(v) => c.set_data(&p, d.as_bytes(), Some(v)).await.map(|_| ()),
                    None => {
                        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                        match c.create(&p, d.as_bytes(), &options).await {
                            Err(zk::Error::NoNode) => {
                                // Parents first, as a single create does; if that fails, the
                                // create after it says why.
                                if let Some(i) = p.rfind('/').filter(|i| *i > 0) {
                                    let _ = c.mkdir(&p[..i], &options).await;
                                }
                                c.create(&p, d.as_bytes(), &options).await.map(|_| ())
                            }
                            other => other.map(|_| ()),
                        }
                    }
                };
                (p, r)
            })
        })?;
        Ok(answers
            .into_iter()
            .map(|a| match a {
                Some((_, Ok(()))) => Ok(()),
                Some((p, Err(zk::Error::BadVersion))) => Err(StoreError::BadVersion(p)),
                Some((p, Err(zk::Error::NodeExists))) => Err(StoreError::NodeExists(p)),
                Some((_, Err(e))) => Err(e.into()),
                None => Err(StoreError::ZooKeeper("a pipelined write was lost".into())),
            })
            .collect())
    }

    /// Overwrites many nodes whatever their versions, pipelined: one result per write, in
    /// order, `NoNode` for each that does not exist yet.
    pub fn overwrite_many(&self, writes: &[(String, String)]) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let writes = writes.to_vec();
        let answers = self.call(move |c| {
            pipelined(c, writes, |c, (p, d): (String, String)| async move { c.set_data(&p, d.as_bytes(), None).await })
        })?;
        Ok(answers
            .into_iter()
            .map(|a| match a {
                Some(Ok(_)) => Ok(()),
                Some(Err(e)) => Err(e.into()),
                None => Err(StoreError::ZooKeeper("a pipelined write was lost".into())),
            })
            .collect())
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

    /// Creates or rewrites an ephemeral node of this session. One another session holds is
    /// left to it, not overwritten: after a session expiry or a coordinator move, another
    /// broker may own a group's membership znodes, and this broker's late writes must not
    /// take them over.
    pub fn put_ephemeral(&self, path: &str, data: &str) -> Result<(), StoreError> {
        match self.create(path, data, true) {
            Err(StoreError::NodeExists(_)) => {
                let p = path.to_string();
                let (owner, mine) = self.call(move |c| async move {
                    let mine = c.session_id().0;
                    c.check_stat(&p).await.map(|s| (s.map(|s| s.ephemeral_owner), mine))
                })??;
                match owner {
                    Some(owner) if owner != mine => {
                        tracing::debug!(%path, owner, "ephemeral znode held by another session; left to it");
                        Ok(())
                    }
                    // Gone meanwhile: whoever held it is no longer writing it.
                    None => self.put_ephemeral(path, data),
                    Some(_) => {
                        self.set_data(path, data, None)??;
                        self.remember_ephemeral(path, data);
                        Ok(())
                    }
                }
            }
            other => other,
        }
    }

    /// Deletes the ephemeral nodes at and below `path` that this session holds; nodes of other
    /// sessions (another coordinator's, since) and persistent ones stay.
    pub fn delete_own_ephemerals(&self, path: &str) -> Result<(), StoreError> {
        self.forget_ephemerals(path);
        let p = path.to_string();
        let (stat, mine) = self.call(move |c| async move {
            let mine = c.session_id().0;
            c.check_stat(&p).await.map(|s| (s, mine))
        })??;
        let Some(stat) = stat else { return Ok(()) };
        if stat.ephemeral_owner == mine {
            return self.delete_if_version(path, stat.version);
        }
        if stat.ephemeral_owner != 0 {
            return Ok(());
        }
        for child in self.children(path)? {
            self.delete_own_ephemerals(&format!("{path}/{child}"))?;
        }
        Ok(())
    }

    pub fn delete_recursive(&self, path: &str) -> Result<(), StoreError> {
        self.forget_ephemerals(path);
        self.delete_tree(path)
    }

    fn delete_tree(&self, path: &str) -> Result<(), StoreError> {
        let p = path.to_string();
        let children = match self.call(move |c| async move { c.list_children(&p).await })? {
            Ok(c) => c,
            Err(zk::Error::NoNode) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        for child in children {
            self.delete_tree(&format!("{path}/{child}"))?;
        }
        let p = path.to_string();
        match self.call(move |c| async move { c.delete(&p, None).await })? {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes a leaf node only if it is still at `version` (gone already counts as done).
    pub fn delete_if_version(&self, path: &str, version: i32) -> Result<(), StoreError> {
        let p = path.to_string();
        match self.call(move |c| async move { c.delete(&p, Some(version)).await })? {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(zk::Error::BadVersion) => Err(StoreError::BadVersion(path.to_string())),
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

/// Opens a session and applies the chroot, creating it if missing. Without a deadline it
/// retries until ZooKeeper answers, logging each failure once per attempt.
async fn open_session(spec: &SessionSpec, deadline: Option<tokio::time::Instant>) -> Result<zk::Client, StoreError> {
    let mut attempts = 0u32;
    let client = loop {
        attempts += 1;
        let attempt = zk::Client::connector()
            .with_session_timeout(spec.session_timeout)
            .with_connection_timeout(spec.connection_timeout.min(Duration::from_secs(5)))
            .connect(&spec.hosts)
            .await;
        match attempt {
            Ok(c) => break c,
            Err(e) if deadline.is_none_or(|d| tokio::time::Instant::now() < d) => {
                // One line when it starts failing, not one per attempt.
                if attempts == 1 {
                    tracing::warn!(zookeeper = %spec.hosts, error = %e, "cannot reach ZooKeeper; retrying every 500 ms");
                } else {
                    tracing::debug!(zookeeper = %spec.hosts, error = %e, attempts, "ZooKeeper still unreachable");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => {
                return Err(StoreError::ZooKeeper(format!(
                    "cannot connect to ZooKeeper at {} within {} ms: {e}",
                    spec.hosts,
                    spec.connection_timeout.as_millis()
                )))
            }
        }
    };
    match &spec.chroot {
        Some(root) => {
            let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            client.mkdir(root, &options).await?;
            client.chroot(root.clone()).map_err(|_| StoreError::ZooKeeper(format!("bad chroot {root}")))
        }
        None => Ok(client),
    }
}

/// Runs `op` on every item with all the requests in flight at once (ZooKeeper answers a
/// pipeline far faster than one round trip after another, and applies one session's requests
/// in order). Answers come back in item order; None for one whose task was lost.
async fn pipelined<T, R, F, Fut>(client: zk::Client, items: Vec<T>, op: F) -> Vec<Option<R>>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(zk::Client, T) -> Fut,
    Fut: Future<Output = R> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    let n = items.len();
    for (i, item) in items.into_iter().enumerate() {
        let answer = op(client.clone(), item);
        set.spawn(async move { (i, answer.await) });
    }
    let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        if let Ok((i, r)) = joined {
            out[i] = Some(r);
        }
    }
    out
}

/// Where watch events go: the changed path into `dirty`, then a bump of `changes`.
#[derive(Clone)]
struct Watches {
    changes: watch::Sender<u64>,
    dirty: Arc<Mutex<Dirty>>,
}

impl Watches {
    fn touch(&self, path: Option<String>) {
        {
            let mut d = self.dirty.lock_unpoisoned();
            match path {
                Some(p) => {
                    d.paths.insert(p);
                }
                None => d.full = true,
            }
        }
        self.changes.send_modify(|n| *n += 1);
    }
}

/// Persistent recursive watches on `paths`, each event recording its path. They belong to
/// the session and end with it, or when `stop` turns true.
async fn start_watches(
    client: &zk::Client,
    w: &Watches,
    paths: &[&str],
    stop: Option<watch::Receiver<bool>>,
) -> Result<(), StoreError> {
    for path in paths {
        let mut watcher = client.watch(path, zk::AddWatchMode::PersistentRecursive).await?;
        let w = w.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            loop {
                let stopped = async {
                    match stop.as_mut() {
                        Some(s) => {
                            let _ = s.wait_for(|v| *v).await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                };
                let event = tokio::select! {
                    e = watcher.changed() => e,
                    // Dropping the watcher removes the watch.
                    _ = stopped => return,
                };
                if event.event_type == zk::EventType::Session {
                    if event.session_state.is_terminated() {
                        break;
                    }
                    // Reconnected within the session: changes meanwhile are redelivered by
                    // the server, but a full pass costs little next to a missed one.
                    w.touch(None);
                    continue;
                }
                w.touch(Some(event.path));
            }
        });
    }
    Ok(())
}

/// Keeps a session open for the life of the process. When one ends, the broker is told at
/// once (a controller must stop acting), a new session is opened with the same watches, and
/// the ephemeral znodes this broker owned are written again in it, so the broker re-registers
/// with a new broker epoch (the czxid of its `/brokers/ids` node) instead of exiting.
async fn supervise(
    spec: SessionSpec,
    mut client: zk::Client,
    shared: Arc<RwLock<zk::Client>>,
    ephemerals: Arc<Mutex<BTreeMap<String, String>>>,
    watches: Watches,
    sessions: watch::Sender<SessionEvent>,
) {
    let mut generation = 1;
    loop {
        let mut state = client.state_watcher();
        let ended = loop {
            let s = state.changed().await;
            tracing::info!(state = ?s, "ZooKeeper session state");
            watches.touch(None);
            if s.is_terminated() {
                break s;
            }
        };
        tracing::warn!(state = ?ended, "ZooKeeper session ended; opening a new one (serving on meanwhile)");
        sessions.send_replace(SessionEvent { generation, live: false });
        let ended_session = client.session_id().0;
        client = loop {
            let next = match open_session(&spec, None).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open a ZooKeeper session; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            match restore(&next, &ephemerals, &watches, ended_session, spec.session_timeout).await {
                Ok(()) => break next,
                Err(e) => {
                    tracing::warn!(error = %e, "new ZooKeeper session failed while restoring; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        };
        *shared.write_unpoisoned() = client.clone();
        generation += 1;
        tracing::info!(generation, "ZooKeeper session re-established; ephemeral znodes re-registered");
        sessions.send_replace(SessionEvent { generation, live: true });
        watches.touch(None);
    }
}

/// Watches and ephemeral znodes in a new session, the broker's registration first. Each node
/// is restored on its own:
/// - held by the ended session (this broker's own): deleted and created again in the new
///   session at once, since the server may keep the ended session for another session timeout;
/// - held by another live session: that session's owner has it now (a group coordinated by
///   another broker since), so it is dropped from this
///   broker's set rather than waited for; waiting on it kept brokers on an expired session
///   for minutes.
async fn restore(
    client: &zk::Client,
    ephemerals: &Mutex<BTreeMap<String, String>>,
    watches: &Watches,
    ended_session: i64,
    session_timeout: Duration,
) -> Result<(), StoreError> {
    start_watches(client, watches, WATCHED, None).await?;
    let mut owned: Vec<(String, String)> =
        ephemerals.lock_unpoisoned().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    owned.sort_by_key(|(path, _)| restore_rank(path));
    let options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let parent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let mine = client.session_id().0;
    for (path, data) in owned {
        let give_up = tokio::time::Instant::now() + session_timeout;
        loop {
            match client.create(&path, data.as_bytes(), &options).await {
                Ok(_) => break,
                Err(zk::Error::NoNode) => {
                    if let Some(i) = path.rfind('/').filter(|i| *i > 0) {
                        client.mkdir(&path[..i], &parent).await?;
                    }
                }
                Err(zk::Error::NodeExists) => match client.check_stat(&path).await? {
                    Some(stat) if stat.ephemeral_owner == mine => break,
                    // This broker's own ended session. The client library declares a session
                    // expired after failing to reach the server for the session timeout, while
                    // the server (a stalled or partitioned ZooKeeper) may keep it, and its
                    // znodes, for as long again: the stale copy is deleted and the node
                    // created in the new session at once.
                    Some(stat) if stat.ephemeral_owner == ended_session && tokio::time::Instant::now() < give_up => {
                        match client.delete(&path, Some(stat.version)).await {
                            Ok(()) => {
                                tracing::info!(%path, "removed this broker's znode left by its ended session");
                            }
                            // Gone or rewritten meanwhile: look again.
                            Err(zk::Error::NoNode | zk::Error::BadVersion) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    Some(stat) => {
                        tracing::info!(%path, owner = stat.ephemeral_owner, "ephemeral znode held by another session; left to it");
                        let mut set = ephemerals.lock_unpoisoned();
                        if set.get(&path) == Some(&data) {
                            set.remove(&path);
                        }
                        break;
                    }
                    None => {}
                },
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// The order ephemeral znodes are restored in: the broker's registration (what makes it live
/// to the controller) before the group mirror's nodes.
fn restore_rank(path: &str) -> u8 {
    u8::from(!path.starts_with("/brokers/ids/"))
}
