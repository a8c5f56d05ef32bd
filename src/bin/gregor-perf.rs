// Over ~800 lines on purpose: one standalone tool whose modes share a connection and report layer.
//! `gregor-perf`: a load generator for any Kafka broker, after Kafka's
//! `kafka-producer-perf-test`, `kafka-consumer-perf-test` and `EndToEndLatency`.
//!
//! It is built to cost the client as little as possible, so that what it measures is the
//! broker: a produce request is encoded once and sent again and again with only its correlation
//! id patched, requests are pipelined up to `--max-in-flight` per connection, and the consumer
//! counts records from the batch headers without decoding a record or printing anything.
//! It speaks the protocol through the `kafka-protocol` crate the broker uses (no librdkafka), so
//! it adds no dependency and none of a client library's per-record work.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use clap::{Args, Parser, Subcommand};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, FetchRequest, FetchResponse, ListOffsetsRequest, MetadataRequest,
    ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Semaphore};

use gregor::protocol::ErrorCode;

const PRODUCE_VERSION: i16 = 9;
const FETCH_VERSION: i16 = 12;
const LIST_OFFSETS_VERSION: i16 = 7;
const METADATA_VERSION: i16 = 12;
const CREATE_TOPICS_VERSION: i16 = 5;
/// The v2 record batch header, up to and including the record count.
const BATCH_HEADER: usize = 61;
/// A response larger than this is taken for a broken stream rather than allocated.
const MAX_RESPONSE: usize = 1 << 30;

#[derive(Parser)]
#[command(name = "gregor-perf", version, about = "Kafka producer/consumer load generator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Produce --records records of --record-size bytes as fast as allowed.
    Produce(ProduceArgs),
    /// Read a topic from the beginning, counting records.
    Consume(ConsumeArgs),
    /// Produce at --throughput records/s and consume them in the same process; report the
    /// time from building each record's batch to receiving it in a fetch.
    EndToEnd(ProduceArgs),
    /// One consumer long-polls every partition of a topic while records arrive on a few of
    /// them; report the broker's CPU per fetch request (with or without a fetch session).
    IdleFetch(IdleFetchArgs),
}

#[derive(Args, Clone)]
struct IdleFetchArgs {
    #[command(flatten)]
    common: Common,
    /// Partitions of the topic (created on one broker if missing), all fetched by one consumer.
    #[arg(long, default_value_t = 1000)]
    partitions: i32,
    /// How many of them receive records while the consumer fetches.
    #[arg(long, default_value_t = 1)]
    active: usize,
    /// Records per second over the active partitions.
    #[arg(long, default_value_t = 1000.0)]
    throughput: f64,
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Fetch through an incremental fetch session (KIP-227), as the Java consumer does;
    /// otherwise every fetch names every partition, as librdkafka's do.
    #[arg(long)]
    sessions: bool,
}

#[derive(Args, Clone)]
struct Common {
    /// host:port of any broker.
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap_server: String,
    #[arg(long)]
    topic: String,
    /// Read this process's utime+stime before and after, and report CPU seconds per million
    /// records (the broker's, when run on the same machine).
    #[arg(long)]
    broker_pid: Vec<u32>,
    /// One JSON object on stdout instead of a line of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Clone)]
struct ProduceArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    #[arg(long, default_value_t = 100)]
    record_size: usize,
    /// Create the topic with this many partitions if it does not exist (else: as it is).
    #[arg(long)]
    partitions: Option<i32>,
    #[arg(long, default_value_t = 1)]
    replication_factor: i16,
    /// 0, 1 or -1 (all).
    #[arg(long, default_value = "1", allow_hyphen_values = true)]
    acks: String,
    /// Bytes of records per partition batch (the producer's batch.size).
    #[arg(long, default_value_t = 16384)]
    batch_size: usize,
    /// end-to-end: how long a batch may wait for more records (the producer's linger.ms).
    #[arg(long, default_value_t = 0)]
    linger_ms: u64,
    /// Requests sent on a connection before the first is answered.
    #[arg(long, default_value_t = 5)]
    max_in_flight: usize,
    /// Records per second over all partitions; -1: as fast as possible.
    #[arg(long, default_value_t = -1.0, allow_hyphen_values = true)]
    throughput: f64,
    #[arg(long, default_value_t = 30_000)]
    request_timeout_ms: i32,
}

#[derive(Args, Clone)]
struct ConsumeArgs {
    #[command(flatten)]
    common: Common,
    /// Stop after this many records (default: everything below the high watermarks at start).
    #[arg(long)]
    records: Option<u64>,
    #[arg(long, default_value_t = 64 << 20)]
    fetch_max_bytes: i32,
    #[arg(long, default_value_t = 8 << 20)]
    partition_max_bytes: i32,
    /// Give up when no record arrives for this long.
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gregor-perf: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Produce(a) => produce(a).await,
            Command::Consume(a) => consume(a).await,
            Command::EndToEnd(a) => end_to_end(a).await,
            Command::IdleFetch(a) => idle_fetch(a).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gregor-perf: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------------
// connections
// ---------------------------------------------------------------------------------------------

fn encode_request<R: Request>(version: i16, correlation_id: i32, req: &R) -> Result<BytesMut> {
    let key = ApiKey::try_from(R::KEY).map_err(|_| anyhow!("unknown API key {}", R::KEY))?;
    let mut header = RequestHeader::default();
    header.request_api_key = R::KEY;
    header.request_api_version = version;
    header.correlation_id = correlation_id;
    header.client_id = Some(StrBytes::from_static_str("gregor-perf"));
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    header.encode(&mut buf, key.request_header_version(version))?;
    req.encode(&mut buf, version)?;
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf)
}

async fn read_frame<R: AsyncRead + Unpin>(rd: &mut R) -> Result<Bytes> {
    let size = rd.read_i32().await.context("reading a response size")?;
    if size < 0 || size as usize > MAX_RESPONSE {
        bail!("response of {size} bytes");
    }
    let size = size as usize;
    let mut buf = BytesMut::with_capacity(size);
    while buf.len() < size {
        let want = size - buf.len();
        if rd.read_buf(&mut (&mut buf).limit(want)).await? == 0 {
            bail!("connection closed in a response");
        }
    }
    Ok(buf.freeze())
}

/// Splits a response frame into its correlation id and body.
fn response_body<R: Request>(version: i16, mut frame: Bytes) -> Result<(i32, R::Response)> {
    let key = ApiKey::try_from(R::KEY).map_err(|_| anyhow!("unknown API key {}", R::KEY))?;
    let header = ResponseHeader::decode(&mut frame, key.response_header_version(version))?;
    let body = <R::Response as Decodable>::decode(&mut frame, version)?;
    Ok((header.correlation_id, body))
}

struct Conn {
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
    next_id: i32,
}

impl Conn {
    async fn open(addr: &str) -> Result<Conn> {
        let stream = TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let (rd, wr) = stream.into_split();
        Ok(Conn { rd: BufReader::with_capacity(256 << 10, rd), wr, next_id: 1 })
    }

    async fn call<R: Request>(&mut self, version: i16, req: &R) -> Result<R::Response> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let frame = encode_request(version, id, req)?;
        self.wr.write_all(&frame).await?;
        let (got, body) = response_body::<R>(version, read_frame(&mut self.rd).await?)?;
        if got != id {
            bail!("response to request {got} where {id} was expected");
        }
        Ok(body)
    }
}

/// Where each partition of the topic is led, by broker address.
struct Layout {
    partitions: usize,
    by_leader: BTreeMap<String, Vec<i32>>,
}

fn topic_name(t: &str) -> TopicName {
    TopicName(StrBytes::from_string(t.to_string()))
}

async fn layout(common: &Common, create: Option<(i32, i16)>) -> Result<Layout> {
    let mut conn = Conn::open(&common.bootstrap_server).await?;
    if let Some((partitions, rf)) = create {
        let mut t = CreatableTopic::default();
        t.name = topic_name(&common.topic);
        t.num_partitions = partitions;
        t.replication_factor = rf;
        let mut req = CreateTopicsRequest::default();
        req.topics = vec![t];
        req.timeout_ms = 30_000;
        let r = conn.call(CREATE_TOPICS_VERSION, &req).await?;
        for t in r.topics {
            if t.error_code != 0 && t.error_code != ErrorCode::TopicAlreadyExists.code() {
                bail!("CreateTopics {}: error {} {:?}", common.topic, t.error_code, t.error_message);
            }
        }
    }
    // A topic just created has no leaders for a moment: ask until every partition has one.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut topic = MetadataRequestTopic::default();
        topic.name = Some(topic_name(&common.topic));
        let mut req = MetadataRequest::default();
        req.topics = Some(vec![topic]);
        let md = conn.call(METADATA_VERSION, &req).await?;
        let addr: BTreeMap<i32, String> =
            md.brokers.iter().map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port))).collect();
        let mut by_leader: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        let mut partitions = 0;
        let mut missing = None;
        for t in &md.topics {
            if t.error_code != 0 {
                missing = Some(format!("topic error {}", t.error_code));
                continue;
            }
            for p in &t.partitions {
                partitions += 1;
                match addr.get(&p.leader_id.0) {
                    Some(a) if p.error_code == 0 => by_leader.entry(a.clone()).or_default().push(p.partition_index),
                    _ => missing = Some(format!("partition {} has no leader", p.partition_index)),
                }
            }
        }
        if missing.is_none() && partitions > 0 {
            return Ok(Layout { partitions, by_leader });
        }
        if Instant::now() > deadline {
            bail!("topic {}: {}", common.topic, missing.unwrap_or_else(|| "no partitions".into()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// record batches
// ---------------------------------------------------------------------------------------------

fn put_varint(buf: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        buf.push((z as u8) | 0x80);
        z >>= 7;
    }
    buf.push(z as u8);
}

fn get_varint(buf: &mut &[u8]) -> Option<i64> {
    let mut z: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        z |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some((z >> 1) as i64 ^ -((z & 1) as i64));
        }
    }
    None
}

/// A v2 batch of uncompressed, keyless records. `value(i, buf)` fills record i's value.
fn record_batch(count: usize, size: usize, timestamp: i64, mut value: impl FnMut(usize, &mut [u8])) -> Bytes {
    let mut records = Vec::with_capacity(count * (size + 8));
    let mut body = vec![0u8; size];
    for i in 0..count {
        value(i, &mut body);
        let mut rec = Vec::with_capacity(size + 8);
        rec.push(0); // attributes
        put_varint(&mut rec, 0); // timestamp delta
        put_varint(&mut rec, i as i64); // offset delta
        put_varint(&mut rec, -1); // no key
        put_varint(&mut rec, size as i64);
        rec.extend_from_slice(&body);
        put_varint(&mut rec, 0); // no headers
        put_varint(&mut records, rec.len() as i64);
        records.extend_from_slice(&rec);
    }
    let mut b = Vec::with_capacity(BATCH_HEADER + records.len());
    b.put_i64(0); // base offset: the broker assigns it
    b.put_i32((BATCH_HEADER - 12 + records.len()) as i32);
    b.put_i32(-1); // partition leader epoch
    b.put_i8(2); // magic
    b.put_u32(0); // crc, below
    b.put_i16(0); // attributes: no compression, CreateTime
    b.put_i32(count as i32 - 1);
    b.put_i64(timestamp);
    b.put_i64(timestamp);
    b.put_i64(-1); // producer id: not idempotent
    b.put_i16(-1);
    b.put_i32(-1);
    b.put_i32(count as i32);
    b.extend_from_slice(&records);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(b)
}

fn filler(i: usize, buf: &mut [u8]) {
    for (j, x) in buf.iter_mut().enumerate() {
        *x = b'a' + ((i + j) % 26) as u8;
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A whole Produce request: `counts[i]` records for `partitions[i]`.
fn produce_frame(a: &ProduceArgs, acks: i16, partitions: &[i32], counts: &[usize]) -> Result<BytesMut> {
    let mut topic = TopicProduceData::default();
    topic.name = topic_name(&a.common.topic);
    let mut same: Option<(usize, Bytes)> = None;
    for (&p, &n) in partitions.iter().zip(counts) {
        if n == 0 {
            continue;
        }
        let batch = match &same {
            Some((m, b)) if *m == n => b.clone(),
            _ => {
                let b = record_batch(n, a.record_size, now_ms(), filler);
                same = Some((n, b.clone()));
                b
            }
        };
        let mut pd = PartitionProduceData::default();
        pd.index = p;
        pd.records = Some(batch);
        topic.partition_data.push(pd);
    }
    let mut req = ProduceRequest::default();
    req.acks = acks;
    req.timeout_ms = a.request_timeout_ms;
    req.topic_data = vec![topic];
    encode_request(PRODUCE_VERSION, 0, &req)
}

fn set_correlation_id(frame: &mut [u8], id: i32) {
    frame[8..12].copy_from_slice(&id.to_be_bytes());
}

fn parse_acks(s: &str) -> Result<i16> {
    match s {
        "all" | "-1" => Ok(-1),
        "0" => Ok(0),
        "1" => Ok(1),
        _ => bail!("--acks must be 0, 1, -1 or all"),
    }
}

/// Checks a Produce answer; the first error code it carries, if any.
fn produce_error(r: &ProduceResponse) -> Option<i16> {
    r.responses.iter().flat_map(|t| &t.partition_responses).map(|p| p.error_code).find(|&c| c != 0)
}

// ---------------------------------------------------------------------------------------------
// broker CPU
// ---------------------------------------------------------------------------------------------

fn cpu_seconds(pids: &[u32]) -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let mut total = 0.0;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let (u, s): (f64, f64) = (rest.get(11)?.parse().ok()?, rest.get(12)?.parse().ok()?);
        total += (u + s) / tick.max(1) as f64;
    }
    (!pids.is_empty()).then_some(total)
}

struct Report {
    fields: Vec<(&'static str, serde_json::Value)>,
}

impl Report {
    fn new() -> Report {
        Report { fields: Vec::new() }
    }

    fn add(&mut self, key: &'static str, v: impl Into<serde_json::Value>) {
        self.fields.push((key, v.into()));
    }

    fn throughput(&mut self, records: u64, bytes: u64, secs: f64, cpu: Option<f64>) {
        self.add("records", records);
        self.add("seconds", secs);
        self.add("records_per_s", records as f64 / secs);
        self.add("mb_per_s", bytes as f64 / secs / 1e6);
        if let Some(c) = cpu {
            self.add("broker_cpu_s", c);
            self.add("broker_cpu_s_per_million", c / records.max(1) as f64 * 1e6);
        }
    }

    fn print(self, json: bool) {
        if json {
            let map: serde_json::Map<String, serde_json::Value> =
                self.fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            println!("{}", serde_json::Value::Object(map));
        } else {
            let text: Vec<String> = self
                .fields
                .iter()
                .map(|(k, v)| match v.as_f64() {
                    Some(f) if f.fract() != 0.0 => format!("{k}={f:.3}"),
                    _ => format!("{k}={v}"),
                })
                .collect();
            println!("{}", text.join(" "));
        }
    }
}

fn percentiles(report: &mut Report, prefix: &'static [&'static str; 4], mut micros: Vec<u64>) {
    micros.sort_unstable();
    let at = |q: f64| -> f64 {
        if micros.is_empty() {
            return f64::NAN;
        }
        let i = ((micros.len() - 1) as f64 * q).round() as usize;
        micros[i.min(micros.len() - 1)] as f64 / 1000.0
    };
    report.add(prefix[0], at(0.5));
    report.add(prefix[1], at(0.99));
    report.add(prefix[2], at(0.999));
    report.add(prefix[3], at(1.0));
}

// ---------------------------------------------------------------------------------------------
// produce
// ---------------------------------------------------------------------------------------------

/// Sends `records` records to the partitions one broker leads, pipelined; returns the records
/// acknowledged and each request's time to its answer (microseconds).
async fn produce_to(
    a: Arc<ProduceArgs>,
    addr: String,
    partitions: Vec<i32>,
    records: u64,
    rate: Option<f64>,
    start: Instant,
) -> Result<(u64, Vec<u64>)> {
    let acks = parse_acks(&a.acks)?;
    let conn = Conn::open(&addr).await?;
    let per_batch = (a.batch_size / (a.record_size + 8).max(1)).max(1);
    let full: Vec<usize> = vec![per_batch; partitions.len()];
    let per_request = (per_batch * partitions.len()) as u64;
    let mut frame = produce_frame(&a, acks, &partitions, &full)?;
    let in_flight = Arc::new(Semaphore::new(a.max_in_flight.max(1)));
    let (tx, mut rx) = mpsc::unbounded_channel::<(i32, Instant, u64)>();
    let Conn { mut rd, mut wr, .. } = conn;
    let permits = in_flight.clone();
    let reader = tokio::spawn(async move {
        let mut acked = 0u64;
        let mut lat = Vec::new();
        while let Some((id, sent, n)) = rx.recv().await {
            let frame = read_frame(&mut rd).await?;
            let (got, r) = response_body::<ProduceRequest>(PRODUCE_VERSION, frame)?;
            if got != id {
                bail!("produce answer {got} where {id} was expected");
            }
            if let Some(code) = produce_error(&r) {
                bail!("produce to {addr} failed with error code {code}");
            }
            lat.push(sent.elapsed().as_micros() as u64);
            acked += n;
            permits.add_permits(1);
        }
        Ok::<_, anyhow::Error>((acked, lat))
    });
    let mut sent = 0u64;
    let mut id = 0i32;
    while sent < records {
        let n = per_request.min(records - sent);
        if let Some(r) = rate {
            let due = start + Duration::from_secs_f64((sent + n) as f64 / r);
            tokio::time::sleep_until(due.into()).await;
        }
        if acks != 0 {
            in_flight.acquire().await?.forget();
        }
        id = id.wrapping_add(1);
        let written = if n == per_request {
            set_correlation_id(&mut frame, id);
            wr.write_all(&frame).await
        } else {
            // The rest, spread over the partitions; built once, at the end.
            let share = n as usize / partitions.len();
            let extra = n as usize % partitions.len();
            let counts: Vec<usize> = (0..partitions.len()).map(|i| share + usize::from(i < extra)).collect();
            let mut last = produce_frame(&a, acks, &partitions, &counts)?;
            set_correlation_id(&mut last, id);
            wr.write_all(&last).await
        };
        if let Err(e) = written {
            // The reader knows why (an answer it could not take, or the broker's close).
            drop(tx);
            return match reader.await? {
                Err(why) => Err(why),
                Ok(_) => Err(e.into()),
            };
        }
        sent += n;
        if acks != 0 && tx.send((id, Instant::now(), n)).is_err() {
            break;
        }
    }
    drop(tx);
    let (acked, lat) = reader.await??;
    if acks == 0 {
        // No answers to wait for: flushed to the socket is as far as acks=0 goes.
        wr.flush().await?;
        return Ok((sent, lat));
    }
    Ok((acked, lat))
}

async fn produce(a: ProduceArgs) -> Result<()> {
    let layout = layout(&a.common, a.partitions.map(|p| (p, a.replication_factor))).await?;
    let rate = (a.throughput > 0.0).then_some(a.throughput);
    let a = Arc::new(a);
    let cpu0 = cpu_seconds(&a.common.broker_pid);
    let start = Instant::now();
    let mut tasks = Vec::new();
    let mut assigned = 0u64;
    let brokers = layout.by_leader.len();
    for (i, (addr, parts)) in layout.by_leader.iter().enumerate() {
        // Each broker's share in proportion to the partitions it leads.
        let share = if i + 1 == brokers {
            a.records - assigned
        } else {
            a.records * parts.len() as u64 / layout.partitions as u64
        };
        assigned += share;
        let rate = rate.map(|r| r * parts.len() as f64 / layout.partitions as f64);
        tasks.push(tokio::spawn(produce_to(a.clone(), addr.clone(), parts.clone(), share, rate, start)));
    }
    let mut acked = 0;
    let mut lat = Vec::new();
    for t in tasks {
        let (n, l) = t.await??;
        acked += n;
        lat.extend(l);
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu0.zip(cpu_seconds(&a.common.broker_pid)).map(|(x, y)| y - x);
    let mut report = Report::new();
    report.throughput(acked, acked * a.record_size as u64, secs, cpu);
    report.add("requests", lat.len());
    percentiles(&mut report, &["request_ms_p50", "request_ms_p99", "request_ms_p999", "request_ms_max"], lat);
    report.print(a.common.json);
    if acked != a.records {
        bail!("{acked} of {} records acknowledged", a.records);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// consume
// ---------------------------------------------------------------------------------------------

async fn list_offsets(conn: &mut Conn, topic: &str, partitions: &[i32], timestamp: i64) -> Result<Vec<i64>> {
    let mut t = ListOffsetsTopic::default();
    t.name = topic_name(topic);
    t.partitions = partitions
        .iter()
        .map(|&p| {
            let mut lp = ListOffsetsPartition::default();
            lp.partition_index = p;
            lp.current_leader_epoch = -1;
            lp.timestamp = timestamp;
            lp
        })
        .collect();
    let mut req = ListOffsetsRequest::default();
    req.replica_id = BrokerId(-1);
    req.topics = vec![t];
    let r = conn.call(LIST_OFFSETS_VERSION, &req).await?;
    let mut out = Vec::with_capacity(partitions.len());
    for &p in partitions {
        let found = r.topics.iter().flat_map(|t| &t.partitions).find(|x| x.partition_index == p);
        match found {
            Some(x) if x.error_code == 0 => out.push(x.offset),
            Some(x) => bail!("ListOffsets partition {p}: error {}", x.error_code),
            None => bail!("ListOffsets: no answer for partition {p}"),
        }
    }
    Ok(out)
}

fn fetch_request(topic: &str, parts: &[i32], offsets: &[i64], c: &ConsumeArgs, max_wait_ms: i32) -> FetchRequest {
    let mut t = FetchTopic::default();
    t.topic = topic_name(topic);
    t.partitions = parts
        .iter()
        .zip(offsets)
        .map(|(&p, &o)| {
            let mut fp = FetchPartition::default();
            fp.partition = p;
            fp.current_leader_epoch = -1;
            fp.fetch_offset = o;
            fp.last_fetched_epoch = -1;
            fp.log_start_offset = -1;
            fp.partition_max_bytes = c.partition_max_bytes;
            fp
        })
        .collect();
    let mut req = FetchRequest::default();
    req.replica_id = BrokerId(-1);
    req.max_wait_ms = max_wait_ms;
    req.min_bytes = 1;
    req.max_bytes = c.fetch_max_bytes;
    req.session_id = 0;
    req.session_epoch = -1;
    req.topics = vec![t];
    req
}

/// What end-to-end does with each record's value.
type ValueSink = Box<dyn FnMut(&[u8]) + Send>;

/// Walks the whole batches in `records` from `offset`: (records at or past `offset`, payload
/// bytes of those batches, the next offset to fetch). With `each`, every record's value is
/// handed over (which needs the records decoded; counting alone reads only batch headers).
fn walk_batches(mut records: &[u8], offset: i64, mut each: Option<&mut ValueSink>) -> Result<(u64, u64, i64)> {
    let (mut count, mut bytes, mut next) = (0u64, 0u64, offset);
    while records.len() >= BATCH_HEADER {
        let base = (&records[0..8]).get_i64();
        let len = (&records[8..12]).get_i32();
        let total = 12 + len.max(0) as usize;
        if len < (BATCH_HEADER - 12) as i32 || total > records.len() {
            break; // the partial batch a fetch may end with
        }
        let magic = records[16];
        if magic != 2 {
            bail!("message format v{magic} at offset {base}: only v2 batches are counted");
        }
        let attributes = (&records[21..23]).get_i16();
        let last = base + i64::from((&records[23..27]).get_i32());
        let n = (&records[57..61]).get_i32().max(0) as u64;
        if last >= next {
            count += if base >= next { n } else { ((last - next + 1) as u64).min(n) };
            bytes += total as u64;
            if let Some(f) = each.as_mut() {
                if attributes & 0x7 != 0 {
                    bail!("compressed batch at offset {base}: end-to-end needs uncompressed records");
                }
                let mut body = &records[BATCH_HEADER..total];
                for _ in 0..n {
                    let len = get_varint(&mut body).ok_or_else(|| anyhow!("bad record length"))?;
                    let rec = body.get(..len.max(0) as usize).ok_or_else(|| anyhow!("record past its batch"))?;
                    body = &body[rec.len()..];
                    let mut r = rec.get(1..).unwrap_or_default();
                    let (_ts, off) = (get_varint(&mut r), get_varint(&mut r));
                    let key = get_varint(&mut r).unwrap_or(-1);
                    r = r.get(key.max(0) as usize..).unwrap_or_default();
                    let vlen = get_varint(&mut r).unwrap_or(-1);
                    if base + off.unwrap_or(0) >= next {
                        f(r.get(..vlen.max(0) as usize).unwrap_or_default());
                    }
                }
            }
            next = last + 1;
        }
        records = &records[total..];
    }
    Ok((count, bytes, next))
}

/// Fetches one broker's partitions from `offsets` until `done` says so; adds to `count` and
/// `bytes` as it goes.
#[allow(clippy::too_many_arguments)]
async fn consume_from(
    c: Arc<ConsumeArgs>,
    addr: String,
    parts: Vec<i32>,
    mut offsets: Vec<i64>,
    count: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    target: u64,
    mut each: Option<ValueSink>,
) -> Result<()> {
    let mut conn = Conn::open(&addr).await?;
    let mut last_progress = Instant::now();
    while count.load(Ordering::Relaxed) < target {
        let req = fetch_request(&c.common.topic, &parts, &offsets, &c, 100);
        let r: FetchResponse = conn.call(FETCH_VERSION, &req).await?;
        if r.error_code != 0 {
            bail!("fetch from {addr}: error {}", r.error_code);
        }
        let mut got = 0;
        for p in r.responses.iter().flat_map(|t| &t.partitions) {
            if p.error_code != 0 {
                bail!("fetch partition {}: error {}", p.partition_index, p.error_code);
            }
            let Some(i) = parts.iter().position(|&x| x == p.partition_index) else { continue };
            let Some(records) = &p.records else { continue };
            let (n, b, next) = walk_batches(records, offsets[i], each.as_mut())?;
            offsets[i] = next;
            got += n;
            count.fetch_add(n, Ordering::Relaxed);
            bytes.fetch_add(b, Ordering::Relaxed);
        }
        if got > 0 {
            last_progress = Instant::now();
        } else if last_progress.elapsed() > Duration::from_millis(c.timeout_ms) {
            bail!("no record from {addr} for {} ms", c.timeout_ms);
        }
    }
    Ok(())
}

async fn consume(c: ConsumeArgs) -> Result<()> {
    let layout = layout(&c.common, None).await?;
    let mut starts = Vec::new();
    let mut available = 0u64;
    for (addr, parts) in &layout.by_leader {
        let mut conn = Conn::open(addr).await?;
        let first = list_offsets(&mut conn, &c.common.topic, parts, -2).await?;
        let end = list_offsets(&mut conn, &c.common.topic, parts, -1).await?;
        available += first.iter().zip(&end).map(|(a, b)| (b - a).max(0) as u64).sum::<u64>();
        starts.push((addr.clone(), parts.clone(), first));
    }
    let target = c.records.unwrap_or(available);
    let c = Arc::new(c);
    let (count, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let cpu0 = cpu_seconds(&c.common.broker_pid);
    let start = Instant::now();
    let tasks: Vec<_> = starts
        .into_iter()
        .map(|(addr, parts, first)| {
            tokio::spawn(consume_from(c.clone(), addr, parts, first, count.clone(), bytes.clone(), target, None))
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu0.zip(cpu_seconds(&c.common.broker_pid)).map(|(x, y)| y - x);
    let mut report = Report::new();
    let n = count.load(Ordering::Relaxed);
    // Bytes as stored (batches with their headers): within 1% of the payload from 1 KiB records.
    report.throughput(n, bytes.load(Ordering::Relaxed), secs, cpu);
    report.print(c.common.json);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// many partitions, few with data
// ---------------------------------------------------------------------------------------------

async fn idle_fetch(a: IdleFetchArgs) -> Result<()> {
    let layout = layout(&a.common, Some((a.partitions, 1))).await?;
    let [(addr, parts)] = layout.by_leader.iter().collect::<Vec<_>>()[..] else {
        bail!("idle-fetch needs the topic's partitions on one broker");
    };
    let (addr, mut parts) = (addr.clone(), parts.clone());
    parts.sort_unstable();
    let active: Vec<i32> = parts.iter().copied().take(a.active.max(1)).collect();
    let mut conn = Conn::open(&addr).await?;
    let mut offsets = list_offsets(&mut conn, &a.common.topic, &parts, -1).await?;
    let index: std::collections::HashMap<i32, usize> = parts.iter().enumerate().map(|(i, p)| (*p, i)).collect();
    let c = ConsumeArgs {
        common: a.common.clone(),
        records: None,
        fetch_max_bytes: 64 << 20,
        partition_max_bytes: 1 << 20,
        timeout_ms: 30_000,
    };
    // Session state: id 0 until the broker opens one; the epoch the next request carries.
    let (mut session_id, mut epoch) = (0, if a.sessions { 0 } else { -1 });
    let mut named: Vec<usize> = (0..parts.len()).collect();
    let (mut fetches, mut records, mut measuring) = (0u64, 0u64, None);
    let mut producer = None;
    let mut deadline = Instant::now() + Duration::from_secs(a.seconds);
    while Instant::now() < deadline {
        let names: Vec<i32> = named.iter().map(|&i| parts[i]).collect();
        let offs: Vec<i64> = named.iter().map(|&i| offsets[i]).collect();
        let mut req = fetch_request(&a.common.topic, &names, &offs, &c, 500);
        req.session_id = session_id;
        req.session_epoch = epoch;
        let r: FetchResponse = conn.call(FETCH_VERSION, &req).await?;
        if r.error_code != 0 {
            bail!("fetch: error {}", r.error_code);
        }
        if a.sessions {
            if session_id == 0 {
                if r.session_id == 0 {
                    bail!("the broker opened no fetch session");
                }
                session_id = r.session_id;
            }
            epoch = if epoch == i32::MAX { 1 } else { epoch + 1 };
        }
        named.clear();
        for p in r.responses.iter().flat_map(|t| &t.partitions) {
            if p.error_code != 0 {
                bail!("fetch partition {}: error {}", p.partition_index, p.error_code);
            }
            let (Some(&i), Some(data)) = (index.get(&p.partition_index), &p.records) else { continue };
            let (n, _, next) = walk_batches(data, offsets[i], None)?;
            if next != offsets[i] {
                offsets[i] = next;
                // A session is told only the positions that moved; without one, all are named.
                named.push(i);
            }
            records += n;
        }
        if !a.sessions || measuring.is_none() {
            named = (0..parts.len()).collect();
        }
        if measuring.is_none() {
            // The first (full) fetch is set-up, not measured. Records start arriving now.
            let n = (a.throughput * a.seconds as f64).max(1.0) as u64;
            let pa = Arc::new(ProduceArgs {
                common: a.common.clone(),
                records: n,
                record_size: 100,
                partitions: None,
                replication_factor: 1,
                acks: "1".into(),
                batch_size: 108,
                linger_ms: 0,
                max_in_flight: 1,
                throughput: a.throughput,
                request_timeout_ms: 30_000,
            });
            let rate = Some(a.throughput);
            producer = Some(tokio::spawn(produce_to(pa, addr.clone(), active.clone(), n, rate, Instant::now())));
            deadline = Instant::now() + Duration::from_secs(a.seconds);
            measuring = Some((Instant::now(), cpu_seconds(&a.common.broker_pid)));
            (fetches, records) = (0, 0);
            if a.sessions {
                named.clear();
            }
            continue;
        }
        fetches += 1;
    }
    let Some((start, cpu0)) = measuring else { bail!("no fetch was answered") };
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu0.zip(cpu_seconds(&a.common.broker_pid)).map(|(x, y)| y - x);
    if let Some(p) = producer {
        p.abort();
    }
    let mut report = Report::new();
    report.add("partitions", parts.len());
    report.add("active", active.len());
    report.add("sessions", a.sessions);
    report.add("fetches", fetches);
    report.add("fetches_per_s", fetches as f64 / secs);
    report.add("records", records);
    if let Some(c) = cpu {
        report.add("broker_cpu_s", c);
        report.add("broker_cpu_us_per_fetch", c / fetches.max(1) as f64 * 1e6);
    }
    report.print(a.common.json);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// end to end
// ---------------------------------------------------------------------------------------------

async fn end_to_end(a: ProduceArgs) -> Result<()> {
    let Some(rate) = (a.throughput > 0.0).then_some(a.throughput) else {
        bail!("end-to-end needs --throughput (records/s)");
    };
    if a.record_size < 8 {
        bail!("end-to-end needs --record-size of at least 8 (the send time)");
    }
    let acks = parse_acks(&a.acks)?;
    let layout = layout(&a.common, a.partitions.map(|p| (p, a.replication_factor))).await?;
    let Some((addr, parts)) = layout.by_leader.iter().next().map(|(a, p)| (a.clone(), p.clone())) else {
        bail!("no partitions");
    };
    if layout.by_leader.len() > 1 {
        eprintln!("gregor-perf: end-to-end uses the partitions led by {addr} only");
    }
    let mut conn = Conn::open(&addr).await?;
    let ends = list_offsets(&mut conn, &a.common.topic, &parts, -1).await?;
    drop(conn);

    let base = Instant::now();
    let lat = Arc::new(std::sync::Mutex::new(Vec::with_capacity(a.records as usize)));
    let sink = lat.clone();
    let each: ValueSink = Box::new(move |v: &[u8]| {
        let now = base.elapsed().as_nanos() as u64;
        if let Some(stamp) = v.get(..8).map(|mut s| s.get_u64()) {
            if let Ok(mut l) = sink.lock() {
                l.push(now.saturating_sub(stamp) / 1000);
            }
        }
    });
    let c = Arc::new(ConsumeArgs {
        common: a.common.clone(),
        records: Some(a.records),
        fetch_max_bytes: 64 << 20,
        partition_max_bytes: 8 << 20,
        timeout_ms: 30_000,
    });
    let (count, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let consumer =
        tokio::spawn(consume_from(c, addr.clone(), parts.clone(), ends, count.clone(), bytes, a.records, Some(each)));

    let cpu0 = cpu_seconds(&a.common.broker_pid);
    let start = Instant::now();
    let Conn { mut rd, mut wr, .. } = Conn::open(&addr).await?;
    let in_flight = Arc::new(Semaphore::new(a.max_in_flight.max(1)));
    let (tx, mut rx) = mpsc::unbounded_channel::<i32>();
    let permits = in_flight.clone();
    let reader = tokio::spawn(async move {
        while let Some(id) = rx.recv().await {
            let (got, r) = response_body::<ProduceRequest>(PRODUCE_VERSION, read_frame(&mut rd).await?)?;
            if got != id {
                bail!("produce answer {got} where {id} was expected");
            }
            if let Some(code) = produce_error(&r) {
                bail!("produce failed with error code {code}");
            }
            permits.add_permits(1);
        }
        Ok::<_, anyhow::Error>(())
    });
    let per_batch = (a.batch_size / (a.record_size + 8)).max(1) as u64;
    let linger = Duration::from_millis(a.linger_ms);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let (mut sent, mut id, mut partition) = (0u64, 0i32, 0usize);
    // When the oldest record not yet sent became due.
    let mut waiting_since: Option<Instant> = None;
    while sent < a.records {
        tick.tick().await;
        let due = ((start.elapsed().as_secs_f64() * rate) as u64).min(a.records);
        let ready = due - sent;
        if ready == 0 {
            continue;
        }
        let oldest = *waiting_since.get_or_insert_with(Instant::now);
        if ready < per_batch && oldest.elapsed() < linger {
            continue;
        }
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            continue; // records wait for an answer, as in a producer at max.in.flight
        };
        permit.forget();
        let n = ready.min(per_batch) as usize;
        let batch = record_batch(n, a.record_size, now_ms(), |_, v| {
            let stamp = base.elapsed().as_nanos() as u64;
            v[..8].copy_from_slice(&stamp.to_be_bytes());
        });
        let mut pd = PartitionProduceData::default();
        pd.index = parts[partition % parts.len()];
        pd.records = Some(batch);
        partition += 1;
        let mut topic = TopicProduceData::default();
        topic.name = topic_name(&a.common.topic);
        topic.partition_data = vec![pd];
        let mut req = ProduceRequest::default();
        req.acks = acks;
        req.timeout_ms = a.request_timeout_ms;
        req.topic_data = vec![topic];
        id = id.wrapping_add(1);
        wr.write_all(&encode_request(PRODUCE_VERSION, id, &req)?).await?;
        if acks != 0 {
            tx.send(id).map_err(|_| anyhow!("produce answers stopped"))?;
        } else {
            in_flight.add_permits(1);
        }
        sent += n as u64;
        waiting_since = (sent < due).then(Instant::now);
    }
    drop(tx);
    reader.await??;
    let produced_in = start.elapsed().as_secs_f64();
    consumer.await??;
    let cpu = cpu0.zip(cpu_seconds(&a.common.broker_pid)).map(|(x, y)| y - x);
    let mut report = Report::new();
    let n = count.load(Ordering::Relaxed);
    report.throughput(n, n * a.record_size as u64, produced_in, cpu);
    let lat = std::mem::take(&mut *lat.lock().map_err(|_| anyhow!("latency list poisoned"))?);
    report.add("measured", lat.len());
    percentiles(&mut report, &["latency_ms_p50", "latency_ms_p99", "latency_ms_p999", "latency_ms_max"], lat);
    report.print(a.common.json);
    if n != a.records {
        bail!("{n} of {} records received", a.records);
    }
    Ok(())
}
