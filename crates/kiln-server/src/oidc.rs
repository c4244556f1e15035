//! OIDC identity tokens for jobs (spec 003, Deep Dive 5: short-lived
//! identity instead of stored cloud keys). A job of a trusted run that asks
//! for `id-token:` gets a JWT in `KILN_ID_TOKEN`, signed (ES256) with the
//! server's current key; `/.well-known/openid-configuration` and
//! `/.well-known/jwks.json` let a cloud provider verify it. Untrusted runs
//! get none.
//!
//! Keys live in `DATA_DIR/oidc/` (0700), one file per key (0600), shared by
//! replicas like the rest of the data dir. A new key is made when the newest
//! is older than [`ROTATE_EVERY`]; older keys stay published for
//! [`KEEP_AFTER_ROTATION`] so tokens they signed still verify.

use anyhow::Context;
use base64::Engine;
use p256::ecdsa::signature::Signer;
use p256::ecdsa::{Signature, SigningKey};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long one key signs before a new one is made.
pub const ROTATE_EVERY: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a replaced key stays in the JWKS (longer than any token lives).
pub const KEEP_AFTER_ROTATION: Duration = Duration::from_secs(24 * 3600);
/// Longest a token lives.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// Shortest a token lives (a job with a short timeout still gets this).
pub const MIN_TTL: Duration = Duration::from_secs(300);

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

struct Key {
    kid: String,
    created_ms: i64,
    sk: SigningKey,
}

impl Key {
    fn jwk(&self) -> Value {
        let pt = self.sk.verifying_key().to_encoded_point(false);
        let (x, y) = (b64(pt.x().expect("x")), b64(pt.y().expect("y")));
        json!({ "kty": "EC", "crv": "P-256", "x": x, "y": y, "kid": self.kid, "use": "sig", "alg": "ES256" })
    }

    fn from_secret(created_ms: i64, secret: &[u8]) -> anyhow::Result<Key> {
        let sk = SigningKey::from_slice(secret).map_err(|e| anyhow::anyhow!("not a P-256 key: {e}"))?;
        let pt = sk.verifying_key().to_encoded_point(false);
        // RFC 7638 thumbprint: members in lexicographic order, no spaces.
        let canonical = format!(
            r#"{{"crv":"P-256","kty":"EC","x":"{}","y":"{}"}}"#,
            b64(pt.x().expect("x")),
            b64(pt.y().expect("y"))
        );
        Ok(Key { kid: b64(&Sha256::digest(canonical.as_bytes())), created_ms, sk })
    }
}

/// Signs identity tokens and publishes the keys that verify them.
pub struct Issuer {
    dir: PathBuf,
    keys: Mutex<Vec<Key>>,
    /// How long one key signs before a new one is made.
    rotate_every: Duration,
    /// How long a replaced key stays published.
    keep_after_rotation: Duration,
}

/// Attestation keys (issue 45): provenance is checked long after it was
/// signed (artifacts live for months, exported keys for longer), so a key
/// signs for 90 days and stays published for ten years after.
pub const ATTESTATION_ROTATE_EVERY: Duration = Duration::from_secs(90 * 24 * 3600);
pub const ATTESTATION_KEEP_AFTER_ROTATION: Duration = Duration::from_secs(3650 * 24 * 3600);

/// What a token says about the job it was issued to.
pub struct Claims<'a> {
    pub issuer: &'a str,
    pub audience: &'a str,
    pub repo: &'a str,
    /// The ref the run was started for (or its commit SHA).
    pub git_ref: &'a str,
    pub sha: &'a str,
    pub event: &'a str,
    pub run_id: &'a str,
    pub job: &'a str,
    pub trust: &'a str,
    /// The environment a deploy job deploys to (issue 46): then `sub` is
    /// `repo:R:environment:E` and the token carries `environment`, so a
    /// cloud role can trust "deploys of R to E" only.
    pub environment: Option<&'a str>,
    pub ttl: Duration,
}

impl Issuer {
    /// The keys in `dir` (created 0700 if missing); a first key is made now
    /// if there is none.
    pub fn open(dir: &Path) -> anyhow::Result<Issuer> {
        Self::open_with(dir, ROTATE_EVERY, KEEP_AFTER_ROTATION)
    }

    /// [`Issuer::open`] with another rotation period and publication time
    /// (the attestation keys': [`ATTESTATION_ROTATE_EVERY`]).
    pub fn open_with(dir: &Path, rotate_every: Duration, keep_after_rotation: Duration) -> anyhow::Result<Issuer> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let issuer = Issuer { dir: dir.to_path_buf(), keys: Mutex::new(Vec::new()), rotate_every, keep_after_rotation };
        issuer.refresh()?;
        Ok(issuer)
    }

    /// Re-read the key directory; make a new key if the newest is due for
    /// rotation; forget keys past their keep time.
    fn refresh(&self) -> anyhow::Result<()> {
        let now = now_ms();
        let mut keys = self.load()?;
        let due = keys.last().is_none_or(|k| now - k.created_ms >= self.rotate_every.as_millis() as i64);
        if due {
            let secret = loop {
                let candidate = rand::random::<[u8; 32]>();
                if SigningKey::from_slice(&candidate).is_ok() {
                    break candidate;
                }
            };
            let path = self.dir.join(format!("es256-{now:015}.key"));
            crate::sealing::write_key_file(&path, &hex::encode(secret))?;
            keys = self.load()?;
        }
        // The newest key signs; a key replaced (by the next one) less than
        // KEEP_AFTER_ROTATION ago stays published: tokens it signed may
        // still be presented.
        let retired: Vec<Option<i64>> = (0..keys.len()).map(|i| keys.get(i + 1).map(|next| next.created_ms)).collect();
        let kept: Vec<Key> = keys
            .into_iter()
            .zip(retired)
            .filter(|(_, retired)| retired.is_none_or(|at| now - at < self.keep_after_rotation.as_millis() as i64))
            .map(|(k, _)| k)
            .collect();
        *self.keys.lock().expect("keys") = kept;
        Ok(())
    }

    fn load(&self) -> anyhow::Result<Vec<Key>> {
        let mut keys = Vec::new();
        for e in std::fs::read_dir(&self.dir).with_context(|| format!("cannot read {}", self.dir.display()))? {
            let path = e?.path();
            let Some(created) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("es256-"))
                .and_then(|n| n.strip_suffix(".key"))
                .and_then(|n| n.parse::<i64>().ok())
            else {
                continue;
            };
            let text = std::fs::read_to_string(&path)?;
            let secret = hex::decode(text.trim()).with_context(|| format!("{} is not hex", path.display()))?;
            keys.push(Key::from_secret(created, &secret).with_context(|| format!("in {}", path.display()))?);
        }
        keys.sort_by_key(|k| k.created_ms);
        Ok(keys)
    }

    /// The JSON Web Key Set of every published key.
    pub fn jwks(&self) -> Value {
        if let Err(e) = self.refresh() {
            tracing::warn!("cannot refresh the OIDC keys: {e:#}");
        }
        let keys = self.keys.lock().expect("keys");
        json!({ "keys": keys.iter().map(Key::jwk).collect::<Vec<_>>() })
    }

    /// Make a new key first if the newest is due for rotation.
    fn rotate_if_due(&self) -> anyhow::Result<()> {
        let newest_ms = self.keys.lock().expect("keys").last().map(|k| k.created_ms);
        if newest_ms.is_none_or(|ms| now_ms() - ms >= self.rotate_every.as_millis() as i64) {
            self.refresh()?;
        }
        Ok(())
    }

    /// A DSSE envelope (JSON) of `payload` signed by the newest key over
    /// its PAE (issue 45), and that key's id.
    pub fn dsse(&self, payload_type: &str, payload: &[u8]) -> anyhow::Result<(String, String)> {
        self.rotate_if_due()?;
        let keys = self.keys.lock().expect("keys");
        let key = keys.last().context("no attestation signing key")?;
        let env = kiln_provenance::dsse::sign(payload_type, payload, &key.sk, &key.kid);
        Ok((serde_json::to_string(&env)?, key.kid.clone()))
    }

    /// Every published public key (its file re-read first, as [`Self::jwks`]
    /// does: another replica may have rotated), for checking statements.
    pub fn public_keys(&self) -> Vec<kiln_provenance::dsse::PublicKey> {
        if let Err(e) = self.refresh() {
            tracing::warn!("cannot refresh the keys: {e:#}");
        }
        let keys = self.keys.lock().expect("keys");
        keys.iter()
            .map(|k| kiln_provenance::dsse::PublicKey { keyid: k.kid.clone(), key: *k.sk.verifying_key() })
            .collect()
    }

    /// The public keys as PEM, newest last (`kiln keys export --pem`).
    pub fn pems(&self) -> Vec<(String, String)> {
        let keys = self.keys.lock().expect("keys");
        keys.iter().map(|k| (k.kid.clone(), kiln_provenance::dsse::pem(k.sk.verifying_key()))).collect()
    }

    /// A signed token for a job.
    pub fn mint(&self, c: &Claims) -> anyhow::Result<String> {
        self.rotate_if_due()?;
        let keys = self.keys.lock().expect("keys");
        let key = keys.last().context("no OIDC signing key")?;
        let iat = now_ms() / 1000;
        let header = json!({ "alg": "ES256", "typ": "JWT", "kid": key.kid });
        let sub = match c.environment {
            Some(env) => format!("repo:{}:environment:{env}", c.repo),
            None => format!("repo:{}:ref:{}", c.repo, c.git_ref),
        };
        let mut payload = json!({
            "iss": c.issuer,
            "sub": sub,
            "aud": c.audience,
            "iat": iat,
            "nbf": iat - 5,
            "exp": iat + c.ttl.clamp(MIN_TTL, MAX_TTL).as_secs() as i64,
            "jti": uuid::Uuid::new_v4().to_string(),
            "repository": c.repo,
            "ref": c.git_ref,
            "sha": c.sha,
            "event": c.event,
            "run_id": c.run_id,
            "job": c.job,
            "trust": c.trust,
        });
        if let Some(env) = c.environment {
            payload["environment"] = json!(env);
        }
        let signing_input = format!(
            "{}.{}",
            b64(&serde_json::to_vec(&header).expect("json")),
            b64(&serde_json::to_vec(&payload).expect("json"))
        );
        let sig: Signature = key.sk.sign(signing_input.as_bytes());
        Ok(format!("{signing_input}.{}", b64(&sig.to_bytes())))
    }
}

/// `/.well-known/openid-configuration` for `issuer`.
pub fn discovery(issuer: &str) -> Value {
    json!({
        "issuer": issuer,
        "jwks_uri": format!("{issuer}/.well-known/jwks.json"),
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["ES256"],
        "claims_supported": ["iss", "sub", "aud", "iat", "nbf", "exp", "jti", "repository", "ref", "sha", "event", "run_id", "job", "trust", "environment"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_persist_rotate_and_sign_verifiable_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let oidc = dir.path().join("oidc");
        let a = Issuer::open(&oidc).unwrap();
        let jwks = a.jwks();
        assert_eq!(jwks["keys"].as_array().unwrap().len(), 1);
        let b = Issuer::open(&oidc).unwrap();
        assert_eq!(b.jwks(), jwks, "replicas on one data dir publish the same key");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&oidc).unwrap().permissions().mode() & 0o777, 0o700);
        for f in std::fs::read_dir(&oidc).unwrap() {
            assert_eq!(f.unwrap().metadata().unwrap().permissions().mode() & 0o777, 0o600);
        }
        let claims = Claims {
            issuer: "https://ci.example",
            audience: "sts.amazonaws.com",
            repo: "app",
            git_ref: "main",
            sha: "abc",
            event: "push",
            run_id: "r1",
            job: "deploy",
            trust: "trusted",
            environment: None,
            ttl: Duration::from_secs(10),
        };
        let deploy = a.mint(&Claims { environment: Some("production"), ..claims }).unwrap();
        let body: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(deploy.split('.').nth(1).unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!(body["sub"], "repo:app:environment:production", "a deploy job's subject names its environment");
        assert_eq!(body["environment"], "production");
        let token = a.mint(&claims).unwrap();
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        let payload: Value =
            serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(parts[1]).unwrap())
                .unwrap();
        assert_eq!(payload["sub"], "repo:app:ref:main");
        let ttl = payload["exp"].as_i64().unwrap() - payload["iat"].as_i64().unwrap();
        assert_eq!(ttl, MIN_TTL.as_secs() as i64, "a short job timeout still gives the minimum");
        // Verify the signature with the published key (p256's verifier).
        use p256::ecdsa::signature::Verifier;
        let key = &jwks["keys"][0];
        let dec = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(v.as_str().unwrap()).unwrap();
        let mut sec1 = vec![4u8];
        sec1.extend(dec(&key["x"]));
        sec1.extend(dec(&key["y"]));
        let vk = p256::ecdsa::VerifyingKey::from_sec1_bytes(&sec1).unwrap();
        let sig =
            Signature::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(parts[2]).unwrap()).unwrap();
        vk.verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig).unwrap();

        // An old key: a new one is made and both are published.
        let old = std::fs::read_dir(&oidc).unwrap().next().unwrap().unwrap().path();
        let aged = now_ms() - ROTATE_EVERY.as_millis() as i64 - 1000;
        std::fs::rename(&old, oidc.join(format!("es256-{aged:015}.key"))).unwrap();
        let c = Issuer::open(&oidc).unwrap();
        assert_eq!(c.jwks()["keys"].as_array().unwrap().len(), 2, "rotated, the previous key still published");
    }
}
