//! Integration tests of kiln-cache (one binary, several modules).

mod common;
mod export;
mod fuzz;
mod hostile;
mod inputs_key;
mod roundtrip;
mod workspace;
