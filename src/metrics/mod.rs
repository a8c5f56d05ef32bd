//! Broker metrics (Kafka's Yammer metrics), exposed to Prometheus on `/metrics` when
//! `metrics.port` is set.
//!
//! Names are the ones Prometheus' JMX exporter gives Kafka's MBeans under its usual Kafka rules
//! (`lowercaseOutputName`, `...PerSec` counts as `_total` counters):
//! `kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec,topic=t` is
//! `kafka_server_brokertopicmetrics_messagesin_total{topic="t"}`, so dashboards and alerts
//! written for Kafka read gregor unchanged.
//!
//! Two kinds, kept apart for the data plane's sake:
//! - counters and histograms that requests move are plain atomics behind handles resolved
//!   once: per partition (its topic's counters), per API and version. Produce and fetch never
//!   look a series up by name, take a lock or allocate to count.
//! - gauges of the broker's state (partitions led, under-replicated, log sizes, ...) are not
//!   kept up to date at all: each scrape computes them from a [`StateSample`] that the broker
//!   takes, so their cost is paid by the scraper, not by requests.

pub mod http;

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};

pub type Result<T> = std::result::Result<T, prometheus::Error>;

/// Upper bounds (ms) of the request latency histograms: sub-millisecond produces up to
/// fetches that wait out a long `max.wait.ms` and acks=all produces that time out.
const TOTAL_TIME_MS_BUCKETS: &[f64] =
    &[0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0];

/// API keys and versions for which request series can exist (Kafka's keys stop below 100,
/// versions below 20); a request outside is still served, just not counted.
const API_KEY_SLOTS: usize = 128;
const VERSION_SLOTS: usize = 32;

const FETCH_KEY: i16 = 1;

/// The inter-broker APIs the protocol crate no longer names, with Kafka's names.
const INTER_BROKER_API_NAMES: &[(i16, &str)] = &[
    (4, "LeaderAndIsr"),
    (5, "StopReplica"),
    (6, "UpdateMetadata"),
    (7, "ControlledShutdown"),
    (56, "AlterPartition"),
];

/// Kafka's name of an API key (`ApiKeys.name`): what the `request` label carries.
pub fn api_name(key: i16) -> Option<Cow<'static, str>> {
    if let Some((_, name)) = INTER_BROKER_API_NAMES.iter().find(|(k, _)| *k == key) {
        return Some(Cow::Borrowed(name));
    }
    kafka_protocol::messages::ApiKey::try_from(key).ok().map(|k| Cow::Owned(format!("{k:?}")))
}

/// Every metric the broker moves itself; the state gauges come with each scrape.
pub struct BrokerMetrics {
    /// Shared with the replica manager, which hands each partition its topic's counters.
    pub topics: Arc<BrokerTopicMetrics>,
    pub requests: RequestMetrics,
    /// Handed to every partition, which counts the ISR changes it applies as leader.
    pub isr: IsrMetrics,
    pub conversions: ConversionMetrics,
    purgatory: IntGaugeVec,
    produce_purgatory: IntGauge,
    fetch_purgatory: IntGauge,
    handling: IntGauge,
    /// Handed to the I/O pool, which counts the jobs it runs.
    pub io_jobs: IntCounter,
    /// Handed to the I/O pool, which shows its size there as `num.io.threads` changes.
    pub io_threads: IntGauge,
    connections: IntGaugeVec,
    connections_created: IntCounterVec,
    spares: Spares,
}

impl BrokerMetrics {
    pub fn new() -> Result<BrokerMetrics> {
        let purgatory = IntGaugeVec::new(
            Opts::new(
                "kafka_server_delayedoperationpurgatory_purgatorysize",
                "Requests parked until their condition holds: acks=all produces waiting for the ISR, fetches waiting \
                 for fetch.min.bytes",
            ),
            &["delayedOperation"],
        )?;
        let produce_purgatory = purgatory.get_metric_with_label_values(&["Produce"])?;
        let fetch_purgatory = purgatory.get_metric_with_label_values(&["Fetch"])?;
        let spares = Spares::new()?;
        Ok(BrokerMetrics {
            topics: Arc::new(BrokerTopicMetrics::new(&spares)?),
            requests: RequestMetrics::new(&spares)?,
            isr: IsrMetrics {
                shrinks: IntCounter::new(
                    "kafka_server_replicamanager_isrshrinks_total",
                    "ISR shrinks of partitions led here, counted as the leader applies them",
                )?,
                expands: IntCounter::new(
                    "kafka_server_replicamanager_isrexpands_total",
                    "ISR expansions of partitions led here, counted as the leader applies them",
                )?,
            },
            conversions: ConversionMetrics {
                produce: IntCounter::new(
                    "kafka_server_brokertopicmetrics_producemessageconversions_total",
                    "Records of message formats v0/v1 (Produce v0-v2) converted to record batches on append",
                )?,
                fetch: IntCounter::new(
                    "kafka_server_brokertopicmetrics_fetchmessageconversions_total",
                    "Records down-converted to message formats v0/v1 for Fetch v0-v3 consumers",
                )?,
            },
            purgatory,
            produce_purgatory,
            fetch_purgatory,
            handling: IntGauge::new(
                "kafka_network_requestchannel_requestqueuesize",
                "Requests being decoded and handled, at most queued.max.requests (gregor handles a request as it \
                 is read, so this is Kafka's queue and its handler threads in one); parked requests are not counted",
            )?,
            io_jobs: IntCounter::new(
                "gregor_io_pool_jobs_total",
                "Requests whose appends or record reads ran on the I/O pool (num.io.threads), one job each",
            )?,
            io_threads: IntGauge::new(
                "gregor_io_pool_threads",
                "Jobs the I/O pool runs at once at most: num.io.threads as now in force, dynamic value included",
            )?,
            connections: IntGaugeVec::new(
                Opts::new("kafka_server_socket_server_metrics_connection_count", "Open client connections"),
                &["listener"],
            )?,
            connections_created: IntCounterVec::new(
                Opts::new("kafka_server_socket_server_metrics_connection_creation_total", "Connections accepted"),
                &["listener"],
            )?,
            spares,
        })
    }

    /// Holds an acks=all produce in the Produce purgatory count until dropped.
    pub fn park_produce(&self) -> GaugeGuard {
        GaugeGuard::new(&self.produce_purgatory)
    }

    /// Holds a long-polling fetch in the Fetch purgatory count until dropped.
    pub fn park_fetch(&self) -> GaugeGuard {
        GaugeGuard::new(&self.fetch_purgatory)
    }

    /// Holds a request in the count of those being handled until dropped.
    pub fn handling(&self) -> GaugeGuard {
        GaugeGuard::new(&self.handling)
    }

    /// The connection counters of one listener, resolved once when it starts accepting.
    pub fn listener(&self, name: &str) -> ListenerMetrics {
        ListenerMetrics {
            open: self.connections.get_metric_with_label_values(&[name]).unwrap_or_else(|_| self.spares.gauge.clone()),
            created: self
                .connections_created
                .get_metric_with_label_values(&[name])
                .unwrap_or_else(|_| self.spares.counter.clone()),
        }
    }

    /// Everything, in Prometheus' text format (version 0.0.4).
    pub fn render(&self, state: &StateSample) -> String {
        let mut families = self.topics.collect();
        families.extend(self.requests.collect());
        families.extend(self.isr.shrinks.collect());
        families.extend(self.isr.expands.collect());
        families.extend(self.conversions.produce.collect());
        families.extend(self.conversions.fetch.collect());
        families.extend(self.purgatory.collect());
        families.extend(self.handling.collect());
        families.extend(self.io_jobs.collect());
        families.extend(self.io_threads.collect());
        families.extend(self.connections.collect());
        families.extend(self.connections_created.collect());
        families.extend(state.families());
        // The encoder refuses a family without series (a vec nothing was counted in yet).
        families.retain(|f| !f.get_metric().is_empty());
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = String::with_capacity(4096);
        if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&families, &mut out) {
            // Only a malformed family (a bug here) gets this far; say so rather than serve half.
            tracing::warn!(error = %e, "cannot encode metrics");
            out.clear();
        }
        out
    }
}

/// Kafka's `IsrShrinksPerSec` and `IsrExpandsPerSec`.
#[derive(Clone)]
pub struct IsrMetrics {
    shrinks: IntCounter,
    expands: IntCounter,
}

impl IsrMetrics {
    pub fn record_shrink(&self) {
        self.shrinks.inc();
    }

    pub fn record_expand(&self) {
        self.expands.inc();
    }

    /// (shrinks, expands) so far.
    #[cfg(test)]
    pub fn counts(&self) -> (u64, u64) {
        (self.shrinks.get(), self.expands.get())
    }

    /// Counters exposed nowhere, for a partition outside a broker.
    #[cfg(test)]
    pub fn detached() -> IsrMetrics {
        BrokerMetrics::new().map(|m| m.isr).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// A request counted in a purgatory gauge for as long as this lives, however its wait ends
/// (satisfied, timed out, or the connection dropped and the future with it).
pub struct GaugeGuard(IntGauge);

impl GaugeGuard {
    fn new(gauge: &IntGauge) -> GaugeGuard {
        gauge.inc();
        GaugeGuard(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// One listener's connection counters.
#[derive(Clone)]
pub struct ListenerMetrics {
    open: IntGauge,
    created: IntCounter,
}

impl ListenerMetrics {
    /// Counts a connection as open until the returned guard is dropped.
    pub fn connection(&self) -> GaugeGuard {
        self.created.inc();
        GaugeGuard::new(&self.open)
    }
}

/// Stand-ins for a series that cannot be made, made up front so that no request has to fail
/// or panic over one. Never expected: names and label counts are fixed here and tested.
#[derive(Clone)]
struct Spares {
    counter: IntCounter,
    gauge: IntGauge,
    histogram: Histogram,
}

impl Spares {
    fn new() -> Result<Spares> {
        Ok(Spares {
            counter: IntCounter::new("unexposed", "never exposed")?,
            gauge: IntGauge::new("unexposed", "never exposed")?,
            histogram: Histogram::with_opts(HistogramOpts::new("unexposed", "never exposed"))?,
        })
    }
}

/// One `BrokerTopicMetrics` meter: a series per topic plus the all-topics series without a
/// topic label, as Kafka's MBean without `topic=` is rendered. Both are counted on each event
/// (as Kafka marks both meters), so deleting a topic never makes the total go backwards.
struct TopicFamily {
    per_topic: IntCounterVec,
    all: IntCounter,
    spare: IntCounter,
}

impl TopicFamily {
    fn new(name: &str, help: &str, spares: &Spares) -> Result<TopicFamily> {
        Ok(TopicFamily {
            per_topic: IntCounterVec::new(Opts::new(name, help), &["topic"])?,
            all: IntCounter::new(name, help)?,
            spare: spares.counter.clone(),
        })
    }

    fn handle(&self, topic: &str) -> TopicCounter {
        let one = self.per_topic.get_metric_with_label_values(&[topic]).unwrap_or_else(|_| self.spare.clone());
        TopicCounter { topic: one, all: self.all.clone() }
    }

    fn collect(&self) -> MetricFamily {
        let mut families = self.per_topic.collect();
        let mut family = families.pop().unwrap_or_default();
        let mut metrics = family.take_metric();
        metrics.extend(self.all.collect().into_iter().flat_map(|mut f| f.take_metric()));
        family.set_metric(metrics);
        family
    }
}

/// A topic's counter and the all-topics one, incremented together.
#[derive(Clone)]
struct TopicCounter {
    topic: IntCounter,
    all: IntCounter,
}

impl TopicCounter {
    fn add(&self, n: u64) {
        self.topic.inc_by(n);
        self.all.inc_by(n);
    }
}

/// Kafka's message-format conversions (broker-wide here; Kafka also keeps them per topic).
pub struct ConversionMetrics {
    pub produce: IntCounter,
    pub fetch: IntCounter,
}

/// Kafka's `BrokerTopicMetrics`.
pub struct BrokerTopicMetrics {
    messages_in: TopicFamily,
    bytes_in: TopicFamily,
    bytes_out: TopicFamily,
    replication_bytes_in: TopicFamily,
    replication_bytes_out: TopicFamily,
}

impl BrokerTopicMetrics {
    fn new(spares: &Spares) -> Result<BrokerTopicMetrics> {
        Ok(BrokerTopicMetrics {
            messages_in: TopicFamily::new(
                "kafka_server_brokertopicmetrics_messagesin_total",
                "Records appended by this broker as leader",
                spares,
            )?,
            bytes_in: TopicFamily::new(
                "kafka_server_brokertopicmetrics_bytesin_total",
                "Bytes of record batches appended by this broker as leader",
                spares,
            )?,
            bytes_out: TopicFamily::new(
                "kafka_server_brokertopicmetrics_bytesout_total",
                "Bytes of record batches sent to consumers (replication excluded)",
                spares,
            )?,
            replication_bytes_in: TopicFamily::new(
                "kafka_server_brokertopicmetrics_replicationbytesin_total",
                "Bytes of record batches appended by this broker as follower",
                spares,
            )?,
            replication_bytes_out: TopicFamily::new(
                "kafka_server_brokertopicmetrics_replicationbytesout_total",
                "Bytes of record batches sent to followers",
                spares,
            )?,
        })
    }

    /// The counters of `topic`, to be kept by each of its partitions (creating the series
    /// allocates; counting through the handle does not).
    pub fn topic(&self, topic: &str) -> TopicMetrics {
        TopicMetrics {
            messages_in: self.messages_in.handle(topic),
            bytes_in: self.bytes_in.handle(topic),
            bytes_out: self.bytes_out.handle(topic),
            replication_bytes_in: self.replication_bytes_in.handle(topic),
            replication_bytes_out: self.replication_bytes_out.handle(topic),
        }
    }

    /// Drops a topic's series once no partition of it is hosted here (Kafka's removeMetrics).
    pub fn remove_topic(&self, topic: &str) {
        for f in self.families() {
            let _ = f.per_topic.remove_label_values(&[topic]);
        }
    }

    fn families(&self) -> [&TopicFamily; 5] {
        [&self.messages_in, &self.bytes_in, &self.bytes_out, &self.replication_bytes_in, &self.replication_bytes_out]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.families().iter().map(|f| f.collect()).collect()
    }
}

/// One topic's traffic counters; each partition holds a copy (a few `Arc`s).
#[derive(Clone)]
pub struct TopicMetrics {
    messages_in: TopicCounter,
    bytes_in: TopicCounter,
    bytes_out: TopicCounter,
    replication_bytes_in: TopicCounter,
    replication_bytes_out: TopicCounter,
}

impl TopicMetrics {
    /// Counters exposed nowhere, for a partition outside a broker.
    #[cfg(test)]
    pub fn detached() -> TopicMetrics {
        BrokerMetrics::new().map(|m| m.topics.topic("")).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn record_leader_append(&self, records: u64, bytes: u64) {
        self.messages_in.add(records);
        self.bytes_in.add(bytes);
    }

    pub fn record_follower_append(&self, bytes: u64) {
        self.replication_bytes_in.add(bytes);
    }

    pub fn record_consumer_fetch(&self, bytes: u64) {
        self.bytes_out.add(bytes);
    }

    pub fn record_follower_fetch(&self, bytes: u64) {
        self.replication_bytes_out.add(bytes);
    }
}

/// Kafka's `RequestMetrics`: `RequestsPerSec` by API and version, `TotalTimeMs` by API, where
/// Fetch is timed as `FetchConsumer` or `FetchFollower` as Kafka does (a follower's fetch
/// waits `replica.fetch.wait.max.ms` by design and would drown the consumers' latency).
pub struct RequestMetrics {
    requests: IntCounterVec,
    total_time: HistogramVec,
    /// By `key * VERSION_SLOTS + version`, made on the first request of that kind, so only
    /// the APIs and versions clients use appear.
    counters: Box<[OnceLock<IntCounter>]>,
    /// By key; Fetch's own slot is unused, the last two are FetchConsumer and FetchFollower.
    timers: Box<[OnceLock<Histogram>]>,
    spares: Spares,
}

impl RequestMetrics {
    fn new(spares: &Spares) -> Result<RequestMetrics> {
        Ok(RequestMetrics {
            requests: IntCounterVec::new(
                Opts::new("kafka_network_requestmetrics_requests_total", "Requests received, by API and version"),
                &["request", "version"],
            )?,
            total_time: HistogramVec::new(
                HistogramOpts::new(
                    "kafka_network_requestmetrics_totaltimems",
                    "Time from a request read whole to its response queued for the socket, in milliseconds",
                )
                .buckets(TOTAL_TIME_MS_BUCKETS.to_vec()),
                &["request"],
            )?,
            counters: (0..API_KEY_SLOTS * VERSION_SLOTS).map(|_| OnceLock::new()).collect(),
            timers: (0..API_KEY_SLOTS + 2).map(|_| OnceLock::new()).collect(),
            spares: spares.clone(),
        })
    }

    /// Counts one request and its time. `from_follower` tells a follower's Fetch from a
    /// consumer's; other APIs ignore it.
    pub fn record(&self, key: i16, version: i16, from_follower: bool, elapsed: Duration) {
        let (Ok(k), Ok(v)) = (usize::try_from(key), usize::try_from(version)) else { return };
        if k >= API_KEY_SLOTS || v >= VERSION_SLOTS {
            return;
        }
        let counter = self.counters[k * VERSION_SLOTS + v].get_or_init(|| {
            let name = api_name(key).unwrap_or(Cow::Borrowed("Unknown"));
            self.requests
                .get_metric_with_label_values(&[name.as_ref(), &v.to_string()])
                .unwrap_or_else(|_| self.spares.counter.clone())
        });
        counter.inc();
        let (slot, name) = match (key, from_follower) {
            (FETCH_KEY, false) => (API_KEY_SLOTS, Cow::Borrowed("FetchConsumer")),
            (FETCH_KEY, true) => (API_KEY_SLOTS + 1, Cow::Borrowed("FetchFollower")),
            _ => (k, Cow::Borrowed("")),
        };
        let timer = self.timers[slot].get_or_init(|| {
            let name = if name.is_empty() { api_name(key).unwrap_or(Cow::Borrowed("Unknown")) } else { name };
            self.total_time
                .get_metric_with_label_values(&[name.as_ref()])
                .unwrap_or_else(|_| self.spares.histogram.clone())
        });
        timer.observe(elapsed.as_secs_f64() * 1000.0);
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut out = self.requests.collect();
        out.extend(self.total_time.collect());
        out
    }
}

/// What a scrape needs of the broker's state, taken by the broker without holding any lock
/// for longer than one partition's read.
#[derive(Debug, Default, Clone)]
pub struct StateSample {
    pub active_controller: bool,
    /// Every partition replica hosted here.
    pub partitions: Vec<PartitionSample>,
    /// The controller's view of the cluster (zero on other brokers, as in Kafka).
    pub offline_partitions: u64,
    pub global_partitions: u64,
    pub global_topics: u64,
    /// Topic changes waiting for the controller's event thread, and those it ran since start.
    pub controller_events_queued: u64,
    pub controller_events_processed: u64,
    /// None in standalone mode, which has no ZooKeeper session.
    pub zookeeper: Option<ZooKeeperSample>,
    pub segment_files: SegmentFilesSample,
    /// The index map cache, in the same shape (`open`: indexes mapped).
    pub index_maps: SegmentFilesSample,
}

/// The segment file cache (`gregor.log.segment.fd.cache.size`): lookups that found the file
/// open, those that had to open it, files closed to stay within the size, files open now.
#[derive(Debug, Default, Clone, Copy)]
pub struct SegmentFilesSample {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub open: u64,
    pub capacity: u64,
}

#[derive(Debug, Clone)]
pub struct PartitionSample {
    pub topic: String,
    pub partition: i32,
    pub leader: bool,
    pub replicas: usize,
    pub isr: usize,
    pub min_isr: usize,
    pub size_bytes: u64,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    pub segments: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct ZooKeeperSample {
    pub connected: bool,
    /// Sessions that ended (expired, or were closed by the server) since start.
    pub expired_sessions: u64,
}

impl StateSample {
    fn families(&self) -> Vec<MetricFamily> {
        let led = || self.partitions.iter().filter(|p| p.leader);
        let under_replicated = led().filter(|p| p.isr < p.replicas).count();
        let under_min_isr = led().filter(|p| p.isr < p.min_isr).count();
        let at_min_isr = led().filter(|p| p.isr == p.min_isr).count();
        let mut out = vec![
            gauge(
                "kafka_server_replicamanager_partitioncount",
                "Partition replicas hosted by this broker",
                self.partitions.len() as f64,
            ),
            gauge("kafka_server_replicamanager_leadercount", "Partitions led by this broker", led().count() as f64),
            gauge(
                "kafka_server_replicamanager_underreplicatedpartitions",
                "Partitions led here whose ISR is smaller than their replica set",
                under_replicated as f64,
            ),
            gauge(
                "kafka_server_replicamanager_underminisrpartitioncount",
                "Partitions led here whose ISR is below min.insync.replicas (acks=all writes are refused)",
                under_min_isr as f64,
            ),
            gauge(
                "kafka_server_replicamanager_atminisrpartitioncount",
                "Partitions led here whose ISR is exactly min.insync.replicas",
                at_min_isr as f64,
            ),
            gauge(
                "kafka_controller_kafkacontroller_activecontrollercount",
                "1 on the active controller, 0 elsewhere",
                u8::from(self.active_controller) as f64,
            ),
            gauge(
                "kafka_controller_kafkacontroller_offlinepartitionscount",
                "Partitions without a live leader (reported by the active controller)",
                self.offline_partitions as f64,
            ),
            gauge(
                "kafka_controller_kafkacontroller_globalpartitioncount",
                "Partitions in the cluster (reported by the active controller)",
                self.global_partitions as f64,
            ),
            gauge(
                "kafka_controller_kafkacontroller_globaltopiccount",
                "Topics in the cluster (reported by the active controller)",
                self.global_topics as f64,
            ),
            gauge(
                "kafka_controller_controllereventmanager_eventqueuesize",
                "Topic changes waiting for this broker's controller event thread",
                self.controller_events_queued as f64,
            ),
            family(
                "gregor_controller_events_total",
                "Topic changes this broker's controller event thread has run",
                MetricType::COUNTER,
                vec![counter_metric(vec![], self.controller_events_processed as f64)],
            ),
        ];
        let counter = |name: &str, help: &str, v: u64| {
            family(name, help, MetricType::COUNTER, vec![counter_metric(vec![], v as f64)])
        };
        let files = &self.segment_files;
        out.push(counter(
            "gregor_log_segment_fd_cache_hits_total",
            "Segment file lookups that found the file open",
            files.hits,
        ));
        out.push(counter(
            "gregor_log_segment_fd_cache_misses_total",
            "Segment file lookups that opened the file",
            files.misses,
        ));
        out.push(counter(
            "gregor_log_segment_fd_cache_evictions_total",
            "Segment files closed to stay within gregor.log.segment.fd.cache.size (least recently used first)",
            files.evictions,
        ));
        out.push(gauge(
            "gregor_log_segment_fd_cache_open",
            "Segment files the cache holds open (a read in flight may hold an evicted one a little longer)",
            files.open as f64,
        ));
        out.push(gauge(
            "gregor_log_segment_fd_cache_size",
            "gregor.log.segment.fd.cache.size as in force",
            files.capacity as f64,
        ));
        let maps = &self.index_maps;
        out.push(counter(
            "gregor_log_index_mmap_cache_hits_total",
            "Index reads and writes that found the index mapped",
            maps.hits,
        ));
        out.push(counter(
            "gregor_log_index_mmap_cache_misses_total",
            "Index reads and writes that mapped it",
            maps.misses,
        ));
        out.push(counter(
            "gregor_log_index_mmap_cache_evictions_total",
            "Index mappings dropped to stay within gregor.log.index.mmap.cache.size (least recently used first)",
            maps.evictions,
        ));
        out.push(gauge(
            "gregor_log_index_mmap_cache_mapped",
            "Index files the cache holds mapped (a lookup in flight may hold an evicted one a little longer)",
            maps.open as f64,
        ));
        out.push(gauge(
            "gregor_log_index_mmap_cache_size",
            "gregor.log.index.mmap.cache.size as in force",
            maps.capacity as f64,
        ));
        if let Some(zk) = self.zookeeper {
            out.push(gauge(
                "kafka_server_sessionexpirelistener_sessionstate",
                "1 while the ZooKeeper session is connected, 0 otherwise (Kafka's SessionState gauge, as a number)",
                u8::from(zk.connected) as f64,
            ));
            out.push(family(
                "kafka_server_sessionexpirelistener_zookeeperexpires_total",
                "ZooKeeper sessions that ended and were replaced",
                MetricType::COUNTER,
                vec![counter_metric(vec![], zk.expired_sessions as f64)],
            ));
        }
        let per_log = |name: &str, help: &str, value: fn(&PartitionSample) -> f64| {
            let metrics = self
                .partitions
                .iter()
                .map(|p| {
                    gauge_metric(
                        vec![label("topic", p.topic.clone()), label("partition", p.partition.to_string())],
                        value(p),
                    )
                })
                .collect();
            family(name, help, MetricType::GAUGE, metrics)
        };
        out.push(per_log("kafka_log_log_size", "Bytes in the partition's log segments", |p| p.size_bytes as f64));
        out.push(per_log("kafka_log_log_logstartoffset", "The partition's log start offset", |p| {
            p.log_start_offset as f64
        }));
        out.push(per_log("kafka_log_log_logendoffset", "The partition's log end offset", |p| p.log_end_offset as f64));
        out.push(per_log("kafka_log_log_numlogsegments", "Segments in the partition's log", |p| p.segments as f64));
        out
    }
}

fn label(name: &str, value: String) -> proto::LabelPair {
    let mut l = proto::LabelPair::default();
    l.set_name(name.to_string());
    l.set_value(value);
    l
}

fn gauge_metric(labels: Vec<proto::LabelPair>, value: f64) -> proto::Metric {
    let mut g = proto::Gauge::default();
    g.set_value(value);
    let mut m = proto::Metric::from_label(labels);
    m.set_gauge(g);
    m
}

fn counter_metric(labels: Vec<proto::LabelPair>, value: f64) -> proto::Metric {
    let mut c = proto::Counter::default();
    c.set_value(value);
    let mut m = proto::Metric::from_label(labels);
    m.set_counter(c);
    m
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<proto::Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

fn gauge(name: &str, help: &str, value: f64) -> MetricFamily {
    family(name, help, MetricType::GAUGE, vec![gauge_metric(vec![], value)])
}

#[cfg(test)]
mod tests;
