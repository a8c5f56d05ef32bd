//! Kafka's `AclAuthorizer` (`authorizer.class.name=kafka.security.authorizer.AclAuthorizer`):
//! ACLs kept in ZooKeeper in Kafka's layout, an in-memory copy every request reads, and the
//! decision rules Kafka applies.
//!
//! Layout: literal patterns at `/kafka-acl/<ResourceType>/<name>`, prefixed ones at
//! `/kafka-acl-extended/prefixed/<ResourceType>/<name>`, each holding
//! `{"version":1,"acls":[{"principal":..,"permissionType":..,"operation":..,"host":..}]}`. A
//! writer announces the pattern it changed with a sequential `acl_changes_` node under
//! `/kafka-acl-changes` (`Topic:name`) or `/kafka-acl-extended-changes` (JSON), and every broker
//! re-reads just that pattern.
//!
//! Invariant: a decision never does I/O. The ACLs are an immutable snapshot behind an `Arc`,
//! replaced whole when a pattern is re-read, so a request sees one consistent set and the lock
//! is held only to clone or swap the pointer.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use serde_json::{json, Value};

use super::KafkaPrincipal;
use crate::config::ConfigError;
use crate::metadata::{StoreError, ZnodeStore};
use crate::sync::RwLockExt;

pub const ACL_PATH: &str = "/kafka-acl";
pub const EXTENDED_ACL_PATH: &str = "/kafka-acl-extended";
pub const ACL_CHANGES: &str = "/kafka-acl-changes";
pub const EXTENDED_ACL_CHANGES: &str = "/kafka-acl-extended-changes";
pub const CHANGE_PREFIX: &str = "acl_changes_";
/// The one name a CLUSTER resource has.
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// A literal resource name, principal or host that matches any.
pub const WILDCARD: &str = "*";
pub const WILDCARD_PRINCIPAL: &str = "User:*";

pub use crate::config::ACL_AUTHORIZER_CLASSES;

/// Kafka's `ResourceType` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceType {
    Topic = 2,
    Group = 3,
    Cluster = 4,
    TransactionalId = 5,
    DelegationToken = 6,
    User = 7,
}

impl ResourceType {
    pub const ALL: [ResourceType; 6] = [
        ResourceType::Topic,
        ResourceType::Group,
        ResourceType::Cluster,
        ResourceType::TransactionalId,
        ResourceType::DelegationToken,
        ResourceType::User,
    ];

    pub fn code(self) -> i8 {
        self as i8
    }

    pub fn from_code(code: i8) -> Option<ResourceType> {
        Self::ALL.into_iter().find(|t| t.code() == code)
    }

    /// The name in znode paths and change notifications.
    pub fn name(self) -> &'static str {
        match self {
            ResourceType::Topic => "Topic",
            ResourceType::Group => "Group",
            ResourceType::Cluster => "Cluster",
            ResourceType::TransactionalId => "TransactionalId",
            ResourceType::DelegationToken => "DelegationToken",
            ResourceType::User => "User",
        }
    }

    /// The Java enum's name, as the extended change notification carries it.
    pub fn enum_name(self) -> &'static str {
        match self {
            ResourceType::Topic => "TOPIC",
            ResourceType::Group => "GROUP",
            ResourceType::Cluster => "CLUSTER",
            ResourceType::TransactionalId => "TRANSACTIONAL_ID",
            ResourceType::DelegationToken => "DELEGATION_TOKEN",
            ResourceType::User => "USER",
        }
    }

    /// Kafka parses resource types ignoring case and underscores (`TOPIC`, `Topic`,
    /// `TRANSACTIONAL_ID`, `TransactionalId`).
    pub fn parse(s: &str) -> Option<ResourceType> {
        let want = normalized(s);
        Self::ALL.into_iter().find(|t| normalized(t.name()) == want)
    }

    /// The operations an ACL on this type can grant (Kafka's `AclEntry.supportedOperations`),
    /// the set reported as "authorized operations".
    pub fn supported_operations(self) -> &'static [Operation] {
        use Operation::*;
        match self {
            ResourceType::Topic => &[Read, Write, Create, Describe, Delete, Alter, DescribeConfigs, AlterConfigs],
            ResourceType::Group => &[Read, Describe, Delete],
            ResourceType::Cluster => {
                &[Create, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, Alter, Describe]
            }
            ResourceType::TransactionalId => &[Describe, Write],
            ResourceType::DelegationToken => &[Describe],
            ResourceType::User => &[CreateTokens, DescribeTokens],
        }
    }
}

fn normalized(s: &str) -> String {
    s.chars().filter(|c| *c != '_').flat_map(char::to_lowercase).collect()
}

/// Kafka's `PatternType`s that ACLs are stored under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PatternType {
    Literal = 3,
    Prefixed = 4,
}

impl PatternType {
    pub fn code(self) -> i8 {
        self as i8
    }

    pub fn from_code(code: i8) -> Option<PatternType> {
        match code {
            3 => Some(PatternType::Literal),
            4 => Some(PatternType::Prefixed),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PatternType::Literal => "LITERAL",
            PatternType::Prefixed => "PREFIXED",
        }
    }

    fn parse(s: &str) -> Option<PatternType> {
        match s.to_ascii_uppercase().as_str() {
            "LITERAL" => Some(PatternType::Literal),
            "PREFIXED" => Some(PatternType::Prefixed),
            _ => None,
        }
    }
}

/// Kafka's `AclOperation` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    All = 2,
    Read = 3,
    Write = 4,
    Create = 5,
    Delete = 6,
    Alter = 7,
    Describe = 8,
    ClusterAction = 9,
    DescribeConfigs = 10,
    AlterConfigs = 11,
    IdempotentWrite = 12,
    CreateTokens = 13,
    DescribeTokens = 14,
}

impl Operation {
    const ALL_OPS: [Operation; 13] = [
        Operation::All,
        Operation::Read,
        Operation::Write,
        Operation::Create,
        Operation::Delete,
        Operation::Alter,
        Operation::Describe,
        Operation::ClusterAction,
        Operation::DescribeConfigs,
        Operation::AlterConfigs,
        Operation::IdempotentWrite,
        Operation::CreateTokens,
        Operation::DescribeTokens,
    ];

    pub fn code(self) -> i8 {
        self as i8
    }

    pub fn from_code(code: i8) -> Option<Operation> {
        Self::ALL_OPS.into_iter().find(|o| o.code() == code)
    }

    /// The name in the znode JSON (Kafka's `SecurityUtils.operationName`).
    pub fn name(self) -> &'static str {
        match self {
            Operation::All => "All",
            Operation::Read => "Read",
            Operation::Write => "Write",
            Operation::Create => "Create",
            Operation::Delete => "Delete",
            Operation::Alter => "Alter",
            Operation::Describe => "Describe",
            Operation::ClusterAction => "ClusterAction",
            Operation::DescribeConfigs => "DescribeConfigs",
            Operation::AlterConfigs => "AlterConfigs",
            Operation::IdempotentWrite => "IdempotentWrite",
            Operation::CreateTokens => "CreateTokens",
            Operation::DescribeTokens => "DescribeTokens",
        }
    }

    fn parse(s: &str) -> Option<Operation> {
        let want = normalized(s);
        Self::ALL_OPS.into_iter().find(|o| normalized(o.name()) == want)
    }

    /// The operations whose ALLOW grants this one: READ, WRITE, DELETE and ALTER imply
    /// DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS. (A DENY is never widened so.)
    fn granted_by(self) -> &'static [Operation] {
        use Operation::*;
        match self {
            Describe => &[Describe, Read, Write, Delete, Alter],
            DescribeConfigs => &[DescribeConfigs, AlterConfigs],
            Read => &[Read],
            Write => &[Write],
            Create => &[Create],
            Delete => &[Delete],
            Alter => &[Alter],
            ClusterAction => &[ClusterAction],
            AlterConfigs => &[AlterConfigs],
            IdempotentWrite => &[IdempotentWrite],
            CreateTokens => &[CreateTokens],
            DescribeTokens => &[DescribeTokens],
            All => &[All],
        }
    }
}

/// Kafka's `AclPermissionType` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Permission {
    Deny = 2,
    Allow = 3,
}

impl Permission {
    pub fn code(self) -> i8 {
        self as i8
    }

    pub fn from_code(code: i8) -> Option<Permission> {
        match code {
            2 => Some(Permission::Deny),
            3 => Some(Permission::Allow),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Permission::Deny => "Deny",
            Permission::Allow => "Allow",
        }
    }

    fn parse(s: &str) -> Option<Permission> {
        match s.to_ascii_lowercase().as_str() {
            "deny" => Some(Permission::Deny),
            "allow" => Some(Permission::Allow),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourcePattern {
    pub resource_type: ResourceType,
    pub name: String,
    pub pattern_type: PatternType,
}

impl ResourcePattern {
    pub fn new(resource_type: ResourceType, name: impl Into<String>, pattern_type: PatternType) -> ResourcePattern {
        ResourcePattern { resource_type, name: name.into(), pattern_type }
    }

    /// The znode holding this pattern's ACLs.
    pub fn path(&self) -> String {
        format!("{}/{}", type_dir(self.pattern_type, self.resource_type), self.name)
    }

    /// Where a change of this pattern is announced, and what the notification holds.
    pub fn change_notification(&self) -> (String, String) {
        match self.pattern_type {
            PatternType::Literal => {
                (format!("{ACL_CHANGES}/{CHANGE_PREFIX}"), format!("{}:{}", self.resource_type.name(), self.name))
            }
            PatternType::Prefixed => (
                format!("{EXTENDED_ACL_CHANGES}/{CHANGE_PREFIX}"),
                json!({
                    "version": 1,
                    "resourceType": self.resource_type.enum_name(),
                    "name": self.name,
                    "patternType": self.pattern_type.name(),
                })
                .to_string(),
            ),
        }
    }
}

fn type_dir(pattern: PatternType, resource_type: ResourceType) -> String {
    match pattern {
        PatternType::Literal => format!("{ACL_PATH}/{}", resource_type.name()),
        PatternType::Prefixed => format!("{EXTENDED_ACL_PATH}/prefixed/{}", resource_type.name()),
    }
}

/// Reads a change notification's data: `Type:name` under `/kafka-acl-changes`, Kafka's JSON
/// event under `/kafka-acl-extended-changes`.
pub fn parse_change_notification(extended: bool, data: &str) -> Option<ResourcePattern> {
    if !extended {
        let (t, name) = data.split_once(':')?;
        return Some(ResourcePattern::new(ResourceType::parse(t)?, name, PatternType::Literal));
    }
    let v: Value = serde_json::from_str(data).ok()?;
    if v.get("version").and_then(Value::as_i64).is_some_and(|n| n > 1) {
        return None;
    }
    Some(ResourcePattern::new(
        ResourceType::parse(v.get("resourceType")?.as_str()?)?,
        v.get("name")?.as_str()?,
        PatternType::parse(v.get("patternType")?.as_str()?)?,
    ))
}

/// One access control entry of a pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AclEntry {
    /// `Type:name`, e.g. `User:alice`, or `User:*`.
    pub principal: String,
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

impl AclEntry {
    fn matches(&self, principal: &str, host: &str, op: Operation, permission: Permission) -> bool {
        self.permission == permission
            && (self.operation == op || self.operation == Operation::All)
            && (self.principal == principal || self.principal == WILDCARD_PRINCIPAL)
            && (self.host == host || self.host == WILDCARD)
    }
}

/// The znode JSON of a pattern's ACLs.
pub fn acls_json(acls: &BTreeSet<AclEntry>) -> String {
    let entries: Vec<Value> = acls
        .iter()
        .map(|a| {
            json!({
                "principal": a.principal,
                "permissionType": a.permission.name(),
                "operation": a.operation.name(),
                "host": a.host,
            })
        })
        .collect();
    json!({"version": 1, "acls": entries}).to_string()
}

/// Parses a pattern znode. An entry gregor does not understand is skipped with a warning
/// rather than failing the whole pattern.
pub fn parse_acls(data: &str) -> BTreeSet<AclEntry> {
    let mut out = BTreeSet::new();
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        tracing::warn!("ACL znode is not JSON; ignored");
        return out;
    };
    for a in v.get("acls").and_then(Value::as_array).into_iter().flatten() {
        let field = |k: &str| a.get(k).and_then(Value::as_str);
        let entry = (|| {
            Some(AclEntry {
                principal: field("principal")?.to_string(),
                host: field("host")?.to_string(),
                operation: Operation::parse(field("operation")?)?,
                permission: Permission::parse(field("permissionType")?)?,
            })
        })();
        match entry {
            Some(e) => {
                out.insert(e);
            }
            None => tracing::warn!(acl = %a, "ACL entry not understood; ignored"),
        }
    }
    out
}

/// Every ACL this broker knows, by pattern.
#[derive(Default, Debug)]
pub struct AclSnapshot {
    pub acls: BTreeMap<ResourcePattern, BTreeSet<AclEntry>>,
    /// The lengths of the prefixed patterns of each type, so a decision looks up only the
    /// prefixes of a name that some pattern could be.
    prefix_lengths: HashMap<ResourceType, BTreeSet<usize>>,
}

impl AclSnapshot {
    fn from_acls(acls: BTreeMap<ResourcePattern, BTreeSet<AclEntry>>) -> AclSnapshot {
        let mut prefix_lengths: HashMap<ResourceType, BTreeSet<usize>> = HashMap::new();
        for p in acls.keys().filter(|p| p.pattern_type == PatternType::Prefixed) {
            prefix_lengths.entry(p.resource_type).or_default().insert(p.name.len());
        }
        AclSnapshot { acls, prefix_lengths }
    }

    /// The ACL sets of every pattern that covers `name`: the literal name, the literal
    /// wildcard, and each prefix pattern.
    fn matching(&self, resource_type: ResourceType, name: &str) -> Vec<&BTreeSet<AclEntry>> {
        let mut out = Vec::new();
        let mut probe = ResourcePattern::new(resource_type, name, PatternType::Literal);
        if let Some(a) = self.acls.get(&probe) {
            out.push(a);
        }
        if name != WILDCARD {
            probe.name = WILDCARD.to_string();
            if let Some(a) = self.acls.get(&probe) {
                out.push(a);
            }
        }
        if let Some(lengths) = self.prefix_lengths.get(&resource_type) {
            probe.pattern_type = PatternType::Prefixed;
            for &len in lengths.iter().take_while(|&&l| l <= name.len()) {
                if !name.is_char_boundary(len) {
                    continue;
                }
                probe.name.clear();
                probe.name.push_str(&name[..len]);
                if let Some(a) = self.acls.get(&probe) {
                    out.push(a);
                }
            }
        }
        out
    }
}

/// Who asks, from where: the subject of a decision.
pub struct Session<'a> {
    pub principal: &'a KafkaPrincipal,
    pub host: Option<IpAddr>,
}

pub struct Authorizer {
    super_users: HashSet<String>,
    allow_if_no_acls: bool,
    acls: RwLock<Arc<AclSnapshot>>,
}

impl Authorizer {
    /// The authorizer `authorizer.class.name` asks for, if any; another class is refused.
    pub fn from_config(values: &BTreeMap<String, String>) -> Result<Option<Authorizer>, ConfigError> {
        let key = "authorizer.class.name";
        let class = values.get(key).map(|v| v.trim()).unwrap_or("");
        if class.is_empty() {
            return Ok(None);
        }
        if !ACL_AUTHORIZER_CLASSES.contains(&class) {
            return Err(super::refuse(
                key,
                format!(
                    "{class} cannot be loaded by gregor; only Kafka's ZooKeeper ACL authorizer ({}) is served",
                    ACL_AUTHORIZER_CLASSES.join(" or ")
                ),
            ));
        }
        let super_users = values
            .get("super.users")
            .map(|v| v.split(';').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect())
            .unwrap_or_default();
        let key = "allow.everyone.if.no.acl.found";
        let allow_if_no_acls = match values.get(key).map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("false") => false,
            Some("true") => true,
            Some(other) => return Err(super::refuse(key, format!("{other:?} is not true or false"))),
        };
        Ok(Some(Authorizer::new(super_users, allow_if_no_acls)))
    }

    pub fn new(super_users: HashSet<String>, allow_if_no_acls: bool) -> Authorizer {
        Authorizer { super_users, allow_if_no_acls, acls: RwLock::new(Arc::new(AclSnapshot::default())) }
    }

    pub fn snapshot(&self) -> Arc<AclSnapshot> {
        self.acls.read_unpoisoned().clone()
    }

    fn is_super_user(&self, principal: &KafkaPrincipal) -> bool {
        self.super_users.contains(&principal.to_string())
    }

    /// Kafka's decision: super users may do anything; a pattern-less resource follows
    /// `allow.everyone.if.no.acl.found`; otherwise a matching DENY wins over any ALLOW, and an
    /// ALLOW of the operation (or of one implying it) is needed.
    pub fn authorize(&self, session: &Session, op: Operation, resource_type: ResourceType, name: &str) -> bool {
        if self.is_super_user(session.principal) {
            return true;
        }
        let snapshot = self.snapshot();
        let sets = snapshot.matching(resource_type, name);
        if sets.iter().all(|s| s.is_empty()) {
            return self.allow_if_no_acls;
        }
        let principal = session.principal.to_string();
        let host = session.host.map(|h| h.to_string()).unwrap_or_default();
        let any = |op: Operation, permission: Permission| {
            sets.iter().any(|s| s.iter().any(|a| a.matches(&principal, &host, op, permission)))
        };
        if any(op, Permission::Deny) {
            return false;
        }
        op.granted_by().iter().any(|&o| any(o, Permission::Allow))
    }

    /// Whether the operation is allowed on at least one resource of the type (Kafka's
    /// `authorizeByResourceType`, which InitProducerId uses for WRITE on any topic): an ALLOW
    /// pattern not covered by a DENY pattern of the same or a shorter prefix.
    pub fn authorize_any(&self, session: &Session, op: Operation, resource_type: ResourceType) -> bool {
        if self.is_super_user(session.principal) {
            return true;
        }
        let snapshot = self.snapshot();
        let principal = session.principal.to_string();
        let host = session.host.map(|h| h.to_string()).unwrap_or_default();
        let of_type: Vec<(&ResourcePattern, &BTreeSet<AclEntry>)> =
            snapshot.acls.iter().filter(|(p, _)| p.resource_type == resource_type).collect();
        if of_type.is_empty() {
            return self.allow_if_no_acls;
        }
        let with = |permission: Permission| -> Vec<&ResourcePattern> {
            of_type
                .iter()
                .filter(|(_, acls)| acls.iter().any(|a| a.matches(&principal, &host, op, permission)))
                .map(|(p, _)| *p)
                .collect()
        };
        let denied = with(Permission::Deny);
        if denied.iter().any(|p| p.pattern_type == PatternType::Literal && p.name == WILDCARD) {
            return false;
        }
        with(Permission::Allow).into_iter().any(|allowed| {
            !denied.iter().any(|d| match (d.pattern_type, allowed.pattern_type) {
                (PatternType::Literal, PatternType::Literal) => d.name == allowed.name,
                (PatternType::Prefixed, _) => allowed.name.starts_with(&d.name),
                (PatternType::Literal, PatternType::Prefixed) => false,
            })
        })
    }

    /// The bit field of the operations allowed on a resource (`1 << code`), as Metadata,
    /// DescribeCluster and DescribeGroups report them.
    pub fn authorized_operations(&self, session: &Session, resource_type: ResourceType, name: &str) -> i32 {
        resource_type
            .supported_operations()
            .iter()
            .filter(|&&op| self.authorize(session, op, resource_type, name))
            .fold(0, |bits, op| bits | (1 << op.code()))
    }

    fn swap(&self, f: impl FnOnce(&mut BTreeMap<ResourcePattern, BTreeSet<AclEntry>>)) {
        let mut guard = self.acls.write_unpoisoned();
        let mut acls = guard.acls.clone();
        f(&mut acls);
        *guard = Arc::new(AclSnapshot::from_acls(acls));
    }

    /// Reads every pattern (at start and after a new ZooKeeper session, when notifications
    /// may have been missed).
    pub fn load_all(&self, store: &ZnodeStore) -> Result<(), StoreError> {
        let mut all = BTreeMap::new();
        for pattern_type in [PatternType::Literal, PatternType::Prefixed] {
            for resource_type in ResourceType::ALL {
                let dir = type_dir(pattern_type, resource_type);
                for name in store.try_children(&dir)? {
                    let pattern = ResourcePattern::new(resource_type, name, pattern_type);
                    if let Some(data) = store.try_get(&pattern.path())? {
                        let acls = parse_acls(&data);
                        if !acls.is_empty() {
                            all.insert(pattern, acls);
                        }
                    }
                }
            }
        }
        let count: usize = all.values().map(BTreeSet::len).sum();
        tracing::info!(patterns = all.len(), acls = count, "ACLs loaded");
        *self.acls.write_unpoisoned() = Arc::new(AclSnapshot::from_acls(all));
        Ok(())
    }

    /// Re-reads one pattern after a change to it. The read happens before the swap, so no
    /// lock is held across I/O.
    pub fn reload(&self, store: &ZnodeStore, pattern: &ResourcePattern) -> Result<(), StoreError> {
        let acls = store.try_get(&pattern.path())?.map(|d| parse_acls(&d)).unwrap_or_default();
        self.set_pattern(pattern, acls);
        Ok(())
    }

    /// Installs what this broker just wrote for a pattern.
    pub fn set_pattern(&self, pattern: &ResourcePattern, acls: BTreeSet<AclEntry>) {
        self.swap(|all| {
            if acls.is_empty() {
                all.remove(pattern);
            } else {
                all.insert(pattern.clone(), acls);
            }
        });
    }

    /// Handles one change notification node (a path under either change root).
    pub fn process_notification(&self, store: &ZnodeStore, path: &str) -> Result<(), StoreError> {
        let extended = path.starts_with(&format!("{EXTENDED_ACL_CHANGES}/"));
        let Some(data) = store.try_get(path)? else { return Ok(()) };
        match parse_change_notification(extended, &data) {
            Some(pattern) => {
                tracing::debug!(?pattern, "ACL change notification");
                self.reload(store, &pattern)
            }
            None => {
                tracing::warn!(%path, %data, "ACL change notification not understood; ignored");
                Ok(())
            }
        }
    }
}

/// The paths Kafka's authorizer creates when it starts.
pub const ROOT_PATHS: &[&str] = &[
    ACL_PATH,
    ACL_CHANGES,
    EXTENDED_ACL_CHANGES,
    "/kafka-acl-extended/prefixed",
    "/kafka-acl/Topic",
    "/kafka-acl/Group",
    "/kafka-acl/Cluster",
    "/kafka-acl/TransactionalId",
    "/kafka-acl/DelegationToken",
    "/kafka-acl/User",
];

#[cfg(test)]
mod tests;
