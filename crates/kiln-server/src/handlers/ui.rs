//! The embedded web UI: the page (with its content security policy) and its
//! cookie session (`POST /v1/ui/session` signs in with a token in the JSON
//! body, from the UI's own origin, and gets a cookie holding a random
//! session id kept hashed in the store; `DELETE` deletes the session). See
//! `auth` for how the cookie is accepted.

use super::body::{parse, read_unauthenticated, refuse_unread};
use crate::auth::{self, SESSION_COOKIE};
use crate::error::{ApiErr, ApiResult};
use crate::state::State;
use axum::body::{Body, Bytes};
use axum::extract::State as S;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use kiln_api as api;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::sync::LazyLock;

const PAGE: &str = include_str!("../../assets/index.html");

/// The page's policy: its one inline script by hash, nothing from elsewhere.
/// (Inline `style` attributes are allowed; scripts are not.)
static UI_CSP: LazyLock<String> = LazyLock::new(|| {
    let script = PAGE
        .split_once("<script>")
        .and_then(|(_, rest)| rest.split_once("</script>"))
        .map(|(s, _)| s)
        .expect("the UI has an inline script");
    let hash = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(script.as_bytes()));
    format!(
        "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; img-src 'self' data:; \
         connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    )
});

/// `GET /`: the UI.
#[utoipa::path(
    operation_id = "ui_page",
    get, path = "/", tag = "ui",
    responses(
        (status = 200, description = "The web UI", content_type = "text/html", body = String),
    ),
    security(()),
)]
pub(crate) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
            (header::CONTENT_SECURITY_POLICY, HeaderValue::from_str(&UI_CSP).expect("ascii")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        PAGE,
    )
        .into_response()
}

#[derive(Deserialize)]
pub(crate) struct SignIn {
    token: String,
}

/// A sign-in must come from the UI's own page (issue 39, item 12: a
/// cross-site `text/plain` form posting a token replaced the admin's
/// session — login CSRF): its body is declared JSON (no cross-site form can
/// send that, and a cross-origin script cannot without a CORS preflight this
/// server never grants), and what the browser says of its origin is this
/// server: `Sec-Fetch-Site`, when sent, is `same-origin`, and `Origin`, when
/// sent, names the host the request came to (or is the origin of
/// `--public-url`). (Clients that are not
/// browsers send neither header and are not at risk of CSRF.)
fn same_origin_json(state: &State, headers: &HeaderMap) -> ApiResult<()> {
    let forbidden = |why: &str| {
        ApiErr::new(StatusCode::FORBIDDEN, "csrf", format!("sign-in refused: {why}; sign in from Kiln's own page"))
    };
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(ApiErr::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            api::codes::INVALID,
            "sign-in takes a JSON body (Content-Type: application/json)",
        ));
    }
    if let Some(site) = headers.get("sec-fetch-site")
        && site.as_bytes() != b"same-origin"
    {
        return Err(forbidden("the request came from another site (Sec-Fetch-Site)"));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
        let origin = origin.to_str().unwrap_or_default();
        let origin_host = origin.split_once("://").map(|(_, rest)| rest);
        // Behind a proxy that rewrites `Host`, the public URL's origin.
        let public = state.config.public_url.as_deref().map(|u| {
            let rest = u
                .split_once("://")
                .map_or(u.len(), |(scheme, rest)| scheme.len() + 3 + rest.find('/').unwrap_or(rest.len()));
            &u[..rest]
        });
        if (host.is_empty() || origin_host != Some(host)) && public != Some(origin) {
            return Err(forbidden("the request's Origin is not this server"));
        }
    }
    Ok(())
}

/// `POST /v1/ui/session` `{"token"}`: 204 with the session cookie when the
/// token is accepted as the bearer header would be, else 401.
#[utoipa::path(
    operation_id = "ui_sign_in",
    post, path = "/v1/ui/session", tag = "ui",
    request_body = super::answers::SignIn,
    responses(
        (status = 204, description = "Signed in: the session cookie is set", headers(("Set-Cookie" = String, description = "The session cookie"))),
        (status = 403, description = "Not from Kiln's own page (`csrf`)", body = api::ErrorBody),
        (status = 415, description = "Not a JSON body", body = api::ErrorBody),
    ),
    security(()),
)]
pub(crate) async fn sign_in(S(state): S<State>, headers: HeaderMap, body: Body) -> Result<Response, Response> {
    same_origin_json(&state, &headers).map_err(refuse_unread)?;
    // A token is short: a small share of the unauthenticated body budget.
    let body = read_unauthenticated(&state, &headers, body, 16 * 1024).await?;
    sign_in_with(&state, &headers, &body.bytes).await.map_err(IntoResponse::into_response)
}

async fn sign_in_with(state: &State, headers: &HeaderMap, body: &Bytes) -> ApiResult<Response> {
    let req: SignIn = parse(body)?;
    let token = req.token.trim();
    // Only cookie-safe characters (a token is `kiln_` and hex).
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.~+/=".contains(&b)) {
        return Err(ApiErr::unauthorized());
    }
    // Any API token signs in; its scope applies to what the UI then calls.
    if auth::principal(state, token).await?.is_none() {
        return Err(ApiErr::unauthorized());
    }
    let (actor, token_hash) = auth::session_subject(state, token).ok_or_else(ApiErr::unauthorized)?;
    // The cookie holds a random session id, never the token: a cookie that
    // leaks (to another port of this host, say) is revocable and expires.
    let id = hex::encode(rand::random::<[u8; 32]>());
    let ttl = i64::try_from(SESSION_TTL.as_millis()).expect("ttl");
    state.store.create_ui_session(&crate::credentials::hash_secret(&id), &actor, &token_hash, ttl).await?;
    let name = cookie_name(state, headers);
    Ok(with_cookies(&[format!("{name}={id}; Max-Age={}; {}", SESSION_TTL.as_secs(), attributes(state, headers))]))
}

/// How long a UI session lasts.
const SESSION_TTL: std::time::Duration = std::time::Duration::from_secs(12 * 3600);

/// Whether the browser talks to this server over a secure context: TLS
/// here or at a proxy in front (`--public-url https://…`), or a loopback
/// host, which browsers treat as secure (Chromium, Firefox) and so accept
/// `Secure` (hence `__Host-`) cookies from over plain http.
fn secure_context(state: &State, headers: &HeaderMap) -> bool {
    if state.config.tls.is_some() || state.config.public_url.as_deref().is_some_and(|u| u.starts_with("https://")) {
        return true;
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    let name = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost")
        || name.to_ascii_lowercase().ends_with(".localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `__Host-kiln_session` in a secure context, else `kiln_session`.
fn cookie_name(state: &State, headers: &HeaderMap) -> &'static str {
    if secure_context(state, headers) { SESSION_COOKIE } else { auth::PLAIN_SESSION_COOKIE }
}

/// Host-only (no `Domain`), the whole path, never read by scripts, never
/// sent cross-site; `Secure` in a secure context.
fn attributes(state: &State, headers: &HeaderMap) -> &'static str {
    if secure_context(state, headers) {
        "Path=/; HttpOnly; SameSite=Strict; Secure"
    } else {
        "Path=/; HttpOnly; SameSite=Strict"
    }
}

/// `DELETE /v1/ui/session`: the session is deleted on the server (its
/// cookie's value then authenticates nothing) and the cookie cleared; 204.
#[utoipa::path(
    operation_id = "ui_sign_out",
    delete, path = "/v1/ui/session", tag = "ui",
    responses(
        (status = 204, description = "Signed out: the session is deleted and the cookie cleared"),
    ),
    security(()),
)]
pub(crate) async fn sign_out(S(state): S<State>, headers: HeaderMap) -> ApiResult<Response> {
    if let Some(id) = auth::session_cookie(&headers) {
        state.store.delete_ui_session(&crate::credentials::hash_secret(&id)).await?;
    }
    let secure = attributes(&state, &headers);
    Ok(with_cookies(&[
        format!("{SESSION_COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict; Secure"),
        format!("{}=; Max-Age=0; {secure}", auth::PLAIN_SESSION_COOKIE),
    ]))
}

fn with_cookies(cookies: &[String]) -> Response {
    let mut res =
        (StatusCode::NO_CONTENT, [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))]).into_response();
    for c in cookies {
        res.headers_mut().append(header::SET_COOKIE, HeaderValue::from_str(c).expect("cookie-safe"));
    }
    res
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_policy_names_the_script_by_hash() {
        let csp = super::UI_CSP.as_str();
        assert!(csp.contains("script-src 'sha256-"), "{csp}");
        assert!(!csp.contains("unsafe-eval") && !csp.contains("script-src 'unsafe-inline'"), "{csp}");
    }
}
