//! The embedded web UI: the page (with its content security policy) and its
//! cookie session (`POST /v1/ui/session` signs in with a token in the JSON
//! body, `DELETE` signs out). See `auth` for how the cookie is accepted.

use super::body::parse;
use crate::auth::{self, SESSION_COOKIE};
use crate::error::{ApiErr, ApiResult};
use crate::state::State;
use axum::body::Bytes;
use axum::extract::State as S;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
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

/// `POST /v1/ui/session` `{"token"}`: 204 with the session cookie when the
/// token is accepted as the bearer header would be, else 401.
pub(crate) async fn sign_in(S(state): S<State>, body: Bytes) -> ApiResult<Response> {
    let req: SignIn = parse(&body)?;
    let token = req.token.trim();
    // Only cookie-safe characters (a token is `kiln_` and hex).
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.~+/=".contains(&b)) {
        return Err(ApiErr::unauthorized());
    }
    // Any API token signs in; its scope applies to what the UI then calls.
    if auth::principal(&state, token).await?.is_none() {
        return Err(ApiErr::unauthorized());
    }
    Ok(with_cookie(&state, format!("{SESSION_COOKIE}={token}")))
}

/// `DELETE /v1/ui/session`: 204, the cookie cleared.
pub(crate) async fn sign_out(S(state): S<State>) -> Response {
    with_cookie(&state, format!("{SESSION_COOKIE}=; Max-Age=0"))
}

fn with_cookie(state: &State, cookie: String) -> Response {
    let secure = if state.config.tls.is_some() { "; Secure" } else { "" };
    let value = format!("{cookie}; Path=/; HttpOnly; SameSite=Strict{secure}");
    (
        StatusCode::NO_CONTENT,
        [
            (header::SET_COOKIE, HeaderValue::from_str(&value).expect("cookie-safe")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
    )
        .into_response()
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
