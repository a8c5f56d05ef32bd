//! The I/O pool, sized by `num.io.threads` (Kafka's request handler pool): where requests do
//! their disk work, so that the async network workers, which serve every connection, never
//! wait on a disk. A Produce's appends come here when one of them may roll a segment or fsync
//! (plain page-cache writes stay inline: a hop costs more than they do), a Fetch's reads when
//! one starts below the active segment; one hop per request rather than one per partition.
//!
//! It is tokio's blocking pool behind a semaphore of `num.io.threads` permits: at most that
//! many jobs run at once, and the others wait for a permit without holding a thread. A job
//! keeps its permit until it ends, even if the request that started it is dropped meanwhile,
//! so the bound holds for work already on its way to the disk. (Dedicated threads fed by a
//! channel cost the same hop; tokio's pool needs no threads of its own while idle.)
//!
//! `num.io.threads` is a dynamic config: [`IoPool::resize`] grows the pool at once, and
//! shrinks it as jobs in flight give their permits back (a permit owed to a shrink is
//! forgotten instead of returned), so no job is cut short or made to wait by a resize.
//!
//! One log dir cannot take the whole pool. A job names the log dirs it touches, and takes a
//! share of each before a thread: with several dirs, a dir's jobs hold at most
//! `(threads - 1) / (dirs - 1)` threads (at least one), so whatever the other dirs' jobs do,
//! one thread is left for each dir when the pool has at least as many threads as dirs. A disk
//! whose fsyncs stall for seconds then slows the requests that write or read there, while
//! the jobs of the other dirs still find threads. Shares are taken in dir order, so two jobs
//! that each wait for a share never wait for each other's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::sync::MutexExt;

#[derive(Debug, thiserror::Error)]
pub enum IoPoolError {
    /// The job panicked (or the runtime is shutting down): its effects are unknown.
    #[error("I/O job failed: {0}")]
    Failed(String),
}

pub struct IoPool {
    permits: Arc<Semaphore>,
    /// The size asked for; the permits in circulation are this plus `owed`.
    threads: AtomicUsize,
    /// Permits a shrink could not take at once because jobs held them: each is forgotten when
    /// a job gives it back.
    owed: Arc<AtomicUsize>,
    /// One resize at a time, so that two cannot both count the same permits.
    resizing: Mutex<()>,
    /// Jobs started (the broker's `gregor_io_pool_jobs_total`).
    jobs: prometheus::IntCounter,
    /// The size asked for (the broker's `gregor_io_pool_threads`).
    size: prometheus::IntGauge,
    /// One share per log dir, in `log.dirs` order.
    dirs: Vec<Arc<DirShare>>,
}

/// The jobs that touch one log dir and hold (or are about to take) a thread.
#[derive(Default)]
struct DirShare {
    running: Mutex<usize>,
    /// Told when a job gives its share back, or when the pool grows.
    freed: Notify,
}

/// A job's place in one dir's share, given back when the job ends.
struct DirSlot(Arc<DirShare>);

impl Drop for DirSlot {
    fn drop(&mut self) {
        let mut running = self.0.running.lock_unpoisoned();
        *running = running.saturating_sub(1);
        drop(running);
        self.0.freed.notify_waiters();
    }
}

/// A running job's permit: back to the pool when the job ends, unless a shrink is owed it.
struct Lease {
    permit: Option<OwnedSemaphorePermit>,
    owed: Arc<AtomicUsize>,
    /// The job's places in its dirs' shares, given back with its thread.
    _dirs: Vec<DirSlot>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            if self.owed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                permit.forget();
            }
        }
    }
}

impl IoPool {
    /// A pool running at most `threads` jobs at once (at least one), for `log_dirs` log dirs,
    /// counting them in `jobs` and showing its size in `size`.
    pub fn new(threads: usize, log_dirs: usize, jobs: prometheus::IntCounter, size: prometheus::IntGauge) -> IoPool {
        let threads = threads.clamp(1, Semaphore::MAX_PERMITS);
        size.set(threads as i64);
        IoPool {
            permits: Arc::new(Semaphore::new(threads)),
            threads: AtomicUsize::new(threads),
            owed: Arc::new(AtomicUsize::new(0)),
            resizing: Mutex::new(()),
            jobs,
            size,
            dirs: (0..log_dirs).map(|_| Arc::new(DirShare::default())).collect(),
        }
    }

    /// The most threads the jobs of one log dir hold at once.
    fn dir_bound(&self) -> usize {
        let threads = self.threads();
        match self.dirs.len() {
            0 | 1 => threads,
            n => ((threads - 1) / (n - 1)).max(1),
        }
    }

    /// A place in the share of dir `idx`, once its jobs hold fewer threads than their bound.
    async fn dir_slot(&self, idx: usize) -> Option<DirSlot> {
        let share = self.dirs.get(idx)?;
        loop {
            // Registered before the look, so a share given back in between is not missed.
            let freed = share.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut running = share.running.lock_unpoisoned();
                if *running < self.dir_bound() {
                    *running += 1;
                    return Some(DirSlot(share.clone()));
                }
            }
            freed.await;
        }
    }

    pub fn threads(&self) -> usize {
        self.threads.load(Ordering::SeqCst)
    }

    /// Makes the pool run at most `threads` jobs at once (at least one). Growing frees the new
    /// permits at once; shrinking takes the free ones and owes the rest, so the jobs running
    /// finish undisturbed and no new one starts until the running ones are under the new size.
    pub fn resize(&self, threads: usize) {
        let threads = threads.clamp(1, Semaphore::MAX_PERMITS);
        let _one = self.resizing.lock_unpoisoned();
        let now = self.threads.swap(threads, Ordering::SeqCst);
        if threads > now {
            let mut more = threads - now;
            // Cancel what an earlier shrink still owes before adding permits.
            if let Ok(owed) = self.owed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| Some(n - n.min(more))) {
                more -= owed.min(more);
            }
            self.permits.add_permits(more);
        } else if threads < now {
            let fewer = now - threads;
            let taken = self.permits.forget_permits(fewer);
            // A job ending between these two lines returns its permit to the pool rather than
            // paying the debt; the debt is then paid by the next one to end, so the count
            // in circulation stays right.
            self.owed.fetch_add(fewer - taken, Ordering::SeqCst);
        }
        self.size.set(threads as i64);
        if threads > now {
            // The dirs' bounds grew with the pool.
            for d in &self.dirs {
                d.freed.notify_waiters();
            }
        }
        if threads != now {
            tracing::info!(from = now, to = threads, "resized the I/O pool (num.io.threads)");
        }
    }

    /// Runs `job` on the pool once a permit is free; its result. The caller's span goes along,
    /// so what the job logs says which connection and request it served.
    pub async fn run<T: Send + 'static>(&self, job: impl FnOnce() -> T + Send + 'static) -> Result<T, IoPoolError> {
        self.run_on(Vec::new(), job).await
    }

    /// [`Self::run`] for a job that touches the log dirs `dirs` (indexes in `log.dirs`): it
    /// takes a share of each first, so the jobs of one dir never hold more than its bound.
    pub async fn run_on<T: Send + 'static>(
        &self,
        mut dirs: Vec<usize>,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, IoPoolError> {
        dirs.sort_unstable();
        dirs.dedup();
        let mut slots = Vec::with_capacity(dirs.len());
        for d in dirs {
            slots.extend(self.dir_slot(d).await);
        }
        let permit =
            self.permits.clone().acquire_owned().await.map_err(|e| IoPoolError::Failed(format!("pool closed: {e}")))?;
        let lease = Lease { permit: Some(permit), owed: self.owed.clone(), _dirs: slots };
        self.jobs.inc();
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || {
            let _lease = lease;
            span.in_scope(job)
        })
        .await
        .map_err(|e| IoPoolError::Failed(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    fn counter() -> prometheus::IntCounter {
        prometheus::IntCounter::new("jobs", "jobs").unwrap()
    }

    fn gauge() -> prometheus::IntGauge {
        prometheus::IntGauge::new("size", "size").unwrap()
    }

    /// Runs `jobs` jobs on a pool of `threads`; the most that ran at once. The first `threads`
    /// jobs wait for each other, so they can only finish if that many run together.
    async fn most_at_once(threads: usize, jobs: usize) -> usize {
        most_at_once_on(Arc::new(IoPool::new(threads, 1, counter(), gauge())), threads, jobs).await
    }

    async fn most_at_once_on(pool: Arc<IoPool>, threads: usize, jobs: usize) -> usize {
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let together = Arc::new(Barrier::new(threads));
        let caller = std::thread::current().id();
        let mut handles = Vec::new();
        for i in 0..jobs {
            let (pool, running, most, together) = (pool.clone(), running.clone(), most.clone(), together.clone());
            handles.push(tokio::spawn(async move {
                pool.run(move || {
                    assert_ne!(std::thread::current().id(), caller, "a job ran on the async worker");
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    if i < threads {
                        together.wait();
                    }
                    running.fetch_sub(1, Ordering::SeqCst);
                    i
                })
                .await
                .unwrap()
            }));
        }
        for (i, h) in handles.into_iter().enumerate() {
            assert_eq!(h.await.unwrap(), i);
        }
        most.load(Ordering::SeqCst)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn jobs_run_off_the_runtime_and_never_more_than_the_threads_at_once() {
        assert_eq!(most_at_once(1, 8).await, 1);
        assert_eq!(most_at_once(3, 24).await, 3);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_panicking_job_is_an_error_and_gives_its_permit_back() {
        let pool = IoPool::new(1, 1, counter(), gauge());
        let r: Result<(), _> = pool.run(|| panic!("boom")).await;
        assert!(r.is_err());
        assert_eq!(pool.run(|| 7).await.unwrap(), 7);
        assert_eq!(pool.jobs.get(), 2);
    }

    /// `n` jobs that hold their permits until told to end: (their handles, the senders that
    /// end them), once all `n` are running.
    async fn held_jobs(
        pool: &Arc<IoPool>,
        n: usize,
    ) -> (Vec<tokio::task::JoinHandle<()>>, Vec<std::sync::mpsc::Sender<()>>) {
        let running = Arc::new(AtomicUsize::new(0));
        let (mut handles, mut ends) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            ends.push(tx);
            let (pool, running) = (pool.clone(), running.clone());
            handles.push(tokio::spawn(async move {
                pool.run(move || {
                    running.fetch_add(1, Ordering::SeqCst);
                    let _ = rx.recv();
                })
                .await
                .unwrap()
            }));
        }
        while running.load(Ordering::SeqCst) < n {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        (handles, ends)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_dir_whose_jobs_all_block_leaves_threads_to_the_other_dirs() {
        // Each dir's bound leaves every other dir a thread: (threads - 1) / (dirs - 1).
        for (threads, dirs, bound) in [(4, 3, 1), (3, 2, 2), (8, 2, 7), (2, 4, 1), (5, 1, 5)] {
            let pool = Arc::new(IoPool::new(threads, dirs, counter(), gauge()));
            assert_eq!(pool.dir_bound(), bound, "{threads} threads, {dirs} dirs");
        }
        let pool = Arc::new(IoPool::new(3, 2, counter(), gauge()));
        let running = Arc::new(AtomicUsize::new(0));
        let (mut stuck, mut ends) = (Vec::new(), Vec::new());
        // Five jobs of dir 0 that block (a disk whose fsyncs hang): two get threads.
        for _ in 0..5 {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            ends.push(tx);
            let (p, r) = (pool.clone(), running.clone());
            stuck.push(tokio::spawn(async move {
                p.run_on(vec![0], move || {
                    r.fetch_add(1, Ordering::SeqCst);
                    let _ = rx.recv();
                    r.fetch_sub(1, Ordering::SeqCst);
                })
                .await
                .unwrap()
            }));
        }
        while running.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        // Dir 1's jobs, one after another, still run; so does one naming no dir.
        for i in 0..4 {
            assert_eq!(pool.run_on(vec![1], move || i).await.unwrap(), i);
        }
        assert_eq!(running.load(Ordering::SeqCst), 2, "dir 0's jobs took more than their share");
        // A job of both dirs waits for dir 0, holding no thread meanwhile.
        let p = pool.clone();
        let both = tokio::spawn(async move { p.run_on(vec![1, 0, 1], || 7).await.unwrap() });
        assert_eq!(pool.run_on(vec![1], || 8).await.unwrap(), 8);
        for end in &ends {
            end.send(()).unwrap();
        }
        for h in stuck {
            h.await.unwrap();
        }
        assert_eq!(both.await.unwrap(), 7);
        assert_eq!(pool.permits.available_permits(), 3);
        assert!(pool.dirs.iter().all(|d| *d.running.lock().unwrap() == 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn growing_lets_more_jobs_run_together_at_once() {
        let pool = Arc::new(IoPool::new(1, 1, counter(), gauge()));
        pool.resize(3);
        assert_eq!((pool.threads(), pool.size.get()), (3, 3));
        assert_eq!(most_at_once_on(pool.clone(), 3, 12).await, 3);
        assert_eq!(pool.permits.available_permits(), 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shrinking_lets_running_jobs_finish_and_starts_none_until_under_the_new_size() {
        let pool = Arc::new(IoPool::new(4, 1, counter(), gauge()));
        let (mut handles, ends) = held_jobs(&pool, 4).await;
        pool.resize(2);
        assert_eq!((pool.threads(), pool.size.get()), (2, 2));
        assert_eq!(pool.owed.load(Ordering::SeqCst), 2, "no permit was free, so the shrink owes both");

        let fifth_ran = Arc::new(AtomicUsize::new(0));
        let f = fifth_ran.clone();
        let p = pool.clone();
        let fifth = tokio::spawn(async move { p.run(move || f.fetch_add(1, Ordering::SeqCst)).await.unwrap() });

        // The first two to end pay the debt: their permits vanish and the fifth job still waits.
        for (i, end) in ends.iter().enumerate().take(2) {
            end.send(()).unwrap();
            handles.remove(0).await.unwrap();
            assert_eq!(pool.owed.load(Ordering::SeqCst), 1 - i);
            assert_eq!(pool.permits.available_permits(), 0);
        }
        assert_eq!(fifth_ran.load(Ordering::SeqCst), 0);
        // Two still run: the third to end lets the fifth start.
        ends[2].send(()).unwrap();
        handles.remove(0).await.unwrap();
        fifth.await.unwrap();
        assert_eq!(fifth_ran.load(Ordering::SeqCst), 1);
        ends[3].send(()).unwrap();
        handles.remove(0).await.unwrap();
        assert_eq!(pool.permits.available_permits(), 2);
        assert_eq!(most_at_once_on(pool.clone(), 2, 10).await, 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn growing_cancels_what_a_shrink_still_owes_before_adding_permits() {
        let pool = Arc::new(IoPool::new(4, 1, counter(), gauge()));
        let (handles, ends) = held_jobs(&pool, 4).await;
        pool.resize(2);
        pool.resize(3);
        assert_eq!((pool.owed.load(Ordering::SeqCst), pool.permits.available_permits()), (1, 0));
        pool.resize(5);
        assert_eq!((pool.owed.load(Ordering::SeqCst), pool.permits.available_permits()), (0, 1));
        pool.resize(0);
        assert_eq!(pool.threads(), 1, "a pool keeps one thread at least");
        for (end, h) in ends.into_iter().zip(handles) {
            end.send(()).unwrap();
            h.await.unwrap();
        }
        assert_eq!((pool.owed.load(Ordering::SeqCst), pool.permits.available_permits()), (0, 1));
    }
}
