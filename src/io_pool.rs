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

use std::sync::Arc;

use tokio::sync::Semaphore;

#[derive(Debug, thiserror::Error)]
pub enum IoPoolError {
    /// The job panicked (or the runtime is shutting down): its effects are unknown.
    #[error("I/O job failed: {0}")]
    Failed(String),
}

pub struct IoPool {
    permits: Arc<Semaphore>,
    threads: usize,
    /// Jobs started (the broker's `gregor_io_pool_jobs_total`).
    jobs: prometheus::IntCounter,
}

impl IoPool {
    /// A pool running at most `threads` jobs at once (at least one), counting them in `jobs`.
    pub fn new(threads: usize, jobs: prometheus::IntCounter) -> IoPool {
        let threads = threads.clamp(1, Semaphore::MAX_PERMITS);
        IoPool { permits: Arc::new(Semaphore::new(threads)), threads, jobs }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `job` on the pool once a permit is free; its result. The caller's span goes along,
    /// so what the job logs says which connection and request it served.
    pub async fn run<T: Send + 'static>(&self, job: impl FnOnce() -> T + Send + 'static) -> Result<T, IoPoolError> {
        let permit =
            self.permits.clone().acquire_owned().await.map_err(|e| IoPoolError::Failed(format!("pool closed: {e}")))?;
        self.jobs.inc();
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
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

    /// Runs `jobs` jobs on a pool of `threads`; the most that ran at once. The first `threads`
    /// jobs wait for each other, so they can only finish if that many run together.
    async fn most_at_once(threads: usize, jobs: usize) -> usize {
        let pool = Arc::new(IoPool::new(threads, counter()));
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
        let pool = IoPool::new(1, counter());
        let r: Result<(), _> = pool.run(|| panic!("boom")).await;
        assert!(r.is_err());
        assert_eq!(pool.run(|| 7).await.unwrap(), 7);
        assert_eq!(pool.jobs.get(), 2);
    }
}
