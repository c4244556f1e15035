//! The shapes of the answers (and one request) that handlers build with
//! `json!` or read untyped: described here for the OpenAPI document
//! (`crate::openapi`), never constructed. The real-answer test
//! (`crates/kiln/tests/e2e_openapi.rs`) holds the handlers to them.

// Described, never built: the handlers build these bodies with `json!`.
#![allow(dead_code)]

use kiln_api as api;
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// `GET /v1/repos`.
#[derive(ToSchema)]
pub(crate) struct RepoList {
    pub repos: Vec<api::Repo>,
}

/// `GET /v1/repos/{repo}/deliveries`, newest first.
#[derive(ToSchema)]
pub(crate) struct DeliveryList {
    pub deliveries: Vec<api::Delivery>,
}

/// `GET /v1/repos/{repo}/secrets`: names and dates, never values.
#[derive(ToSchema)]
pub(crate) struct SecretList {
    pub secrets: Vec<api::SecretInfo>,
}

/// `GET /v1/tokens`.
#[derive(ToSchema)]
pub(crate) struct TokenList {
    pub tokens: Vec<api::TokenInfo>,
}

/// `GET /v1/agent-tokens`.
#[derive(ToSchema)]
pub(crate) struct JoinTokenList {
    pub agent_tokens: Vec<api::JoinTokenInfo>,
}

/// `GET /v1/agents`.
#[derive(ToSchema)]
pub(crate) struct AgentList {
    pub agents: Vec<api::AgentInfo>,
}

/// `GET /v1/audit`, newest first.
#[derive(ToSchema)]
pub(crate) struct AuditLog {
    pub entries: Vec<api::AuditEntry>,
}

/// A token was revoked: its id.
#[derive(ToSchema)]
pub(crate) struct Revoked {
    pub revoked: String,
}

/// An agent was removed: its id.
#[derive(ToSchema)]
pub(crate) struct Removed {
    pub removed: String,
}

/// A secret was deleted: its name.
#[derive(ToSchema)]
pub(crate) struct Deleted {
    pub deleted: String,
}

/// The session drains: it claims nothing more.
#[derive(ToSchema)]
pub(crate) struct Draining {
    pub draining: bool,
}

/// An empty object.
#[derive(ToSchema)]
pub(crate) struct Empty {}

/// `POST /v1/ui/session`: any API token.
#[derive(ToSchema)]
pub(crate) struct SignIn {
    pub token: String,
}

/// `GET /.well-known/openid-configuration` (the issuer of job identity tokens).
#[derive(ToSchema)]
pub(crate) struct OidcDiscovery {
    pub issuer: String,
    pub jwks_uri: String,
    pub response_types_supported: Vec<String>,
    pub subject_types_supported: Vec<String>,
    pub id_token_signing_alg_values_supported: Vec<String>,
    pub claims_supported: Vec<String>,
}

/// `GET /.well-known/jwks.json`: the public keys of job identity tokens (JWK, P-256).
#[derive(ToSchema)]
pub(crate) struct Jwks {
    pub keys: Vec<BTreeMap<String, String>>,
}

/// A DSSE envelope (issue 45): `payload` is the base64 of an in-toto
/// Statement v1 (SLSA Provenance v1), each signature ECDSA P-256 over the
/// PAE of `payloadType` and the payload, DER in base64, `keyid` the JWK
/// thumbprint of a key at `/.well-known/kiln-attestation-keys.json`.
#[derive(ToSchema)]
pub(crate) struct DsseEnvelope {
    #[schema(rename = "payloadType")]
    pub payload_type: String,
    pub payload: String,
    pub signatures: Vec<BTreeMap<String, String>>,
}

/// `GET /v1/repos/{repo}/notifications`: never the secret.
#[derive(ToSchema)]
pub(crate) struct NotificationList {
    pub notifications: Vec<api::Notification>,
}

/// `GET /v1/repos/{repo}/notifications/deliveries`, newest first.
#[derive(ToSchema)]
pub(crate) struct NotificationDeliveryList {
    pub deliveries: Vec<api::NotificationDelivery>,
}

/// `GET /v1/repos/{repo}/quarantine`: open quarantines, then those ended
/// in the last 30 days.
#[derive(ToSchema)]
pub(crate) struct QuarantineList {
    pub quarantine: Vec<api::Quarantine>,
}
