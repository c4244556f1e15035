//! Bearer-token authorization. Two scopes: the admin token for the public
//! API, the agent token for the agent API. Neither grants the other's calls.

use crate::State;
use crate::error::ApiErr;
use axum::extract::{Request, State as S};
use axum::middleware::Next;
use axum::response::Response;

fn bearer(req: &Request) -> Option<String> {
    if let Some(h) = req.headers().get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        return h.strip_prefix("Bearer ").map(|t| t.trim().to_string());
    }
    // EventSource in browsers cannot set headers: accept `?token=` on GETs.
    if req.method() == axum::http::Method::GET {
        return req
            .uri()
            .query()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token=").map(|t| t.to_string())));
    }
    None
}

/// Constant-time comparison.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub async fn require_admin(S(state): S<State>, req: Request, next: Next) -> Result<Response, ApiErr> {
    match bearer(&req) {
        Some(t) if same(&t, &state.admin_token) => Ok(next.run(req).await),
        _ => Err(ApiErr::unauthorized()),
    }
}

pub async fn require_agent(S(state): S<State>, req: Request, next: Next) -> Result<Response, ApiErr> {
    match bearer(&req) {
        Some(t) if same(&t, &state.agent_token) => Ok(next.run(req).await),
        _ => Err(ApiErr::unauthorized()),
    }
}
