//! What the broker does when a log dir goes offline at runtime (Kafka's
//! `ReplicaManager.handleLogDirFailure`, KIP-112). The log that met the I/O error has already
//! marked the dir offline, so its logs answer KAFKA_STORAGE_ERROR from that moment; this
//! handler, off the request path, then stops serving the dir's partitions (their fetchers stop,
//! they leave the replica manager, produce and fetch answer KAFKA_STORAGE_ERROR), and tells
//! the controller with a `/log_dir_event_notification/log_dir_event_<seq>` znode. The
//! controller answers with LeaderAndIsr for this broker's replicas; those in the offline dir
//! answer KAFKA_STORAGE_ERROR, and the controller moves their leadership and drops them from
//! the ISRs. With every dir offline the broker halts, as Kafka's does.

use std::sync::Arc;
use std::time::Duration;

use super::ReplicaManager;
use crate::metadata::zk_data;
use crate::sync::MutexExt;

/// Between attempts to write the notification while ZooKeeper is unreachable. Kafka has no
/// key for it: its ZooKeeper client blocks the write until the session is back, where ours
/// returns the error and this loop asks again.
const NOTIFY_RETRY: Duration = Duration::from_millis(500);

impl ReplicaManager {
    /// Waits for log dirs to be reported offline and handles each once.
    pub fn spawn_log_dir_failure_handler(self: &Arc<Self>) {
        let broker = self.clone();
        tokio::spawn(async move {
            let channel = broker.logs().failure_channel().clone();
            loop {
                channel.reported().await;
                for dir in channel.take() {
                    let b = broker.clone();
                    // It takes the replica state lock and the log manager's: not on a worker.
                    if let Err(e) = tokio::task::spawn_blocking(move || b.handle_log_dir_failure(dir)).await {
                        tracing::error!(dir, error = %e, "log dir failure handler failed");
                    }
                    broker.notify_log_dir_event().await;
                }
            }
        });
    }

    /// Stops serving every partition of the offline dir `dir`.
    fn handle_log_dir_failure(&self, dir: usize) {
        // Against a LeaderAndIsr opening the same partitions meanwhile.
        let _serial = self.state_lock.lock_unpoisoned();
        let logs = self.logs();
        let path = logs.dirs().get(dir).map(|d| d.display().to_string()).unwrap_or_default();
        let gone = logs.handle_log_dir_failure(dir);
        for (topic, index) in &gone {
            let tp = (topic.clone(), *index);
            self.fetchers.unfollow(&tp);
            let was_leader = self.hosted(topic, *index).is_some_and(|p| p.is_leader());
            if let Some(l) = self.listener() {
                l.forget_partition(&tp);
            }
            self.stop_serving(topic, *index);
            if was_leader {
                if let Some(l) = self.listener() {
                    l.on_resign(&tp);
                }
            }
        }
        self.notify_changed();
        tracing::error!(dir = %path, partitions = gone.len(), "log dir is offline; its partitions are no longer served here");
        if !logs.any_online() {
            // Kafka's LogManager halts here: a broker with no disk can only mislead clients.
            tracing::error!("every log dir has failed; halting");
            std::process::exit(1);
        }
    }

    /// Kafka's `KafkaZkClient.propagateLogDirEvent`: a persistent sequential znode the
    /// controller watches. Retried until written; a new controller that missed it still finds
    /// it, since the controller deletes notifications only once it has acted on them.
    async fn notify_log_dir_event(self: &Arc<Self>) {
        if !self.handles.store.is_zookeeper() {
            return;
        }
        let data = zk_data::log_dir_event_json(self.broker_id);
        loop {
            let b = self.clone();
            let d = data.clone();
            let written = tokio::task::spawn_blocking(move || {
                b.handles.store.create_sequential(
                    &format!("{}/{}", zk_data::LOG_DIR_EVENT_NOTIFICATION, zk_data::LOG_DIR_EVENT_PREFIX),
                    &d,
                )
            })
            .await;
            match written {
                Ok(Ok(())) => return,
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot write the log dir event notification; retrying"),
                Err(e) => tracing::warn!(error = %e, "log dir event notification task failed; retrying"),
            }
            if self.is_shutting_down() {
                return;
            }
            tokio::time::sleep(NOTIFY_RETRY).await;
        }
    }
}
