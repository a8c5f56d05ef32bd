//! DescribeClientQuotas and AlterClientQuotas (v0-1). As in ZooKeeper-mode Kafka any broker
//! serves them: it reads or writes the quota znodes itself (blocking: run off the runtime).

use kafka_protocol::messages::alter_client_quotas_response::{EntityData as AlterEntity, EntryData as AlterEntry};
use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest, DescribeClientQuotasResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::RequestContext;
use crate::client_quota::{self, check_alteration, Entity, CLIENT_ID, IP, USER};
use crate::protocol::ErrorCode;
use crate::security::authorizer::Operation;

const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;
const MATCH_SPECIFIED: i8 = 2;

/// One filter component: the entity type and what its name must be (None: any name).
enum NameMatch {
    Exact(String),
    Default,
    Any,
}

fn matches(slot: &Option<Option<String>>, want: Option<&NameMatch>, strict: bool) -> bool {
    match (want, slot) {
        (None, None) => true,
        (None, Some(_)) => !strict,
        (Some(_), None) => false,
        (Some(NameMatch::Any), Some(_)) => true,
        (Some(NameMatch::Default), Some(n)) => n.is_none(),
        (Some(NameMatch::Exact(w)), Some(n)) => n.as_deref() == Some(w.as_str()),
    }
}

fn entity_data(e: &Entity) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    if let Some(u) = &e.user {
        out.push((USER.to_string(), u.clone()));
    }
    if let Some(c) = &e.client {
        out.push((CLIENT_ID.to_string(), c.clone()));
    }
    out
}

pub fn describe_client_quotas(ctx: &RequestContext, req: DescribeClientQuotasRequest) -> DescribeClientQuotasResponse {
    let mut r = DescribeClientQuotasResponse::default();
    // null on success, as Kafka answers (the crate's default is an empty string)
    r.error_message = None;
    if !ctx.authorized_cluster(Operation::DescribeConfigs) {
        r.error_code = ErrorCode::ClusterAuthorizationFailed.code();
        r.error_message = Some(StrBytes::from_static_str("Cluster authorization failed."));
        r.entries = None;
        return r;
    }
    let fail = |r: &mut DescribeClientQuotasResponse, m: String| {
        r.error_code = ErrorCode::InvalidRequest.code();
        r.error_message = Some(StrBytes::from_string(m));
        r.entries = None;
    };
    let (mut user, mut client, mut ip) = (None, None, None);
    for c in &req.components {
        let want = match (c.match_type, &c._match) {
            (MATCH_EXACT, Some(n)) => NameMatch::Exact(n.to_string()),
            (MATCH_DEFAULT, _) => NameMatch::Default,
            (MATCH_SPECIFIED, _) => NameMatch::Any,
            (t, _) => {
                fail(&mut r, format!("Unexpected match type {t}"));
                return r;
            }
        };
        let slot = match c.entity_type.as_str() {
            USER => &mut user,
            CLIENT_ID => &mut client,
            IP => &mut ip,
            other => {
                fail(&mut r, format!("Custom entity type '{other}' not supported"));
                return r;
            }
        };
        if slot.replace(want).is_some() {
            fail(&mut r, format!("Duplicate {} filter component entity type", c.entity_type.as_str()));
            return r;
        }
    }
    if ip.is_some() && (user.is_some() || client.is_some()) {
        fail(&mut r, "Invalid entity filter component combination, IP filter component should not be used with user or clientId filter component.".into());
        return r;
    }
    let table = match ctx.components.quotas.read_client_quotas() {
        Ok(t) => t,
        Err(e) => {
            r.error_code = ErrorCode::UnknownServerError.code();
            r.error_message = Some(StrBytes::from_string(e.to_string()));
            return r;
        }
    };
    let mut entries = Vec::new();
    // IP quotas are never stored (they are refused), so an IP filter finds nothing.
    if ip.is_none() {
        for (entity, values) in &table {
            if !matches(&entity.user, user.as_ref(), req.strict)
                || !matches(&entity.client, client.as_ref(), req.strict)
            {
                continue;
            }
            let mut entry = EntryData::default();
            entry.entity = entity_data(entity)
                .into_iter()
                .map(|(t, n)| {
                    let mut d = EntityData::default();
                    d.entity_type = StrBytes::from_string(t);
                    d.entity_name = n.map(StrBytes::from_string);
                    d
                })
                .collect();
            entry.values = values
                .iter()
                .map(|(k, v)| {
                    let mut d = ValueData::default();
                    d.key = StrBytes::from_string(k.clone());
                    d.value = *v;
                    d
                })
                .collect();
            entries.push(entry);
        }
    }
    r.entries = Some(entries);
    r
}

pub fn alter_client_quotas(ctx: &RequestContext, req: AlterClientQuotasRequest) -> AlterClientQuotasResponse {
    let mut r = AlterClientQuotasResponse::default();
    let allowed = ctx.authorized_cluster(Operation::AlterConfigs);
    for entry in req.entries {
        let pairs: Vec<(String, Option<String>)> = entry
            .entity
            .iter()
            .map(|e| (e.entity_type.to_string(), e.entity_name.as_ref().map(|n| n.to_string())))
            .collect();
        let mut out = AlterEntry::default();
        out.error_message = None;
        out.entity = entry
            .entity
            .iter()
            .map(|e| {
                let mut d = AlterEntity::default();
                d.entity_type = e.entity_type.clone();
                d.entity_name = e.entity_name.clone();
                d
            })
            .collect();
        let keys: Vec<&str> = entry.ops.iter().map(|o| o.key.as_str()).collect();
        let allowed = match allowed {
            true => Ok(()),
            false => Err((ErrorCode::ClusterAuthorizationFailed, "Cluster authorization failed.".to_string())),
        };
        let checked = allowed
            .and_then(|()| check_alteration(&pairs, &keys).map_err(|m| (ErrorCode::InvalidRequest, m)))
            .and_then(|entity| {
                let mut ops = Vec::new();
                for op in &entry.ops {
                    if op.remove {
                        ops.push((op.key.to_string(), None));
                        continue;
                    }
                    // Both byte rates are Kafka LONG configs of at least 1 byte/s.
                    let v = op.value;
                    let invalid = |m: String| Err((ErrorCode::InvalidRequest, m));
                    if !v.is_finite() || (v - v.round()).abs() > 1e-6 {
                        return invalid(format!("Configuration {} must be a Long value", op.key.as_str()));
                    }
                    if v < 1.0 {
                        return invalid(format!("Configuration {} must be at least 1, got {v}", op.key.as_str()));
                    }
                    ops.push((op.key.to_string(), Some(v)));
                }
                Ok((entity, ops))
            });
        match checked {
            Err((code, m)) => {
                out.error_code = code.code();
                out.error_message = Some(StrBytes::from_string(m));
            }
            Ok(_) if req.validate_only => {}
            Ok((entity, ops)) => {
                if let Err(e) = ctx.components.quotas.alter_client_quota(&entity, &ops) {
                    out.error_code = ErrorCode::UnknownServerError.code();
                    out.error_message = Some(StrBytes::from_string(e.to_string()));
                } else {
                    tracing::info!(path = ?entity.path(), ?ops, "client quota altered");
                }
            }
        }
        r.entries.push(out);
    }
    r
}

/// The principal and client id a request's quotas are looked up by.
pub fn quota_identity(ctx: &RequestContext) -> (&'static str, String) {
    let client = ctx.header.client_id.as_ref().map(|c| c.to_string()).unwrap_or_default();
    (client_quota::ANONYMOUS, client)
}
