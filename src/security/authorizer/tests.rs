use super::*;

fn entry(principal: &str, host: &str, op: Operation, permission: Permission) -> AclEntry {
    AclEntry { principal: principal.into(), host: host.into(), operation: op, permission }
}

fn with(acls: &[(ResourcePattern, AclEntry)], allow_if_no_acls: bool, supers: &[&str]) -> Authorizer {
    let a = Authorizer::new(supers.iter().map(|s| s.to_string()).collect(), allow_if_no_acls);
    for (p, e) in acls {
        let mut set = a.snapshot().acls.get(p).cloned().unwrap_or_default();
        set.insert(e.clone());
        a.set_pattern(p, set);
    }
    a
}

fn topic(name: &str) -> ResourcePattern {
    ResourcePattern::new(ResourceType::Topic, name, PatternType::Literal)
}

fn prefixed(name: &str) -> ResourcePattern {
    ResourcePattern::new(ResourceType::Topic, name, PatternType::Prefixed)
}

fn can(a: &Authorizer, user: &str, ip: &str, op: Operation, name: &str) -> bool {
    let p = KafkaPrincipal::user(user);
    a.authorize(&Session { principal: &p, host: ip.parse().ok() }, op, ResourceType::Topic, name)
}

#[test]
fn allow_deny_wildcards_prefixes_and_hosts() {
    use Operation::*;
    use Permission::*;
    let a = with(
        &[
            (topic("orders"), entry("User:alice", "*", Read, Allow)),
            (topic("orders"), entry("User:bob", "10.0.0.1", Write, Allow)),
            (prefixed("pay"), entry("User:*", "*", Describe, Allow)),
            (prefixed("payroll"), entry("User:carol", "*", Describe, Deny)),
            (topic("*"), entry("User:dave", "*", All, Allow)),
            (topic("secret"), entry("User:dave", "*", Read, Deny)),
        ],
        false,
        &["User:admin"],
    );
    assert!(can(&a, "alice", "1.2.3.4", Read, "orders"));
    // READ implies DESCRIBE; it does not imply WRITE.
    assert!(can(&a, "alice", "1.2.3.4", Describe, "orders"));
    assert!(!can(&a, "alice", "1.2.3.4", Write, "orders"));
    // Host filters.
    assert!(can(&a, "bob", "10.0.0.1", Write, "orders"));
    assert!(!can(&a, "bob", "10.0.0.2", Write, "orders"));
    // Prefixes, the wildcard principal, and a longer DENY prefix.
    assert!(can(&a, "erin", "1.1.1.1", Describe, "payments"));
    assert!(!can(&a, "carol", "1.1.1.1", Describe, "payroll-2024"));
    assert!(can(&a, "carol", "1.1.1.1", Describe, "payments"));
    // The wildcard resource, ALL, and a DENY of READ that leaves DESCRIBE alone.
    assert!(can(&a, "dave", "1.1.1.1", Alter, "anything"));
    assert!(!can(&a, "dave", "1.1.1.1", Read, "secret"));
    assert!(can(&a, "dave", "1.1.1.1", Describe, "secret"));
    // Super users pass; resources without ACLs follow allow.everyone.if.no.acl.found.
    assert!(can(&a, "admin", "1.1.1.1", Delete, "orders"));
    let none = with(&[(topic("x"), entry("User:alice", "*", Read, Allow))], false, &[]);
    assert!(!can(&none, "alice", "1.1.1.1", Read, "y"));
    let open = with(&[(topic("x"), entry("User:alice", "*", Read, Allow))], true, &[]);
    assert!(can(&open, "bob", "1.1.1.1", Read, "y"));
    assert!(!can(&open, "bob", "1.1.1.1", Read, "x"), "x has ACLs, none for bob");
}

#[test]
fn alter_configs_implies_describe_configs_and_ops_are_reported_as_bits() {
    let a = with(&[(topic("t"), entry("User:u", "*", Operation::AlterConfigs, Permission::Allow))], false, &[]);
    let p = KafkaPrincipal::user("u");
    let s = Session { principal: &p, host: None };
    assert!(a.authorize(&s, Operation::DescribeConfigs, ResourceType::Topic, "t"));
    assert_eq!(
        a.authorized_operations(&s, ResourceType::Topic, "t"),
        (1 << Operation::AlterConfigs.code()) | (1 << Operation::DescribeConfigs.code())
    );
}

#[test]
fn write_on_any_topic_by_resource_type() {
    use Operation::Write;
    use Permission::*;
    let p = KafkaPrincipal::user("u");
    let s = Session { principal: &p, host: None };
    let only_prefix = with(&[(prefixed("a"), entry("User:u", "*", Write, Allow))], false, &[]);
    assert!(only_prefix.authorize_any(&s, Write, ResourceType::Topic));
    let covered = with(
        &[(prefixed("ab"), entry("User:u", "*", Write, Allow)), (prefixed("a"), entry("User:u", "*", Write, Deny))],
        false,
        &[],
    );
    assert!(!covered.authorize_any(&s, Write, ResourceType::Topic));
    let nothing = with(&[(topic("t"), entry("User:v", "*", Write, Allow))], false, &[]);
    assert!(!nothing.authorize_any(&s, Write, ResourceType::Topic));
}

#[test]
fn znode_json_paths_and_notifications_in_kafkas_layout() {
    let mut set = BTreeSet::new();
    set.insert(entry("User:alice", "*", Operation::Read, Permission::Allow));
    let json = acls_json(&set);
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["version"], 1);
    assert_eq!(v["acls"][0]["principal"], "User:alice");
    assert_eq!(v["acls"][0]["permissionType"], "Allow");
    assert_eq!(v["acls"][0]["operation"], "Read");
    assert_eq!(v["acls"][0]["host"], "*");
    assert_eq!(parse_acls(&json), set);
    // Kafka's other spellings parse too.
    let kafka = r#"{"version":1,"acls":[{"principal":"User:x","permissionType":"DENY","operation":"DESCRIBE_CONFIGS","host":"*"},{"bogus":1}]}"#;
    let parsed = parse_acls(kafka);
    assert_eq!(parsed.len(), 1);
    assert_eq!(parsed.iter().next().unwrap().operation, Operation::DescribeConfigs);

    assert_eq!(topic("t1").path(), "/kafka-acl/Topic/t1");
    let g = ResourcePattern::new(ResourceType::Group, "g", PatternType::Prefixed);
    assert_eq!(g.path(), "/kafka-acl-extended/prefixed/Group/g");
    let (path, data) = topic("t:1").change_notification();
    assert_eq!((path.as_str(), data.as_str()), ("/kafka-acl-changes/acl_changes_", "Topic:t:1"));
    assert_eq!(parse_change_notification(false, &data), Some(topic("t:1")));
    assert_eq!(parse_change_notification(false, "TOPIC:t"), Some(topic("t")));
    let tx = ResourcePattern::new(ResourceType::TransactionalId, "tx", PatternType::Prefixed);
    let (path, data) = tx.change_notification();
    assert_eq!(path, "/kafka-acl-extended-changes/acl_changes_");
    assert!(data.contains(r#""resourceType":"TRANSACTIONAL_ID""#), "{data}");
    assert_eq!(parse_change_notification(true, &data), Some(tx));
    assert_eq!(parse_change_notification(true, "not json"), None);
}

#[test]
fn config_accepts_kafkas_authorizer_only() {
    let mut v = BTreeMap::new();
    assert!(Authorizer::from_config(&v).unwrap().is_none());
    v.insert("authorizer.class.name".to_string(), "kafka.security.authorizer.AclAuthorizer".to_string());
    v.insert("super.users".to_string(), "User:admin; User:ops".to_string());
    let a = Authorizer::from_config(&v).unwrap().unwrap();
    assert!(a.is_super_user(&KafkaPrincipal::user("ops")));
    v.insert("authorizer.class.name".to_string(), "com.example.MyAuthorizer".to_string());
    let err = Authorizer::from_config(&v).err().unwrap().to_string();
    assert!(err.contains("authorizer.class.name"), "{err}");
}
