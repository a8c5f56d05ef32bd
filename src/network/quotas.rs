//! Connection quotas: how many connections the broker, each listener and each client address
//! may hold, and how fast new ones may be accepted.

use super::*;

/// Kafka's connection quotas: `max.connections` over the broker, `listener.name.<l>.max.connections`
/// per listener, and `max.connections.per.ip` (with its overrides) per client address. As in
/// Kafka, the inter-broker listener is exempt from the broker-wide limit (brokers can always
/// reach each other), so with a single listener only the per-listener and per-IP limits bind.
pub struct ConnectionQuotas {
    /// The broker-wide limits, dynamic broker configs in Kafka (SocketServer's
    /// reconfigurable set): changed in place by [`ConnectionQuotas::reconfigure`].
    limits: std::sync::RwLock<Limits>,
    pub(super) inter_broker_listener: String,
    pub(super) per_listener_max: HashMap<String, usize>,
    counts: Mutex<Counts>,
    /// Signalled whenever a connection ends, for an acceptor waiting for room.
    pub(super) freed: Notify,
    /// `max.connection.creation.rate`, over the listeners but the inter-broker one.
    pub(super) broker_rate: Mutex<Option<TokenBucket>>,
    /// `listener.name.<l>.max.connection.creation.rate`.
    pub(super) listener_rates: HashMap<String, Mutex<TokenBucket>>,
    /// `queued.max.request.bytes`, shared by every connection.
    pub memory: RequestMemoryPool,
    /// Lines about refused and closed connections, bounded per client address.
    pub(super) closings: ClosingLog,
}

/// `max.connections`, `max.connections.per.ip` and its overrides.
struct Limits {
    pub(super) max_total: usize,
    pub(super) max_per_ip: usize,
    pub(super) overrides: HashMap<IpAddr, usize>,
    pub(super) creation_rate: Option<u32>,
}

impl Limits {
    pub(super) fn of(config: &crate::config::BrokerConfig) -> Limits {
        Limits {
            max_total: config.max_connections,
            max_per_ip: config.max_connections_per_ip,
            overrides: config.max_connections_per_ip_overrides.iter().copied().collect(),
            creation_rate: config.max_connection_creation_rate,
        }
    }
}

/// A connection creation rate as Kafka enforces it: not by refusing connections but by
/// accepting the next one only when the rate allows (the client waits in the backlog). A
/// bucket of one second's worth of connections, refilled continuously.
pub(super) struct TokenBucket {
    pub(super) rate: f64,
    pub(super) tokens: f64,
    pub(super) at: Instant,
}

impl TokenBucket {
    pub(super) fn new(rate: u32) -> Mutex<TokenBucket> {
        Mutex::new(TokenBucket::full(rate))
    }

    pub(super) fn full(rate: u32) -> TokenBucket {
        let rate = f64::from(rate);
        TokenBucket { rate, tokens: rate, at: Instant::now() }
    }

    /// Takes a token, or says how long until there is one.
    pub(super) fn take(&mut self, now: Instant) -> Option<std::time::Duration> {
        self.tokens =
            (self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * self.rate).min(self.rate.max(1.0));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return None;
        }
        if self.rate <= 0.0 {
            // A rate of 0: no new connection, ever (checked again once a second).
            return Some(std::time::Duration::from_secs(1));
        }
        Some(std::time::Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
    }
}

#[derive(Default)]
struct Counts {
    pub(super) total: usize,
    pub(super) per_listener: HashMap<Arc<str>, usize>,
    pub(super) per_ip: HashMap<IpAddr, usize>,
}

impl ConnectionQuotas {
    pub fn new(config: &crate::config::BrokerConfig) -> Arc<ConnectionQuotas> {
        Arc::new(ConnectionQuotas {
            limits: std::sync::RwLock::new(Limits::of(config)),
            inter_broker_listener: config.inter_broker_listener.clone(),
            per_listener_max: config.listener_max_connections.clone(),
            counts: Mutex::new(Counts::default()),
            freed: Notify::new(),
            broker_rate: Mutex::new(config.max_connection_creation_rate.map(TokenBucket::full)),
            listener_rates: config
                .listener_max_connection_creation_rate
                .iter()
                .map(|(l, &r)| (l.clone(), TokenBucket::new(r)))
                .collect(),
            memory: RequestMemoryPool::new(config.queued_max_request_bytes),
            closings: ClosingLog::new(config.connection_log_interval),
        })
    }

    /// How long `listener` must wait before it accepts its next connection, taking the token
    /// when there is none to wait for. The listener's own rate is checked first, so a
    /// connection it holds back does not use up the broker-wide rate.
    pub(super) fn creation_delay(&self, listener: &str) -> Option<std::time::Duration> {
        let now = Instant::now();
        if let Some(bucket) = self.listener_rates.get(listener) {
            if let Some(wait) = bucket.lock_unpoisoned().take(now) {
                return Some(wait);
            }
        }
        if listener == self.inter_broker_listener {
            return None;
        }
        let wait = self.broker_rate.lock_unpoisoned().as_mut()?.take(now);
        if wait.is_some() {
            // Give the listener's token back: this connection is not accepted yet.
            if let Some(b) = self.listener_rates.get(listener) {
                let mut b = b.lock_unpoisoned();
                b.tokens += 1.0;
            }
        }
        wait
    }

    fn limits(&self) -> std::sync::RwLockReadGuard<'_, Limits> {
        self.limits.read_unpoisoned()
    }

    /// Applies new broker-wide limits (dynamic broker configs). Connections already open
    /// stay, as in Kafka; an acceptor waiting for room looks again at once.
    pub fn reconfigure(&self, config: &crate::config::BrokerConfig) {
        let next = Limits::of(config);
        let rate_changed = {
            let mut l = self.limits.write_unpoisoned();
            let changed = l.creation_rate != next.creation_rate;
            *l = next;
            changed
        };
        if rate_changed {
            *self.broker_rate.lock_unpoisoned() = config.max_connection_creation_rate.map(TokenBucket::full);
        }
        self.freed.notify_waiters();
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock_unpoisoned()
    }

    /// Why `listener` cannot take another connection now, if it cannot.
    fn no_slot(&self, counts: &Counts, listener: &str) -> Option<String> {
        let max = self.per_listener_max.get(listener).copied().unwrap_or(usize::MAX);
        if counts.per_listener.get(listener).copied().unwrap_or(0) >= max {
            return Some(format!("listener {listener} has the configured maximum of {max} connections"));
        }
        let max_total = self.limits().max_total;
        if listener != self.inter_broker_listener && counts.total >= max_total {
            return Some(format!("the broker has the configured maximum of {max_total} connections"));
        }
        None
    }

    pub(super) fn full(&self, listener: &str) -> bool {
        self.no_slot(&self.counts(), listener).is_some()
    }

    /// Counts a new connection from `ip` on `listener`, or says which limit it would pass.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr, listener: &Arc<str>) -> Result<Admitted, String> {
        let mut counts = self.counts();
        if let Some(why) = self.no_slot(&counts, listener) {
            return Err(why);
        }
        let limit = {
            let l = self.limits();
            l.overrides.get(&ip).copied().unwrap_or(l.max_per_ip)
        };
        let open = counts.per_ip.get(&ip).copied().unwrap_or(0);
        if open >= limit {
            return Err(format!("/{ip} already has the configured maximum of {limit} connections"));
        }
        counts.per_ip.insert(ip, open + 1);
        *counts.per_listener.entry(listener.clone()).or_insert(0) += 1;
        counts.total += 1;
        Ok(Admitted { quotas: self.clone(), ip, listener: listener.clone() })
    }
}

/// A connection's place in the quotas, given back when it ends.
pub(super) struct Admitted {
    pub(super) quotas: Arc<ConnectionQuotas>,
    pub(super) ip: IpAddr,
    pub(super) listener: Arc<str>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self.quotas.counts();
        match counts.per_ip.get_mut(&self.ip) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                counts.per_ip.remove(&self.ip);
            }
        }
        if let Some(n) = counts.per_listener.get_mut(&self.listener) {
            *n = n.saturating_sub(1);
        }
        counts.total = counts.total.saturating_sub(1);
        drop(counts);
        self.quotas.freed.notify_waiters();
    }
}
