//! The operator's routes of the HTTP surface: cluster membership and
//! leadership, backups, and auth (roles and tokens). The table of every
//! route is in the parent module.

use std::convert::Infallible;

use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use leasehold_core::auth::Rule;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{Body, Caller, Param, Result};
use crate::service::ApiError;

pub(super) async fn cluster_status(Caller(s): Caller) -> Result<Json<Value>> {
    Ok(Json(json!(s.cluster_status().await?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MemberBody {
    id: u64,
    addr: String,
}

pub(super) async fn add_member(
    Caller(s): Caller,
    Body(b): Body<MemberBody>,
) -> Result<Json<Value>> {
    Ok(Json(json!(s.add_member(b.id, b.addr).await?)))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct TransferBody {
    /// The voter to hand leadership to; none: the most caught-up.
    #[serde(default)]
    to: Option<u64>,
}

/// A backup of the applied table, from the leader after a linearizable
/// read: a snapshot file (`leasehold snapshot status` reads it), sent a MiB
/// at a time.
pub(super) async fn backup(Caller(s): Caller) -> Result<Response> {
    let backup = s.backup().await?;
    let index = backup.index;
    let term = backup.term;
    let bytes = Bytes::from(backup.bytes);
    let len = bytes.len();
    let chunks: Vec<std::result::Result<Bytes, Infallible>> = (0..len)
        .step_by(1 << 20)
        .map(|at| Ok(bytes.slice(at..len.min(at + (1 << 20)))))
        .collect();
    let body = axum::body::Body::from_stream(futures::stream::iter(chunks));
    Ok((
        [
            ("content-type", "application/octet-stream".to_string()),
            ("content-length", len.to_string()),
            ("leasehold-snapshot-index", index.to_string()),
            ("leasehold-snapshot-term", term.to_string()),
        ],
        body,
    )
        .into_response())
}

/// Body `{"to": ID}`, or none: the most caught-up follower.
pub(super) async fn transfer_leader(Caller(s): Caller, body: Bytes) -> Result<Json<Value>> {
    let body: TransferBody = if body.iter().all(u8::is_ascii_whitespace) {
        TransferBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid("body", e))?
    };
    Ok(Json(json!(s.transfer_leader(body.to).await?)))
}

pub(super) async fn remove_member(Caller(s): Caller, Param(id): Param) -> Result<Json<Value>> {
    let id = id
        .parse()
        .map_err(|_| ApiError::invalid("id", format!("{id:?} is not a node id")))?;
    Ok(Json(json!(s.remove_member(id).await?)))
}

pub(super) async fn auth_state(Caller(s): Caller) -> Result<Json<Value>> {
    Ok(Json(json!(s.auth_state().await?)))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct EnableBody {
    /// The root token's secret, chosen by the caller so a retry is safe.
    #[serde(default)]
    secret: Option<String>,
}

pub(super) async fn enable_auth(Caller(s): Caller, body: Bytes) -> Result<Json<Value>> {
    // The body is optional: none, or one JSON object.
    let b: EnableBody = if body.iter().all(u8::is_ascii_whitespace) {
        EnableBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid("body", e))?
    };
    Ok(Json(json!(s.enable_auth(b.secret).await?)))
}

pub(super) async fn disable_auth(Caller(s): Caller) -> Result<Json<Value>> {
    s.disable_auth().await?;
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RoleBody {
    rules: Vec<Rule>,
}

pub(super) async fn set_role(
    Caller(s): Caller,
    Param(name): Param,
    Body(b): Body<RoleBody>,
) -> Result<Json<Value>> {
    s.set_role(name, b.rules).await?;
    Ok(Json(json!({})))
}

pub(super) async fn delete_role(Caller(s): Caller, Param(name): Param) -> Result<Json<Value>> {
    s.delete_role(name).await?;
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TokenBody {
    name: String,
    role: String,
    /// The token's secret, chosen by the caller so a retry is safe.
    #[serde(default)]
    secret: Option<String>,
}

pub(super) async fn create_token(
    Caller(s): Caller,
    Body(b): Body<TokenBody>,
) -> Result<Json<Value>> {
    Ok(Json(json!(s.create_token(b.name, b.role, b.secret).await?)))
}

pub(super) async fn revoke_token(Caller(s): Caller, Param(id): Param) -> Result<Json<Value>> {
    let id = id
        .parse()
        .map_err(|_| ApiError::invalid("id", format!("{id:?} is not a token id")))?;
    s.revoke_token(id).await?;
    Ok(Json(json!({})))
}
