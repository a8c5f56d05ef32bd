//! Controlled shutdown, the broker's side (Kafka's `KafkaServer.controlledShutdown`): before
//! it deregisters, a stopping broker asks the controller to move its leaderships away.

use std::sync::Arc;
use std::time::Duration;

use super::Broker;

/// The ControlledShutdown version sent to the controller.
const CONTROLLED_SHUTDOWN_VERSION: i16 = 3;

/// Controlled shutdown as Kafka does it: ask the controller (ControlledShutdown) to move
/// every leadership this broker holds to another ISR member and take it out of the ISRs,
/// keep serving until it has, and only then deregister. Retried as Kafka retries
/// (`controlled.shutdown.max.retries`); a rolling restart then costs clients only
/// retriable NOT_LEADER errors.
pub(super) async fn controlled_shutdown(broker: &Arc<Broker>) {
    let enabled =
        broker.components.config.values.get("controlled.shutdown.enable").map(String::as_str) != Some("false");
    if !broker.components.store.is_zookeeper() || !enabled {
        return;
    }
    let retries = broker.components.config.controlled_shutdown_max_retries;
    let backoff = broker.components.config.controlled_shutdown_retry_backoff;
    // A departing broker must not look like a caught-up follower.
    broker.components.replicas.begin_shutdown();
    // Kafka spends at most `retries` backoffs waiting; gregor asks again sooner (below) but
    // gives up after the same time.
    let deadline = tokio::time::Instant::now() + backoff * retries;
    for attempt in 0..=retries {
        match ask_controlled_shutdown(broker).await {
            Ok(0) => {
                tracing::info!("controlled shutdown: leadership moved to other replicas");
                return;
            }
            Ok(remaining) => tracing::info!(remaining, attempt, "controlled shutdown: partitions still led here"),
            Err(e) => tracing::info!(error = %e, attempt, "controlled shutdown request failed"),
        }
        if tokio::time::Instant::now() + backoff > deadline {
            break;
        }
        tokio::time::sleep(backoff.min(Duration::from_millis(500) * (attempt + 1))).await;
    }
    tracing::warn!("controlled shutdown did not complete; shutting down with leaderships still here");
}

/// One ControlledShutdown round trip; the number of partitions still led here.
async fn ask_controlled_shutdown(broker: &Arc<Broker>) -> anyhow::Result<usize> {
    use crate::protocol::inter_broker::{ControlledShutdownRequest, ControlledShutdownResponse};
    let me = broker.components.config.broker_id;
    let epoch = broker.broker_epoch();
    let snapshot = broker.components.cache.snapshot();
    let resp: ControlledShutdownResponse = if broker.components.controller.is_controller() {
        let c = broker.components.controller.clone();
        tokio::task::spawn_blocking(move || c.handle_controlled_shutdown(me, epoch)).await?
    } else {
        let target = snapshot
            .brokers
            .iter()
            .find(|b| b.id == snapshot.controller_id)
            .ok_or_else(|| anyhow::anyhow!("no controller known"))?;
        let client_id = format!("gregor-broker-{me}");
        let mut stream = broker.components.security.inter_broker.connect(&target.host, target.port, &client_id).await?;
        let req = ControlledShutdownRequest { broker_id: me, broker_epoch: epoch };
        let call = crate::protocol::inter_broker::round_trip(
            &mut stream,
            1,
            &client_id,
            &req,
            CONTROLLED_SHUTDOWN_VERSION,
            broker.components.config.socket_request_max_bytes,
        );
        tokio::time::timeout(broker.components.security.inter_broker.request_timeout, call).await??
    };
    if resp.error_code != 0 {
        anyhow::bail!("controller answered error {}", resp.error_code);
    }
    Ok(resp.remaining_partitions.len())
}
