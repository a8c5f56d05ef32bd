//! The controller's event queue: one thread runs every topic change (create, delete, add
//! partitions, reassign, auto-create) in arrival order, as Kafka's controller event thread does.
//!
//! A request handler hands its change over and waits for the answer; it never holds a lock
//! while the change writes to ZooKeeper and tells the brokers, so a slow store stalls only the
//! changes queued behind it, never a handler that does not change topics. Because one thread
//! applies the changes, a step sees the state the previous step left and needs no lock of
//! its own against another change.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::Instant;

use crate::sync::MutexExt;

type Job = Box<dyn FnOnce() + Send>;

struct Event {
    name: &'static str,
    queued_at: Instant,
    job: Job,
}

/// Why an event did not produce its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventError {
    /// The queue's thread is gone (the broker is shutting down).
    Stopped,
    /// The step panicked; the queue goes on with the next one.
    Failed,
}

pub struct EventQueue {
    sender: Mutex<Option<Sender<Event>>>,
    thread: Option<ThreadId>,
    queued: AtomicUsize,
    processed: AtomicI64,
}

impl EventQueue {
    /// Starts the queue's thread. It ends when the queue is dropped and the steps already
    /// queued have run.
    pub fn start() -> std::io::Result<std::sync::Arc<EventQueue>> {
        let (tx, rx) = mpsc::channel::<Event>();
        // Steps start tasks (a fetcher for a new follower, a channel to a new broker): the
        // thread runs inside the runtime that started the broker.
        let runtime = tokio::runtime::Handle::try_current().ok();
        let queue = std::sync::Arc::new_cyclic(|me: &std::sync::Weak<EventQueue>| {
            let me = me.clone();
            let spawned = std::thread::Builder::new()
                .name("controller-event".into())
                .spawn(move || {
                    let _runtime = runtime.as_ref().map(|r| r.enter());
                    run(rx, me)
                })
                .map(|h| h.thread().id());
            EventQueue {
                sender: Mutex::new(spawned.is_ok().then_some(tx)),
                thread: spawned.ok(),
                queued: AtomicUsize::new(0),
                processed: AtomicI64::new(0),
            }
        });
        match queue.thread {
            Some(_) => Ok(queue),
            None => Err(std::io::Error::other("cannot start the controller event thread")),
        }
    }

    /// Runs `step` on the queue's thread after the steps queued before it, and returns its
    /// result. Called from the queue's own thread (a step that needs another step's work),
    /// it runs at once: waiting for itself would never end.
    pub fn run<R: Send + 'static>(
        &self,
        name: &'static str,
        step: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, EventError> {
        if Some(std::thread::current().id()) == self.thread {
            return Ok(step());
        }
        let (reply_tx, reply_rx) = mpsc::sync_channel::<R>(1);
        // The step's log lines belong to the request that asked for it (its connection span).
        let span = tracing::Span::current();
        let job: Job = Box::new(move || {
            let _in_request = span.enter();
            let _ = reply_tx.send(step());
        });
        {
            let sender = self.sender.lock_unpoisoned();
            let Some(sender) = sender.as_ref() else {
                return Err(EventError::Stopped);
            };
            self.queued.fetch_add(1, Ordering::Relaxed);
            if sender.send(Event { name, queued_at: Instant::now(), job }).is_err() {
                self.queued.fetch_sub(1, Ordering::Relaxed);
                return Err(EventError::Stopped);
            }
        }
        // The reply channel closes without a value only when the step panicked.
        wait_blocking(move || reply_rx.recv().map_err(|_| EventError::Failed))
    }

    /// Steps waiting to run (Kafka's `EventQueueSize`).
    pub fn len(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Steps taken from the queue since start.
    pub fn processed(&self) -> i64 {
        self.processed.load(Ordering::Relaxed)
    }

    /// Stops taking steps; those queued still run.
    pub fn close(&self) {
        self.sender.lock_unpoisoned().take();
    }
}

/// Blocks until `wait` returns. On a multi-threaded runtime's worker the wait is announced
/// to tokio, which moves the worker's other tasks elsewhere meanwhile.
fn wait_blocking<R>(wait: impl FnOnce() -> R) -> R {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi_thread {
        tokio::task::block_in_place(wait)
    } else {
        wait()
    }
}

fn run(rx: Receiver<Event>, queue: std::sync::Weak<EventQueue>) {
    while let Ok(event) = rx.recv() {
        let waited = event.queued_at.elapsed();
        // Counted as taken before it runs: its caller may read the counts as soon as it has
        // the answer.
        if let Some(q) = queue.upgrade() {
            q.queued.fetch_sub(1, Ordering::Relaxed);
            q.processed.fetch_add(1, Ordering::Relaxed);
        }
        let started = Instant::now();
        // A panicking step must not take the queue down with it: the steps behind it are
        // other clients' requests.
        if std::panic::catch_unwind(AssertUnwindSafe(event.job)).is_err() {
            tracing::error!(step = event.name, "controller step panicked; its request fails");
        }
        let took = started.elapsed();
        if took.as_secs() >= 5 || waited.as_secs() >= 5 {
            tracing::warn!(
                step = event.name,
                waited_ms = waited.as_millis() as u64,
                took_ms = took.as_millis() as u64,
                "slow controller step"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn steps_run_one_at_a_time_in_arrival_order() {
        let q = EventQueue::start().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let running = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (q, log, running) = (q.clone(), log.clone(), running.clone());
                std::thread::spawn(move || {
                    q.run("test", move || {
                        // Two steps inside at once would see 1 here.
                        assert_eq!(running.fetch_add(1, Ordering::SeqCst), 0);
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        log.lock_unpoisoned().push(i);
                        running.fetch_sub(1, Ordering::SeqCst);
                        i * 10
                    })
                })
            })
            .collect();
        let answers: Vec<i32> = threads.into_iter().map(|t| t.join().unwrap().unwrap()).collect();
        assert_eq!(answers, (0..8).map(|i| i * 10).collect::<Vec<_>>());
        assert_eq!(log.lock_unpoisoned().len(), 8);
        assert_eq!(q.processed(), 8);
        assert!(q.is_empty());
    }

    #[test]
    fn a_step_may_run_another_step_without_waiting_for_itself() {
        let q = EventQueue::start().unwrap();
        let inner = q.clone();
        let got = q.run("outer", move || inner.run("inner", || 7).unwrap() + 1).unwrap();
        assert_eq!(got, 8);
    }

    #[test]
    fn a_panicking_step_fails_alone() {
        let q = EventQueue::start().unwrap();
        assert_eq!(q.run("boom", || -> i32 { panic!("step failed") }), Err(EventError::Failed));
        assert_eq!(q.run("next", || 2), Ok(2));
    }

    #[test]
    fn a_closed_queue_refuses_new_steps() {
        let q = EventQueue::start().unwrap();
        q.close();
        assert_eq!(q.run("late", || 1), Err(EventError::Stopped));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_runtime_worker_may_wait_for_a_step_and_steps_may_spawn_tasks() {
        let q = EventQueue::start().unwrap();
        assert_eq!(q.run("from a worker", || 3), Ok(3));
        let task = q.run("spawns", || tokio::spawn(async { 4 })).unwrap();
        assert_eq!(task.await.unwrap(), 4);
    }
}
