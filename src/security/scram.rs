//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka has them: credentials in
//! ZooKeeper at `/config/users/<user>` in Kafka's format, kept in a cache every broker
//! refreshes when a user's znode changes, and the server side of the exchange.

use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;

use base64::Engine;
use hmac::{KeyInit, Mac};

use crate::metadata::{StoreError, ZnodeStore};
use crate::sync::RwLockExt;

pub const CONFIG_USERS: &str = "/config/users";
/// Kafka's bounds on SCRAM iterations (`ScramMechanism.minIterations` / `maxIterations`).
pub const MIN_ITERATIONS: i32 = 4096;
pub const MAX_ITERATIONS: i32 = 16384;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mechanism {
    Sha256,
    Sha512,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Mechanism> {
        match name {
            "SCRAM-SHA-256" => Some(Mechanism::Sha256),
            "SCRAM-SHA-512" => Some(Mechanism::Sha512),
            _ => None,
        }
    }

    /// The type byte of DescribeUserScramCredentials / AlterUserScramCredentials.
    pub fn from_type(t: i8) -> Option<Mechanism> {
        match t {
            1 => Some(Mechanism::Sha256),
            2 => Some(Mechanism::Sha512),
            _ => None,
        }
    }

    pub fn type_id(self) -> i8 {
        match self {
            Mechanism::Sha256 => 1,
            Mechanism::Sha512 => 2,
        }
    }

    fn hmac(self, key: &[u8], data: &[&[u8]]) -> Vec<u8> {
        fn run<M: Mac + KeyInit>(key: &[u8], data: &[&[u8]]) -> Vec<u8> {
            // HMAC takes keys of any length, so this cannot fail.
            let Ok(mut m) = <M as KeyInit>::new_from_slice(key) else {
                return Vec::new();
            };
            for d in data {
                m.update(d);
            }
            m.finalize().into_bytes().to_vec()
        }
        match self {
            Mechanism::Sha256 => run::<hmac::Hmac<sha2::Sha256>>(key, data),
            Mechanism::Sha512 => run::<hmac::Hmac<sha2::Sha512>>(key, data),
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        use sha2::Digest;
        match self {
            Mechanism::Sha256 => sha2::Sha256::digest(data).to_vec(),
            Mechanism::Sha512 => sha2::Sha512::digest(data).to_vec(),
        }
    }

    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => {
                let mut out = vec![0u8; 32];
                pbkdf2::pbkdf2_hmac::<sha2::Sha256>(password, salt, iterations, &mut out);
                out
            }
            Mechanism::Sha512 => {
                let mut out = vec![0u8; 64];
                pbkdf2::pbkdf2_hmac::<sha2::Sha512>(password, salt, iterations, &mut out);
                out
            }
        }
    }
}

/// What the server keeps of a password (RFC 5802 section 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramCredential {
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: i32,
}

impl ScramCredential {
    pub fn from_salted_password(mechanism: Mechanism, salt: Vec<u8>, salted: &[u8], iterations: i32) -> Self {
        let client_key = mechanism.hmac(salted, &[b"Client Key"]);
        ScramCredential {
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(salted, &[b"Server Key"]),
            salt,
            iterations,
        }
    }

    pub fn from_password(mechanism: Mechanism, password: &str, iterations: i32) -> Self {
        let salt = random_bytes(32);
        let salted = mechanism.salted_password(password.as_bytes(), &salt, iterations.max(1) as u32);
        Self::from_salted_password(mechanism, salt, &salted, iterations)
    }

    /// Kafka's `ScramCredentialUtils.credentialToString`.
    pub fn to_kafka_string(&self) -> String {
        format!(
            "salt={},stored_key={},server_key={},iterations={}",
            B64.encode(&self.salt),
            B64.encode(&self.stored_key),
            B64.encode(&self.server_key),
            self.iterations
        )
    }

    pub fn parse(s: &str) -> Option<ScramCredential> {
        let mut fields: HashMap<&str, &str> = HashMap::new();
        for part in s.split(',') {
            let (k, v) = part.split_once('=')?;
            fields.insert(k.trim(), v.trim());
        }
        Some(ScramCredential {
            salt: B64.decode(fields.get("salt")?).ok()?,
            stored_key: B64.decode(fields.get("stored_key")?).ok()?,
            server_key: B64.decode(fields.get("server_key")?).ok()?,
            iterations: fields.get("iterations")?.parse().ok()?,
        })
    }
}

pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    if getrandom::getrandom(&mut b).is_err() {
        // No entropy source at all: uuid's generator draws from the same one, so fall back
        // to the time-based mix rather than fail; this only happens on a broken system.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        for (i, x) in b.iter_mut().enumerate() {
            *x = (t >> ((i % 16) * 8)) as u8 ^ i as u8;
        }
    }
    b
}

/// The znode of a user's config: `/config/users/<sanitized user>`.
pub fn user_path(sanitized: &str) -> String {
    format!("{CONFIG_USERS}/{sanitized}")
}

/// Kafka's `Sanitizer.sanitize`: a user name as a znode name (URL-encoded, `*` too).
pub fn sanitize(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Kafka's `Sanitizer.desanitize`.
pub fn desanitize(name: &str) -> String {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            if let Some(v) = name.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The user entity's config map (`{"version":1,"config":{...}}`), which may hold quotas too.
pub fn parse_user_config(data: &str) -> BTreeMap<String, String> {
    serde_json::from_str::<serde_json::Value>(data)
        .ok()
        .and_then(|v| v.get("config").and_then(|c| c.as_object()).cloned())
        .map(|m| m.into_iter().filter_map(|(k, v)| Some((k, v.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

pub fn user_config_json(config: &BTreeMap<String, String>) -> String {
    serde_json::json!({"version": 1, "config": config}).to_string()
}

fn credentials_of(config: &BTreeMap<String, String>) -> BTreeMap<Mechanism, ScramCredential> {
    config.iter().filter_map(|(k, v)| Some((Mechanism::from_name(k)?, ScramCredential::parse(v)?))).collect()
}

/// Every user's SCRAM credentials, as the znodes last read held them.
#[derive(Default)]
pub struct CredentialCache {
    users: RwLock<HashMap<String, BTreeMap<Mechanism, ScramCredential>>>,
}

impl CredentialCache {
    pub fn get(&self, user: &str, mechanism: Mechanism) -> Option<ScramCredential> {
        self.users.read_unpoisoned().get(user)?.get(&mechanism).cloned()
    }

    pub fn describe(&self, user: &str) -> Option<Vec<(Mechanism, i32)>> {
        let users = self.users.read_unpoisoned();
        let creds = users.get(user)?;
        Some(creds.iter().map(|(m, c)| (*m, c.iterations)).collect())
    }

    pub fn users(&self) -> Vec<String> {
        let mut v: Vec<String> = self.users.read_unpoisoned().keys().cloned().collect();
        v.sort();
        v
    }

    /// Reads every user's znode (at start and after a new session). Reads happen before the
    /// lock is taken.
    pub fn load_all(&self, store: &ZnodeStore) -> Result<(), StoreError> {
        let mut next = HashMap::new();
        for child in store.try_children(CONFIG_USERS)? {
            if let Some(data) = store.try_get(&user_path(&child))? {
                let creds = credentials_of(&parse_user_config(&data));
                if !creds.is_empty() {
                    next.insert(desanitize(&child), creds);
                }
            }
        }
        *self.users.write_unpoisoned() = next;
        Ok(())
    }

    /// Re-reads one user's znode (by its znode name) after it changed.
    pub fn reload(&self, store: &ZnodeStore, znode: &str) -> Result<(), StoreError> {
        let user = desanitize(znode);
        let user = user.as_str();
        let creds =
            store.try_get(&user_path(znode))?.map(|d| credentials_of(&parse_user_config(&d))).unwrap_or_default();
        let mut users = self.users.write_unpoisoned();
        if creds.is_empty() {
            users.remove(user);
        } else {
            users.insert(user.to_string(), creds);
        }
        Ok(())
    }
}

/// Kafka's `saslName` decoding (RFC 5802: `=2C` is `,` and `=3D` is `=`).
fn decode_sasl_name(s: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return None,
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The server side of one exchange.
pub enum ScramServer {
    /// Waiting for client-first.
    Start {
        mechanism: Mechanism,
    },
    /// Server-first sent; waiting for client-final.
    Challenged {
        mechanism: Mechanism,
        user: String,
        /// None: an unknown user, given a made-up salt so the exchange looks the same as for a
        /// real one and fails only at the proof.
        credential: Option<ScramCredential>,
        client_first_bare: String,
        server_first: String,
        nonce: String,
        gs2_header: String,
    },
    Done,
}

pub enum Step {
    /// Send this to the client and wait for its next message.
    Challenge(Vec<u8>),
    /// Authenticated as the user; the server-final message goes to the client.
    Success { user: String, server_final: Vec<u8> },
    /// Why, for the log only: the client is told nothing specific.
    Failure(String),
}

impl ScramServer {
    pub fn new(mechanism: Mechanism) -> ScramServer {
        ScramServer::Start { mechanism }
    }

    pub fn step(&mut self, message: &[u8], cache: &CredentialCache, decoy_key: &[u8]) -> Step {
        let state = std::mem::replace(self, ScramServer::Done);
        let Ok(message) = std::str::from_utf8(message) else {
            return Step::Failure("SCRAM message is not UTF-8".into());
        };
        match state {
            ScramServer::Start { mechanism } => {
                // gs2-header: "n,," / "y,," / "n,a=authzid,"; channel binding ("p=") is not offered.
                let mut parts = message.splitn(3, ',');
                let (Some(cb), Some(authz), Some(bare)) = (parts.next(), parts.next(), parts.next()) else {
                    return Step::Failure("malformed client-first message".into());
                };
                if cb != "n" && cb != "y" {
                    return Step::Failure(format!("unsupported channel binding flag {cb:?}"));
                }
                let mut user = None;
                let mut cnonce = None;
                for attr in bare.split(',') {
                    if let Some(u) = attr.strip_prefix("n=") {
                        user = decode_sasl_name(u);
                    } else if let Some(r) = attr.strip_prefix("r=") {
                        cnonce = Some(r.to_string());
                    } else if attr.starts_with("tokenauth=") {
                        return Step::Failure("delegation tokens are not supported".into());
                    }
                }
                let (Some(user), Some(cnonce)) = (user, cnonce) else {
                    return Step::Failure("client-first message lacks n= or r=".into());
                };
                if cnonce.is_empty() || user.is_empty() {
                    return Step::Failure("empty user name or nonce".into());
                }
                if let Some(a) = authz.strip_prefix("a=") {
                    if decode_sasl_name(a).as_deref() != Some(user.as_str()) {
                        return Step::Failure("authorization id differs from the user name".into());
                    }
                } else if !authz.is_empty() {
                    return Step::Failure("malformed authorization id".into());
                }
                let credential = cache.get(&user, mechanism);
                let (salt, iterations) = match &credential {
                    Some(c) => (c.salt.clone(), c.iterations),
                    None => (mechanism.hmac(decoy_key, &[user.as_bytes()]), MIN_ITERATIONS),
                };
                let snonce = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random_bytes(24));
                let nonce = format!("{cnonce}{snonce}");
                let server_first = format!("r={nonce},s={},i={iterations}", B64.encode(&salt));
                *self = ScramServer::Challenged {
                    mechanism,
                    user,
                    credential,
                    client_first_bare: bare.to_string(),
                    server_first: server_first.clone(),
                    nonce,
                    gs2_header: format!("{cb},{authz},"),
                };
                Step::Challenge(server_first.into_bytes())
            }
            ScramServer::Challenged {
                mechanism,
                user,
                credential,
                client_first_bare,
                server_first,
                nonce,
                gs2_header,
            } => {
                let Some(proof_at) = message.rfind(",p=") else {
                    return Step::Failure("client-final message has no proof".into());
                };
                let without_proof = &message[..proof_at];
                let proof = match B64.decode(&message[proof_at + 3..]) {
                    Ok(p) => p,
                    Err(_) => return Step::Failure("proof is not base64".into()),
                };
                let mut channel = None;
                let mut rnonce = None;
                for attr in without_proof.split(',') {
                    if let Some(c) = attr.strip_prefix("c=") {
                        channel = Some(c);
                    } else if let Some(r) = attr.strip_prefix("r=") {
                        rnonce = Some(r);
                    }
                }
                if channel.and_then(|c| B64.decode(c).ok()).as_deref() != Some(gs2_header.as_bytes()) {
                    return Step::Failure("channel binding does not match the client-first message".into());
                }
                // Kafka checks only that the echoed nonce ends with the server's (librdkafka 2.0
                // repeats the client nonce in front), so that is what is checked here too.
                if !rnonce.is_some_and(|r| r.ends_with(nonce.as_str())) {
                    return Step::Failure("nonce does not match the server's".into());
                }
                let Some(credential) = credential else {
                    return Step::Failure(format!("unknown user {user}"));
                };
                let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
                let signature = mechanism.hmac(&credential.stored_key, &[auth_message.as_bytes()]);
                if proof.len() != signature.len() {
                    return Step::Failure(format!("wrong proof for user {user}"));
                }
                let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
                let stored = mechanism.hash(&client_key);
                // Constant time: the comparison must not tell how much of the key matched.
                let same = stored.len() == credential.stored_key.len()
                    && stored.iter().zip(&credential.stored_key).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
                if !same {
                    return Step::Failure(format!("wrong password for user {user}"));
                }
                let server_signature = mechanism.hmac(&credential.server_key, &[auth_message.as_bytes()]);
                Step::Success { user, server_final: format!("v={}", B64.encode(server_signature)).into_bytes() }
            }
            ScramServer::Done => Step::Failure("SCRAM exchange already finished".into()),
        }
    }
}

/// The client side, for this broker's own connections to other brokers and for tests.
pub struct ScramClient {
    mechanism: Mechanism,
    user: String,
    password: String,
    cnonce: String,
    client_first_bare: String,
    server_signature: Option<Vec<u8>>,
}

impl ScramClient {
    pub fn new(mechanism: Mechanism, user: &str, password: &str) -> ScramClient {
        let cnonce = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random_bytes(24));
        let name = user.replace('=', "=3D").replace(',', "=2C");
        ScramClient {
            mechanism,
            user: user.to_string(),
            password: password.to_string(),
            client_first_bare: format!("n={name},r={cnonce}"),
            cnonce,
            server_signature: None,
        }
    }

    pub fn user(&self) -> &str {
        &self.user
    }

    pub fn first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    pub fn final_message(&mut self, server_first: &[u8]) -> Result<Vec<u8>, String> {
        let sf = std::str::from_utf8(server_first).map_err(|_| "server-first is not UTF-8")?;
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for attr in sf.split(',') {
            if let Some(v) = attr.strip_prefix("r=") {
                nonce = Some(v);
            } else if let Some(v) = attr.strip_prefix("s=") {
                salt = B64.decode(v).ok();
            } else if let Some(v) = attr.strip_prefix("i=") {
                iterations = v.parse::<u32>().ok();
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err(format!("malformed server-first message {sf:?}"));
        };
        if !nonce.starts_with(&self.cnonce) || iterations == 0 {
            return Err("server nonce or iterations are invalid".into());
        }
        let m = self.mechanism;
        let salted = m.salted_password(self.password.as_bytes(), &salt, iterations);
        let client_key = m.hmac(&salted, &[b"Client Key"]);
        let stored_key = m.hash(&client_key);
        let without_proof = format!("c={},r={nonce}", B64.encode("n,,"));
        let auth_message = format!("{},{sf},{without_proof}", self.client_first_bare);
        let signature = m.hmac(&stored_key, &[auth_message.as_bytes()]);
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        let server_key = m.hmac(&salted, &[b"Server Key"]);
        self.server_signature = Some(m.hmac(&server_key, &[auth_message.as_bytes()]));
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    pub fn verify_server_final(&self, server_final: &[u8]) -> Result<(), String> {
        let sf = std::str::from_utf8(server_final).map_err(|_| "server-final is not UTF-8")?;
        let v = sf.strip_prefix("v=").ok_or_else(|| format!("server-final message {sf:?}"))?;
        if Some(B64.decode(v).map_err(|_| "server signature is not base64")?) != self.server_signature {
            return Err("the server's signature does not verify".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's SCRAM-SHA-256 example: user "user", password "pencil".
    #[test]
    fn rfc7677_example_verifies() {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = Mechanism::Sha256.salted_password(b"pencil", &salt, 4096);
        let cred = ScramCredential::from_salted_password(Mechanism::Sha256, salt, &salted, 4096);
        let client_first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO";
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let without_proof = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let auth = format!("{client_first_bare},{server_first},{without_proof}");
        let sig = Mechanism::Sha256.hmac(&cred.server_key, &[auth.as_bytes()]);
        assert_eq!(B64.encode(sig), "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
        let client_key = Mechanism::Sha256.hmac(&salted, &[b"Client Key"]);
        let csig = Mechanism::Sha256.hmac(&cred.stored_key, &[auth.as_bytes()]);
        let proof: Vec<u8> = client_key.iter().zip(&csig).map(|(a, b)| a ^ b).collect();
        assert_eq!(B64.encode(proof), "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=");
    }

    fn cache_with(user: &str, password: &str, m: Mechanism) -> CredentialCache {
        let cache = CredentialCache::default();
        let mut creds = BTreeMap::new();
        creds.insert(m, ScramCredential::from_password(m, password, 4096));
        cache.users.write().unwrap().insert(user.to_string(), creds);
        cache
    }

    fn exchange(cache: &CredentialCache, user: &str, password: &str, m: Mechanism) -> Result<String, String> {
        let mut client = ScramClient::new(m, user, password);
        let mut server = ScramServer::new(m);
        let Step::Challenge(sf) = server.step(&client.first(), cache, b"k") else {
            return Err("no challenge".into());
        };
        let cf = client.final_message(&sf)?;
        match server.step(&cf, cache, b"k") {
            Step::Success { user, server_final } => {
                client.verify_server_final(&server_final)?;
                Ok(user)
            }
            Step::Failure(why) => Err(why),
            Step::Challenge(_) => Err("unexpected challenge".into()),
        }
    }

    #[test]
    fn exchanges_succeed_only_with_the_right_password() {
        for m in [Mechanism::Sha256, Mechanism::Sha512] {
            let cache = cache_with("alice", "alice-secret", m);
            assert_eq!(exchange(&cache, "alice", "alice-secret", m).unwrap(), "alice");
            assert!(exchange(&cache, "alice", "wrong", m).unwrap_err().contains("wrong password"));
            assert!(exchange(&cache, "mallory", "x", m).unwrap_err().contains("unknown user"));
        }
        // A credential for one mechanism does not authenticate the other.
        let cache = cache_with("alice", "alice-secret", Mechanism::Sha256);
        assert!(exchange(&cache, "alice", "alice-secret", Mechanism::Sha512).is_err());
    }

    #[test]
    fn credentials_round_trip_kafkas_string_form() {
        let c = ScramCredential::from_password(Mechanism::Sha512, "pw", 4096);
        let s = c.to_kafka_string();
        assert!(s.starts_with("salt=") && s.ends_with(",iterations=4096"));
        assert_eq!(ScramCredential::parse(&s).unwrap(), c);
        assert_eq!(decode_sasl_name("a=2Cb=3Dc").as_deref(), Some("a,b=c"));
        assert_eq!(decode_sasl_name("bad=xx"), None);
    }
}
