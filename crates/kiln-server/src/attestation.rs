//! The server's provenance signer (issue 45): the store builds each bound
//! artifact's in-toto statement from the facts of its binding transaction
//! and asks this to sign it with the newest attestation key
//! (`DATA_DIR/attestation`, ECDSA P-256, out of every step's reach: steps
//! run on agents, which hold no key). The public keys are served at
//! `/.well-known/kiln-attestation-keys.json` and exported by `kiln keys
//! export`.

use crate::oidc::Issuer;
use std::sync::Arc;

pub(crate) struct Attester {
    issuer: Arc<Issuer>,
    base_url: String,
}

impl Attester {
    pub(crate) fn new(issuer: Arc<Issuer>, base_url: String) -> Attester {
        Attester { issuer, base_url: base_url.trim_end_matches('/').to_string() }
    }
}

impl kiln_store::Attester for Attester {
    fn sign(&self, statement: &[u8]) -> Result<(String, String), String> {
        self.issuer.dsse(kiln_provenance::dsse::IN_TOTO, statement).map_err(|e| format!("{e:#}"))
    }

    fn builder_id(&self, pool: &str) -> String {
        format!("{}/builders/{pool}", self.base_url)
    }

    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }

    fn verifying_keys(&self) -> Vec<kiln_provenance::dsse::PublicKey> {
        self.issuer.public_keys()
    }
}
