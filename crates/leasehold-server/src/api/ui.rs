//! The dashboard at `/ui`: one page, its script and its style, built into
//! the binary (no CDN, nothing fetched from elsewhere). The page reads the
//! HTTP API like any client: `/health` (on a follower, a link to the
//! leader's own `/ui` at its `leader_url`), `/v1/cluster`, `/v1/locks`
//! (`held=true` unless free keys are asked for) and `/v1/leases` a page at
//! a time (100 entries, with their cursors), `/v1/events` for the node's
//! recent history, and `/v1/watch` for events as they happen.

use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::service::LockService;

const PAGE: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");

/// Scripts, styles and calls from this origin only.
const POLICY: &str = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, content_type),
            (CONTENT_SECURITY_POLICY, POLICY),
            (CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

/// The dashboard's routes; `/` sends a browser to it.
pub fn routes() -> Router<LockService> {
    Router::new()
        .route("/", get(|| async { axum::response::Redirect::to("/ui") }))
        .route(
            "/ui",
            get(|| async { asset("text/html; charset=utf-8", PAGE) }),
        )
        .route(
            "/ui/",
            get(|| async { asset("text/html; charset=utf-8", PAGE) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}
