//! The `/metrics` endpoint: a minimal HTTP/1.1 responder, which is all a Prometheus scrape
//! needs. One request per connection (answered with `Connection: close`), a bounded request
//! head with a deadline, and a cap on connections served at once, so a stray or hostile
//! client costs a task and a few kilobytes, never the broker.
//!
//! The scrape itself runs on the blocking pool: with thousands of partitions, gathering and
//! formatting takes milliseconds that must not be taken from an async worker serving clients.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// Renders the exposition text; called once per scrape, off the async workers.
pub type Scrape = Arc<dyn Fn() -> String + Send + Sync>;

/// A GET with the headers Prometheus sends is a few hundred bytes.
const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// Reading the request, scraping and writing the answer together; Prometheus' own default
/// scrape timeout is 10 s, so a connection still open after this is not a scrape.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Scrapers are a handful (a Prometheus or two, an agent); beyond this, connections are
/// closed at once.
const MAX_CONNECTIONS: usize = 16;

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub async fn serve(listener: TcpListener, scrape: Scrape, mut shutdown: watch::Receiver<bool>) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, "too many metrics connections; closing");
                    continue;
                };
                let scrape = scrape.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(EXCHANGE_TIMEOUT, answer(stream, scrape)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics connection failed"),
                        Err(_) => tracing::debug!(%peer, "metrics connection timed out"),
                    }
                });
            }
            Err(e) => {
                // Typically EMFILE: back off instead of spinning on accept.
                tracing::warn!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, scrape: Scrape) -> std::io::Result<()> {
    let head = read_head(&mut stream).await?;
    let response = match route(&head) {
        Route::Metrics { with_body } => {
            let body = tokio::task::spawn_blocking(move || scrape()).await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "metrics scrape failed");
                String::new()
            });
            respond("200 OK", CONTENT_TYPE, &body, with_body)
        }
        Route::NotFound => respond("404 Not Found", "text/plain", "metrics are at /metrics\n", true),
        Route::MethodNotAllowed => respond("405 Method Not Allowed", "text/plain", "GET or HEAD only\n", true),
        Route::Bad => respond("400 Bad Request", "text/plain", "bad request\n", true),
    };
    stream.write_all(&response).await?;
    stream.shutdown().await
}

/// Reads up to the blank line that ends the request head. A head that does not end within
/// [`MAX_REQUEST_HEAD`] is returned as read and refused by [`route`] (it cannot be a scrape).
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while head.len() < MAX_REQUEST_HEAD && !ends_head(&head) {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(head)
}

fn ends_head(head: &[u8]) -> bool {
    head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n")
}

#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics { with_body: bool },
    NotFound,
    MethodNotAllowed,
    Bad,
}

fn route(head: &[u8]) -> Route {
    if !ends_head(head) {
        return Route::Bad;
    }
    let Some(line) = head.split(|&b| b == b'\n').next().and_then(|l| std::str::from_utf8(l).ok()) else {
        return Route::Bad;
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::Bad;
    };
    if !version.starts_with("HTTP/1.") {
        return Route::Bad;
    }
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    if path != "/metrics" {
        return Route::NotFound;
    }
    match method {
        "GET" => Route::Metrics { with_body: true },
        "HEAD" => Route::Metrics { with_body: false },
        _ => Route::MethodNotAllowed,
    }
}

fn respond(status: &str, content_type: &str, body: &str, with_body: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if with_body {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_and_head_of_metrics_are_served() {
        let r = |s: &str| route(s.as_bytes());
        assert_eq!(r("GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"), Route::Metrics { with_body: true });
        assert_eq!(r("GET /metrics?name[]=x HTTP/1.0\r\n\r\n"), Route::Metrics { with_body: true });
        assert_eq!(r("HEAD /metrics HTTP/1.1\n\n"), Route::Metrics { with_body: false });
        assert_eq!(r("POST /metrics HTTP/1.1\r\n\r\n"), Route::MethodNotAllowed);
        assert_eq!(r("GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(r("GET /metricsx HTTP/1.1\r\n\r\n"), Route::NotFound);
        // Not HTTP/1.x, not a request line, or a head that never ended.
        assert_eq!(r("GET /metrics SPDY/3\r\n\r\n"), Route::Bad);
        assert_eq!(r("GET /metrics\r\n\r\n"), Route::Bad);
        assert_eq!(r("GET /metrics HTTP/1.1 extra\r\n\r\n"), Route::Bad);
        assert_eq!(r("GET /metrics HTTP/1.1\r\nHost: x"), Route::Bad);
        assert_eq!(route(b"\xff\xfe /metrics HTTP/1.1\r\n\r\n"), Route::Bad);
        assert_eq!(r(""), Route::Bad);
    }

    async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_scrape_gets_the_text_with_its_length() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = watch::channel(false);
        let server = tokio::spawn(serve(listener, Arc::new(|| "up 1\n".to_string()), stop_rx));

        let ok = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
        assert!(ok.contains("Content-Length: 5\r\n"));
        assert!(ok.ends_with("\r\n\r\nup 1\n"));
        let head = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n").await;
        assert!(head.contains("Content-Length: 5\r\n") && head.ends_with("\r\n\r\n"), "{head}");
        assert!(exchange(addr, b"GET /x HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.1 404"));
        // A head that does not end within the limit is refused, not buffered. (Exactly the
        // limit, so that the server has read all of it and closes without a reset.)
        let mut junk = b"GET /metrics HTTP/1.1\r\n".to_vec();
        junk.resize(MAX_REQUEST_HEAD, b'a');
        let mut s = TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(&junk).await;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        assert!(out.starts_with(b"HTTP/1.1 400"), "{}", String::from_utf8_lossy(&out));

        stop_tx.send(true).unwrap();
        server.await.unwrap();
    }
}
