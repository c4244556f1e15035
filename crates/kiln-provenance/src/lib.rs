//! Supply-chain attestations (issue 45): DSSE envelopes signed over PAE
//! with ECDSA P-256 ([`dsse`]), in-toto Statement v1 with the SLSA
//! Provenance v1 and Test Result predicates built from the server's frozen
//! facts ([`statement`]), and the checks `kiln verify` applies, each with
//! its own exit code ([`verify`]). Pure: the server holds the keys and
//! writes statements in its binding transaction; the CLI reads files.

pub mod deploy;
pub mod dsse;
pub mod statement;
pub mod verify;
