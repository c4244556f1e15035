//! Webhook authenticity (signatures and tokens) and delivery metadata.

use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::{Forge, ParseError};

type HmacSha256 = Hmac<Sha256>;

const GITHUB_SIGNATURE: &str = "x-hub-signature-256";
const GITLAB_TOKEN: &str = "x-gitlab-token";
const GITEA_SIGNATURE: &str = "x-gitea-signature";
const FORGEJO_SIGNATURE: &str = "x-forgejo-signature";

/// Why a delivery was not accepted as coming from the forge. The messages
/// name headers, never the secret or the value received.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("no webhook secret is configured; deliveries are refused")]
    EmptySecret,
    #[error("header {0} is missing")]
    MissingHeader(&'static str),
    #[error("header {0} is malformed")]
    MalformedHeader(&'static str),
    #[error("header {0} does not match")]
    Mismatch(&'static str),
}

/// Verify that a delivery comes from the forge:
///
/// * GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`;
/// * GitLab: `X-Gitlab-Token` equal to the secret;
/// * Gitea/Forgejo: `X-Gitea-Signature` and/or `X-Forgejo-Signature`, the hex
///   HMAC-SHA256 of the body without a prefix. Forgejo sends both; every one
///   present must match, and at least one must be.
///
/// All comparisons are constant time. An empty secret never verifies. A header
/// given more than once is malformed.
pub fn verify(forge: Forge, headers: &HeaderMap, body: &[u8], secret: &[u8]) -> Result<(), VerifyError> {
    if secret.is_empty() {
        return Err(VerifyError::EmptySecret);
    }
    match forge {
        Forge::Github => {
            let value =
                single_header(headers, GITHUB_SIGNATURE)?.ok_or(VerifyError::MissingHeader(GITHUB_SIGNATURE))?;
            let hex_mac = value.strip_prefix("sha256=").ok_or(VerifyError::MalformedHeader(GITHUB_SIGNATURE))?;
            check_hex_mac(GITHUB_SIGNATURE, hex_mac, body, secret)
        }
        Forge::Gitlab => {
            let value = single_header(headers, GITLAB_TOKEN)?.ok_or(VerifyError::MissingHeader(GITLAB_TOKEN))?;
            // Hash both sides so the comparison is over equal lengths and
            // leaks neither the secret's length nor a matching prefix.
            let got = Sha256::digest(value.as_bytes());
            let want = Sha256::digest(secret);
            if ct_eq(&got, &want) { Ok(()) } else { Err(VerifyError::Mismatch(GITLAB_TOKEN)) }
        }
        Forge::Gitea => {
            let mut checked = false;
            for name in [FORGEJO_SIGNATURE, GITEA_SIGNATURE] {
                if let Some(value) = single_header(headers, name)? {
                    check_hex_mac(name, value, body, secret)?;
                    checked = true;
                }
            }
            if checked { Ok(()) } else { Err(VerifyError::MissingHeader(GITEA_SIGNATURE)) }
        }
    }
}

/// The header `(name, value)` the forge would send with this body for this
/// secret. Names are lowercase (as `http::HeaderName` stores them), so
/// `HeaderName::from_static(name)` works. For Gitea the `X-Gitea-Signature`
/// header is returned (Forgejo also sends `X-Forgejo-Signature`, the same
/// value).
pub fn sign(forge: Forge, secret: &[u8], body: &[u8]) -> (&'static str, String) {
    match forge {
        Forge::Github => (GITHUB_SIGNATURE, format!("sha256={}", hmac_hex(secret, body))),
        Forge::Gitlab => (GITLAB_TOKEN, String::from_utf8_lossy(secret).into_owned()),
        Forge::Gitea => (GITEA_SIGNATURE, hmac_hex(secret, body)),
    }
}

fn hmac_hex(secret: &[u8], body: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

fn check_hex_mac(name: &'static str, hex_mac: &str, body: &[u8], secret: &[u8]) -> Result<(), VerifyError> {
    if hex_mac.len() != 64 {
        return Err(VerifyError::MalformedHeader(name));
    }
    let tag = hex::decode(hex_mac).map_err(|_| VerifyError::MalformedHeader(name))?;
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(body);
    mac.verify_slice(&tag).map_err(|_| VerifyError::Mismatch(name))
}

/// The header's value when present exactly once and visible ASCII.
fn single_header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<Option<&'a str>, VerifyError> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(VerifyError::MalformedHeader(name));
    }
    let s = first.to_str().map_err(|_| VerifyError::MalformedHeader(name))?.trim();
    Ok(Some(s))
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// What the headers say about a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryMeta {
    /// The forge's delivery id, or `sha256:<hex of the body>` when it sent
    /// none. Redeliveries of the same delivery carry the same id.
    pub id: String,
    /// The event name as the forge spells it (`push`, `Push Hook`, ...).
    pub event: String,
}

const MAX_META_LEN: usize = 200;

/// The delivery id and the event name:
///
/// * GitHub: `X-GitHub-Delivery`, `X-GitHub-Event`;
/// * GitLab: `X-Gitlab-Event-UUID`, `X-Gitlab-Event`;
/// * Gitea/Forgejo: `X-Forgejo-Delivery` or `X-Gitea-Delivery`,
///   `X-Forgejo-Event` or `X-Gitea-Event`.
///
/// Without an id header the id is `sha256:` + the hex SHA-256 of the body.
/// A missing event header, or an id or event that is not 1 to 200 printable
/// ASCII characters, is an error.
pub fn delivery_meta(forge: Forge, headers: &HeaderMap, body: &[u8]) -> Result<DeliveryMeta, ParseError> {
    let (id_headers, event_headers): (&[&'static str], &[&'static str]) = match forge {
        Forge::Github => (&["x-github-delivery"], &["x-github-event"]),
        // Not X-Gitlab-Webhook-UUID: that names the hook, not the delivery.
        Forge::Gitlab => (&["x-gitlab-event-uuid"], &["x-gitlab-event"]),
        Forge::Gitea => (&["x-forgejo-delivery", "x-gitea-delivery"], &["x-forgejo-event", "x-gitea-event"]),
    };
    let event = first_meta(headers, event_headers)?
        .ok_or_else(|| ParseError::new(format!("header {} is missing", event_headers.join(" or "))))?;
    let id = match first_meta(headers, id_headers)? {
        Some(id) => id,
        None => format!("sha256:{}", hex::encode(Sha256::digest(body))),
    };
    Ok(DeliveryMeta { id, event })
}

fn first_meta(headers: &HeaderMap, names: &[&'static str]) -> Result<Option<String>, ParseError> {
    for &name in names {
        let Some(value) = headers.get(name) else {
            continue;
        };
        let bytes = value.as_bytes();
        // Printable ASCII; GitLab's event names contain spaces ("Push Hook").
        let printable = bytes.iter().all(|b| (0x20..=0x7e).contains(b));
        let s = std::str::from_utf8(bytes).unwrap_or("").trim();
        if !printable || s.is_empty() || s.len() > MAX_META_LEN {
            return Err(ParseError::new(format!(
                "header {name} must be 1 to {MAX_META_LEN} printable ASCII characters"
            )));
        }
        return Ok(Some(s.to_owned()));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ct_eq_compares() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }

    #[test]
    fn github_doc_example_signature() {
        // The example from GitHub's "Validating webhook deliveries".
        let (name, value) = sign(Forge::Github, b"It's a Secret to Everybody", b"Hello, World!");
        assert_eq!(name, "x-hub-signature-256");
        assert_eq!(value, "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17");
    }
}
