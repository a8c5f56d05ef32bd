//! The server side of SASL on SASL_PLAINTEXT and SASL_SSL listeners (Kafka's
//! `SaslServerAuthenticator`): SaslHandshake, then the mechanism's tokens (wrapped in
//! SaslAuthenticate from handshake v1 on, raw after v0), then requests as the authenticated
//! principal. Re-authentication (KIP-368) runs the same exchange again on a live connection.

use std::collections::{BTreeMap, HashMap};

use super::scram::{self, Mechanism, ScramServer};
use super::{jaas, listener_value, refuse, KafkaPrincipal, MECHANISMS};
use crate::config::ConfigError;

const PLAIN_LOGIN_MODULE: &str = "org.apache.kafka.common.security.plain.PlainLoginModule";
const SCRAM_LOGIN_MODULE: &str = "org.apache.kafka.common.security.scram.ScramLoginModule";

/// A listener's SASL settings.
pub struct SaslSettings {
    /// `sasl.enabled.mechanisms`, in the order given.
    pub mechanisms: Vec<String>,
    /// PLAIN's users: `user_<name>="<password>"` of the PlainLoginModule entry.
    plain_users: HashMap<String, String>,
    /// `sasl.server.max.receive.size`: the largest frame read before authentication.
    pub max_receive_size: usize,
}

impl SaslSettings {
    pub fn from_config(values: &BTreeMap<String, String>, listener: &str) -> Result<SaslSettings, ConfigError> {
        let (key, list) = listener_value(values, listener, "sasl.enabled.mechanisms")
            .unwrap_or_else(|| ("sasl.enabled.mechanisms".into(), "GSSAPI"));
        let mechanisms: Vec<String> =
            list.split(',').map(|m| m.trim().to_ascii_uppercase()).filter(|m| !m.is_empty()).collect();
        if mechanisms.is_empty() {
            return Err(refuse(&key, format!("listener {listener} uses SASL but enables no mechanism")));
        }
        for m in &mechanisms {
            if !MECHANISMS.contains(&m.as_str()) {
                let why = match m.as_str() {
                    "GSSAPI" => "Kerberos (GSSAPI) is not supported (and is Kafka's default when the key is unset)",
                    "OAUTHBEARER" => "OAUTHBEARER is not supported",
                    _ => "unknown mechanism",
                };
                return Err(refuse(
                    &key,
                    format!("{m} on listener {listener}: {why}; gregor supports {}", MECHANISMS.join(", ")),
                ));
            }
        }
        let mut plain_users = HashMap::new();
        if mechanisms.iter().any(|m| m == "PLAIN") {
            let (jkey, modules) = jaas_for(values, listener, "PLAIN")?.ok_or_else(|| {
                refuse(
                    &format!("listener.name.{}.plain.sasl.jaas.config", listener.to_ascii_lowercase()),
                    format!("PLAIN is enabled on listener {listener} but no PlainLoginModule lists its users"),
                )
            })?;
            let module = modules
                .iter()
                .find(|m| m.class == PLAIN_LOGIN_MODULE)
                .ok_or_else(|| refuse(&jkey, format!("PLAIN needs a {PLAIN_LOGIN_MODULE} entry")))?;
            for (k, v) in &module.options {
                if let Some(user) = k.strip_prefix("user_") {
                    plain_users.insert(user.to_string(), v.clone());
                }
            }
        }
        for m in mechanisms.iter().filter(|m| m.starts_with("SCRAM-")) {
            if let Some((jkey, modules)) = jaas_for(values, listener, m)? {
                if !modules.iter().any(|x| x.class == SCRAM_LOGIN_MODULE || x.class == PLAIN_LOGIN_MODULE) {
                    return Err(refuse(&jkey, format!("{m} needs a {SCRAM_LOGIN_MODULE} entry")));
                }
            }
        }
        let max_receive_size = match listener_value(values, listener, "sasl.server.max.receive.size") {
            None => 524_288,
            Some((k, v)) => v
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| refuse(&k, format!("{v:?} is not a positive number of bytes")))?,
        };
        Ok(SaslSettings { mechanisms, plain_users, max_receive_size })
    }

    fn enabled(&self, mechanism: &str) -> bool {
        self.mechanisms.iter().any(|m| m == mechanism)
    }

    /// PLAIN's check: constant time in the password, so timing says nothing about it.
    fn plain_password_matches(&self, user: &str, password: &str) -> bool {
        match self.plain_users.get(user) {
            Some(expected) => {
                let (a, b) = (expected.as_bytes(), password.as_bytes());
                let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
                a.len() == b.len() && diff == 0
            }
            None => false,
        }
    }
}

/// `listener.name.<l>.<mechanism>.sasl.jaas.config`, else `sasl.jaas.config`, parsed.
pub(crate) fn jaas_for(
    values: &BTreeMap<String, String>,
    listener: &str,
    mechanism: &str,
) -> Result<Option<(String, Vec<jaas::LoginModule>)>, ConfigError> {
    let prefixed =
        format!("listener.name.{}.{}.sasl.jaas.config", listener.to_ascii_lowercase(), mechanism.to_ascii_lowercase());
    let (key, text) = match values.get(&prefixed) {
        Some(v) => (prefixed, v.as_str()),
        None => match values.get("sasl.jaas.config") {
            Some(v) => ("sasl.jaas.config".to_string(), v.as_str()),
            None => return Ok(None),
        },
    };
    let modules = jaas::parse(text).map_err(|e| refuse(&key, e))?;
    Ok(Some((key, modules)))
}

/// Where a connection is in its SASL exchange.
pub enum AuthState {
    /// Nothing to do: PLAINTEXT or SSL.
    NotSasl,
    /// Before SaslHandshake: only ApiVersions and SaslHandshake are served.
    Handshake,
    /// After the handshake: the mechanism's tokens.
    Authenticate {
        exchange: Exchange,
        raw: bool,
    },
    Authenticated,
}

pub enum Exchange {
    Plain,
    /// Boxed: only connections mid-exchange carry its state.
    Scram(Box<ScramServer>),
}

pub enum TokenOutcome {
    Challenge(Vec<u8>),
    Success {
        principal: KafkaPrincipal,
        response: Vec<u8>,
    },
    /// For the log; the client hears only that authentication failed.
    Failure(String),
}

impl Exchange {
    /// The exchange a handshake for `mechanism` starts, or None if the listener does not
    /// enable it.
    pub fn start(settings: &SaslSettings, mechanism: &str) -> Option<Exchange> {
        if !settings.enabled(mechanism) {
            return None;
        }
        match mechanism {
            "PLAIN" => Some(Exchange::Plain),
            m => Mechanism::from_name(m).map(|m| Exchange::Scram(Box::new(ScramServer::new(m)))),
        }
    }

    pub fn step(
        &mut self,
        token: &[u8],
        settings: &SaslSettings,
        cache: &scram::CredentialCache,
        decoy_key: &[u8],
    ) -> TokenOutcome {
        match self {
            Exchange::Plain => {
                // authzid NUL authcid NUL password (RFC 4616).
                let parts: Vec<&[u8]> = token.splitn(3, |b| *b == 0).collect();
                let [authzid, user, password] = parts.as_slice() else {
                    return TokenOutcome::Failure("malformed PLAIN token".into());
                };
                let (Ok(authzid), Ok(user), Ok(password)) =
                    (std::str::from_utf8(authzid), std::str::from_utf8(user), std::str::from_utf8(password))
                else {
                    return TokenOutcome::Failure("PLAIN token is not UTF-8".into());
                };
                if user.is_empty() || password.is_empty() {
                    return TokenOutcome::Failure("PLAIN token without user name or password".into());
                }
                if !authzid.is_empty() && authzid != user {
                    return TokenOutcome::Failure(format!("authorization id {authzid:?} differs from user {user:?}"));
                }
                if !settings.plain_password_matches(user, password) {
                    return TokenOutcome::Failure(format!("invalid user name or password for {user:?}"));
                }
                TokenOutcome::Success { principal: KafkaPrincipal::user(user), response: Vec::new() }
            }
            Exchange::Scram(server) => match server.step(token, cache, decoy_key) {
                scram::Step::Challenge(c) => TokenOutcome::Challenge(c),
                scram::Step::Success { user, server_final } => {
                    TokenOutcome::Success { principal: KafkaPrincipal::user(user), response: server_final }
                }
                scram::Step::Failure(why) => TokenOutcome::Failure(why),
            },
        }
    }
}

/// What Kafka tells a client whose credentials were refused: the same for every cause.
pub fn failure_message(mechanism: &str) -> String {
    format!("Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn mechanisms_and_plain_users_come_from_kafkas_keys() {
        let v = values(&[
            ("listener.name.sasl_ssl.sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-512"),
            (
                "listener.name.sasl_ssl.plain.sasl.jaas.config",
                "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"admin\" \
                 password=\"admin-secret\" user_admin=\"admin-secret\" user_alice=\"alice-secret\";",
            ),
        ]);
        let s = SaslSettings::from_config(&v, "SASL_SSL").unwrap();
        assert_eq!(s.mechanisms, vec!["PLAIN", "SCRAM-SHA-512"]);
        let cache = scram::CredentialCache::default();
        let mut ok = Exchange::start(&s, "PLAIN").unwrap();
        assert!(matches!(
            ok.step(b"\0alice\0alice-secret", &s, &cache, b"k"),
            TokenOutcome::Success { principal, .. } if principal.to_string() == "User:alice"
        ));
        for bad in [&b"\0alice\0wrong"[..], b"\0bob\0alice-secret", b"admin\0alice\0alice-secret", b"garbage"] {
            assert!(matches!(Exchange::Plain.step(bad, &s, &cache, b"k"), TokenOutcome::Failure(_)));
        }
        assert!(Exchange::start(&s, "SCRAM-SHA-256").is_none());
    }

    #[test]
    fn unsupported_mechanisms_are_refused_naming_the_key() {
        for (list, key) in [
            (None, "sasl.enabled.mechanisms"),
            (Some("GSSAPI"), "sasl.enabled.mechanisms"),
            (Some("OAUTHBEARER"), "sasl.enabled.mechanisms"),
        ] {
            let mut v = values(&[]);
            if let Some(l) = list {
                v.insert("sasl.enabled.mechanisms".into(), l.into());
            }
            let err = SaslSettings::from_config(&v, "SASL_PLAINTEXT").err().unwrap().to_string();
            assert!(err.starts_with(key), "{err}");
        }
        let v = values(&[("sasl.enabled.mechanisms", "PLAIN")]);
        let err = SaslSettings::from_config(&v, "SASL_PLAINTEXT").err().unwrap().to_string();
        assert!(err.contains("plain.sasl.jaas.config"), "{err}");
    }
}
