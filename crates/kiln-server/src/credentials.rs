//! Credentials the server issues and checks (invariant 11: an agent call on
//! an attempt is accepted only from the agent session that holds it).
//!
//! - A **join token** lets a machine register as an agent: the bootstrap
//!   `DATA_DIR/agent.token`, or one made with `kiln agent-token create`
//!   (`kiln_j1.ID.SECRET`, stored as the sha256 of SECRET, revocable).
//! - Registration returns the agent's **session credential**
//!   (`kiln_s1.AGENT.SESSION.MAC`): it claims work and holds the session
//!   stream for that agent session only.
//! - Each claim returns an **attempt token** (`kiln_a1.MAC`) for that one
//!   `(job, epoch)`: heartbeats, logs, uploads, seals, restores and the
//!   completion of the attempt need it, and nothing else accepts it.
//!
//! Session credentials and attempt tokens are HMACs under a key derived
//! from `blob.key` (shared by replicas), so checking them costs no database
//! read; what they name is still checked by the store (the session must be
//! the agent's current one, the epoch current and live).
//!
//! API tokens made with `kiln token create` are `kiln_t1.ID.SECRET`.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub(crate) const JOIN_PREFIX: &str = "kiln_j1";
pub(crate) const API_PREFIX: &str = "kiln_t1";
const SESSION_PREFIX: &str = "kiln_s1";
const ATTEMPT_PREFIX: &str = "kiln_a1";
/// A step's shard capability (issue 43).
const SHARD_PREFIX: &str = "kiln_sh1";

/// The key of agent credentials, derived from the server's `blob.key`.
#[derive(Clone)]
pub struct AgentKeys {
    key: Vec<u8>,
}

/// Who a valid session credential names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentCaller {
    pub agent_id: String,
    pub session_id: String,
}

impl AgentKeys {
    pub fn new(server_key: &[u8]) -> Self {
        let mut m = Hmac::<Sha256>::new_from_slice(server_key).expect("any key length");
        m.update(b"kiln agent credentials v1");
        AgentKeys { key: m.finalize().into_bytes().to_vec() }
    }

    fn mac(&self, parts: &[&str]) -> Hmac<Sha256> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        for p in parts {
            m.update(p.as_bytes());
            m.update(&[0]);
        }
        m
    }

    pub fn session_credential(&self, agent_id: &str, session_id: &str) -> String {
        let tag = self.mac(&["session", agent_id, session_id]).finalize().into_bytes();
        format!("{SESSION_PREFIX}.{agent_id}.{session_id}.{}", hex::encode(tag))
    }

    /// The agent session a credential names, if the server issued it.
    pub fn verify_session(&self, token: &str) -> Option<AgentCaller> {
        let mut it = token.strip_prefix(SESSION_PREFIX)?.strip_prefix('.')?.split('.');
        let (agent_id, session_id, tag) = (it.next()?, it.next()?, it.next()?);
        if it.next().is_some() {
            return None;
        }
        let tag = hex::decode(tag).ok()?;
        self.mac(&["session", agent_id, session_id]).verify_slice(&tag).ok()?;
        Some(AgentCaller { agent_id: agent_id.to_string(), session_id: session_id.to_string() })
    }

    pub fn attempt_token(&self, job_id: &str, epoch: i64) -> String {
        let tag = self.mac(&["attempt", job_id, &epoch.to_string()]).finalize().into_bytes();
        format!("{ATTEMPT_PREFIX}.{}", hex::encode(tag))
    }

    /// The shard capability of `(job, epoch)` (issue 43): handed to the
    /// attempt's steps as `$KILN_SHARD_TOKEN`; it allows only
    /// `POST /v1/jobs/{job}/attempts/{epoch}/shards/next`, and only while
    /// that attempt is live.
    pub fn shard_token(&self, job_id: &str, epoch: i64) -> String {
        let tag = self.mac(&["shard", job_id, &epoch.to_string()]).finalize().into_bytes();
        format!("{SHARD_PREFIX}.{}", hex::encode(tag))
    }

    /// Whether `token` is the shard capability of exactly `(job, epoch)`.
    pub fn holds_shard(&self, token: &str, job_id: &str, epoch: i64) -> bool {
        let Some(tag) = token.strip_prefix(SHARD_PREFIX).and_then(|t| t.strip_prefix('.')) else {
            return false;
        };
        let Ok(tag) = hex::decode(tag) else { return false };
        self.mac(&["shard", job_id, &epoch.to_string()]).verify_slice(&tag).is_ok()
    }

    /// Whether `token` is the attempt token of exactly `(job, epoch)`.
    pub fn holds_attempt(&self, token: &str, job_id: &str, epoch: i64) -> bool {
        let Some(tag) = token.strip_prefix(ATTEMPT_PREFIX).and_then(|t| t.strip_prefix('.')) else {
            return false;
        };
        let Ok(tag) = hex::decode(tag) else { return false };
        self.mac(&["attempt", job_id, &epoch.to_string()]).verify_slice(&tag).is_ok()
    }
}

/// A new stored-hashed token `PREFIX.ID.SECRET`: `(id, token, sha256 of SECRET)`.
pub(crate) fn mint(prefix: &str) -> (String, String, String) {
    let id = hex::encode(rand::random::<[u8; 6]>());
    let secret = hex::encode(rand::random::<[u8; 24]>());
    let token = format!("{prefix}.{id}.{secret}");
    (id, token, hash_secret(&secret))
}

/// `(id, secret)` of a `PREFIX.ID.SECRET` token.
pub(crate) fn split<'a>(token: &'a str, prefix: &str) -> Option<(&'a str, &'a str)> {
    let (id, secret) = token.strip_prefix(prefix)?.strip_prefix('.')?.split_once('.')?;
    let ok = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    (ok(id) && ok(secret)).then_some((id, secret))
}

pub(crate) fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Constant-time string comparison.
pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// API tokens recently read from the store, so a busy caller costs no read
/// per request. A revocation on this replica takes effect at once, on
/// another replica within [`TOKEN_CACHE_TTL`].
#[derive(Default)]
pub(crate) struct TokenCache {
    pub entries: Mutex<HashMap<String, (kiln_store::ApiTokenRecord, Instant)>>,
    /// When each token's `last_used_at` was last written.
    pub touched: Mutex<HashMap<String, Instant>>,
}

pub(crate) const TOKEN_CACHE_TTL: Duration = Duration::from_secs(2);
pub(crate) const TOUCH_EVERY: Duration = Duration::from_secs(60);

impl TokenCache {
    pub fn forget(&self, id: &str) {
        self.entries.lock().expect("token cache").remove(id);
    }

    /// Read every token from the store again (several were revoked at once).
    pub fn forget_all(&self) {
        self.entries.lock().expect("token cache").clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_credentials_name_one_session_and_cannot_be_forged() {
        let k = AgentKeys::new(b"server key");
        let c = k.session_credential("a1", "s1");
        assert_eq!(k.verify_session(&c), Some(AgentCaller { agent_id: "a1".into(), session_id: "s1".into() }));
        // Another agent or session under the same MAC, another key, junk.
        let tag = c.rsplit('.').next().unwrap();
        for bad in [
            format!("kiln_s1.a2.s1.{tag}"),
            format!("kiln_s1.a1.s2.{tag}"),
            format!("kiln_s1.a1.s1.{tag}.x"),
            AgentKeys::new(b"other key").session_credential("a1", "s1"),
            k.attempt_token("a1", 1),
            "kiln_s1".into(),
            "kiln_s1.a1.s1.zz".into(),
            String::new(),
        ] {
            assert_eq!(k.verify_session(&bad), None, "{bad}");
        }
    }

    #[test]
    fn attempt_tokens_hold_exactly_one_epoch_of_one_job() {
        let k = AgentKeys::new(b"server key");
        let t = k.attempt_token("job-1", 3);
        assert!(k.holds_attempt(&t, "job-1", 3));
        assert!(!k.holds_attempt(&t, "job-1", 4), "not the next epoch");
        assert!(!k.holds_attempt(&t, "job-1", 2), "not an earlier epoch");
        assert!(!k.holds_attempt(&t, "job-2", 3), "not another job");
        assert!(!AgentKeys::new(b"other").holds_attempt(&t, "job-1", 3));
        assert!(!k.holds_attempt(&k.session_credential("job-1", "3"), "job-1", 3));
        assert!(!k.holds_attempt("kiln_a1.", "job-1", 3));
    }

    #[test]
    fn a_shard_capability_is_no_attempt_token_and_holds_one_epoch() {
        let k = AgentKeys::new(b"server key");
        let shard = k.shard_token("job-1", 3);
        assert!(k.holds_shard(&shard, "job-1", 3));
        assert!(!k.holds_shard(&shard, "job-1", 4) && !k.holds_shard(&shard, "job-2", 3));
        assert!(!k.holds_attempt(&shard, "job-1", 3), "a step's capability never works as the attempt's token");
        assert!(!k.holds_shard(&k.attempt_token("job-1", 3), "job-1", 3), "nor the other way round");
    }

    #[test]
    fn minted_tokens_split_and_hash() {
        let (id, token, hash) = mint(JOIN_PREFIX);
        let (got_id, secret) = split(&token, JOIN_PREFIX).unwrap();
        assert_eq!(got_id, id);
        assert_eq!(hash_secret(secret), hash);
        assert!(split(&token, API_PREFIX).is_none());
        assert!(split("kiln_j1.zz.11", JOIN_PREFIX).is_none());
        assert!(split("kiln_j1.11", JOIN_PREFIX).is_none());
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "abcd"));
    }
}
