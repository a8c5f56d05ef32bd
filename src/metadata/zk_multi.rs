//! Fenced batch writes: many znode writes in a few ZooKeeper multi-op transactions, each
//! guarded by a version check of another znode (the controller's `/controller_epoch`), as
//! Kafka's controller writes partition states. A controller deposed meanwhile has its writes
//! refused whole by ZooKeeper itself, whatever its own view says; and a transaction of a
//! thousand writes costs ZooKeeper one proposal and one log append, not a thousand.

use zookeeper_client as zk;

use super::store::StoreError;
use super::zk_store::ZkStore;

/// Writes in one transaction at most: well under ZooKeeper's 1 MiB request limit
/// (`jute.maxbuffer`) for partition states, and large enough that a pass over thousands of
/// partitions is a handful of round trips.
const MULTI_OPS: usize = 500;
/// A transaction that fails on one write is sent again without it; after this many failures
/// in one batch the rest go one write per transaction (pipelined), so heavy contention costs
/// one round of pipelined requests instead of one transaction per lost race.
const MULTI_RETRIES: usize = 3;

/// One write: `Some(version)` a compare-and-set of an existing node, `None` a create.
pub type Write = (String, String, Option<i32>);

impl ZkStore {
    /// Writes `writes` fenced by `guard` (path, version): one result per write, in order.
    /// The whole call fails with [`StoreError::Fenced`] if the guard no longer has its
    /// version; then nothing after the failed transaction was written.
    pub fn write_many_guarded(
        &self,
        writes: &[Write],
        guard: (&str, i32),
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let mut results: Vec<Option<Result<(), StoreError>>> = (0..writes.len()).map(|_| None).collect();
        for (start, chunk) in (0..writes.len()).step_by(MULTI_OPS).zip(writes.chunks(MULTI_OPS)) {
            let mut pending: Vec<usize> = (0..chunk.len()).collect();
            let mut parents_made = false;
            let mut failures = 0;
            while !pending.is_empty() && failures < MULTI_RETRIES {
                let batch: Vec<Write> = pending.iter().map(|&i| chunk[i].clone()).collect();
                let guard_path = guard.0.to_string();
                let answer = self.call(move |c| async move { commit(&c, &guard_path, guard.1, &batch).await })?;
                match answer {
                    Ok(()) => {
                        for &i in &pending {
                            results[start + i] = Some(Ok(()));
                        }
                        pending.clear();
                    }
                    Err(zk::MultiWriteError::OperationFailed { index: 0, .. }) => {
                        return Err(StoreError::Fenced(guard.0.to_string()));
                    }
                    Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                        let at = pending[index - 1];
                        let (path, _, version) = &chunk[at];
                        if source == zk::Error::NoNode && version.is_none() && !parents_made {
                            // New partitions: their parent znodes first (outside the transaction,
                            // as Kafka creates them), then the batch again.
                            parents_made = true;
                            self.make_parents(pending.iter().map(|&i| &chunk[i]))?;
                            continue;
                        }
                        results[start + at] = Some(Err(op_error(path, source)));
                        pending.remove(index - 1);
                        failures += 1;
                    }
                    Err(zk::MultiWriteError::RequestFailed { source }) => return Err(source.into()),
                }
            }
            if !pending.is_empty() {
                let rest: Vec<Write> = pending.iter().map(|&i| chunk[i].clone()).collect();
                for (&i, r) in pending.iter().zip(self.write_each_guarded(rest, guard)?) {
                    results[start + i] = Some(r);
                }
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(StoreError::ZooKeeper("a batched write was lost".into()))))
            .collect())
    }

    /// One transaction per write (the guard and the write), pipelined.
    fn write_each_guarded(
        &self,
        writes: Vec<Write>,
        guard: (&str, i32),
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let guard_path = guard.0.to_string();
        let answers = self.call(move |c| async move {
            let mut set = tokio::task::JoinSet::new();
            let n = writes.len();
            for (i, w) in writes.into_iter().enumerate() {
                let (c, g) = (c.clone(), guard_path.clone());
                set.spawn(async move {
                    let r = commit(&c, &g, guard.1, std::slice::from_ref(&w)).await;
                    (i, w.0, r)
                });
            }
            let mut out: Vec<Option<(String, Result<(), zk::MultiWriteError>)>> = (0..n).map(|_| None).collect();
            while let Some(Ok((i, path, r))) = set.join_next().await {
                out[i] = Some((path, r));
            }
            out
        })?;
        let mut results = Vec::with_capacity(answers.len());
        for a in answers {
            results.push(match a {
                Some((_, Ok(()))) => Ok(()),
                Some((_, Err(zk::MultiWriteError::OperationFailed { index: 0, .. }))) => {
                    return Err(StoreError::Fenced(guard.0.to_string()))
                }
                Some((path, Err(zk::MultiWriteError::OperationFailed { source, .. }))) => Err(op_error(&path, source)),
                Some((_, Err(zk::MultiWriteError::RequestFailed { source }))) => Err(source.into()),
                None => Err(StoreError::ZooKeeper("a batched write was lost".into())),
            });
        }
        Ok(results)
    }

    /// Creates the missing parents of the creates among `writes`, pipelined.
    fn make_parents<'a>(&self, writes: impl Iterator<Item = &'a Write>) -> Result<(), StoreError> {
        let mut parents: Vec<String> = writes
            .filter(|(_, _, v)| v.is_none())
            .filter_map(|(p, _, _)| p.rfind('/').filter(|i| *i > 0).map(|i| p[..i].to_string()))
            .collect();
        parents.sort();
        parents.dedup();
        self.call(move |c| async move {
            let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            let mut set = tokio::task::JoinSet::new();
            for p in parents {
                let c = c.clone();
                let options = options.clone();
                set.spawn(async move { c.mkdir(&p, &options).await });
            }
            // A parent that could not be made shows as the create's own error next time.
            while set.join_next().await.is_some() {}
        })
    }
}

/// Sends one transaction: the guard's check, then `writes`.
async fn commit(c: &zk::Client, guard: &str, version: i32, writes: &[Write]) -> Result<(), zk::MultiWriteError> {
    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let mut multi = c.new_multi_writer();
    multi.add_check_version(guard, version)?;
    for (path, data, v) in writes {
        match v {
            Some(v) => multi.add_set_data(path, data.as_bytes(), Some(*v))?,
            None => multi.add_create(path, data.as_bytes(), &options)?,
        }
    }
    multi.commit().await.map(|_| ())
}

fn op_error(path: &str, e: zk::Error) -> StoreError {
    match e {
        zk::Error::BadVersion => StoreError::BadVersion(path.to_string()),
        zk::Error::NodeExists => StoreError::NodeExists(path.to_string()),
        zk::Error::NoNode => StoreError::NoNode(path.to_string()),
        other => other.into(),
    }
}
