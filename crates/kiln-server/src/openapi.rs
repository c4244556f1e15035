//! The OpenAPI 3.1 document of the HTTP API, served at `GET /openapi.json`
//! (no credential: it holds no secrets) and printed by `kiln openapi`.
//!
//! It is generated, not written: the schemas are `kiln-api`'s wire types
//! (`ToSchema`, behind that crate's `openapi` feature) and the operations
//! are the `#[utoipa::path]` annotations on the handlers. What every
//! operation shares is added here, by [`Common`]: the error body
//! (`{"error": {"code", "message"}}`, `crate::error`) as each operation's
//! `default` answer, 401 where a credential is needed, 404 where a path
//! names something, 409 (`stale_epoch`) on the calls of an attempt.
//!
//! Kept whole by two tests: every route `router.rs` registers is in the
//! document (below), and real answers of every route family validate
//! against it (`crates/kiln/tests/e2e_openapi.rs`); `scripts/test` checks
//! the document with an independent validator.

use crate::handlers::{
    access, agents, artifacts, attempts, blob, env_secrets, environments, health, logs, notify, oidc, repos, runs,
    secrets, teams, tests_api, ui,
};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use kiln_api as api;
use std::sync::LazyLock;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, RefOr, Response as DocResponse, ResponseBuilder};
use utoipa::{Modify, OpenApi};

/// Security scheme names, as operations' `security(...)` name them.
pub(crate) mod scheme {
    /// `DATA_DIR/admin.token` or an API token (`kiln token create`).
    pub const API_TOKEN: &str = "api_token";
    /// The web UI's session cookie.
    pub const UI_SESSION: &str = "ui_session";
    /// An agent join token (`kiln agent-token create`).
    pub const JOIN_TOKEN: &str = "join_token";
    /// The session credential `POST /v1/agents/register` answers with.
    pub const AGENT_SESSION: &str = "agent_session";
    /// An assignment's `attempt_token`, for its `(job, epoch)` only.
    pub const ATTEMPT_TOKEN: &str = "attempt_token";
    /// A data-plane capability (`?cap=`), handed out in upload and download answers.
    pub const CAPABILITY: &str = "capability";
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Kiln",
        description = "The HTTP API of Kiln, a self-hostable CI/CD system: the public API (API tokens and \
                       the web UI's session), the agent API (join token, session credential, attempt \
                       token), the data plane (capability URLs), forge webhooks and health endpoints. \
                       Errors are `{\"error\": {\"code\", \"message\"}}` with a fitting status.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        repos::create, repos::list, repos::get, repos::update, repos::delete, repos::hook_info,
        repos::deliveries, repos::webhook,
        runs::submit, runs::list, runs::workflow_inputs, runs::workflows, runs::list_all, runs::list_events,
        runs::get, runs::run_events, runs::cancel, runs::retry, runs::retry_job, runs::cancel_job, runs::artifacts,
        notify::create, notify::list, notify::delete, notify::deliveries, notify::badge,
        tests_api::stage, tests_api::run_tests, tests_api::history, tests_api::timings, tests_api::quarantine,
        tests_api::unquarantine, tests_api::quarantine_list, tests_api::attempt_timings,
        tests_api::shard_next,
        teams::list, teams::create, teams::get, teams::update, teams::delete, teams::queue_view,
        teams::set_priority,
        environments::list, environments::create, environments::get, environments::update, environments::delete,
        environments::decide, environments::approvals, environments::deployments, environments::rollback,
        environments::rings, environments::promote, environments::pause,
        secrets::list, secrets::put, secrets::delete,
        env_secrets::list, env_secrets::put, env_secrets::delete,
        logs::events, artifacts::get, artifacts::provenance, artifacts::test_attestation,
        access::create_token, access::list_tokens, access::revoke_token, access::create_join_token,
        access::list_join_tokens, access::revoke_join_token, access::list_agents, access::remove_agent,
        access::overview, access::audit,
        agents::register, agents::claim, agents::session, agents::drain,
        attempts::heartbeat, attempts::append_log, attempts::append_log_batch, attempts::complete, attempts::release, attempts::commit_image,
        artifacts::create_upload, artifacts::part_url, artifacts::seal, artifacts::restore,
        artifacts::cache_lookup, artifacts::cache_save, artifacts::cache_report,
        blob::put_part, blob::get_object, blob::export_object,
        oidc::discovery, oidc::jwks, oidc::attestation_jwks, ui::page, ui::sign_in, ui::sign_out,
        health::healthz, health::readyz, health::metrics, serve,
    ),
    components(schemas(
        api::ErrorBody, api::LogEvent, api::LogSealed, api::LogGap, api::LogEnd, api::CancelNotice,
        api::ClaimRequest, api::LogChunk,
    )),
    modifiers(&Common),
    tags(
        (name = "repos", description = "Repositories, their secrets and webhook deliveries"),
        (name = "runs", description = "Workflow runs, their jobs, logs and artifacts"),
        (name = "teams", description = "Teams (fair share of slots by weight, quotas) and the queue"),
        (name = "environments", description = "Deployment environments: approvals, allowed refs, deploy queues"),
        (name = "access", description = "API tokens, agent join tokens, agents, overview and audit (admin scope)"),
        (name = "agent", description = "The agent protocol: registration, claims, the session stream and the calls of a running attempt"),
        (name = "data", description = "The data plane: capability URLs, no bearer token"),
        (name = "webhooks", description = "Forge webhooks: the forge's signature is the credential"),
        (name = "ui", description = "The web UI and its cookie session"),
        (name = "health", description = "Health, readiness, metrics, OIDC discovery and this document"),
    ),
)]
pub struct ApiDoc;

/// The document.
pub fn document() -> Document {
    ApiDoc::openapi()
}

static JSON: LazyLock<String> = LazyLock::new(|| document().to_pretty_json().expect("the OpenAPI document serializes"));

/// The document as pretty JSON (what `GET /openapi.json` serves).
pub fn json() -> &'static str {
    &JSON
}

/// `GET /openapi.json`: this document.
#[utoipa::path(
    operation_id = "openapi_serve",
    get, path = "/openapi.json", tag = "health",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", content_type = "application/json", body = Object)),
    security(()),
)]
pub(crate) async fn serve() -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], json()).into_response()
}

/// What every operation shares: the security schemes, and the error
/// answers (see the module's docs).
struct Common;

impl Modify for Common {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        let bearer = |desc: &str| {
            let mut h = Http::new(HttpAuthScheme::Bearer);
            h.description = Some(desc.to_string());
            SecurityScheme::Http(h)
        };
        components.add_security_scheme(
            scheme::API_TOKEN,
            bearer(
                "`DATA_DIR/admin.token` (scope `admin`) or an API token made with `kiln token create`: scope \
                 `admin` (everything), `read` (every read except secrets, tokens, agents and the audit log) or \
                 `trigger` (start and read the runs of one repository). Never in a URL.",
            ),
        );
        components.add_security_scheme(
            scheme::UI_SESSION,
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                "__Host-kiln_session",
                "The web UI's session (`POST /v1/ui/session`; `kiln_session` over plain http off loopback); it \
                 stands for the token it signed in with. A request that is not a GET must also send \
                 `X-Kiln-CSRF`.",
            ))),
        );
        components.add_security_scheme(
            scheme::JOIN_TOKEN,
            bearer("An agent join token (`kiln agent-token create`, or `DATA_DIR/agent.token`): registers agents of its pool."),
        );
        components.add_security_scheme(
            scheme::AGENT_SESSION,
            bearer("The session credential `POST /v1/agents/register` answers with; for that agent's paths only."),
        );
        components.add_security_scheme(
            scheme::ATTEMPT_TOKEN,
            bearer(
                "An assignment's `attempt_token`: for the calls of that `(job, epoch)` only, while its lease is live.",
            ),
        );
        components.add_security_scheme(
            scheme::CAPABILITY,
            SecurityScheme::ApiKey(ApiKey::Query(ApiKeyValue::with_description(
                "cap",
                "A capability handed out in an upload session or a download answer: one object, until it expires.",
            ))),
        );

        let error = |desc: &str| -> RefOr<DocResponse> {
            ResponseBuilder::new()
                .description(desc)
                .content(
                    "application/json",
                    ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build(),
                )
                .build()
                .into()
        };
        for (path, item) in doc.paths.paths.iter_mut() {
            let attempt = path.starts_with("/v1/jobs/{job}/attempts/{epoch}/");
            let names_something = path.contains('{');
            let ops = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.options,
                &mut item.head,
                &mut item.patch,
                &mut item.trace,
            ];
            for op in ops.into_iter().flatten() {
                let secured = op.security.as_ref().is_none_or(|reqs| {
                    // `security(())` is the empty requirement: open to anyone.
                    let v = serde_json::to_value(reqs).unwrap_or_default();
                    v.as_array().is_some_and(|a| a.iter().any(|r| r.as_object().is_some_and(|o| !o.is_empty())))
                });
                let r = &mut op.responses.responses;
                if secured {
                    r.entry("401".into()).or_insert_with(|| error("No credential, or not one this route takes"));
                }
                if names_something {
                    r.entry("404".into()).or_insert_with(|| error("What the path names does not exist (`not_found`)"));
                }
                if attempt {
                    r.entry("409".into()).or_insert_with(|| {
                        error("The epoch is not current or its lease expired (`stale_epoch`): the attempt may not publish")
                    });
                }
                r.entry("default".into()).or_insert_with(|| {
                    error("An error: `code` is one of `unauthorized`, `forbidden`, `not_found`, `invalid`, `conflict`, `stale_epoch`, `idempotency_key_reused`, `unavailable`, `internal`, `too_large`, `ambiguous`, `expired`")
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// `(METHOD, path)` of every `.route(...)` in `router.rs`'s source: the
    /// path literal and each method router (`get(…)`, `post(…)`, …) named
    /// in the call, however it is formatted.
    fn router_routes() -> BTreeSet<(String, String)> {
        let src = include_str!("router.rs");
        let mut out = BTreeSet::new();
        let mut rest = src;
        while let Some(at) = rest.find(".route(\"") {
            rest = &rest[at + ".route(".len()..];
            // The call's arguments: up to the parenthesis that closes it.
            let mut depth = 1;
            let end = rest
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map(|(i, _)| i)
                .expect("a closed .route( call");
            let args = &rest[..end];
            let path = args[1..].split('"').next().expect("a path literal").to_string();
            let mut methods = 0;
            for m in ["get", "post", "put", "patch", "delete"] {
                let mut hay = args;
                while let Some(i) = hay.find(&format!("{m}(")) {
                    let before = hay[..i].chars().next_back();
                    if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                        out.insert((m.to_uppercase(), path.clone()));
                        methods += 1;
                    }
                    hay = &hay[i + m.len()..];
                }
            }
            assert!(methods > 0, "no method router found in .route({args})");
        }
        out
    }

    fn documented() -> BTreeSet<(String, String)> {
        let doc = serde_json::to_value(super::document()).unwrap();
        let mut out = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                if ["get", "post", "put", "patch", "delete", "head", "options", "trace"].contains(&method.as_str()) {
                    out.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        out
    }

    #[test]
    fn the_parser_sees_the_routes_router_rs_registers() {
        let routes = router_routes();
        // A few of each shape: one method, chained methods, `.merge(…)`.
        for (m, p) in [
            ("GET", "/v1/workflow-runs/{run}"),
            ("POST", "/v1/repos"),
            ("GET", "/v1/repos"),
            ("PATCH", "/v1/repos/{repo}"),
            ("DELETE", "/v1/repos/{repo}"),
            ("PUT", "/blob/uploads/{generation}/parts/{part}"),
            ("GET", "/openapi.json"),
        ] {
            assert!(routes.contains(&(m.to_string(), p.to_string())), "{m} {p} not parsed from router.rs: {routes:?}");
        }
        assert!(routes.len() > 50, "{routes:?}");
    }

    /// Every route the server registers is documented, and the document
    /// names no route the server does not have. A route added to
    /// `router.rs` without a `#[utoipa::path]` on its handler (listed in
    /// `ApiDoc`'s `paths`) fails here.
    #[test]
    fn every_route_is_documented_and_nothing_else() {
        let routes = router_routes();
        let doc = documented();
        let missing: Vec<_> = routes.difference(&doc).collect();
        let extra: Vec<_> = doc.difference(&routes).collect();
        assert!(
            missing.is_empty(),
            "routes in router.rs missing from the OpenAPI document (annotate the handler with \
             #[utoipa::path] and list it in openapi::ApiDoc): {missing:?}"
        );
        assert!(extra.is_empty(), "the OpenAPI document has routes router.rs does not register: {extra:?}");
    }

    /// Each operation says who may call it, and errors have their shape.
    #[test]
    fn every_operation_has_security_and_the_error_body() {
        let doc = serde_json::to_value(super::document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let schemes = doc["components"]["securitySchemes"].as_object().unwrap();
        let mut ids = std::collections::BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let id = op["operationId"].as_str().unwrap_or_else(|| panic!("{method} {path}: no operationId"));
                assert!(ids.insert(id.to_string()), "{method} {path}: operationId {id} is not unique");
                let reqs = op["security"].as_array().unwrap_or_else(|| panic!("{method} {path}: no `security`"));
                for req in reqs {
                    for name in req.as_object().unwrap().keys() {
                        assert!(schemes.contains_key(name), "{method} {path}: unknown scheme {name}");
                    }
                }
                assert_eq!(
                    op["responses"]["default"]["content"]["application/json"]["schema"]["$ref"],
                    "#/components/schemas/ErrorBody",
                    "{method} {path}"
                );
            }
        }
        let err = &doc["components"]["schemas"]["ErrorBody"];
        assert_eq!(err["required"], serde_json::json!(["error"]));
        let run = &doc["components"]["schemas"]["Run"];
        assert!(run["required"].as_array().unwrap().contains(&"status".into()), "{run}");
        assert_eq!(
            doc["components"]["schemas"]["RunStatus"]["enum"],
            serde_json::json!(["queued", "running", "cancelling", "success", "failed", "cancelled"])
        );
    }
}
