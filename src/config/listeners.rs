//! Listeners and security: `listeners`, `advertised.listeners`, the security protocol map, the
//! inter-broker listener, the metrics endpoint, and the refusal of security settings gregor
//! cannot honour.

use std::collections::BTreeMap;

use super::parse::{boolean, num, value};
use super::{invalid, unsupported, ConfigError};

/// The authorizer class names gregor serves (the second is the pre-2.4 name of the same
/// authorizer).
pub const ACL_AUTHORIZER_CLASSES: &[&str] =
    &["kafka.security.authorizer.AclAuthorizer", "kafka.security.auth.SimpleAclAuthorizer"];

/// Kafka's `SecurityProtocol` names.
pub(super) const SECURITY_PROTOCOLS: &[&str] = &["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"];
/// Kafka's default `security.inter.broker.protocol`, and the name of the listener it picks.
pub(super) const PLAINTEXT: &str = "PLAINTEXT";
/// Kafka's default `listener.security.protocol.map`: each protocol name maps to itself.
pub(super) const DEFAULT_PROTOCOL_MAP: &str =
    "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL";

/// gregor's own keys (Kafka exposes metrics over JMX instead). Not in [`DEFAULTS`](super::DEFAULTS):
/// unset means off, and DescribeConfigs lists them only where they are set.
pub(super) const METRICS_PORT: &str = "metrics.port";
pub(super) const METRICS_HOST: &str = "metrics.host";
pub(super) const METRICS_DEFAULT_HOST: &str = "0.0.0.0";

/// One `NAME://host:port` entry of `listeners` / `advertised.listeners`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub listener_name: String,
    pub host: String,
    pub port: u16,
    /// From `listener.security.protocol.map` once [`BrokerConfig::from_map`] resolved it; until
    /// then what Kafka's default map gives (the upper-cased name), e.g. for the endpoints of other
    /// brokers read from ZooKeeper, where only host and port are used.
    security_protocol: String,
}

impl Endpoint {
    /// Another broker's endpoint, as the controller passed it on.
    pub fn of_broker(listener_name: String, host: String, port: u16, security_protocol: &str) -> Endpoint {
        Endpoint { listener_name, host, port, security_protocol: security_protocol.to_string() }
    }

    pub fn security_protocol(&self) -> &str {
        &self.security_protocol
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "{}://[{}]:{}", self.listener_name, self.host, self.port)
        } else {
            write!(f, "{}://{}:{}", self.listener_name, self.host, self.port)
        }
    }
}

/// The listeners as parsed, their protocols resolved and their security settings checked.
pub(super) struct Listeners {
    pub listeners: Vec<Endpoint>,
    pub advertised_listeners: Vec<Endpoint>,
    pub inter_broker_listener: String,
}

impl Listeners {
    pub(super) fn parse(values: &BTreeMap<String, String>) -> Result<Listeners, ConfigError> {
        let get = |k: &str| value(values, k);
        let protocols = parse_protocol_map(
            values.get("listener.security.protocol.map").map_or(DEFAULT_PROTOCOL_MAP, String::as_str),
        )?;
        let mut listeners = parse_endpoints("listeners", get("listeners"))?;
        if listeners.is_empty() {
            return Err(invalid("listeners", get("listeners"), "at least one listener is required"));
        }
        resolve_protocols("listeners", &mut listeners, &protocols)?;
        let advertised_listeners = if get("advertised.listeners").is_empty() {
            listeners.clone()
        } else {
            let mut eps = parse_endpoints("advertised.listeners", get("advertised.listeners"))?;
            resolve_protocols("advertised.listeners", &mut eps, &protocols)?;
            eps
        };
        check_security(values, &listeners, &advertised_listeners)?;
        check_security_keys(values)?;
        let tls_sasl_keys = tls_sasl_keys(values);
        if !tls_sasl_keys.is_empty() && listeners.iter().all(|e| e.security_protocol == PLAINTEXT) {
            // Names only: values such as sasl.jaas.config hold secrets.
            tracing::warn!(
                keys = %tls_sasl_keys.join(","),
                "SSL/SASL settings apply to SSL and SASL listeners only; with only PLAINTEXT listeners they have no effect"
            );
        }
        if let Some(ep) =
            advertised_listeners.iter().find(|e| e.host == "0.0.0.0" || e.host == "::" || e.host.is_empty())
        {
            return Err(invalid(
                "advertised.listeners",
                &ep.to_string(),
                "advertised.listeners cannot use the nonroutable meta-address 0.0.0.0; set advertised.listeners to a \
                 routable address",
            ));
        }
        let inter_broker_listener = inter_broker_listener(
            get("inter.broker.listener.name"),
            get("security.inter.broker.protocol"),
            &advertised_listeners,
        );
        Ok(Listeners { listeners, advertised_listeners, inter_broker_listener })
    }
}

/// `metrics.host` and `metrics.port`: the port turns the endpoint on; the host defaults to
/// every interface, since a scraper (Prometheus in another container) is rarely local.
pub(super) fn metrics_address(host: &str, port: &str) -> Result<Option<(String, u16)>, ConfigError> {
    let host = host.trim();
    if port.trim().is_empty() {
        if !host.is_empty() {
            tracing::warn!(key = METRICS_HOST, "has no effect without {METRICS_PORT}; metrics are not served");
        }
        return Ok(None);
    }
    let port = match num::<u16>(METRICS_PORT, port)? {
        0 => return Err(invalid(METRICS_PORT, port, "must be a port number from 1 to 65535")),
        p => p,
    };
    let host = if host.is_empty() { METRICS_DEFAULT_HOST } else { host.trim_start_matches('[').trim_end_matches(']') };
    Ok(Some((host.to_string(), port)))
}

/// `listener.security.protocol.map` (`NAME:PROTOCOL,...`), keyed by upper-cased listener name
/// because Kafka normalises listener names that way.
pub(super) fn parse_protocol_map(value: &str) -> Result<BTreeMap<String, &'static str>, ConfigError> {
    const KEY: &str = "listener.security.protocol.map";
    let mut out = BTreeMap::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, protocol) =
            item.split_once(':').ok_or_else(|| invalid(KEY, value, format!("expected NAME:PROTOCOL, got {item:?}")))?;
        let name = name.trim();
        if name.is_empty() {
            return Err(invalid(KEY, value, format!("empty listener name in {item:?}")));
        }
        let protocol = security_protocol(KEY, value, protocol)?;
        if out.insert(name.to_ascii_uppercase(), protocol).is_some() {
            return Err(invalid(KEY, value, format!("listener name {name} appears twice")));
        }
    }
    Ok(out)
}

pub(super) fn security_protocol(key: &str, value: &str, name: &str) -> Result<&'static str, ConfigError> {
    let upper = name.trim().to_ascii_uppercase();
    SECURITY_PROTOCOLS.iter().copied().find(|p| *p == upper).ok_or_else(|| {
        invalid(
            key,
            value,
            format!("unknown security protocol {:?}; expected one of {}", name.trim(), SECURITY_PROTOCOLS.join(", ")),
        )
    })
}

pub(super) fn resolve_protocols(
    key: &str,
    endpoints: &mut [Endpoint],
    protocols: &BTreeMap<String, &'static str>,
) -> Result<(), ConfigError> {
    for ep in endpoints {
        let protocol = protocols.get(&ep.listener_name.to_ascii_uppercase()).ok_or_else(|| {
            invalid(
                key,
                &ep.to_string(),
                format!(
                    "no security protocol defined for listener {} in listener.security.protocol.map",
                    ep.listener_name
                ),
            )
        })?;
        ep.security_protocol = protocol.to_string();
    }
    Ok(())
}

/// Refuses every security setting gregor cannot honour (a secured control-plane listener,
/// an authorizer other than Kafka's ACL one, ZooKeeper TLS/SASL): serving such a
/// configuration would give clients, or other brokers, more than it allows. Runs before
/// anything binds a port or touches the data directories. The listeners' own TLS and SASL
/// keys, and what this broker needs to connect to the others over a secured inter-broker
/// listener, are checked by `security::Security::from_config` at start.
pub(super) fn check_security(
    values: &BTreeMap<String, String>,
    listeners: &[Endpoint],
    advertised: &[Endpoint],
) -> Result<(), ConfigError> {
    let get = |k: &str| values.get(k).map(|v| v.trim()).unwrap_or("");
    let named = |eps: &[Endpoint], name: &str| -> Option<Endpoint> {
        eps.iter().find(|e| e.listener_name.eq_ignore_ascii_case(name)).cloned()
    };
    let names = |eps: &[Endpoint]| eps.iter().map(|e| e.listener_name.as_str()).collect::<Vec<_>>().join(",");

    // A single standalone broker has no inter-broker traffic to secure.
    let clustered = !get("zookeeper.connect").is_empty();
    let key = "security.inter.broker.protocol";
    if !get(key).is_empty() {
        let protocol = security_protocol(key, get(key), get(key))?;
        if !get("inter.broker.listener.name").is_empty() {
            // Kafka refuses the pair too: each names the inter-broker listener.
            return Err(invalid(
                key,
                get(key),
                "only one of inter.broker.listener.name and security.inter.broker.protocol may be set",
            ));
        }
        // Kafka takes the listener named after the protocol; it must be advertised, since
        // the other brokers connect to it.
        if clustered && protocol != PLAINTEXT && named(advertised, protocol).is_none() {
            return Err(invalid(
                key,
                protocol,
                format!(
                    "the inter-broker listener {protocol} must be a listener in advertised.listeners ({})",
                    names(advertised)
                ),
            ));
        }
    }
    // Kafka looks the inter-broker listener up among the advertised ones (other brokers connect
    // to it) and the control-plane listener among those it binds.
    for (key, pool, pool_key) in [
        ("inter.broker.listener.name", advertised, "advertised.listeners"),
        ("control.plane.listener.name", listeners, "listeners"),
    ] {
        let name = get(key);
        if name.is_empty() {
            continue;
        }
        let ep = named(pool, name).ok_or_else(|| {
            invalid(key, name, format!("must be a listener name defined in {pool_key} ({})", names(pool)))
        })?;
        // The controller reaches brokers over the inter-broker listener; a control-plane
        // listener of its own would carry nothing, so one secured more than that is refused
        // rather than left unused while the requests go elsewhere.
        if key == "control.plane.listener.name" && ep.security_protocol != PLAINTEXT && clustered {
            return Err(unsupported(
                key,
                format!(
                    "listener {} ({ep}) uses security protocol {}, but gregor's controller sends its requests over \
                     the inter-broker listener, not a separate control-plane one; secure inter.broker.listener.name \
                     instead",
                    ep.listener_name, ep.security_protocol
                ),
            ));
        }
    }
    for (key, eps) in [("listeners", listeners), ("advertised.listeners", advertised)] {
        for ep in eps {
            if eps.iter().filter(|e| e.listener_name.eq_ignore_ascii_case(&ep.listener_name)).count() > 1 {
                return Err(invalid(key, &ep.to_string(), format!("listener {} is defined twice", ep.listener_name)));
            }
        }
    }
    let key = "authorizer.class.name";
    if !get(key).is_empty() && !ACL_AUTHORIZER_CLASSES.contains(&get(key)) {
        return Err(unsupported(
            key,
            format!(
                "{} cannot be loaded by gregor; only Kafka's ZooKeeper ACL authorizer ({}) is served",
                get(key),
                ACL_AUTHORIZER_CLASSES.join(" or ")
            ),
        ));
    }
    // The ZooKeeper client has no TLS and no SASL, so these would be served with less than
    // asked: metadata in the clear, or znodes open to anyone.
    for (key, what) in [
        ("zookeeper.ssl.client.enable", "TLS to ZooKeeper is not supported yet; the connection would be plaintext"),
        (
            "zookeeper.set.acl",
            "ZooKeeper ACLs need a SASL-authenticated ZooKeeper session, which gregor does not support yet; the \
             znodes would be left open",
        ),
    ] {
        if !get(key).is_empty() && boolean(key, get(key))? {
            return Err(unsupported(key, what));
        }
    }
    Ok(())
}

/// The given keys that configure TLS or SASL, which only SSL/SASL listeners read.
pub(super) fn tls_sasl_keys(values: &BTreeMap<String, String>) -> Vec<&str> {
    values
        .keys()
        .map(String::as_str)
        .filter(|k| k.starts_with("ssl.") || k.starts_with("sasl.") || k.starts_with("listener.name."))
        .collect()
}

/// The advertised listener's own spelling of the name, since other brokers match names
/// exactly; check_security has already refused a name that is not advertised. Without
/// `inter.broker.listener.name`, Kafka takes the listener named after
/// `security.inter.broker.protocol` (PLAINTEXT); gregor falls back to the first listener.
pub(super) fn inter_broker_listener(configured: &str, protocol: &str, advertised: &[Endpoint]) -> String {
    let wanted = match (configured, protocol.trim()) {
        ("", "") => PLAINTEXT,
        ("", p) => p,
        (c, _) => c,
    };
    advertised
        .iter()
        .find(|e| e.listener_name.eq_ignore_ascii_case(wanted))
        .or(advertised.first())
        .map(|e| e.listener_name.clone())
        .unwrap_or_default()
}

pub fn parse_endpoints(key: &str, value: &str) -> Result<Vec<Endpoint>, ConfigError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, addr) = item.split_once("://").ok_or_else(|| invalid(key, value, "expected NAME://host:port"))?;
        let (host, port) = addr.rsplit_once(':').ok_or_else(|| invalid(key, value, "missing port"))?;
        let port: u16 = port.parse().map_err(|_| invalid(key, value, format!("bad port {port:?}")))?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        if name.is_empty() {
            return Err(invalid(key, value, "empty listener name"));
        }
        if out.iter().any(|e: &Endpoint| e.listener_name == name) {
            return Err(invalid(key, value, format!("listener name {name} appears twice")));
        }
        let security_protocol = name.to_ascii_uppercase();
        out.push(Endpoint { listener_name: name.to_string(), host, port, security_protocol });
    }
    Ok(out)
}

/// Checks the security keys that can be checked without reading files, as the config is
/// parsed (so `--check`-style failures name the key early); `security::Security::from_config` does
/// the rest at start.
pub(super) fn check_security_keys(values: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    for key in ["ssl.engine.factory.class", "ssl.provider"] {
        if values.get(key).is_some_and(|v| !v.trim().is_empty()) {
            return Err(unsupported(key, "gregor has its own TLS engine (rustls); this setting cannot be honoured"));
        }
    }
    for (key, v) in values {
        if key.ends_with("sasl.server.callback.handler.class") && !v.trim().is_empty() {
            return Err(unsupported(key, "custom SASL callback handlers cannot be loaded by gregor"));
        }
        if key.ends_with("principal.builder.class") && !v.trim().is_empty() {
            return Err(unsupported(
                key,
                "custom principal builders cannot be loaded by gregor; use ssl.principal.mapping.rules",
            ));
        }
    }
    Ok(())
}
