//! Graceful shutdown of one replica behind a load balancer (issue 31).
//!
//! On SIGTERM the replica first says it is going (`/readyz` answers 503
//! `draining`, and every answer carries `Connection: close`, so clients and
//! the balancer move their connections elsewhere) while it still serves, for
//! `MNEMOSYNE_SHUTDOWN_DELAY_SECS`. Then it stops accepting, lets the
//! requests in flight finish — an answer's body included — and only then
//! ends what never finishes by itself (GET event streams, session workers),
//! all within `MNEMOSYNE_SHUTDOWN_GRACE_SECS`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use tokio::sync::Notify;

/// Whether the replica is draining, and the requests it is still answering.
#[derive(Default)]
pub struct Drain {
    draining: AtomicBool,
    in_flight: AtomicUsize,
    settled: Notify,
}

impl Drain {
    pub fn new() -> Arc<Self> {
        Arc::new(Drain::default())
    }

    /// Set once the shutdown signal arrived.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn start(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Requests being answered (bodies still being sent included), GET
    /// streams on `/mcp` excepted.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Waits until no request is in flight, at most `limit`; `false` when
    /// some were still running.
    pub async fn settled(&self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.settled.notified();
                if self.in_flight() == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }

    fn enter(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }
}

/// One request in flight; counted out when its answer has been sent or
/// dropped.
struct InFlight(Arc<Drain>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.settled.notify_waiters();
        }
    }
}

/// Counts each request until its answer is sent (a GET on `/mcp` is an event
/// stream that ends only at shutdown: not counted), and while draining asks
/// the client to close the connection after the answer.
pub async fn track(State(drain): State<Arc<Drain>>, req: Request, next: Next) -> Response {
    let stream = req.method() == http::Method::GET && req.uri().path().trim_end_matches('/') == "/mcp";
    let held = (!stream).then(|| drain.enter());
    let mut resp = next.run(req).await;
    if drain.is_draining() {
        resp.headers_mut()
            .insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    let Some(held) = held else { return resp };
    resp.map(|body| axum::body::Body::new(Holding { body, _held: held }))
}

/// A body that holds `T` (its request counted in flight, a search's slot)
/// until it is sent or dropped; its length and end are the inner body's (a
/// `Content-Length` stays).
pub(crate) struct Holding<T> {
    pub(crate) body: axum::body::Body,
    pub(crate) _held: T,
}

impl<T: Send + Unpin + 'static> http_body::Body for Holding<T> {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
