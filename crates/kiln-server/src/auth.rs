//! Bearer-token authorization. Two scopes: the admin token for the public
//! API, the agent token for the agent API. Neither grants the other's calls.
//!
//! A public-API credential comes from the `Authorization: Bearer` header,
//! or — for the web UI — from its session cookie (`kiln_session`, HttpOnly,
//! SameSite=Strict, set by `POST /v1/ui/session`). Tokens in URLs are not
//! accepted: they end up in logs, history and `Referer`s. A cookie is sent
//! by the browser on its own, so a cookie-authenticated request that is not
//! a GET must also carry `X-Kiln-CSRF` (a header no cross-site form can set
//! and no cross-origin script may send without a CORS preflight, which this
//! server never grants).

use crate::error::ApiErr;
use crate::state::{AppState, State};
use axum::extract::{Request, State as S};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

/// The web UI's session cookie.
pub(crate) const SESSION_COOKIE: &str = "kiln_session";
/// The header a cookie-authenticated non-GET request must carry.
pub(crate) const CSRF_HEADER: &str = "x-kiln-csrf";

/// The token of an `Authorization: Bearer` header.
fn bearer(req: &Request) -> Option<String> {
    let h = req.headers().get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    h.strip_prefix("Bearer ").map(|t| t.trim().to_string())
}

/// The value of cookie `name`.
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name && !v.is_empty()).then(|| v.trim_matches('"').to_string())
        })
}

/// The public-API credential a request carries: its bearer token, else the
/// UI's session cookie (then a non-GET must carry [`CSRF_HEADER`]).
/// `Ok(None)`: no credential at all.
pub(crate) fn public_credential(req: &Request) -> Result<Option<String>, ApiErr> {
    if let Some(t) = bearer(req) {
        return Ok(Some(t));
    }
    let Some(t) = cookie(req.headers(), SESSION_COOKIE) else { return Ok(None) };
    if !matches!(*req.method(), Method::GET | Method::HEAD) && !req.headers().contains_key(CSRF_HEADER) {
        return Err(ApiErr::new(
            StatusCode::FORBIDDEN,
            "csrf",
            format!("a request authenticated by the session cookie must carry the {CSRF_HEADER} header"),
        ));
    }
    Ok(Some(t))
}

/// Whether `token` grants the public API (the bearer header, the session
/// cookie and the UI's sign-in all ask this).
pub(crate) fn accepts_public(state: &AppState, token: &str) -> bool {
    same(token, &state.admin_token)
}

/// Constant-time comparison.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub async fn require_admin(S(state): S<State>, req: Request, next: Next) -> Result<Response, ApiErr> {
    match public_credential(&req)? {
        Some(t) if accepts_public(&state, &t) => Ok(next.run(req).await),
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
    use axum::body::Body;

    fn req(method: Method, headers: &[(&str, &str)], uri: &str) -> Request {
        let mut b = axum::http::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn credentials_come_from_the_header_or_the_cookie_never_the_query() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
        let get = |h: &[(&str, &str)], uri: &str| public_credential(&req(Method::GET, h, uri)).unwrap();
        assert_eq!(get(&[("authorization", "Bearer t1")], "/v1/repos"), Some("t1".into()));
        assert_eq!(get(&[], "/v1/repos?token=t1"), None, "a token in the URL is ignored");
        assert_eq!(get(&[("cookie", "a=b; kiln_session=t2; c=d")], "/"), Some("t2".into()));
        assert_eq!(get(&[("cookie", "kiln_session=")], "/"), None);
        // A cookie-authenticated POST needs the CSRF header; a bearer one does not.
        let post = |h: &[(&str, &str)]| public_credential(&req(Method::POST, h, "/v1/repos"));
        assert_eq!(post(&[("cookie", "kiln_session=t2")]).unwrap_err().status, StatusCode::FORBIDDEN);
        assert_eq!(post(&[("cookie", "kiln_session=t2"), ("x-kiln-csrf", "1")]).unwrap(), Some("t2".into()));
        assert_eq!(post(&[("authorization", "Bearer t1")]).unwrap(), Some("t1".into()));
    }
}
