//! CreateAcls (30), DescribeAcls (29) and DeleteAcls (31) as a ZooKeeper-mode broker answers
//! them: each changed pattern's znode is rewritten (compare-and-set on its version), its change
//! announced under `/kafka-acl-changes` or `/kafka-acl-extended-changes`, and this broker's
//! copy updated at once; the other brokers follow the notification.
//!
//! Creating and deleting need ALTER on the cluster, describing DESCRIBE; without an
//! authorizer each is answered SECURITY_DISABLED, as Kafka does.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{DeleteAclsFilterResult, DeleteAclsMatchingAcl};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse, DescribeAclsRequest,
    DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::metadata::{StoreError, ZnodeStore};
use crate::protocol::ErrorCode;
use crate::security::authorizer::{
    acls_json, parse_acls, AclEntry, Authorizer, Operation, PatternType, Permission, ResourcePattern, ResourceType,
    CLUSTER_NAME, WILDCARD,
};

/// Kafka's codes for "any" and "match" in filters.
const ANY: i8 = 1;
const MATCH: i8 = 2;
/// Attempts at a compare-and-set of one pattern's znode before giving up.
const WRITE_ATTEMPTS: usize = 10;

fn message(code: ErrorCode, text: &str) -> (i16, Option<StrBytes>) {
    (code.code(), Some(StrBytes::from_string(text.to_string())))
}

const NO_AUTHORIZER: &str = "No Authorizer is configured on the broker";

/// One binding of a CreateAcls request, checked as Kafka checks it.
fn binding(
    resource_type: i8,
    name: &str,
    pattern_type: i8,
    principal: &str,
    host: &str,
    operation: i8,
    permission: i8,
) -> Result<(ResourcePattern, AclEntry), String> {
    let resource_type = ResourceType::from_code(resource_type).ok_or("Invalid ACL creation: unknown resource type")?;
    let pattern_type = PatternType::from_code(pattern_type).ok_or("Invalid ACL creation: unknown pattern type")?;
    let operation = Operation::from_code(operation).ok_or("Invalid ACL creation: unknown operation")?;
    let permission = Permission::from_code(permission).ok_or("Invalid ACL creation: unknown permission type")?;
    if name.is_empty() {
        return Err("Invalid empty resource name".into());
    }
    if resource_type == ResourceType::Cluster && name != CLUSTER_NAME {
        return Err(format!("The only valid name for the CLUSTER resource is {CLUSTER_NAME}"));
    }
    if !principal.split_once(':').is_some_and(|(t, n)| !t.is_empty() && !n.is_empty()) {
        return Err(format!("Could not parse principal from `{principal}` (no colon is present separating the principal type from the principal name)"));
    }
    if host.is_empty() {
        return Err("Invalid empty host".into());
    }
    // The name becomes a znode name.
    if name.contains('/') || name == "." || name == ".." {
        return Err(format!("Invalid resource name {name:?}: it cannot be a ZooKeeper node name"));
    }
    Ok((
        ResourcePattern::new(resource_type, name, pattern_type),
        AclEntry { principal: principal.to_string(), host: host.to_string(), operation, permission },
    ))
}

/// A DescribeAcls or DeleteAcls filter (Kafka's `AclBindingFilter`).
#[derive(Debug, Clone)]
pub struct AclFilter {
    resource_type: Option<ResourceType>,
    name: Option<String>,
    /// None: ANY; Some(None): MATCH; Some(Some(t)): that pattern type.
    pattern_type: Option<Option<PatternType>>,
    principal: Option<String>,
    host: Option<String>,
    operation: Option<Operation>,
    permission: Option<Permission>,
}

impl AclFilter {
    pub fn parse(
        resource_type: i8,
        name: Option<&str>,
        pattern_type: i8,
        principal: Option<&str>,
        host: Option<&str>,
        operation: i8,
        permission: i8,
    ) -> Result<AclFilter, String> {
        let any_or = |code: i8, what: &str, parse: &dyn Fn(i8) -> bool| -> Result<bool, String> {
            if code == ANY {
                Ok(true)
            } else if parse(code) {
                Ok(false)
            } else {
                Err(format!("Invalid ACL filter: unknown {what}"))
            }
        };
        let resource_type = match any_or(resource_type, "resource type", &|c| ResourceType::from_code(c).is_some())? {
            true => None,
            false => ResourceType::from_code(resource_type),
        };
        let pattern_type = match pattern_type {
            ANY => None,
            MATCH => Some(None),
            c => Some(Some(PatternType::from_code(c).ok_or("Invalid ACL filter: unknown pattern type")?)),
        };
        let operation = match any_or(operation, "operation", &|c| Operation::from_code(c).is_some())? {
            true => None,
            false => Operation::from_code(operation),
        };
        let permission = match any_or(permission, "permission type", &|c| Permission::from_code(c).is_some())? {
            true => None,
            false => Permission::from_code(permission),
        };
        Ok(AclFilter {
            resource_type,
            name: name.map(str::to_string),
            pattern_type,
            principal: principal.map(str::to_string),
            host: host.map(str::to_string),
            operation,
            permission,
        })
    }

    /// Kafka's `ResourcePatternFilter.matches`: MATCH selects every pattern that covers the
    /// name (the literal, the wildcard, the prefixes of it); ANY or a given type, only
    /// patterns with exactly that name.
    pub fn matches_pattern(&self, p: &ResourcePattern) -> bool {
        if self.resource_type.is_some_and(|t| t != p.resource_type) {
            return false;
        }
        if let Some(Some(t)) = self.pattern_type {
            if t != p.pattern_type {
                return false;
            }
        }
        let Some(name) = &self.name else { return true };
        match self.pattern_type {
            Some(None) => match p.pattern_type {
                PatternType::Literal => *name == p.name || p.name == WILDCARD,
                PatternType::Prefixed => name.starts_with(&p.name),
            },
            _ => *name == p.name,
        }
    }

    pub fn matches_entry(&self, a: &AclEntry) -> bool {
        self.principal.as_ref().is_none_or(|p| *p == a.principal)
            && self.host.as_ref().is_none_or(|h| *h == a.host)
            && self.operation.is_none_or(|o| o == a.operation)
            && self.permission.is_none_or(|p| p == a.permission)
    }

    /// A filter that names one exact pattern, so a delete reads one znode instead of all.
    fn exact_patterns(&self) -> Option<Vec<ResourcePattern>> {
        let (Some(t), Some(name)) = (self.resource_type, &self.name) else { return None };
        match self.pattern_type {
            Some(Some(p)) => Some(vec![ResourcePattern::new(t, name.clone(), p)]),
            _ => None,
        }
    }
}

pub fn create_acls(ctx: &RequestContext, req: CreateAclsRequest) -> CreateAclsResponse {
    let refused = |code: ErrorCode, text: &str| {
        let results = req
            .creations
            .iter()
            .map(|_| {
                let mut r = AclCreationResult::default();
                (r.error_code, r.error_message) = message(code, text);
                r
            })
            .collect();
        let mut resp = CreateAclsResponse::default();
        resp.results = results;
        resp
    };
    let Some(authorizer) = &ctx.components.security.authorizer else {
        return refused(ErrorCode::SecurityDisabled, NO_AUTHORIZER);
    };
    if !ctx.authorized_cluster(Operation::Alter) {
        return refused(ErrorCode::ClusterAuthorizationFailed, "Cluster authorization failed.");
    }
    let mut outcomes: Vec<Result<(), (ErrorCode, String)>> = Vec::with_capacity(req.creations.len());
    let mut wanted: BTreeMap<ResourcePattern, Vec<(usize, AclEntry)>> = BTreeMap::new();
    for (i, c) in req.creations.iter().enumerate() {
        match binding(
            c.resource_type,
            &c.resource_name,
            c.resource_pattern_type,
            &c.principal,
            &c.host,
            c.operation,
            c.permission_type,
        ) {
            Ok((pattern, entry)) => {
                outcomes.push(Ok(()));
                wanted.entry(pattern).or_default().push((i, entry));
            }
            Err(e) => outcomes.push(Err((ErrorCode::InvalidRequest, e))),
        }
    }
    for (pattern, entries) in wanted {
        let added: Vec<AclEntry> = entries.iter().map(|(_, e)| e.clone()).collect();
        let result = update_pattern(&ctx.components.store, authorizer, &pattern, |set| {
            set.extend(added.iter().cloned());
        });
        match result {
            Ok(_) => tracing::info!(?pattern, count = entries.len(), principal = %ctx.principal, "ACLs created"),
            Err(e) => {
                tracing::warn!(?pattern, error = %e, "cannot store ACLs");
                for (i, _) in &entries {
                    if let Some(o) = outcomes.get_mut(*i) {
                        *o = Err((ErrorCode::UnknownServerError, e.to_string()));
                    }
                }
            }
        }
    }
    let mut resp = CreateAclsResponse::default();
    resp.results = outcomes
        .into_iter()
        .map(|o| {
            let mut r = AclCreationResult::default();
            if let Err((code, text)) = o {
                (r.error_code, r.error_message) = message(code, &text);
            }
            r
        })
        .collect();
    resp
}

/// Rewrites one pattern's znode with `change` applied, announces it and installs it here.
/// Returns the set before the change. Runs on the blocking pool; no lock is held meanwhile.
fn update_pattern(
    store: &ZnodeStore,
    authorizer: &Authorizer,
    pattern: &ResourcePattern,
    change: impl Fn(&mut BTreeSet<AclEntry>),
) -> Result<BTreeSet<AclEntry>, StoreError> {
    let path = pattern.path();
    for _ in 0..WRITE_ATTEMPTS {
        let current = store.get_versioned(&path)?;
        let before = current.as_ref().map(|(d, _)| parse_acls(d)).unwrap_or_default();
        let mut after = before.clone();
        change(&mut after);
        if after == before {
            return Ok(before);
        }
        let written = match (&current, after.is_empty()) {
            (None, _) => store.create(&path, &acls_json(&after), false),
            // Kafka removes a pattern's znode with its last ACL; conditionally, so an ACL
            // another broker added meanwhile is not lost with it.
            (Some((_, version)), true) => store.delete_if_version(&path, *version),
            (Some((_, version)), false) => store.set_if_version(&path, &acls_json(&after), *version),
        };
        match written {
            Ok(()) => {
                let (prefix, data) = pattern.change_notification();
                store.create_sequential(&prefix, &data)?;
                authorizer.set_pattern(pattern, after);
                return Ok(before);
            }
            // Another broker changed it between the read and the write: read again.
            Err(StoreError::BadVersion(_) | StoreError::NodeExists(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::ZooKeeper(format!("{path} kept changing; gave up after {WRITE_ATTEMPTS} attempts")))
}

fn filter_error<T>(e: String) -> Result<T, (ErrorCode, String)> {
    Err((ErrorCode::InvalidRequest, e))
}

pub fn describe_acls(ctx: &RequestContext, req: DescribeAclsRequest) -> DescribeAclsResponse {
    let mut resp = DescribeAclsResponse::default();
    let Some(authorizer) = &ctx.components.security.authorizer else {
        (resp.error_code, resp.error_message) = message(ErrorCode::SecurityDisabled, NO_AUTHORIZER);
        return resp;
    };
    if !ctx.authorized_cluster(Operation::Describe) {
        (resp.error_code, resp.error_message) =
            message(ErrorCode::ClusterAuthorizationFailed, "Cluster authorization failed.");
        return resp;
    }
    let filter = AclFilter::parse(
        req.resource_type_filter,
        req.resource_name_filter.as_deref(),
        req.pattern_type_filter,
        req.principal_filter.as_deref(),
        req.host_filter.as_deref(),
        req.operation,
        req.permission_type,
    )
    .or_else(filter_error);
    let filter = match filter {
        Ok(f) => f,
        Err((code, text)) => {
            (resp.error_code, resp.error_message) = message(code, &text);
            return resp;
        }
    };
    let snapshot = authorizer.snapshot();
    resp.resources = snapshot
        .acls
        .iter()
        .filter(|(p, _)| filter.matches_pattern(p))
        .filter_map(|(p, acls)| {
            let acls: Vec<AclDescription> = acls
                .iter()
                .filter(|a| filter.matches_entry(a))
                .map(|a| {
                    let mut d = AclDescription::default();
                    d.principal = StrBytes::from_string(a.principal.clone());
                    d.host = StrBytes::from_string(a.host.clone());
                    d.operation = a.operation.code();
                    d.permission_type = a.permission.code();
                    d
                })
                .collect();
            if acls.is_empty() {
                return None;
            }
            let mut r = DescribeAclsResource::default();
            r.resource_type = p.resource_type.code();
            r.resource_name = StrBytes::from_string(p.name.clone());
            r.pattern_type = p.pattern_type.code();
            r.acls = acls;
            Some(r)
        })
        .collect();
    resp
}

pub fn delete_acls(ctx: &RequestContext, req: DeleteAclsRequest) -> DeleteAclsResponse {
    let refused = |code: ErrorCode, text: &str| {
        let mut resp = DeleteAclsResponse::default();
        resp.filter_results = req
            .filters
            .iter()
            .map(|_| {
                let mut r = DeleteAclsFilterResult::default();
                (r.error_code, r.error_message) = message(code, text);
                r
            })
            .collect();
        resp
    };
    let Some(authorizer) = &ctx.components.security.authorizer else {
        return refused(ErrorCode::SecurityDisabled, NO_AUTHORIZER);
    };
    if !ctx.authorized_cluster(Operation::Alter) {
        return refused(ErrorCode::ClusterAuthorizationFailed, "Cluster authorization failed.");
    }
    let mut results = Vec::with_capacity(req.filters.len());
    for f in &req.filters {
        let mut result = DeleteAclsFilterResult::default();
        let filter = match AclFilter::parse(
            f.resource_type_filter,
            f.resource_name_filter.as_deref(),
            f.pattern_type_filter,
            f.principal_filter.as_deref(),
            f.host_filter.as_deref(),
            f.operation,
            f.permission_type,
        ) {
            Ok(filter) => filter,
            Err(e) => {
                (result.error_code, result.error_message) = message(ErrorCode::InvalidRequest, &e);
                results.push(result);
                continue;
            }
        };
        let patterns: Vec<ResourcePattern> = filter.exact_patterns().unwrap_or_else(|| {
            authorizer.snapshot().acls.keys().filter(|p| filter.matches_pattern(p)).cloned().collect()
        });
        for pattern in patterns {
            let outcome = update_pattern(&ctx.components.store, authorizer, &pattern, |set| {
                set.retain(|a| !filter.matches_entry(a));
            });
            match outcome {
                Ok(before) => {
                    for a in before.iter().filter(|a| filter.matches_entry(a)) {
                        let mut m = DeleteAclsMatchingAcl::default();
                        m.resource_type = pattern.resource_type.code();
                        m.resource_name = StrBytes::from_string(pattern.name.clone());
                        m.pattern_type = pattern.pattern_type.code();
                        m.principal = StrBytes::from_string(a.principal.clone());
                        m.host = StrBytes::from_string(a.host.clone());
                        m.operation = a.operation.code();
                        m.permission_type = a.permission.code();
                        result.matching_acls.push(m);
                    }
                }
                Err(e) => {
                    tracing::warn!(?pattern, error = %e, "cannot delete ACLs");
                    (result.error_code, result.error_message) = message(ErrorCode::UnknownServerError, &e.to_string());
                }
            }
        }
        if !result.matching_acls.is_empty() {
            tracing::info!(count = result.matching_acls.len(), principal = %ctx.principal, "ACLs deleted");
        }
        results.push(result);
    }
    let mut resp = DeleteAclsResponse::default();
    resp.filter_results = results;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(t: ResourceType, name: &str, p: PatternType) -> ResourcePattern {
        ResourcePattern::new(t, name, p)
    }

    fn filter(t: i8, name: Option<&str>, p: i8) -> AclFilter {
        AclFilter::parse(t, name, p, None, None, ANY, ANY).unwrap()
    }

    #[test]
    fn pattern_filters_follow_kafkas_any_match_and_exact_rules() {
        use PatternType::*;
        use ResourceType::*;
        let lit = pattern(Topic, "orders", Literal);
        let wild = pattern(Topic, "*", Literal);
        let pre = pattern(Topic, "ord", Prefixed);
        let group = pattern(Group, "orders", Literal);
        let matching = filter(Topic.code(), Some("orders"), MATCH);
        assert!(matching.matches_pattern(&lit) && matching.matches_pattern(&wild) && matching.matches_pattern(&pre));
        assert!(!matching.matches_pattern(&group));
        let any = filter(ANY, Some("orders"), ANY);
        assert!(any.matches_pattern(&lit) && any.matches_pattern(&group));
        assert!(!any.matches_pattern(&wild) && !any.matches_pattern(&pre));
        let prefixed = filter(Topic.code(), Some("ord"), Prefixed.code());
        assert!(prefixed.matches_pattern(&pre) && !prefixed.matches_pattern(&lit));
        assert!(filter(ANY, None, ANY).matches_pattern(&pre));
        assert_eq!(prefixed.exact_patterns(), Some(vec![pre]));
        assert!(matching.exact_patterns().is_none());
    }

    #[test]
    fn entry_filters_and_unknown_codes() {
        let f = AclFilter::parse(ANY, None, ANY, Some("User:a"), None, Operation::Read.code(), ANY).unwrap();
        let e = AclEntry {
            principal: "User:a".into(),
            host: "*".into(),
            operation: Operation::Read,
            permission: Permission::Allow,
        };
        assert!(f.matches_entry(&e));
        assert!(!f.matches_entry(&AclEntry { operation: Operation::Write, ..e.clone() }));
        assert!(AclFilter::parse(0, None, ANY, None, None, ANY, ANY).is_err());
        assert!(AclFilter::parse(ANY, None, 0, None, None, ANY, ANY).is_err());
        assert!(AclFilter::parse(ANY, None, ANY, None, None, 0, ANY).is_err());
    }

    #[test]
    fn a_pattern_znode_follows_its_acls_and_the_authorizer_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = ZnodeStore::Embedded(crate::metadata::EmbeddedStore::open(dir.path().join("store")).unwrap());
        let authorizer = Authorizer::new(Default::default(), false);
        let p = pattern(ResourceType::Topic, "t", PatternType::Prefixed);
        let e = AclEntry {
            principal: "User:a".into(),
            host: "*".into(),
            operation: Operation::Read,
            permission: Permission::Allow,
        };
        let before = update_pattern(&store, &authorizer, &p, |s| {
            s.insert(e.clone());
        })
        .unwrap();
        assert!(before.is_empty());
        assert_eq!(store.get("/kafka-acl-extended/prefixed/Topic/t").map(|d| parse_acls(&d).len()), Some(1));
        assert_eq!(authorizer.snapshot().acls.get(&p).map(BTreeSet::len), Some(1));
        let before = update_pattern(&store, &authorizer, &p, |s| s.clear()).unwrap();
        assert_eq!(before.len(), 1);
        assert_eq!(store.get("/kafka-acl-extended/prefixed/Topic/t"), None, "the last ACL takes its znode along");
        assert!(authorizer.snapshot().acls.is_empty());
    }

    #[test]
    fn bindings_are_checked_as_kafka_checks_them() {
        let t = ResourceType::Topic.code();
        let ok = binding(t, "x", 3, "User:a", "*", 3, 3);
        assert!(ok.is_ok());
        assert!(binding(ANY, "x", 3, "User:a", "*", 3, 3).is_err());
        assert!(binding(t, "x", MATCH, "User:a", "*", 3, 3).is_err());
        assert!(binding(t, "x", 3, "alice", "*", 3, 3).is_err());
        assert!(binding(t, "x", 3, "User:a", "*", ANY, 3).is_err());
        assert!(binding(t, "", 3, "User:a", "*", 3, 3).is_err());
        assert!(binding(ResourceType::Cluster.code(), "c", 3, "User:a", "*", 7, 3).is_err());
        assert!(binding(ResourceType::Cluster.code(), CLUSTER_NAME, 3, "User:a", "*", 7, 3).is_ok());
    }
}
