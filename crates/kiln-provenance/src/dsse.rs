//! DSSE (Dead Simple Signing Envelope, v1): the signature is over the
//! pre-authentication encoding (PAE) of the payload type and the payload
//! bytes exactly as they travel — never over a re-serialisation — so a
//! verifier checks the bytes it was given before it parses them.
//!
//! Signatures are ECDSA P-256 over SHA-256, DER-encoded (what
//! `securesystemslib` and sigstore's tools produce and accept), base64 in
//! the envelope. Keys are named by their `keyid`: the JWK thumbprint the
//! server's JWKS publishes (RFC 7638), so one key set serves identity tokens
//! and attestations.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use p256::ecdsa::signature::{Signer, Verifier};
use p256::ecdsa::{DerSignature, Signature, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

/// The payload type of an in-toto statement.
pub const IN_TOTO: &str = "application/vnd.in-toto+json";

/// Most bytes of an envelope a verifier reads (a statement is a few KiB).
pub const MAX_ENVELOPE: usize = 4 * 1024 * 1024;

/// `PAE(type, body)` = `"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!("DSSEv1 {} {} {} ", payload_type.len(), payload_type, payload.len()).into_bytes();
    out.extend_from_slice(payload);
    out
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    /// The payload, base64 (standard alphabet, padded).
    pub payload: String,
    pub signatures: Vec<Sig>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sig {
    #[serde(default)]
    pub keyid: String,
    /// The DER signature, base64.
    pub sig: String,
}

/// A verification key and its id.
#[derive(Debug, Clone)]
pub struct PublicKey {
    pub keyid: String,
    pub key: VerifyingKey,
}

/// Why an envelope did not verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DsseError {
    /// Not an envelope (bad JSON, base64, payload type, no signature).
    Malformed(String),
    /// Signed only by keys the verifier does not hold.
    UnknownKey(Vec<String>),
    /// A known key, and the signature does not match the envelope's
    /// bytes (the payload or its type changed since it was signed).
    BadSignature(String),
}

impl std::fmt::Display for DsseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DsseError::Malformed(m) => write!(f, "not a DSSE envelope: {m}"),
            DsseError::UnknownKey(ids) if ids.is_empty() => write!(f, "the envelope carries no signature"),
            DsseError::UnknownKey(ids) => {
                write!(f, "signed by key {} that is not in the key set", ids.join(", "))
            }
            DsseError::BadSignature(id) => write!(
                f,
                "the signature by key {id} does not match the envelope: its payload or payload type changed after signing"
            ),
        }
    }
}

/// Sign `payload` as `payload_type` with `key` (named `keyid`).
pub fn sign(payload_type: &str, payload: &[u8], key: &SigningKey, keyid: &str) -> Envelope {
    let sig: Signature = key.sign(&pae(payload_type, payload));
    let der: DerSignature = sig.to_der();
    Envelope {
        payload_type: payload_type.to_string(),
        payload: STANDARD.encode(payload),
        signatures: vec![Sig { keyid: keyid.to_string(), sig: STANDARD.encode(der.as_bytes()) }],
    }
}

/// Parse an envelope's JSON (at most [`MAX_ENVELOPE`] bytes).
pub fn parse(bytes: &[u8]) -> Result<Envelope, DsseError> {
    if bytes.len() > MAX_ENVELOPE {
        return Err(DsseError::Malformed(format!("{} bytes, more than {MAX_ENVELOPE}", bytes.len())));
    }
    serde_json::from_slice(bytes).map_err(|e| DsseError::Malformed(e.to_string()))
}

/// The payload of `env` if a signature by one of `keys` verifies over its
/// PAE and its type is `payload_type`.
pub fn verify(env: &Envelope, payload_type: &str, keys: &[PublicKey]) -> Result<Vec<u8>, DsseError> {
    if env.payload_type != payload_type {
        return Err(DsseError::Malformed(format!("payload type `{}`, expected `{payload_type}`", env.payload_type)));
    }
    let payload = STANDARD.decode(&env.payload).map_err(|e| DsseError::Malformed(format!("payload: {e}")))?;
    let signed = pae(&env.payload_type, &payload);
    let mut unknown = Vec::new();
    let mut bad = None;
    for s in &env.signatures {
        // A signature without a key id is tried against every key.
        let candidates: Vec<&PublicKey> = keys.iter().filter(|k| s.keyid.is_empty() || k.keyid == s.keyid).collect();
        if candidates.is_empty() {
            unknown.push(s.keyid.clone());
            continue;
        }
        let Ok(raw) = STANDARD.decode(&s.sig) else {
            bad = Some(s.keyid.clone());
            continue;
        };
        let sig = DerSignature::try_from(raw.as_slice())
            .ok()
            .and_then(|d| Signature::from_der(d.as_bytes()).ok())
            .or_else(|| Signature::from_slice(&raw).ok());
        let Some(sig) = sig else {
            bad = Some(s.keyid.clone());
            continue;
        };
        if candidates.iter().any(|k| k.key.verify(&signed, &sig).is_ok()) {
            return Ok(payload);
        }
        bad = Some(s.keyid.clone());
    }
    match bad {
        Some(id) => Err(DsseError::BadSignature(id)),
        None => Err(DsseError::UnknownKey(unknown)),
    }
}

/// The RFC 7638 thumbprint of a P-256 public key (base64url of the SHA-256
/// of its canonical JWK): the key id.
pub fn thumbprint(key: &VerifyingKey) -> String {
    use sha2::{Digest, Sha256};
    let (x, y) = coordinates(key);
    let canonical = format!(r#"{{"crv":"P-256","kty":"EC","x":"{x}","y":"{y}"}}"#);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
}

fn coordinates(key: &VerifyingKey) -> (String, String) {
    let point = key.to_encoded_point(false);
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    // An uncompressed point always has both coordinates.
    (b64(point.x().map(|x| &x[..]).unwrap_or_default()), b64(point.y().map(|y| &y[..]).unwrap_or_default()))
}

/// A key as PEM (SubjectPublicKeyInfo): what other tools read
/// (`openssl`, `cosign verify-blob --key`, `securesystemslib`).
pub fn pem(key: &VerifyingKey) -> String {
    use p256::pkcs8::{EncodePublicKey, LineEnding};
    key.to_public_key_pem(LineEnding::LF).expect("a P-256 key encodes")
}

/// A key as a JWK (`kty` EC, `crv` P-256, `kid`, `alg` ES256).
pub fn jwk(key: &VerifyingKey, kid: &str) -> serde_json::Value {
    let (x, y) = coordinates(key);
    serde_json::json!({ "kty": "EC", "crv": "P-256", "x": x, "y": y, "kid": kid, "use": "sig", "alg": "ES256" })
}

/// The P-256 keys of a JWKS document (`{"keys": [...]}`); other keys are
/// skipped, a malformed P-256 key is an error.
pub fn keys_from_jwks(jwks: &[u8]) -> Result<Vec<PublicKey>, String> {
    let doc: serde_json::Value = serde_json::from_slice(jwks).map_err(|e| format!("not a JWKS document: {e}"))?;
    let keys = doc.get("keys").and_then(|k| k.as_array()).ok_or("not a JWKS document: no `keys` list")?;
    let mut out = Vec::new();
    for k in keys {
        if k.get("kty").and_then(|v| v.as_str()) != Some("EC") || k.get("crv").and_then(|v| v.as_str()) != Some("P-256")
        {
            continue;
        }
        let field = |name: &str| -> Result<Vec<u8>, String> {
            let s = k.get(name).and_then(|v| v.as_str()).ok_or_else(|| format!("a P-256 key without `{name}`"))?;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s).map_err(|e| format!("key `{name}`: {e}"))
        };
        let (x, y) = (field("x")?, field("y")?);
        if x.len() != 32 || y.len() != 32 {
            return Err("a P-256 key whose coordinates are not 32 bytes".into());
        }
        let mut sec1 = Vec::with_capacity(65);
        sec1.push(0x04);
        sec1.extend_from_slice(&x);
        sec1.extend_from_slice(&y);
        let point = p256::EncodedPoint::from_bytes(&sec1).map_err(|_| "a P-256 key that is not a point".to_string())?;
        let key = VerifyingKey::from_encoded_point(&point).map_err(|_| "a P-256 key not on the curve".to_string())?;
        let keyid = k.get("kid").and_then(|v| v.as_str()).map_or_else(|| thumbprint(&key), str::to_string);
        out.push(PublicKey { keyid, key });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SigningKey {
        loop {
            if let Ok(k) = SigningKey::from_bytes(&rand::random::<[u8; 32]>().into()) {
                return k;
            }
        }
    }

    #[test]
    fn pae_is_the_spec_encoding() {
        // The DSSE protocol document's example.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
        );
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ");
    }

    #[test]
    fn an_envelope_verifies_with_its_key_only_and_over_its_exact_bytes() {
        let k = key();
        let id = thumbprint(k.verifying_key());
        let pub_k = PublicKey { keyid: id.clone(), key: *k.verifying_key() };
        let env = sign(IN_TOTO, br#"{"a": 1}"#, &k, &id);
        assert_eq!(verify(&env, IN_TOTO, std::slice::from_ref(&pub_k)).unwrap(), br#"{"a": 1}"#);
        // Through JSON and a JWKS.
        let env2 = parse(serde_json::to_vec(&env).unwrap().as_slice()).unwrap();
        let jwks = serde_json::json!({ "keys": [jwk(k.verifying_key(), &id)] });
        let keys = keys_from_jwks(serde_json::to_vec(&jwks).unwrap().as_slice()).unwrap();
        assert!(verify(&env2, IN_TOTO, &keys).is_ok());
        // The same JSON re-serialised with other spacing is another payload.
        let mut tampered = env.clone();
        tampered.payload = STANDARD.encode(br#"{"a":1}"#);
        assert!(matches!(verify(&tampered, IN_TOTO, std::slice::from_ref(&pub_k)), Err(DsseError::BadSignature(_))));
        let mut retyped = env.clone();
        retyped.payload_type = "text/plain".into();
        assert!(matches!(
            verify(&retyped, "text/plain", std::slice::from_ref(&pub_k)),
            Err(DsseError::BadSignature(_))
        ));
        assert!(matches!(verify(&env, "text/plain", std::slice::from_ref(&pub_k)), Err(DsseError::Malformed(_))));
        let other = key();
        let other = PublicKey { keyid: thumbprint(other.verifying_key()), key: *other.verifying_key() };
        assert!(matches!(verify(&env, IN_TOTO, std::slice::from_ref(&other)), Err(DsseError::UnknownKey(_))));
        // Another key under the same id: the signature does not verify.
        let impostor = PublicKey { keyid: id, key: other.key };
        assert!(matches!(verify(&env, IN_TOTO, &[impostor]), Err(DsseError::BadSignature(_))));
        assert!(matches!(parse(b"{"), Err(DsseError::Malformed(_))));
    }
}
