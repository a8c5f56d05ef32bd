use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use super::otlp::tests::metrics_data;
use super::*;
use crate::config::client_telemetry::ClientTelemetryConfig;
use crate::metadata::{EmbeddedStore, ZnodeStore};

fn manager(max_clients: usize, max_series_per_client: usize) -> (tempfile::TempDir, ClientMetricsManager) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(ZnodeStore::Embedded(EmbeddedStore::open(dir.path().join("znodes")).unwrap()));
    let config = ClientTelemetryConfig {
        enabled: true,
        max_bytes: 1 << 20,
        max_clients,
        max_series: 10_000,
        max_series_per_client,
    };
    (dir, ClientMetricsManager::new(store, config))
}

fn configs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn client(software: &str) -> ClientAttributes {
    ClientAttributes {
        client_id: "app".into(),
        software_name: Some(software.into()),
        software_version: Some("2.16.0".into()),
        source_address: "127.0.0.1".into(),
        source_port: Some(40000),
        ..Default::default()
    }
}

fn push(s: &Subscribed, payload: &[u8]) -> Push<'static> {
    let payload: &'static [u8] = Box::leak(payload.to_vec().into_boxed_slice());
    Push {
        client_instance_id: s.client_instance_id,
        subscription_id: s.subscription_id,
        terminating: false,
        compression_type: 0,
        metrics: payload,
    }
}

#[tokio::test(start_paused = true)]
async fn subscriptions_are_stored_matched_and_fetched_once_per_interval() {
    let (_dir, m) = manager(100, 100);
    m.store_subscription(
        "rdkafka",
        &configs(&[
            ("metrics", "org.apache.kafka.producer."),
            ("interval.ms", "1000"),
            ("match", "client_software_name=librdkafka"),
        ]),
    )
    .unwrap();
    m.store_subscription("all", &configs(&[("metrics", "org.apache.kafka.consumer."), ("interval.ms", "5000")]))
        .unwrap();
    assert_eq!(m.names(), vec!["all", "rdkafka"]);

    let s = m.get_subscriptions(Uuid::nil(), client("librdkafka")).unwrap();
    assert!(!s.client_instance_id.is_nil());
    assert_eq!(s.metrics, vec!["org.apache.kafka.consumer.", "org.apache.kafka.producer."]);
    assert_eq!((s.push_interval_ms, s.telemetry_max_bytes), (1000, 1 << 20));
    let java = m.get_subscriptions(Uuid::nil(), client("apache-kafka-java")).unwrap();
    assert_eq!((java.metrics.clone(), java.push_interval_ms), (vec!["org.apache.kafka.consumer.".to_string()], 5000));
    assert_ne!(java.client_instance_id, s.client_instance_id);

    // Before the interval has passed, the client is told to wait.
    let again = m.get_subscriptions(s.client_instance_id, client("librdkafka"));
    assert_eq!(again, Err(ErrorCode::ThrottlingQuotaExceeded));
    tokio::time::advance(Duration::from_millis(1000)).await;
    assert_eq!(m.get_subscriptions(s.client_instance_id, client("librdkafka")).unwrap(), s);

    // A changed subscription is fetched at once, with another subscription id.
    m.store_subscription("rdkafka", &configs(&[("metrics", "*"), ("match", "client_software_name=librdkafka")]))
        .unwrap();
    let changed = m.get_subscriptions(s.client_instance_id, client("librdkafka")).unwrap();
    assert_eq!((changed.metrics.clone(), changed.push_interval_ms), (vec!["*".to_string()], 5000));
    assert_ne!(changed.subscription_id, s.subscription_id);
    // A subscription whose every config is deleted is gone.
    m.store_subscription("rdkafka", &BTreeMap::new()).unwrap();
    assert_eq!(m.names(), vec!["all"]);
    assert!(m.configs("rdkafka").is_none());
}

#[tokio::test(start_paused = true)]
async fn pushes_are_checked_in_kafkas_order() {
    let (_dir, m) = manager(100, 100);
    m.store_subscription("all", &configs(&[("metrics", "*"), ("interval.ms", "1000")])).unwrap();
    let s = m.get_subscriptions(Uuid::nil(), client("librdkafka")).unwrap();
    let payload = metrics_data(&[("org.apache.kafka.producer.queue.size", false, vec![(vec![], 3.0)])]);
    let attrs = || client("librdkafka");

    // The first push after a Get is accepted at once; the next must wait for the interval.
    assert_eq!(m.push(push(&s, &payload), attrs()), Ok(()));
    assert_eq!(m.push(push(&s, &payload), attrs()), Err(ErrorCode::ThrottlingQuotaExceeded));
    tokio::time::advance(Duration::from_millis(1000)).await;
    let wrong = Push { subscription_id: s.subscription_id ^ 1, ..push(&s, &payload) };
    assert_eq!(m.push(wrong, attrs()), Err(ErrorCode::UnknownSubscriptionId));
    // After UNKNOWN_SUBSCRIPTION_ID the client may fetch its subscription again at once.
    let s = m.get_subscriptions(s.client_instance_id, attrs()).unwrap();
    // That Get came early, so it moved no timestamp: the next push waits out the interval.
    assert_eq!(m.push(push(&s, &payload), attrs()), Err(ErrorCode::ThrottlingQuotaExceeded));
    tokio::time::advance(Duration::from_millis(1000)).await;
    let bad_codec = Push { compression_type: 9, ..push(&s, &payload) };
    assert_eq!(m.push(bad_codec, attrs()), Err(ErrorCode::UnsupportedCompressionType));
    tokio::time::advance(Duration::from_millis(1000)).await;
    assert_eq!(m.push(push(&s, &[0x0a, 0x09, 0x01]), attrs()), Err(ErrorCode::InvalidRecord));
    tokio::time::advance(Duration::from_millis(1000)).await;
    let gzip = crate::log::compression::compress(1, &payload).unwrap();
    assert_eq!(m.push(Push { compression_type: 1, ..push(&s, &gzip) }, attrs()), Ok(()));
    tokio::time::advance(Duration::from_millis(1000)).await;
    assert_eq!(m.push(push(&s, &vec![0u8; (1 << 20) + 1]), attrs()), Err(ErrorCode::TelemetryTooLarge));

    // A terminating push is accepted whenever it comes; nothing is accepted after it.
    assert_eq!(m.push(Push { terminating: true, ..push(&s, &payload) }, attrs()), Ok(()));
    tokio::time::advance(Duration::from_millis(1000)).await;
    assert_eq!(m.push(push(&s, &payload), attrs()), Err(ErrorCode::InvalidRequest));
    let nil = Push { client_instance_id: Uuid::nil(), ..push(&s, &payload) };
    assert_eq!(m.push(nil, attrs()), Err(ErrorCode::InvalidRequest));

    let text = m.render();
    assert!(text.contains("gregor_client_telemetry_pushes_total{error=\"NONE\"} 3"), "{text}");
    assert!(text.contains("gregor_client_telemetry_pushes_total{error=\"THROTTLING_QUOTA_EXCEEDED\"} 2"), "{text}");
    assert!(text.contains("gregor_client_telemetry_pushes_total{error=\"TELEMETRY_TOO_LARGE\"} 1"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn pushed_points_are_served_with_the_client_labels_within_bounds() {
    let (_dir, m) = manager(100, 2);
    m.store_subscription("all", &configs(&[("metrics", "*"), ("interval.ms", "1000")])).unwrap();
    let s = m.get_subscriptions(Uuid::nil(), client("librdkafka")).unwrap();
    let payload = metrics_data(&[
        ("org.apache.kafka.producer.queue.size", false, vec![(vec![], 3.0)]),
        ("org.apache.kafka.client.requests", true, vec![(vec![("node.id", "1")], 10.0), (vec![("node.id", "2")], 4.0)]),
        ("kafka.server.forged", false, vec![(vec![], 1.0)]),
    ]);
    m.push(push(&s, &payload), client("librdkafka")).unwrap();
    let text = m.render();
    let id = instance_id_string(s.client_instance_id);
    assert!(
        text.contains(&format!(
            "org_apache_kafka_producer_queue_size{{client_instance_id=\"{id}\",client_id=\"app\"}} 3"
        )),
        "{text}"
    );
    assert!(text.contains("# TYPE org_apache_kafka_client_requests counter"), "{text}");
    assert!(text.contains("client_id=\"app\",node_id=\"1\"} 10"), "{text}");
    // The per-client bound left out the rest, counted.
    assert!(!text.contains("node_id=\"2\""), "{text}");
    assert!(!text.contains("forged"), "{text}");
    assert!(text.contains("gregor_client_telemetry_series_dropped_total 2"), "{text}");
    assert_eq!(family_name("kafka.server.x"), "client_kafka_server_x");

    // A client silent past its expiry is forgotten, and its series with it.
    tokio::time::advance(Duration::from_secs(61)).await;
    let text = m.render();
    assert!(!text.contains(&id), "{text}");
}

#[tokio::test(start_paused = true)]
async fn the_instance_table_is_bounded() {
    let (_dir, m) = manager(2, 10);
    let ids: Vec<Uuid> =
        (0..3).map(|_| m.get_subscriptions(Uuid::nil(), client("librdkafka")).unwrap().client_instance_id).collect();
    {
        let instances = m.instances.lock().unwrap();
        assert_eq!(instances.by_id.len(), 2);
        assert!(!instances.by_id.contains_key(&ids[0]), "the least recently seen goes first");
        assert_eq!(instances.order.len(), 2);
    }

    // Idle past the expiry (three default push intervals), both go at the next request; the
    // order goes with them.
    tokio::time::advance(Duration::from_secs(899)).await;
    assert_eq!(m.instances.lock().unwrap().expire(tokio::time::Instant::now()), 0);
    tokio::time::advance(Duration::from_secs(1)).await;
    let fresh = m.get_subscriptions(Uuid::nil(), client("librdkafka")).unwrap().client_instance_id;
    let instances = m.instances.lock().unwrap();
    assert_eq!(instances.by_id.keys().collect::<Vec<_>>(), vec![&fresh]);
    assert_eq!(instances.order.values().collect::<Vec<_>>(), vec![&fresh]);
}

#[test]
fn instance_ids_are_written_as_kafka_writes_them() {
    assert_eq!(instance_id_string(Uuid::nil()), "AAAAAAAAAAAAAAAAAAAAAA");
    assert_eq!(instance_id_string(Uuid::from_u128(1)), "AAAAAAAAAAAAAAAAAAAAAQ");
}
