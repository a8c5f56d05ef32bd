//! TLS listeners with rustls: keystores and truststores in PEM form as Kafka 2.7+ reads them
//! (files or inline values), `ssl.client.auth`, `ssl.enabled.protocols`, `ssl.cipher.suites`,
//! and the principal taken from a client certificate's subject through
//! `ssl.principal.mapping.rules`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use base64::Engine;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs1KeyDer, PrivatePkcs8KeyDer, PrivateSec1KeyDer};

use super::{listener_value, refuse, KafkaPrincipal};
use crate::config::ConfigError;
use crate::sync::{MutexExt, RwLockExt};

pub struct ServerTls {
    pub config: rustls::ServerConfig,
    /// Whether client certificates are asked for (requested or required).
    pub client_auth: bool,
}

use tokio_rustls::rustls;

/// One PEM block: its label and DER bytes. Tolerates the whole block on one line, as a
/// server.properties value continued with backslashes ends up.
fn pem_blocks(text: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let after = &rest[start + "-----BEGIN ".len()..];
        let label_end = after.find("-----").ok_or("unterminated PEM header")?;
        let label = after[..label_end].trim().to_string();
        let body_and_more = &after[label_end + 5..];
        let end = body_and_more.find("-----END ").ok_or_else(|| format!("no END line for PEM block {label}"))?;
        let body: String = body_and_more[..end].chars().filter(|c| !c.is_whitespace()).collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(body.as_bytes())
            .map_err(|e| format!("PEM block {label} is not valid base64: {e}"))?;
        out.push((label, der));
        let tail = &body_and_more[end + "-----END ".len()..];
        rest = match tail.find("-----") {
            Some(i) => &tail[i + 5..],
            None => "",
        };
    }
    Ok(out)
}

fn certificates(blocks: &[(String, Vec<u8>)]) -> Vec<CertificateDer<'static>> {
    blocks.iter().filter(|(l, _)| l == "CERTIFICATE").map(|(_, d)| CertificateDer::from(d.clone())).collect()
}

/// The private key of `blocks`: PKCS#8 (encrypted with `password` if so), or an unencrypted
/// PKCS#1/SEC1 key.
fn private_key(
    blocks: &[(String, Vec<u8>)],
    password: Option<&str>,
    key: &str,
) -> Result<PrivateKeyDer<'static>, ConfigError> {
    for (label, der) in blocks {
        match label.as_str() {
            "PRIVATE KEY" => return Ok(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(der.clone()))),
            "RSA PRIVATE KEY" => return Ok(PrivateKeyDer::Pkcs1(PrivatePkcs1KeyDer::from(der.clone()))),
            "EC PRIVATE KEY" => return Ok(PrivateKeyDer::Sec1(PrivateSec1KeyDer::from(der.clone()))),
            "ENCRYPTED PRIVATE KEY" => {
                let password = password.ok_or_else(|| {
                    refuse(
                        "ssl.key.password",
                        format!("the private key of {key} is encrypted; ssl.key.password is needed"),
                    )
                })?;
                let info = pkcs8::EncryptedPrivateKeyInfoRef::try_from(der.as_slice())
                    .map_err(|e| refuse(key, format!("unreadable encrypted private key: {e}")))?;
                let plain = info
                    .decrypt(password.as_bytes())
                    .map_err(|e| refuse("ssl.key.password", format!("cannot decrypt the private key of {key}: {e}")))?;
                return Ok(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(plain.as_bytes().to_vec())));
            }
            _ => {}
        }
    }
    Err(refuse(key, "no private key found (expected a PEM PRIVATE KEY or ENCRYPTED PRIVATE KEY block)"))
}

fn read_file(key: &str, path: &str) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| refuse(key, format!("cannot read {path}: {e}")))
}

fn blocks_of(key: &str, text: &str) -> Result<Vec<(String, Vec<u8>)>, ConfigError> {
    pem_blocks(text).map_err(|e| refuse(key, e))
}

/// A store type other than PEM is refused: gregor reads PEM only.
fn require_pem(values: &BTreeMap<String, String>, listener: &str, type_key: &str) -> Result<(), ConfigError> {
    let Some((key, ty)) = listener_value(values, listener, type_key) else {
        return Ok(());
    };
    if ty.is_empty() || ty.eq_ignore_ascii_case("PEM") {
        return Ok(());
    }
    Err(refuse(
        &key,
        format!("{ty} stores are not supported; gregor reads PEM only (convert with openssl and set {type_key}=PEM)"),
    ))
}

/// The store's type as Kafka would take it: PEM where said, else its default (JKS), unless
/// only inline PEM values are given.
fn store_is_pem(values: &BTreeMap<String, String>, listener: &str, type_key: &str) -> bool {
    listener_value(values, listener, type_key).is_some_and(|(_, t)| t.eq_ignore_ascii_case("PEM"))
}

/// Builds an SSL or SASL_SSL listener's rustls configuration.
pub fn server_config(
    values: &BTreeMap<String, String>,
    listener: &str,
    protocol: &str,
) -> Result<ServerTls, ConfigError> {
    let get = |key: &str| listener_value(values, listener, key).filter(|(_, v)| !v.is_empty());
    require_pem(values, listener, "ssl.keystore.type")?;
    require_pem(values, listener, "ssl.truststore.type")?;
    for pw in ["ssl.keystore.password", "ssl.truststore.password"] {
        if let Some((key, _)) = get(pw) {
            if store_is_pem(
                values,
                listener,
                if pw.contains("keystore") { "ssl.keystore.type" } else { "ssl.truststore.type" },
            ) {
                return Err(refuse(&key, "a PEM store has no store password (Kafka refuses it too); use ssl.key.password for an encrypted key"));
            }
        }
    }
    let (chain, key) = keystore(values, listener, protocol)?;
    let provider = crypto_provider(values, listener)?;
    let versions = protocol_versions(values, listener)?;
    let provider = Arc::new(provider);
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| refuse("ssl.enabled.protocols", e.to_string()))?;

    // Kafka (KIP-684): on SASL_SSL only the listener-prefixed ssl.client.auth counts.
    let client_auth = if protocol == "SASL_SSL" {
        values.get(&format!("listener.name.{}.ssl.client.auth", listener.to_ascii_lowercase())).map(|v| v.trim())
    } else {
        get("ssl.client.auth").map(|(_, v)| v)
    };
    let client_auth = match client_auth.unwrap_or("none") {
        "" | "none" => None,
        "requested" => Some(false),
        "required" => Some(true),
        other => return Err(refuse("ssl.client.auth", format!("{other:?}: expected none, requested or required"))),
    };
    let builder = match client_auth {
        None => builder.with_no_client_auth(),
        Some(required) => {
            let roots = trust_roots(values, listener)?;
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if required { verifier } else { verifier.allow_unauthenticated() };
            let verifier = verifier.build().map_err(|e| refuse("ssl.truststore.location", e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder.with_single_cert(chain, key).map_err(|e| {
        refuse(
            "ssl.keystore.location",
            format!("listener {listener}: key and certificate do not make a usable pair: {e}"),
        )
    })?;
    Ok(ServerTls { config, client_auth: client_auth.is_some() })
}

/// The listener's keystore: its certificate chain and private key, from
/// `ssl.keystore.location` (one PEM file) or the inline `ssl.keystore.certificate.chain` and
/// `ssl.keystore.key`. A broker serves it on the listener and presents it as its client
/// certificate when it connects to another broker's listener of the same name.
pub(crate) fn keystore(
    values: &BTreeMap<String, String>,
    listener: &str,
    protocol: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), ConfigError> {
    let get = |key: &str| listener_value(values, listener, key).filter(|(_, v)| !v.is_empty());
    let key_password = get("ssl.key.password").map(|(_, v)| v.to_string());

    let (chain, key) = match (get("ssl.keystore.location"), get("ssl.keystore.certificate.chain"), get("ssl.keystore.key")) {
        (Some((lkey, path)), None, None) => {
            if !store_is_pem(values, listener, "ssl.keystore.type") {
                return Err(refuse(
                    &lkey,
                    format!("{path}: only PEM keystores are supported (Kafka's default type is JKS); set ssl.keystore.type=PEM"),
                ));
            }
            let blocks = blocks_of(&lkey, &read_file(&lkey, path)?)?;
            let chain = certificates(&blocks);
            (chain, private_key(&blocks, key_password.as_deref(), &lkey)?)
        }
        (None, Some((ckey, chain)), Some((kkey, keytext))) => {
            let chain = certificates(&blocks_of(&ckey, chain)?);
            (chain, private_key(&blocks_of(&kkey, keytext)?, key_password.as_deref(), &kkey)?)
        }
        (None, None, None) => {
            return Err(refuse(
                &format!("listener.name.{}.ssl.keystore.location", listener.to_ascii_lowercase()),
                format!("listener {listener} ({protocol}) needs a keystore: ssl.keystore.location, or ssl.keystore.certificate.chain with ssl.keystore.key"),
            ))
        }
        (Some((k, _)), _, _) => {
            return Err(refuse(&k, "give either ssl.keystore.location or the inline ssl.keystore.certificate.chain and ssl.keystore.key, not both"))
        }
        (None, Some((k, _)), None) | (None, None, Some((k, _))) => {
            return Err(refuse(&k, "ssl.keystore.certificate.chain and ssl.keystore.key go together"))
        }
    };
    if chain.is_empty() {
        return Err(refuse("ssl.keystore.location", format!("listener {listener}: the keystore holds no CERTIFICATE")));
    }

    Ok((chain, key))
}

/// rustls' ring provider with the cipher suites `ssl.cipher.suites` allows.
pub(crate) fn crypto_provider(
    values: &BTreeMap<String, String>,
    listener: &str,
) -> Result<rustls::crypto::CryptoProvider, ConfigError> {
    let get = |key: &str| listener_value(values, listener, key).filter(|(_, v)| !v.is_empty());
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some((key, suites)) = get("ssl.cipher.suites") {
        let wanted: Vec<&str> = suites.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        if !wanted.is_empty() {
            provider.cipher_suites.retain(|s| wanted.iter().any(|w| *w == format!("{:?}", s.suite())));
            if provider.cipher_suites.is_empty() {
                return Err(refuse(&key, format!("none of {suites} is a cipher suite gregor's TLS engine offers")));
            }
        }
    }
    Ok(provider)
}

/// A TLS listener's acceptor, rebuilt when its keystore or truststore file changes, so a
/// renewed certificate is served to new connections without a restart (connections already
/// open keep the session they have).
pub struct ReloadableTls {
    acceptor: RwLock<tokio_rustls::TlsAcceptor>,
    /// The store files and the modification time each had when the acceptor was built.
    files: Mutex<Vec<(PathBuf, Option<SystemTime>)>>,
    listener: String,
    protocol: String,
}

fn modified(path: &PathBuf) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl ReloadableTls {
    pub fn new(values: &BTreeMap<String, String>, listener: &str, protocol: &str, built: ServerTls) -> ReloadableTls {
        let files = ["ssl.keystore.location", "ssl.truststore.location"]
            .iter()
            .filter_map(|key| listener_value(values, listener, key))
            .filter(|(_, v)| !v.is_empty())
            .map(|(_, v)| PathBuf::from(v))
            .map(|p| {
                let m = modified(&p);
                (p, m)
            })
            .collect();
        ReloadableTls {
            acceptor: RwLock::new(tokio_rustls::TlsAcceptor::from(Arc::new(built.config))),
            files: Mutex::new(files),
            listener: listener.to_string(),
            protocol: protocol.to_string(),
        }
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        self.acceptor.read_unpoisoned().clone()
    }

    /// Rebuilds the acceptor if a store file changed since it was built (blocking: reads
    /// files). A store that does not load (half written, a key that does not match) leaves
    /// the current one in place, and is tried again at the next change.
    pub fn reload_if_changed(&self, values: &BTreeMap<String, String>) -> bool {
        let mut files = self.files.lock_unpoisoned();
        let now: Vec<Option<SystemTime>> = files.iter().map(|(p, _)| modified(p)).collect();
        if files.iter().zip(&now).all(|((_, was), is)| was == is) {
            return false;
        }
        for ((_, was), is) in files.iter_mut().zip(now) {
            *was = is;
        }
        drop(files);
        match server_config(values, &self.listener, &self.protocol) {
            Ok(built) => {
                *self.acceptor.write_unpoisoned() = tokio_rustls::TlsAcceptor::from(Arc::new(built.config));
                tracing::info!(listener = %self.listener, "keystore or truststore changed: new connections use it");
                true
            }
            Err(e) => {
                tracing::error!(listener = %self.listener, error = %e, "changed keystore or truststore not usable; keeping the previous one");
                false
            }
        }
    }
}

/// The truststore: `ssl.truststore.location` (PEM file) or the inline `ssl.truststore.certificates`.
pub fn trust_roots(values: &BTreeMap<String, String>, listener: &str) -> Result<rustls::RootCertStore, ConfigError> {
    let get = |key: &str| listener_value(values, listener, key).filter(|(_, v)| !v.is_empty());
    let (key, text) = match (get("ssl.truststore.location"), get("ssl.truststore.certificates")) {
        (Some((k, path)), None) => {
            if !store_is_pem(values, listener, "ssl.truststore.type") {
                return Err(refuse(&k, format!("{path}: only PEM truststores are supported (Kafka's default type is JKS); set ssl.truststore.type=PEM")));
            }
            let t = read_file(&k, path)?;
            (k, t)
        }
        (None, Some((k, certs))) => (k, certs.to_string()),
        (None, None) => {
            return Err(refuse(
                "ssl.truststore.location",
                format!(
                    "listener {listener} authenticates client certificates (ssl.client.auth) but has no truststore"
                ),
            ))
        }
        (Some((k, _)), Some(_)) => {
            return Err(refuse(&k, "give ssl.truststore.location or ssl.truststore.certificates, not both"))
        }
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(&blocks_of(&key, &text)?) {
        roots.add(cert).map_err(|e| refuse(&key, format!("unusable CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(refuse(&key, "the truststore holds no CERTIFICATE"));
    }
    Ok(roots)
}

/// `ssl.enabled.protocols` (and `ssl.protocol`): TLSv1.2 and TLSv1.3 are what rustls has.
/// Older versions listed beside them are left out with a warning (serving fewer is not less
/// secure); a list of only older ones is refused.
pub(crate) fn protocol_versions(
    values: &BTreeMap<String, String>,
    listener: &str,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, ConfigError> {
    if let Some((key, p)) = listener_value(values, listener, "ssl.protocol") {
        if !matches!(p, "" | "TLS" | "TLSv1.2" | "TLSv1.3") {
            return Err(refuse(&key, format!("{p}: gregor speaks TLSv1.2 and TLSv1.3 only")));
        }
    }
    let (key, list) = listener_value(values, listener, "ssl.enabled.protocols")
        .unwrap_or_else(|| ("ssl.enabled.protocols".into(), "TLSv1.2,TLSv1.3"));
    let mut versions = Vec::new();
    for p in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match p {
            "TLSv1.3" => versions.push(&rustls::version::TLS13),
            "TLSv1.2" => versions.push(&rustls::version::TLS12),
            other => tracing::warn!(key = %key, protocol = other, "not supported by gregor's TLS engine; left out"),
        }
    }
    if versions.is_empty() {
        return Err(refuse(&key, format!("{list}: none of these is TLSv1.2 or TLSv1.3, the versions gregor supports")));
    }
    Ok(versions)
}

/// A certificate subject in RFC 2253 form, as Java's `X500Principal.getName()` gives it
/// (most significant RDN last, so `CN=...` first) — the string Kafka's mapping rules match.
pub fn subject_dn(cert_der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let registry = x509_parser::objects::oid_registry();
    let rdns: Vec<String> = cert
        .subject()
        .iter()
        .map(|rdn| {
            rdn.iter()
                .map(|attr| {
                    let oid = attr.attr_type();
                    let short = x509_parser::objects::oid2abbrev(oid, registry).ok().map(|s| match s {
                        "emailAddress" => "EMAILADDRESS".to_string(),
                        "stateOrProvinceName" => "ST".to_string(),
                        s => s.to_string(),
                    });
                    let key = match short.as_deref() {
                        Some(k @ ("CN" | "C" | "L" | "ST" | "O" | "OU" | "STREET" | "DC" | "UID")) => k.to_string(),
                        _ => oid.to_id_string(),
                    };
                    let value = attr.as_str().map(escape_dn_value).unwrap_or_default();
                    format!("{key}={value}")
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    Some(rdns.into_iter().rev().collect::<Vec<_>>().join(","))
}

fn escape_dn_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for (i, c) in v.chars().enumerate() {
        let edge = (i == 0 && (c == ' ' || c == '#')) || (i + 1 == v.chars().count() && c == ' ');
        if matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') || edge {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[derive(Debug, Clone)]
enum Rule {
    Default,
    Map { pattern: regex::Regex, replacement: String, case: Option<char> },
}

/// `ssl.principal.mapping.rules` (Kafka's `SslPrincipalMapper`): the first rule whose pattern
/// matches the whole distinguished name gives the principal's name; DEFAULT keeps the DN.
#[derive(Debug, Clone)]
pub struct PrincipalMapper {
    rules: Vec<Rule>,
}

impl Default for PrincipalMapper {
    fn default() -> Self {
        PrincipalMapper { rules: vec![Rule::Default] }
    }
}

impl PrincipalMapper {
    pub fn from_config(values: &BTreeMap<String, String>, listener: &str) -> Result<PrincipalMapper, ConfigError> {
        match listener_value(values, listener, "ssl.principal.mapping.rules") {
            None => Ok(PrincipalMapper::default()),
            Some((key, text)) => PrincipalMapper::parse(text).map_err(|e| refuse(&key, e)),
        }
    }

    pub fn parse(text: &str) -> Result<PrincipalMapper, String> {
        let mut rules = Vec::new();
        let mut rest = text.trim_start_matches([' ', '\t', '\n', ',']);
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("DEFAULT") {
                rules.push(Rule::Default);
                rest = r;
            } else if let Some(r) = rest.strip_prefix("RULE:") {
                let (pattern, r) = until_slash(r).ok_or_else(|| format!("unterminated pattern in rule at {rest:?}"))?;
                let (replacement, r) =
                    until_slash(r).ok_or_else(|| format!("unterminated replacement in rule at {rest:?}"))?;
                let (case, r) = match r.chars().next() {
                    Some(c @ ('L' | 'U')) => (Some(c), &r[1..]),
                    _ => (None, r),
                };
                let pattern = regex::Regex::new(&format!("^(?:{pattern})$"))
                    .map_err(|e| format!("pattern {pattern:?} is not a regular expression gregor can use: {e}"))?;
                rules.push(Rule::Map { pattern, replacement: java_replacement(&replacement), case });
                rest = r;
            } else {
                return Err(format!("expected DEFAULT or RULE:pattern/replacement/[LU] at {rest:?}"));
            }
            let skipped = rest.trim_start_matches([' ', '\t']);
            rest = match skipped.chars().next() {
                None => "",
                Some(',' | '\n') => skipped[1..].trim_start_matches([' ', '\t', '\n']),
                Some(_) => return Err(format!("unexpected text after a rule: {skipped:?}")),
            };
        }
        if rules.is_empty() {
            rules.push(Rule::Default);
        }
        Ok(PrincipalMapper { rules })
    }

    /// The principal of a certificate subject; a subject no rule matches keeps its DN, as
    /// Kafka's builder falls back to (Kafka throws; a mapping that refuses is unusable anyway).
    pub fn principal(&self, dn: &str) -> KafkaPrincipal {
        for rule in &self.rules {
            match rule {
                Rule::Default => return KafkaPrincipal::user(dn),
                Rule::Map { pattern, replacement, case } => {
                    if pattern.is_match(dn) {
                        let name = pattern.replace(dn, replacement.as_str()).into_owned();
                        let name = match case {
                            Some('L') => name.to_lowercase(),
                            Some('U') => name.to_uppercase(),
                            _ => name,
                        };
                        return KafkaPrincipal::user(name);
                    }
                }
            }
        }
        KafkaPrincipal::user(dn)
    }
}

/// Text up to an unescaped `/` (escapes `\/` kept as `/`), and what follows it.
fn until_slash(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some((_, '/')) => out.push('/'),
                Some((_, other)) => {
                    out.push('\\');
                    out.push(other);
                }
                None => out.push('\\'),
            },
            '/' => return Some((out, &s[i + 1..])),
            c => out.push(c),
        }
    }
    None
}

/// Java's `$1` group references as the regex crate spells them (`${1}`), so `$1abc` is group 1
/// followed by text, as in Java.
fn java_replacement(r: &str) -> String {
    let mut out = String::new();
    let mut chars = r.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(|d| d.is_ascii_digit()) {
            out.push_str("${");
            while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
                out.push(d);
                chars.next();
            }
            out.push('}');
        } else if c == '\\' {
            if let Some(n) = chars.next() {
                if n == '$' {
                    out.push_str("$$");
                } else {
                    out.push(n);
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The principal of an authenticated TLS peer, from its leaf certificate.
pub fn peer_principal(conn: &rustls::ServerConnection, mapper: &PrincipalMapper) -> Option<KafkaPrincipal> {
    let leaf = conn.peer_certificates()?.first()?;
    let dn = subject_dn(leaf.as_ref())?;
    Some(mapper.principal(&dn))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_rules_as_kafka_documents_them() {
        let m = PrincipalMapper::parse(
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L, DEFAULT",
        )
        .unwrap();
        assert_eq!(m.principal("CN=kafka-broker,OU=ServiceUsers,O=Unknown,C=US").name, "kafka-broker");
        assert_eq!(m.principal("CN=Alice,OU=ENG,O=Org,L=City,ST=State,C=US").name, "alice@eng");
        assert_eq!(m.principal("CN=bob,O=Other").name, "CN=bob,O=Other");
        assert_eq!(PrincipalMapper::default().principal("CN=x").to_string(), "User:CN=x");
        assert!(PrincipalMapper::parse("RULE:^CN=(.*$/$1/").is_err());
        assert!(PrincipalMapper::parse("NOPE").is_err());
        let u = PrincipalMapper::parse("RULE:^CN=([^,]*).*$/$1/U").unwrap();
        assert_eq!(u.principal("CN=carol,O=x").name, "CAROL");
    }

    #[test]
    fn pem_blocks_on_one_line_or_many() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(b"hello world");
        let one = format!("-----BEGIN CERTIFICATE----- {} -----END CERTIFICATE-----", b64);
        let many =
            format!("junk\n-----BEGIN CERTIFICATE-----\n{}\n{}\n-----END CERTIFICATE-----\n", &b64[..4], &b64[4..]);
        for t in [one, many] {
            let blocks = pem_blocks(&t).unwrap();
            assert_eq!(blocks, vec![("CERTIFICATE".to_string(), b"hello world".to_vec())]);
        }
        assert!(pem_blocks("-----BEGIN CERTIFICATE----- abc").is_err());
    }
}
