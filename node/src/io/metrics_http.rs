//! The HTTP side of the metrics endpoint: hyper's HTTP/1 server on a
//! small tokio runtime of its own, with limits that keep a hostile or
//! broken client from costing the node memory or the scrapes their
//! answers.
//!
//! - The request line and headers together are read into at most
//!   [`MAX_REQUEST_HEAD`] bytes; a larger head is answered
//!   `431 Request Header Fields Too Large` and the connection closed.
//! - They must arrive within [`HEADER_TIMEOUT`] (one byte every few seconds
//!   does not keep a connection open), and a whole connection lasts at most
//!   [`CONNECTION_DEADLINE`] (a client that does not read its answer).
//! - At most [`MAX_CONNECTIONS`] are served at once; more are closed at
//!   once. Connections are served concurrently, so a slow one never holds a
//!   scrape up.
//! - One request per connection (no keep-alive); only `GET` and `HEAD` of
//!   `/metrics` and `/health` are answered, a request body is never read.

use std::convert::Infallible;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONNECTION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

/// Request line plus headers, at most (hyper's smallest read buffer).
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// The request head must arrive within this.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection is closed this long after it was accepted, whatever it does.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);
/// Connections served at the same time (each holds at most its request
/// head and its answer: a few hundred KiB together).
pub const MAX_CONNECTIONS: usize = 64;

/// The text of a scrape, or why it failed.
pub type Scrape = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `listener` on the calling thread until the process ends.
pub fn serve(listener: TcpListener, scrape: Scrape) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("metrics endpoint: no runtime: {e}");
            return;
        }
    };
    runtime.block_on(accept_loop(listener, scrape));
}

async fn accept_loop(listener: TcpListener, scrape: Scrape) {
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("metrics endpoint: {e}");
            return;
        }
    };
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut refused = 0u64;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors, say: wait rather than spin.
                tracing::debug!("metrics accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    "metrics endpoint: {MAX_CONNECTIONS} connections open, closed {refused} \
                     more so far"
                );
            }
            continue; // dropping the stream closes it
        };
        let scrape = scrape.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let scrape = scrape.clone();
                async move { Ok::<_, Infallible>(answer(&req, &scrape)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_REQUEST_HEAD)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_DEADLINE, connection).await {
                Ok(Err(e)) => tracing::debug!("metrics request failed: {e}"),
                Err(_) => {
                    tracing::debug!("metrics connection closed after {CONNECTION_DEADLINE:?}")
                }
                Ok(Ok(())) => {}
            }
            drop(slot);
        });
    }
}

fn answer(req: &Request<Incoming>, scrape: &Scrape) -> Response<Full<Bytes>> {
    let head = req.method() == Method::HEAD;
    let (status, kind, body) = match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => match scrape() {
            Ok(text) => (StatusCode::OK, OPENMETRICS, text),
            Err(e) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("{e}\n"),
            ),
        },
        (&Method::GET | &Method::HEAD, "/health") => (StatusCode::OK, "text/plain", "ok\n".into()),
        (&Method::GET | &Method::HEAD, _) => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "slowmo serves /metrics and /health only\n".into(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET /metrics\n".into(),
        ),
    };
    let len = body.len();
    let mut response = Response::new(Full::new(if head {
        Bytes::new()
    } else {
        Bytes::from(body)
    }));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(kind));
    headers.insert(CONNECTION, hyper::header::HeaderValue::from_static("close"));
    if head {
        headers.insert(hyper::header::CONTENT_LENGTH, len.into());
    }
    response
}
