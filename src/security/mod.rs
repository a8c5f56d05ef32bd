//! Authentication (Kafka's `ChannelBuilders`, `SslFactory`, `SaslServerAuthenticator`): what
//! each listener demands of a client before it serves requests, and who the client is once it
//! has: the connection's [`KafkaPrincipal`], which the request context carries to handlers.
//!
//! Everything is built once at start from Kafka's keys (`ssl.*`, `sasl.*`, and their
//! `listener.name.<l>.` forms); a setting that cannot be honoured stops the broker with a
//! message naming the key, so no listener is ever served with less security than asked for.

pub mod authorizer;
pub mod client;
pub mod jaas;
mod metadata_listener;
pub mod sasl;
pub mod scram;
pub mod tls;

pub use metadata_listener::SecurityListener;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::config::{BrokerConfig, ConfigError};

/// Who a connection is, as Kafka's authorizer sees it: `User:ANONYMOUS` until (or without)
/// authentication, else the SASL user or the client certificate's mapped subject.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KafkaPrincipal {
    pub principal_type: String,
    pub name: String,
}

impl KafkaPrincipal {
    pub const USER_TYPE: &'static str = "User";
    pub const ANONYMOUS_NAME: &'static str = "ANONYMOUS";

    pub fn user(name: impl Into<String>) -> KafkaPrincipal {
        KafkaPrincipal { principal_type: Self::USER_TYPE.to_string(), name: name.into() }
    }

    pub fn anonymous() -> KafkaPrincipal {
        Self::user(Self::ANONYMOUS_NAME)
    }
}

impl std::fmt::Display for KafkaPrincipal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.principal_type, self.name)
    }
}

/// A configuration error naming its key.
pub(crate) fn refuse(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Unsupported { key: key.to_string(), reason: reason.into() }
}

/// Kafka's lookup of a listener's setting: `listener.name.<listener>.<key>` (listener name in
/// lower case) over the unprefixed key. Returns the key that was found, for messages.
pub(crate) fn listener_value<'a>(
    values: &'a BTreeMap<String, String>,
    listener: &str,
    key: &str,
) -> Option<(String, &'a str)> {
    let prefixed = format!("listener.name.{}.{key}", listener.to_ascii_lowercase());
    if let Some(v) = values.get(&prefixed) {
        return Some((prefixed, v.trim()));
    }
    values.get(key).map(|v| (key.to_string(), v.trim()))
}

/// The SASL mechanisms gregor implements.
pub const MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// What one listener requires of its clients.
pub struct ListenerSecurity {
    pub name: String,
    pub protocol: String,
    pub tls: Option<tls::ReloadableTls>,
    /// Whether the TLS client certificate names the principal (SSL listeners; on SASL_SSL the
    /// SASL identity wins, as in Kafka).
    pub principal_from_certificate: bool,
    pub principal_mapper: tls::PrincipalMapper,
    pub sasl: Option<sasl::SaslSettings>,
}

impl ListenerSecurity {
    pub fn plaintext(name: &str) -> ListenerSecurity {
        ListenerSecurity {
            name: name.to_string(),
            protocol: "PLAINTEXT".into(),
            tls: None,
            principal_from_certificate: false,
            principal_mapper: tls::PrincipalMapper::default(),
            sasl: None,
        }
    }
}

/// Every listener's security, the SCRAM credentials, and what this broker presents when it
/// connects to another broker.
pub struct Security {
    listeners: HashMap<String, Arc<ListenerSecurity>>,
    pub scram: scram::CredentialCache,
    /// `connection.failed.authentication.delay.ms`.
    pub failed_authentication_delay: std::time::Duration,
    /// `connections.max.reauth.ms`; zero: sessions do not expire.
    pub max_reauth_ms: i64,
    /// `gregor.ssl.store.check.interval.ms`: how often the store files are looked at; zero: never.
    pub store_check_interval: std::time::Duration,
    /// Keys the made-up salts of unknown SCRAM users, so that they are stable per user.
    pub decoy_key: Vec<u8>,
    /// `authorizer.class.name`; None: every principal may do everything, as in Kafka.
    pub authorizer: Option<authorizer::Authorizer>,
    /// How this broker connects to the others: the inter-broker listener's protocol, trust
    /// and credentials.
    pub inter_broker: Arc<client::InterBrokerClient>,
}

impl Security {
    /// Builds every listener's TLS and SASL settings, reading certificate files. Called at
    /// start, before anything binds or registers.
    pub fn from_config(config: &BrokerConfig) -> Result<Security, ConfigError> {
        let values = &config.values;
        let mut listeners = HashMap::new();
        for ep in &config.listeners {
            let sec = build_listener(values, &ep.listener_name, ep.security_protocol())?;
            listeners.insert(ep.listener_name.clone(), Arc::new(sec));
        }
        let ms = |key: &str, default: i64| -> Result<i64, ConfigError> {
            match values.get(key).map(|v| v.trim()) {
                None | Some("") => Ok(default),
                Some(v) => v
                    .parse::<i64>()
                    .ok()
                    .filter(|n| *n >= 0)
                    .ok_or_else(|| refuse(key, format!("{v:?} is not a number of milliseconds"))),
            }
        };
        Ok(Security {
            listeners,
            scram: scram::CredentialCache::default(),
            failed_authentication_delay: std::time::Duration::from_millis(ms(
                "connection.failed.authentication.delay.ms",
                100,
            )? as u64),
            max_reauth_ms: ms("connections.max.reauth.ms", 0)?,
            store_check_interval: std::time::Duration::from_millis(
                ms("gregor.ssl.store.check.interval.ms", 30000)? as u64
            ),
            decoy_key: scram::random_bytes(32),
            authorizer: authorizer::Authorizer::from_config(values)?,
            // After the listeners: the inter-broker listener's own settings were checked there.
            inter_broker: Arc::new(client::InterBrokerClient::from_config(config)?),
        })
    }

    /// Whether any listener serves TLS (and so has stores to watch).
    pub fn has_tls(&self) -> bool {
        self.listeners.values().any(|l| l.tls.is_some())
    }

    /// Rebuilds the TLS of every listener whose keystore or truststore file changed
    /// (blocking: reads files).
    pub fn reload_changed_stores(&self, values: &BTreeMap<String, String>) {
        for l in self.listeners.values() {
            if let Some(t) = &l.tls {
                t.reload_if_changed(values);
            }
        }
    }

    pub fn listener(&self, name: &str) -> Arc<ListenerSecurity> {
        self.listeners.get(name).cloned().unwrap_or_else(|| Arc::new(ListenerSecurity::plaintext(name)))
    }
}

fn build_listener(
    values: &BTreeMap<String, String>,
    listener: &str,
    protocol: &str,
) -> Result<ListenerSecurity, ConfigError> {
    let mut sec = ListenerSecurity::plaintext(listener);
    sec.protocol = protocol.to_string();
    let uses_tls = matches!(protocol, "SSL" | "SASL_SSL");
    let uses_sasl = matches!(protocol, "SASL_PLAINTEXT" | "SASL_SSL");
    if uses_tls {
        let built = tls::server_config(values, listener, protocol)?;
        sec.principal_from_certificate = protocol == "SSL" && built.client_auth;
        sec.tls = Some(tls::ReloadableTls::new(values, listener, protocol, built));
    }
    if uses_tls || protocol == "SASL_PLAINTEXT" {
        sec.principal_mapper = tls::PrincipalMapper::from_config(values, listener)?;
    }
    if uses_sasl {
        sec.sasl = Some(sasl::SaslSettings::from_config(values, listener)?);
    }
    Ok(sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_print_as_kafka_does() {
        assert_eq!(KafkaPrincipal::anonymous().to_string(), "User:ANONYMOUS");
        assert_eq!(KafkaPrincipal::user("alice").to_string(), "User:alice");
    }

    #[test]
    fn listener_prefixed_keys_win() {
        let mut v = BTreeMap::new();
        v.insert("ssl.client.auth".to_string(), "none".to_string());
        v.insert("listener.name.internal.ssl.client.auth".to_string(), "required".to_string());
        assert_eq!(listener_value(&v, "INTERNAL", "ssl.client.auth").unwrap().1, "required");
        assert_eq!(listener_value(&v, "EXTERNAL", "ssl.client.auth").unwrap().1, "none");
    }
}
