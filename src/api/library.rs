//! Library ingest and workspace lifecycle (DESIGN §6).

use axum::Router;

use crate::startup::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
}
