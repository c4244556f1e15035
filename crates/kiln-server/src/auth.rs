//! Bearer-token authorization. Two scopes: the admin token for the public
//! API, the agent token for the agent API. Neither grants the other's calls.

use crate::error::ApiErr;
use crate::state::State;
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
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token=").map(percent_decode)));
    }
    None
}

/// Decode `%XX` escapes of a query value (a browser may encode the token).
fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(x) = u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
        {
            out.push(x);
            i += 3;
        } else {
            out.push(if b[i] == b'+' { b' ' } else { b[i] });
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_tokens_are_percent_decoded() {
        assert_eq!(percent_decode("kiln_ab12"), "kiln_ab12");
        assert_eq!(percent_decode("a%2Bb%3D%3d"), "a+b==");
        assert_eq!(percent_decode("bad%zz%4"), "bad%zz%4");
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
    }
}
