//! Short-lived, narrowly scoped capabilities for the data plane: a signed
//! (HMAC-SHA256) statement "operation OP on generation G until T". Agents and
//! people move bytes with these URLs only; they carry no other authority, and
//! an upload capability is additionally checked against the live epoch.

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

#[derive(Clone)]
pub struct Signer {
    key: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Put,
    Get,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Get => "get",
        }
    }
}

impl Signer {
    pub fn new(key: Vec<u8>) -> Self {
        Signer { key }
    }

    fn mac(&self, payload: &str) -> Hmac<Sha256> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        m.update(payload.as_bytes());
        m
    }

    pub fn sign(&self, op: Op, generation: &str, expires_at_ms: i64) -> String {
        let payload = format!("{}:{generation}:{expires_at_ms}", op.as_str());
        let tag = self.mac(&payload).finalize().into_bytes();
        format!("{}.{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(payload), hex::encode(tag))
    }

    /// Accepts the capability only for exactly this operation and generation
    /// before its expiry.
    pub fn verify(&self, cap: &str, op: Op, generation: &str, now_ms: i64) -> bool {
        let Some((p, tag)) = cap.split_once('.') else { return false };
        let Ok(payload) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(p) else { return false };
        let Ok(payload) = String::from_utf8(payload) else { return false };
        let Ok(tag) = hex::decode(tag) else { return false };
        if self.mac(&payload).verify_slice(&tag).is_err() {
            return false;
        }
        let mut parts = payload.splitn(3, ':');
        let (Some(o), Some(g), Some(exp)) = (parts.next(), parts.next(), parts.next()) else { return false };
        let Ok(exp) = exp.parse::<i64>() else { return false };
        o == op.as_str() && g == generation && now_ms < exp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_to_op_generation_and_time() {
        let s = Signer::new(b"secret".to_vec());
        let cap = s.sign(Op::Put, "g1", 1000);
        assert!(s.verify(&cap, Op::Put, "g1", 999));
        assert!(!s.verify(&cap, Op::Put, "g1", 1000), "expired");
        assert!(!s.verify(&cap, Op::Get, "g1", 0), "wrong operation");
        assert!(!s.verify(&cap, Op::Put, "g2", 0), "wrong generation");
        assert!(!Signer::new(b"other".to_vec()).verify(&cap, Op::Put, "g1", 0), "wrong key");
        let (p, t) = cap.split_once('.').unwrap();
        let forged = format!("{}.{t}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("put:g1:99999999"));
        assert!(!s.verify(&forged, Op::Put, "g1", 0), "tampered payload");
        assert!(!s.verify(p, Op::Put, "g1", 0));
        assert!(!s.verify("", Op::Put, "g1", 0));
    }
}
