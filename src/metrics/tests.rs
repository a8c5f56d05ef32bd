use super::*;

/// The value of the series `name{labels}` exactly as written (labels in order).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn topic_counters_have_a_per_topic_and_an_all_topics_series() {
    let m = BrokerMetrics::new().unwrap();
    let a = m.topics.topic("a");
    let b = m.topics.topic("b");
    a.record_leader_append(3, 300);
    a.record_leader_append(2, 200);
    b.record_leader_append(1, 50);
    b.record_consumer_fetch(50);
    let text = m.render(&StateSample::default());
    assert_eq!(sample(&text, "kafka_server_brokertopicmetrics_messagesin_total{topic=\"a\"}"), Some(5.0));
    assert_eq!(sample(&text, "kafka_server_brokertopicmetrics_messagesin_total{topic=\"b\"}"), Some(1.0));
    assert_eq!(sample(&text, "kafka_server_brokertopicmetrics_messagesin_total"), Some(6.0));
    assert_eq!(sample(&text, "kafka_server_brokertopicmetrics_bytesin_total{topic=\"a\"}"), Some(500.0));
    assert_eq!(sample(&text, "kafka_server_brokertopicmetrics_bytesout_total{topic=\"b\"}"), Some(50.0));
    // One TYPE line per family, the all-topics series included in it.
    assert_eq!(text.matches("# TYPE kafka_server_brokertopicmetrics_messagesin_total counter").count(), 1);

    // A deleted topic's series go; the total keeps what it counted.
    m.topics.remove_topic("a");
    let text = m.render(&StateSample::default());
    assert_eq!(sample(&text, "kafka_server_brokertopicmetrics_messagesin_total{topic=\"a\"}"), None);
    assert_eq!(sample(&text, "kafka_server_brokertopicmetrics_messagesin_total"), Some(6.0));
}

#[test]
fn requests_are_counted_by_kafkas_api_names_and_versions() {
    let m = BrokerMetrics::new().unwrap();
    m.requests.record(0, 9, false, Duration::from_micros(700));
    m.requests.record(0, 9, false, Duration::from_millis(3));
    m.requests.record(3, 12, false, Duration::from_micros(100));
    m.requests.record(1, 13, false, Duration::from_millis(400));
    m.requests.record(1, 13, true, Duration::from_millis(400));
    m.requests.record(4, 7, false, Duration::from_millis(1));
    // Out of any table: ignored, not a panic.
    m.requests.record(-1, 0, false, Duration::ZERO);
    m.requests.record(0, 500, false, Duration::ZERO);
    let text = m.render(&StateSample::default());
    let count = |s: &str| sample(&text, s);
    assert_eq!(count("kafka_network_requestmetrics_requests_total{request=\"Produce\",version=\"9\"}"), Some(2.0));
    assert_eq!(count("kafka_network_requestmetrics_requests_total{request=\"Metadata\",version=\"12\"}"), Some(1.0));
    assert_eq!(count("kafka_network_requestmetrics_requests_total{request=\"Fetch\",version=\"13\"}"), Some(2.0));
    assert_eq!(count("kafka_network_requestmetrics_requests_total{request=\"LeaderAndIsr\",version=\"7\"}"), Some(1.0));
    assert_eq!(count("kafka_network_requestmetrics_totaltimems_count{request=\"Produce\"}"), Some(2.0));
    assert_eq!(count("kafka_network_requestmetrics_totaltimems_bucket{request=\"Produce\",le=\"1\"}"), Some(1.0));
    assert_eq!(count("kafka_network_requestmetrics_totaltimems_bucket{request=\"Produce\",le=\"5\"}"), Some(2.0));
    assert_eq!(count("kafka_network_requestmetrics_totaltimems_count{request=\"FetchConsumer\"}"), Some(1.0));
    assert_eq!(count("kafka_network_requestmetrics_totaltimems_count{request=\"FetchFollower\"}"), Some(1.0));
    assert_eq!(count("kafka_network_requestmetrics_totaltimems_count{request=\"Fetch\"}"), None);
    assert!(text.contains("# TYPE kafka_network_requestmetrics_totaltimems histogram"));
}

#[test]
fn api_names_are_kafkas() {
    for (key, name) in [
        (0, "Produce"),
        (1, "Fetch"),
        (2, "ListOffsets"),
        (3, "Metadata"),
        (8, "OffsetCommit"),
        (10, "FindCoordinator"),
        (18, "ApiVersions"),
        (19, "CreateTopics"),
        (22, "InitProducerId"),
        (23, "OffsetForLeaderEpoch"),
        (32, "DescribeConfigs"),
        (44, "IncrementalAlterConfigs"),
        (56, "AlterPartition"),
        (60, "DescribeCluster"),
    ] {
        assert_eq!(api_name(key).as_deref(), Some(name), "key {key}");
    }
    assert_eq!(api_name(-1), None);
}

#[test]
fn purgatory_and_connections_count_what_is_held() {
    let m = BrokerMetrics::new().unwrap();
    let listener = m.listener("PLAINTEXT");
    let c1 = listener.connection();
    let _c2 = listener.connection();
    let p = m.park_produce();
    let _f = m.park_fetch();
    let _f2 = m.park_fetch();
    drop(c1);
    let text = m.render(&StateSample::default());
    assert_eq!(sample(&text, "kafka_server_socket_server_metrics_connection_count{listener=\"PLAINTEXT\"}"), Some(1.0));
    assert_eq!(
        sample(&text, "kafka_server_socket_server_metrics_connection_creation_total{listener=\"PLAINTEXT\"}"),
        Some(2.0)
    );
    let purgatory = |op: &str| {
        sample(&text, &format!("kafka_server_delayedoperationpurgatory_purgatorysize{{delayedOperation=\"{op}\"}}"))
    };
    assert_eq!((purgatory("Produce"), purgatory("Fetch")), (Some(1.0), Some(2.0)));
    drop(p);
    let text = m.render(&StateSample::default());
    assert_eq!(
        sample(&text, "kafka_server_delayedoperationpurgatory_purgatorysize{delayedOperation=\"Produce\"}"),
        Some(0.0)
    );
}

#[test]
fn state_gauges_are_computed_from_the_sample() {
    let m = BrokerMetrics::new().unwrap();
    m.isr.record_shrink();
    m.isr.record_expand();
    m.isr.record_expand();
    let p = |partition, leader, replicas, isr| PartitionSample {
        topic: "t".into(),
        partition,
        leader,
        replicas,
        isr,
        min_isr: 2,
        size_bytes: 1000 + partition as u64,
        log_start_offset: 0,
        log_end_offset: 10,
        segments: 1,
    };
    let state = StateSample {
        active_controller: true,
        partitions: vec![p(0, true, 3, 3), p(1, true, 3, 2), p(2, true, 3, 1), p(3, false, 3, 1)],
        offline_partitions: 1,
        global_partitions: 12,
        global_topics: 2,
        controller_events_queued: 3,
        controller_events_processed: 9,
        zookeeper: Some(ZooKeeperSample { connected: true, expired_sessions: 1 }),
        segment_files: SegmentFilesSample { hits: 7, misses: 3, evictions: 2, open: 1, capacity: 64 },
        index_maps: SegmentFilesSample { hits: 11, misses: 5, evictions: 4, open: 6, capacity: 128 },
    };
    let text = m.render(&state);
    let v = |s: &str| sample(&text, s);
    assert_eq!(v("kafka_server_replicamanager_partitioncount"), Some(4.0));
    assert_eq!(v("kafka_controller_controllereventmanager_eventqueuesize"), Some(3.0));
    assert_eq!(v("gregor_controller_events_total"), Some(9.0));
    assert_eq!(v("gregor_log_segment_fd_cache_hits_total"), Some(7.0));
    assert_eq!(v("gregor_log_segment_fd_cache_misses_total"), Some(3.0));
    assert_eq!(v("gregor_log_segment_fd_cache_evictions_total"), Some(2.0));
    assert_eq!(v("gregor_log_segment_fd_cache_open"), Some(1.0));
    assert_eq!(v("gregor_log_segment_fd_cache_size"), Some(64.0));
    assert_eq!(v("gregor_log_index_mmap_cache_hits_total"), Some(11.0));
    assert_eq!(v("gregor_log_index_mmap_cache_misses_total"), Some(5.0));
    assert_eq!(v("gregor_log_index_mmap_cache_evictions_total"), Some(4.0));
    assert_eq!(v("gregor_log_index_mmap_cache_mapped"), Some(6.0));
    assert_eq!(v("gregor_log_index_mmap_cache_size"), Some(128.0));
    assert_eq!(v("kafka_server_replicamanager_leadercount"), Some(3.0));
    // A follower's view of its ISR is not its to report.
    assert_eq!(v("kafka_server_replicamanager_underreplicatedpartitions"), Some(2.0));
    assert_eq!(v("kafka_server_replicamanager_underminisrpartitioncount"), Some(1.0));
    assert_eq!(v("kafka_server_replicamanager_atminisrpartitioncount"), Some(1.0));
    assert_eq!(v("kafka_server_replicamanager_isrshrinks_total"), Some(1.0));
    assert_eq!(v("kafka_server_replicamanager_isrexpands_total"), Some(2.0));
    assert_eq!(v("kafka_controller_kafkacontroller_activecontrollercount"), Some(1.0));
    assert_eq!(v("kafka_controller_kafkacontroller_offlinepartitionscount"), Some(1.0));
    assert_eq!(v("kafka_server_sessionexpirelistener_sessionstate"), Some(1.0));
    assert_eq!(v("kafka_server_sessionexpirelistener_zookeeperexpires_total"), Some(1.0));
    assert_eq!(v("kafka_log_log_size{topic=\"t\",partition=\"2\"}"), Some(1002.0));
    assert_eq!(v("kafka_log_log_logendoffset{topic=\"t\",partition=\"0\"}"), Some(10.0));

    // Standalone: no ZooKeeper, no session series.
    let text = m.render(&StateSample::default());
    assert!(!text.contains("sessionexpirelistener"));
    assert_eq!(sample(&text, "kafka_server_replicamanager_partitioncount"), Some(0.0));
}

#[test]
fn label_values_are_escaped() {
    let m = BrokerMetrics::new().unwrap();
    // Topic names cannot hold quotes, but nothing here should rely on that.
    m.topics.topic("we\"ird\\").record_leader_append(1, 1);
    let text = m.render(&StateSample::default());
    assert!(text.contains("topic=\"we\\\"ird\\\\\"} 1"), "{text}");
}
