//! The parsers of what other brokers and Kafka's tools write into ZooKeeper: cluster id,
//! topic assignment, partition state, topic config, broker registration, reassignment,
//! producer-id blocks. Any bytes give a value or None, never a panic.
#![no_main]
use gregor::metadata::zk_data;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = zk_data::parse_cluster_id(text);
    if let Some((assignment, _)) = zk_data::parse_topic_json(text) {
        let _ = format!("{assignment:?}");
    }
    if let Some(state) = zk_data::parse_partition_state(text) {
        // What we parse we can write back.
        let again = zk_data::partition_state_json(&state);
        assert!(zk_data::parse_partition_state(&again).is_some(), "{again} does not parse");
    }
    let config = zk_data::parse_topic_config(text);
    let again = zk_data::topic_config_json(&config);
    assert_eq!(zk_data::parse_topic_config(&again), config);
    let _ = zk_data::parse_producer_id_block_end(text);
    let _ = gregor::metadata::zk_sync::parse_broker(1, text, "PLAINTEXT", 0);
    let _ = gregor::controller::election::parse_reassignment(text);
    let _ = zk_data::uuid_from_kafka(text);
});
