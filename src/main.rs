//! `gregor [server.properties|file.toml] [--override key=value]...`, shaped like Kafka's
//! `kafka-server-start.sh`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use gregor::broker::Broker;
use gregor::config::BrokerConfig;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

/// How long shutdown waits for in-flight requests (a long-polling fetch waits up to its
/// max.wait.ms, 500 ms by default in clients) before flushing the logs anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(Parser, Debug)]
#[command(name = "gregor", version, about = "A Kafka wire-protocol-compatible broker")]
struct Args {
    /// server.properties (Java properties) or a .toml file with the same keys.
    config: Option<PathBuf>,
    /// Override one property, as kafka-server-start.sh does: --override key=value
    #[arg(long = "override", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

fn main() -> std::process::ExitCode {
    if let Err(e) = init_logging() {
        eprintln!("gregor: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let args = Args::parse();
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("gregor: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr, as text for people (the default) or, with `GREGOR_LOG_FORMAT=json`, one
/// JSON object per line for log collectors: the event's fields at the top level beside
/// `timestamp`, `level`, `target` and `message`, and the enclosing span (the connection's peer
/// and listener) under `span`.
fn init_logging() -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GREGOR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let format = std::env::var_os("GREGOR_LOG_FORMAT");
    let format = match format.as_deref().map(|f| f.to_str().map(str::to_ascii_lowercase)) {
        None => String::new(),
        Some(Some(f)) => f,
        Some(None) => return Err("GREGOR_LOG_FORMAT is not valid UTF-8; expected json or text".into()),
    };
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format.as_str() {
        "" | "text" => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        "json" => logs.json().flatten_event(true).with_current_span(true).with_span_list(false).with_ansi(false).init(),
        other => return Err(format!("GREGOR_LOG_FORMAT={other:?} is not a log format; expected json or text")),
    }
    Ok(())
}

fn run(args: Args) -> anyhow::Result<()> {
    let config = BrokerConfig::load(args.config.as_deref(), &args.overrides, std::env::vars())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve(config))
}

async fn serve(config: BrokerConfig) -> anyhow::Result<()> {
    // Taken over before any port is bound: a stop sent as soon as the port answers (an
    // orchestrator, a test) is then a clean shutdown after the start, not the default death.
    let signals = Signals::install()?;
    // Keystores, truststores and SASL settings that cannot be used refuse the start before
    // any port is bound (the broker reads them again when it starts).
    gregor::security::Security::from_config(&config)?;
    let mut bound = Vec::new();
    for ep in &config.listeners {
        let addr = format!("{}:{}", if ep.host.is_empty() { "0.0.0.0" } else { &ep.host }, ep.port);
        let listener =
            tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        bound.push((listener, ep.listener_name.clone()));
    }
    // Bound with the listeners, so a port in use stops the broker before it registers.
    let metrics_listener = match &config.metrics_address {
        Some((host, port)) => Some(
            tokio::net::TcpListener::bind((host.as_str(), *port))
                .await
                .with_context(|| format!("cannot listen on {host}:{port} for metrics (metrics.host, metrics.port)"))?,
        ),
        None => None,
    };
    let broker = Broker::start(config).await?;
    broker.spawn_tasks();

    let (stop_tx, stop_rx) = watch::channel(false);
    let tracker = TaskTracker::new();
    let quotas = gregor::network::ConnectionQuotas::new(&broker.effective_config());
    {
        let quotas = quotas.clone();
        broker.on_config_change(move |c| quotas.reconfigure(c));
    }
    let mut listeners = Vec::new();
    for (listener, name) in bound {
        tracing::info!(address = %listener.local_addr()?, listener = %name, "listening");
        listeners.push(tokio::spawn(gregor::network::serve_listener(
            broker.components(),
            listener,
            Arc::from(name.as_str()),
            quotas.clone(),
            stop_rx.clone(),
            tracker.clone(),
        )));
    }
    if let Some(listener) = metrics_listener {
        tracing::info!(address = %listener.local_addr()?, "serving metrics on /metrics");
        let b = broker.clone();
        let scrape: gregor::metrics::http::Scrape = Arc::new(move || b.render_metrics());
        tokio::spawn(gregor::metrics::http::serve(listener, scrape, stop_rx.clone()));
    }

    signals.wait().await;
    tracing::info!("shutting down");
    broker.controlled_shutdown().await;
    let _ = stop_tx.send(true);
    for l in listeners {
        let _ = l.await;
    }
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait()).await.is_err() {
        tracing::warn!("connections still open after the grace period; flushing anyway");
    }
    tokio::task::spawn_blocking(move || broker.shutdown()).await?;
    Ok(())
}

/// SIGTERM and SIGINT, each a graceful shutdown.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
