use super::keys::*;
use super::parse::*;
use super::*;

fn load(pairs: &[(&str, &str)]) -> Result<BrokerConfig, ConfigError> {
    BrokerConfig::from_map(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
}

#[test]
fn keys_kafka_updates_dynamically_but_gregor_cannot_are_told_apart() {
    for k in ["num.replica.fetchers", "listeners", "listener.name.plaintext.ssl.keystore.location", "metric.reporters"]
    {
        assert!(is_dynamic_in_kafka_only(k) && !is_dynamic_broker_config(k), "{k}");
    }
    for k in [
        "max.connections.per.ip",
        "log.cleaner.threads",
        "log.retention.ms",
        "message.max.bytes",
        "num.io.threads",
        "sasl.kerberos.min.time.before.relogin",
        "sasl.enabled.mechanisms",
    ] {
        assert!(is_dynamic_broker_config(k) && !is_dynamic_in_kafka_only(k), "{k}");
    }
    assert!(!is_dynamic_in_kafka_only("broker.id") && !is_dynamic_broker_config("broker.id"));
}

#[test]
fn dynamic_values_override_static_ones_and_only_dynamic_keys_are_taken() {
    let c = load(&[("log.retention.hours", "1"), ("num.partitions", "4")]).unwrap();
    assert_eq!(c.log.retention_ms, 3_600_000);
    let dynamic: BTreeMap<String, String> = [("log.retention.ms".to_string(), "5000".to_string())].into();
    let d = c.with_dynamic(&dynamic).unwrap();
    assert_eq!((d.log.retention_ms, d.num_partitions), (5000, 4));
    assert_eq!(d.given, c.given, "what the operator set statically is unchanged");
    let fixed: BTreeMap<String, String> = [("num.partitions".to_string(), "9".to_string())].into();
    assert!(c.with_dynamic(&fixed).is_err());
    let bad: BTreeMap<String, String> = [("log.retention.ms".to_string(), "soon".to_string())].into();
    assert!(c.with_dynamic(&bad).is_err());
}

#[test]
fn defaults_are_kafkas() {
    let c = load(&[]).unwrap();
    assert_eq!(c.broker_id, 0);
    assert_eq!(c.listeners[0].port, 9092);
    assert_eq!(c.log_dirs, vec![PathBuf::from("./data")]);
    assert_eq!(c.log.segment_bytes, 1 << 30);
    assert_eq!(c.log.retention_ms, 168 * 3_600_000);
    assert_eq!(c.log.max_message_bytes, 1_048_588);
    assert_eq!(c.socket_request_max_bytes, 104_857_600);
    assert!(c.zookeeper_connect.is_none());
}

#[test]
fn limits_default_to_kafkas_and_bad_values_are_refused() {
    use std::time::Duration;
    let c = load(&[]).unwrap();
    assert_eq!(c.offset_metadata_max_bytes, 4096);
    assert_eq!(c.offsets_commit_timeout, Duration::from_millis(5000));
    assert_eq!(c.replica_fetch_backoff, Duration::from_millis(1000));
    assert_eq!(c.controlled_shutdown_max_retries, 3);
    assert_eq!(c.controlled_shutdown_retry_backoff, Duration::from_millis(5000));
    assert_eq!(c.request_timeout, Duration::from_millis(30000));
    assert_eq!(c.controller_socket_timeout, Duration::from_millis(30000));
    assert_eq!(c.replica_socket_timeout, Duration::from_millis(30000));
    let c = load(&[
        ("offset.metadata.max.bytes", "0"),
        ("offsets.commit.timeout.ms", "1"),
        ("replica.fetch.backoff.ms", "0"),
        ("controlled.shutdown.max.retries", "0"),
        ("controlled.shutdown.retry.backoff.ms", "0"),
        ("request.timeout.ms", "250"),
        ("controller.socket.timeout.ms", "100"),
        ("replica.socket.timeout.ms", "500"),
    ])
    .unwrap();
    assert_eq!(c.replica_socket_timeout, Duration::from_millis(500));
    assert_eq!((c.offset_metadata_max_bytes, c.controlled_shutdown_max_retries), (0, 0));
    assert_eq!(c.offsets_commit_timeout, Duration::from_millis(1));
    assert_eq!(c.replica_fetch_backoff, Duration::ZERO);
    assert_eq!(c.controlled_shutdown_retry_backoff, Duration::ZERO);
    assert_eq!(c.request_timeout, Duration::from_millis(250));
    assert_eq!(c.controller_socket_timeout, Duration::from_millis(100));
    let bad: &[(&str, &[&str])] = &[
        ("offset.metadata.max.bytes", &["-1", "4k"]),
        ("offsets.commit.timeout.ms", &["0", "-5", "soon"]),
        ("replica.fetch.backoff.ms", &["-1", "1s"]),
        ("controlled.shutdown.max.retries", &["-1", "three"]),
        ("controlled.shutdown.retry.backoff.ms", &["-1", ""]),
        ("request.timeout.ms", &["0", "30s"]),
        ("controller.socket.timeout.ms", &["0", "-1", "30s"]),
        // Below replica.fetch.wait.max.ms (500) every long poll would time out.
        ("replica.socket.timeout.ms", &["0", "499", "30s"]),
    ];
    for (key, values) in bad {
        for value in *values {
            let err = refusal(&[(key, value)]);
            assert!(err.starts_with(&format!("invalid value {value:?} for configuration {key}")), "{err}");
        }
    }
}

#[test]
fn metrics_are_served_only_with_a_valid_port() {
    assert_eq!(load(&[]).unwrap().metrics_address, None);
    let c = load(&[("metrics.port", "9404")]).unwrap();
    assert_eq!(c.metrics_address, Some(("0.0.0.0".to_string(), 9404)));
    let c = load(&[("metrics.port", " 9404 "), ("metrics.host", "127.0.0.1")]).unwrap();
    assert_eq!(c.metrics_address, Some(("127.0.0.1".to_string(), 9404)));
    let c = load(&[("metrics.port", "9404"), ("metrics.host", "[::1]")]).unwrap();
    assert_eq!(c.metrics_address, Some(("::1".to_string(), 9404)));
    assert_eq!(load(&[("metrics.host", "127.0.0.1")]).unwrap().metrics_address, None);
    for bad in ["http", "-1", "0", "65536", "9404x"] {
        let err = refusal(&[("metrics.port", bad)]);
        assert!(err.starts_with(&format!("invalid value {bad:?} for configuration metrics.port")), "{err}");
    }
    // As the Kafka images spell it in the environment.
    let env = [("KAFKA_METRICS_PORT".to_string(), "9404".to_string())];
    let c = BrokerConfig::load(None, &[], env.into_iter()).unwrap();
    assert_eq!(c.metrics_address.map(|(_, p)| p), Some(9404));
}

#[test]
fn wildcard_listener_needs_an_advertised_address() {
    let err = load(&[("listeners", "PLAINTEXT://0.0.0.0:9092")]).unwrap_err().to_string();
    assert!(err.contains("advertised.listeners"), "{err}");
    let c = load(&[("listeners", "PLAINTEXT://0.0.0.0:9092"), ("advertised.listeners", "PLAINTEXT://kafka:9092")]);
    assert_eq!(c.unwrap().advertised_listeners[0].host, "kafka");
}

#[test]
fn connection_limits() {
    let c = load(&[]).unwrap();
    assert_eq!(c.max_connections, i32::MAX as usize);
    assert_eq!(c.connections_max_idle, std::time::Duration::from_secs(600));
    let c = load(&[
        ("max.connections", "100"),
        ("max.connections.per.ip", "0"),
        ("max.connections.per.ip.overrides", "127.0.0.1:5, [::1]:7"),
    ])
    .unwrap();
    assert_eq!((c.max_connections, c.max_connections_per_ip), (100, 0));
    assert_eq!(
        c.max_connections_per_ip_overrides,
        vec![("127.0.0.1".parse().unwrap(), 5), ("::1".parse().unwrap(), 7)]
    );
    for (key, value) in [
        ("max.connections", "-1"),
        ("max.connections.per.ip", "lots"),
        ("max.connections.per.ip.overrides", "127.0.0.1"),
        ("max.connections.per.ip.overrides", "127.0.0.1:-3"),
        ("connections.max.idle.ms", "0"),
    ] {
        let err = refusal(&[(key, value)]);
        assert!(err.contains(key), "{err}");
    }
}

#[test]
fn inter_broker_traffic_uses_the_named_listener_wherever_it_is_listed() {
    let c = load(&[
        ("listeners", "EXTERNAL://127.0.0.1:19092,INTERNAL://127.0.0.1:9092"),
        ("listener.security.protocol.map", "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT"),
        ("inter.broker.listener.name", "internal"),
    ])
    .unwrap();
    assert_eq!(c.inter_broker_listener, "INTERNAL");
    let c = load(&[
        ("listeners", "PLAINTEXT_HOST://127.0.0.1:19092,PLAINTEXT://127.0.0.1:9092"),
        ("listener.security.protocol.map", "PLAINTEXT:PLAINTEXT,PLAINTEXT_HOST:PLAINTEXT"),
    ])
    .unwrap();
    assert_eq!(c.inter_broker_listener, "PLAINTEXT", "unset: the listener named after the protocol");
    let c = load(&[
        ("listeners", "A://127.0.0.1:19092,B://127.0.0.1:9092"),
        ("listener.security.protocol.map", "A:PLAINTEXT,B:PLAINTEXT"),
    ])
    .unwrap();
    assert_eq!(c.inter_broker_listener, "A");
}

fn refusal(pairs: &[(&str, &str)]) -> String {
    match load(pairs) {
        Ok(_) => panic!("{pairs:?} was accepted"),
        Err(e) => e.to_string(),
    }
}

const INTERNAL_EXTERNAL: &[(&str, &str)] = &[
    ("listeners", "INTERNAL://127.0.0.1:9092,EXTERNAL://127.0.0.1:19092"),
    ("advertised.listeners", "INTERNAL://kafka:9092,EXTERNAL://localhost:19092"),
    ("listener.security.protocol.map", "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT"),
    ("inter.broker.listener.name", "INTERNAL"),
];

#[test]
fn custom_listener_names_map_to_plaintext() {
    let c = load(INTERNAL_EXTERNAL).unwrap();
    assert_eq!(c.listeners.len(), 2);
    assert!(c.listeners.iter().chain(&c.advertised_listeners).all(|e| e.security_protocol() == "PLAINTEXT"));
    assert_eq!(c.advertised_for("EXTERNAL").map(|e| e.port), Some(19092));
    let c = load(&[("listeners", "PLAINTEXT://127.0.0.1:9092")]).unwrap();
    assert_eq!(c.listeners[0].security_protocol(), "PLAINTEXT");
    // Kafka normalises names and protocols to upper case.
    let c =
        load(&[("listeners", "internal://127.0.0.1:9092"), ("listener.security.protocol.map", "Internal:plaintext")]);
    assert_eq!(c.unwrap().listeners[0].security_protocol(), "PLAINTEXT");
}

#[test]
fn secured_listeners_are_accepted_and_so_is_a_secured_inter_broker_listener() {
    // Standalone there is no inter-broker traffic: any listener may be secured (its TLS
    // and SASL keys are checked when the broker builds them).
    let c = load(&[("listeners", "SASL_SSL://127.0.0.1:29592")]).unwrap();
    assert_eq!(c.listeners[0].security_protocol(), "SASL_SSL");
    for protocol in ["SSL", "SASL_PLAINTEXT", "SASL_SSL"] {
        for inter_broker in ["INTERNAL", "EXTERNAL"] {
            let c = load(&[
                ("zookeeper.connect", "127.0.0.1:2181"),
                ("listeners", "INTERNAL://127.0.0.1:9092,EXTERNAL://127.0.0.1:29592"),
                ("listener.security.protocol.map", &format!("INTERNAL:PLAINTEXT,EXTERNAL:{protocol}")),
                ("inter.broker.listener.name", inter_broker),
            ])
            .unwrap();
            assert_eq!(c.listeners[1].security_protocol(), protocol);
            assert_eq!(c.inter_broker_listener, inter_broker);
        }
    }
    // In a cluster, the inter-broker listener falls back to the first one; that it is
    // secured is for the broker's start to check (credentials, truststore).
    let c = load(&[("zookeeper.connect", "127.0.0.1:2181"), ("listeners", "SASL_SSL://127.0.0.1:29592")]).unwrap();
    assert_eq!(c.inter_broker_listener, "SASL_SSL");
    let err = refusal(&[("listeners", "PLAINTEXT://127.0.0.1:9092,plaintext://127.0.0.1:9093")]);
    assert!(err.contains("defined twice"), "{err}");
}

#[test]
fn protocol_map_errors_name_the_key() {
    let err = refusal(&[("listeners", "INTERNAL://127.0.0.1:9092")]);
    assert!(err.contains("listeners") && err.contains("no security protocol defined for listener INTERNAL"), "{err}");
    for bad in ["INTERNAL", "INTERNAL:TLS", ":PLAINTEXT", "INTERNAL:PLAINTEXT,INTERNAL:SSL"] {
        let err = refusal(&[("listeners", "INTERNAL://127.0.0.1:9092"), ("listener.security.protocol.map", bad)]);
        assert!(err.contains("listener.security.protocol.map"), "{bad}: {err}");
    }
    let err = refusal(&[("listeners", "PLAINTEXT://127.0.0.1:9092"), ("advertised.listeners", "OTHER://kafka:9092")]);
    assert!(err.contains("advertised.listeners") && err.contains("listener OTHER"), "{err}");
}

#[test]
fn inter_broker_protocol_picks_its_listener_and_a_secured_control_plane_is_refused() {
    // security.inter.broker.protocol names the listener, as in Kafka; it must exist.
    let err = refusal(&[("security.inter.broker.protocol", "SASL_SSL"), ("zookeeper.connect", "zk:2181")]);
    assert!(err.contains("security.inter.broker.protocol") && err.contains("advertised.listeners"), "{err}");
    let c = load(&[
        ("security.inter.broker.protocol", "sasl_ssl"),
        ("zookeeper.connect", "zk:2181"),
        ("listeners", "PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093"),
    ])
    .unwrap();
    assert_eq!(c.inter_broker_listener, "SASL_SSL");
    let err = refusal(&[("security.inter.broker.protocol", "KERBEROS")]);
    assert!(err.contains("security.inter.broker.protocol") && err.contains("unknown security protocol"), "{err}");
    assert!(load(&[("security.inter.broker.protocol", "PLAINTEXT")]).is_ok());

    let with = |key: &'static str, value: &'static str| {
        let mut pairs = INTERNAL_EXTERNAL.to_vec();
        pairs.retain(|(k, _)| *k != key);
        pairs.push((key, value));
        pairs
    };
    let err = refusal(&with("security.inter.broker.protocol", "PLAINTEXT"));
    assert!(err.contains("only one of inter.broker.listener.name and security.inter.broker.protocol"), "{err}");
    let err = refusal(&with("inter.broker.listener.name", "REPLICATION"));
    assert!(err.contains("inter.broker.listener.name") && err.contains("INTERNAL,EXTERNAL"), "{err}");
    let err = refusal(&with("control.plane.listener.name", "CONTROL"));
    assert!(err.contains("control.plane.listener.name"), "{err}");
    assert!(load(&with("control.plane.listener.name", "INTERNAL")).is_ok());

    let mut secured = with("listener.security.protocol.map", "INTERNAL:SASL_PLAINTEXT,EXTERNAL:PLAINTEXT");
    secured.push(("zookeeper.connect", "zk:2181"));
    assert_eq!(load(&secured).unwrap().inter_broker_listener, "INTERNAL");
    secured.push(("control.plane.listener.name", "internal"));
    let err = refusal(&secured);
    assert!(err.starts_with("control.plane.listener.name: listener INTERNAL (INTERNAL://127.0.0.1:9092)"), "{err}");
}

#[test]
fn zookeeper_tls_and_acls_are_refused_when_asked_for() {
    for key in ["zookeeper.ssl.client.enable", "zookeeper.set.acl"] {
        let err = refusal(&[(key, "true")]);
        assert!(err.starts_with(&format!("{key}: ")), "{err}");
        assert!(load(&[(key, "false")]).is_ok());
        assert!(refusal(&[(key, "yes")]).contains(key));
    }
}

#[test]
fn only_kafkas_acl_authorizer_is_accepted() {
    for class in ["kafka.security.authorizer.AclAuthorizer", "kafka.security.auth.SimpleAclAuthorizer"] {
        assert!(load(&[("authorizer.class.name", class)]).is_ok());
    }
    let err = refusal(&[("authorizer.class.name", "org.apache.kafka.metadata.authorizer.StandardAuthorizer")]);
    assert!(
        err.starts_with("authorizer.class.name: org.apache.kafka.metadata.authorizer.StandardAuthorizer cannot"),
        "{err}"
    );
    assert!(load(&[("authorizer.class.name", " ")]).is_ok());
    assert!(load(&[("super.users", "User:admin"), ("allow.everyone.if.no.acl.found", "true")]).is_ok());
}

#[test]
fn ssl_and_sasl_keys_without_secured_listeners_are_accepted() {
    let c = load(&[
        ("ssl.client.auth", "required"),
        ("ssl.keystore.location", "/etc/kafka/keystore.jks"),
        ("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-256"),
        ("sasl.mechanism.inter.broker.protocol", "PLAIN"),
        ("listener.name.plaintext.plain.sasl.jaas.config", "x"),
    ]);
    assert_eq!(c.unwrap().listeners[0].security_protocol(), "PLAINTEXT");
}

#[test]
fn retention_precedence_ms_minutes_hours() {
    assert_eq!(load(&[("log.retention.minutes", "2")]).unwrap().log.retention_ms, 120_000);
    let c = load(&[("log.retention.minutes", "2"), ("log.retention.ms", "5")]).unwrap();
    assert_eq!(c.log.retention_ms, 5);
}

#[test]
fn bad_value_names_the_key() {
    let err = load(&[("num.partitions", "many")]).unwrap_err().to_string();
    assert!(err.contains("num.partitions"), "{err}");
    let err = load(&[("listeners", "127.0.0.1:9092")]).unwrap_err().to_string();
    assert!(err.contains("listeners"), "{err}");
    assert!(load(&[("auto.create.topics.enable", "yes")]).is_err());
    assert!(load(&[("log.segment.bytes", "0")]).is_err());
    for bad in ["0", "-1"] {
        let err = load(&[("num.io.threads", bad)]).unwrap_err().to_string();
        assert!(err.contains("num.io.threads") && err.contains("at least 1"), "{err}");
    }
    assert_eq!(load(&[]).unwrap().num_io_threads, 8);
    assert_eq!(load(&[("num.io.threads", "1")]).unwrap().num_io_threads, 1);
}

#[test]
fn internal_topics_have_kafkas_shape_and_refuse_zero() {
    let c = load(&[]).unwrap();
    let want =
        InternalTopicConfig { num_partitions: 50, replication_factor: 3, segment_bytes: 104_857_600, min_isr: None };
    assert_eq!(c.offsets_topic, want);
    assert_eq!(c.transaction_state_log, InternalTopicConfig { min_isr: Some(2), ..want });
    for key in ["offsets.topic.num.partitions", "offsets.topic.replication.factor", "transaction.state.log.min.isr"] {
        assert!(refusal(&[(key, "0")]).contains(key), "{key}");
    }
}

#[test]
fn properties_syntax() {
    let p = parse_properties("# c\n! c\nbroker.id=3\nlog.dirs : /a,\\\n  /b\nnum.partitions 4\n");
    assert_eq!(p["broker.id"], "3");
    assert_eq!(p["log.dirs"], "/a,/b");
    assert_eq!(p["num.partitions"], "4");
}

#[test]
fn toml_dotted_keys_flatten() {
    let t = parse_toml("broker.id = 2\n[log]\ndirs = [\"/x\", \"/y\"]\n\"retention.hours\" = 1\n").unwrap();
    assert_eq!(t["broker.id"], "2");
    assert_eq!(t["log.dirs"], "/x,/y");
    assert_eq!(t["log.retention.hours"], "1");
}

#[test]
fn env_names_map_like_kafka_images() {
    assert_eq!(env_to_key("KAFKA_ADVERTISED_LISTENERS").as_deref(), Some("advertised.listeners"));
    assert_eq!(env_to_key("KAFKA_BROKER_ID").as_deref(), Some("broker.id"));
    assert_eq!(env_to_key("KAFKA_HEAP_OPTS"), None);
    assert_eq!(env_to_key("KAFKA_JMX_PORT"), None);
    assert_eq!(env_to_key("KAFKA_CFG_ZOOKEEPER_CONNECT").as_deref(), Some("zookeeper.connect"));
    assert_eq!(
        env_to_key("KAFKA_CFG_LISTENER_NAME_INTERNAL_SSL_KEY___PASSWORD").as_deref(),
        Some("listener.name.internal.ssl.key-password")
    );
    assert_eq!(env_to_key("PATH"), None);
}

#[test]
fn precedence_file_env_override() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("s.properties");
    std::fs::write(&f, "broker.id=1\nnum.partitions=2\nlog.dirs=/tmp/x\n").unwrap();
    let env = vec![("KAFKA_NUM_PARTITIONS".to_string(), "5".to_string())];
    let c = BrokerConfig::load(Some(&f), &["log.dirs=/tmp/y".into()], env.into_iter()).unwrap();
    assert_eq!(c.broker_id, 1);
    assert_eq!(c.num_partitions, 5);
    assert_eq!(c.log_dirs, vec![PathBuf::from("/tmp/y")]);
}

#[test]
fn share_group_keys_are_checked_against_their_bounds() {
    let c = share_group_config(&load(&[]).unwrap()).unwrap();
    assert!(!c.enabled, "share groups are off unless the protocols name them");
    assert_eq!((c.record_lock_duration_ms, c.delivery_count_limit, c.partition_max_record_locks), (30_000, 5, 2_000));
    let on = load(&[
        ("group.coordinator.rebalance.protocols", "classic,share"),
        ("group.share.min.record.lock.duration.ms", "1000"),
        ("group.share.record.lock.duration.ms", "2000"),
    ])
    .unwrap();
    let c = share_group_config(&on).unwrap();
    assert!(c.enabled && c.record_lock_duration_ms == 2000);
    for (key, value) in [
        ("group.share.record.lock.duration.ms", "1000"),
        ("group.share.delivery.count.limit", "11"),
        ("group.share.partition.max.record.locks", "10"),
        ("group.share.session.timeout.ms", "x"),
    ] {
        let err = share_group_config(&load(&[(key, value)]).unwrap()).unwrap_err().to_string();
        assert!(err.contains(key), "{key}={value}: {err}");
    }
}

#[test]
fn the_migration_policies_are_kafkas_and_bidirectional_is_the_default() {
    use crate::config::MigrationPolicy::*;
    let policy = |v: &str| consumer_group_config(&load(&[("group.consumer.migration.policy", v)]).unwrap());
    assert_eq!(consumer_group_config(&load(&[]).unwrap()).unwrap().migration, Bidirectional);
    for (v, want) in
        [("DISABLED", Disabled), ("upgrade", Upgrade), (" Downgrade", Downgrade), ("bidirectional", Bidirectional)]
    {
        assert_eq!(policy(v).unwrap().migration, want, "{v}");
    }
    assert!(Bidirectional.upgrade() && Bidirectional.downgrade() && Upgrade.upgrade() && !Upgrade.downgrade());
    assert!(!Disabled.upgrade() && !Disabled.downgrade() && Downgrade.downgrade() && !Downgrade.upgrade());
    let err = policy("both").unwrap_err().to_string();
    assert!(err.contains("group.consumer.migration.policy"), "{err}");
}
