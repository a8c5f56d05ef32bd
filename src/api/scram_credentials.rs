//! DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), as a ZooKeeper-mode
//! broker answers them: credentials live in `/config/users/<user>` and each change is
//! announced under `/config/changes`, so every broker's credential cache follows.

use std::collections::{BTreeMap, HashMap};

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
};

use super::RequestContext;
use crate::metadata::zk_data;
use crate::protocol::ErrorCode;
use crate::security::authorizer::Operation;
use crate::security::scram::{self, Mechanism, ScramCredential};

pub fn describe(
    ctx: &RequestContext,
    req: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let cache = &ctx.components.security.scram;
    if !ctx.authorized_cluster(Operation::Describe) {
        return DescribeUserScramCredentialsResponse::default()
            .with_error_code(ErrorCode::ClusterAuthorizationFailed.code())
            .with_error_message(Some("Cluster authorization failed.".into()));
    }
    let requested: Vec<String> = match req.users {
        Some(users) if !users.is_empty() => users.into_iter().map(|u| u.name.to_string()).collect(),
        _ => cache.users(),
    };
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for u in &requested {
        *seen.entry(u.as_str()).or_insert(0) += 1;
    }
    let mut results = Vec::new();
    let mut reported = std::collections::HashSet::new();
    for user in &requested {
        if !reported.insert(user.clone()) {
            continue;
        }
        let mut r = DescribeUserScramCredentialsResult::default().with_user(user.clone().into());
        if seen.get(user.as_str()).copied().unwrap_or(0) > 1 {
            r = r.with_error_code(ErrorCode::DuplicateResource.code()).with_error_message(Some(
                format!("Cannot describe SCRAM credentials for the same user twice in a single request: {user}").into(),
            ));
        } else {
            match cache.describe(user) {
                Some(infos) => {
                    r = r.with_credential_infos(
                        infos
                            .into_iter()
                            .map(|(m, iterations)| {
                                CredentialInfo::default().with_mechanism(m.type_id()).with_iterations(iterations)
                            })
                            .collect(),
                    );
                }
                None => {
                    r = r.with_error_code(ErrorCode::ResourceNotFound.code()).with_error_message(Some(
                        format!("Attempt to describe a user credential that does not exist: {user}").into(),
                    ));
                }
            }
        }
        results.push(r);
    }
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

enum Change {
    Upsert(Mechanism, ScramCredential),
    Delete(Mechanism),
}

pub fn alter(ctx: &RequestContext, req: AlterUserScramCredentialsRequest) -> AlterUserScramCredentialsResponse {
    // A user named twice (in either list) is refused whole, as Kafka does.
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for name in req.deletions.iter().map(|d| &d.name).chain(req.upsertions.iter().map(|u| &u.name)) {
        *count.entry(name.to_string()).or_insert(0) += 1;
    }
    let mut errors: BTreeMap<String, (ErrorCode, String)> = BTreeMap::new();
    let mut changes: BTreeMap<String, Vec<Change>> = BTreeMap::new();
    let fail = |errors: &mut BTreeMap<String, (ErrorCode, String)>, user: &str, code, msg: &str| {
        errors.entry(user.to_string()).or_insert((code, msg.to_string()));
    };
    for d in &req.deletions {
        let user = d.name.to_string();
        match Mechanism::from_type(d.mechanism) {
            None => fail(&mut errors, &user, ErrorCode::UnsupportedSaslMechanism, "Unknown SCRAM mechanism"),
            Some(_) if user.is_empty() => {
                fail(&mut errors, &user, ErrorCode::UnacceptableCredential, "Username must not be empty")
            }
            Some(m) => changes.entry(user).or_default().push(Change::Delete(m)),
        }
    }
    for u in &req.upsertions {
        let user = u.name.to_string();
        let Some(m) = Mechanism::from_type(u.mechanism) else {
            fail(&mut errors, &user, ErrorCode::UnsupportedSaslMechanism, "Unknown SCRAM mechanism");
            continue;
        };
        if user.is_empty() {
            fail(&mut errors, &user, ErrorCode::UnacceptableCredential, "Username must not be empty");
        } else if u.iterations < scram::MIN_ITERATIONS {
            fail(&mut errors, &user, ErrorCode::UnacceptableCredential, "Too few iterations");
        } else if u.iterations > scram::MAX_ITERATIONS {
            fail(&mut errors, &user, ErrorCode::UnacceptableCredential, "Too many iterations");
        } else if u.salt.is_empty() || u.salted_password.is_empty() {
            fail(&mut errors, &user, ErrorCode::UnacceptableCredential, "Salt and salted password must not be empty");
        } else {
            let cred = ScramCredential::from_salted_password(m, u.salt.to_vec(), &u.salted_password, u.iterations);
            changes.entry(user).or_default().push(Change::Upsert(m, cred));
        }
    }
    for (user, n) in &count {
        if *n > 1 {
            errors.insert(
                user.clone(),
                (ErrorCode::DuplicateResource, "A user credential cannot be altered twice in the same request".into()),
            );
        }
    }
    if !ctx.authorized_cluster(Operation::Alter) {
        for user in count.keys() {
            errors
                .insert(user.clone(), (ErrorCode::ClusterAuthorizationFailed, "Cluster authorization failed.".into()));
        }
    }
    let mut results = Vec::new();
    for user in count.keys() {
        let outcome = match errors.get(user) {
            Some(e) => Err(e.clone()),
            None => apply(ctx, user, changes.remove(user).unwrap_or_default()),
        };
        let mut r = AlterUserScramCredentialsResult::default().with_user(user.clone().into());
        if let Err((code, message)) = outcome {
            r = r.with_error_code(code.code()).with_error_message(Some(message.into()));
        } else {
            tracing::info!(user = %user, "SCRAM credentials altered");
        }
        results.push(r);
    }
    AlterUserScramCredentialsResponse::default().with_results(results)
}

/// Writes one user's new credentials and announces the change. Runs on the blocking pool.
fn apply(ctx: &RequestContext, user: &str, changes: Vec<Change>) -> Result<(), (ErrorCode, String)> {
    let store = &ctx.components.store;
    let path = scram::user_path(&scram::sanitize(user));
    let stored = |e: crate::metadata::StoreError| (ErrorCode::UnknownServerError, e.to_string());
    let mut config = store.try_get(&path).map_err(stored)?.map(|d| scram::parse_user_config(&d)).unwrap_or_default();
    for change in changes {
        match change {
            Change::Delete(m) => {
                if config.remove(m.name()).is_none() {
                    return Err((
                        ErrorCode::ResourceNotFound,
                        "Attempt to delete a user credential that does not exist".into(),
                    ));
                }
            }
            Change::Upsert(m, cred) => {
                config.insert(m.name().to_string(), cred.to_kafka_string());
            }
        }
    }
    store.set(&path, &scram::user_config_json(&config)).map_err(stored)?;
    let notice = serde_json::json!({"version": 2, "entity_path": format!("users/{}", scram::sanitize(user))});
    store
        .create_sequential(&format!("{}/config_change_", zk_data::CONFIG_CHANGES), &notice.to_string())
        .map_err(stored)?;
    ctx.components.security.scram.reload(store, &scram::sanitize(user)).map_err(stored)?;
    Ok(())
}
