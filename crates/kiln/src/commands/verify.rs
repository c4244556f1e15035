//! `kiln artifact provenance`, `kiln keys export` and `kiln verify` (issue
//! 45): fetch a bound artifact's signed provenance, export the server's
//! provenance keys, and check an artifact against its provenance — online
//! (the server's keys) or offline (`--keys`) — with an exit code per failed
//! check (kiln-provenance's `verify::Failure`).

use super::shared::client;
use crate::cli::{Conn, KeysCommand, VerifyArgs};
use kiln_api::exit;
use kiln_cmd::{CmdResult, Failure, usage};
use kiln_provenance::verify::{Policy, verify as check};
use std::path::Path;

fn write_or_print(output: Option<&Path>, text: &str) -> Result<(), Failure> {
    match output {
        Some(p) => std::fs::write(p, text).map_err(|e| usage(format!("cannot write {}: {e}", p.display()))),
        None => {
            kiln_cmd::outln!("{text}");
            Ok(())
        }
    }
}

/// `kiln artifact provenance RUN JOB NAME [-o FILE]`.
pub(super) async fn provenance(conn: &Conn, run: &str, job: &str, name: &str, output: Option<&Path>) -> CmdResult {
    let env = client(conn)?.artifact_provenance(run, job, name).await?;
    write_or_print(output, &serde_json::to_string_pretty(&env).expect("json"))?;
    if let Some(p) = output {
        eprintln!("provenance of {job}/{name} written to {}", p.display());
    }
    Ok(exit::OK)
}

/// `kiln keys export [-o FILE] [--pem]`.
pub(super) async fn keys(cmd: KeysCommand) -> CmdResult {
    let KeysCommand::Export { output, pem, conn } = cmd;
    let jwks = client(&conn)?.attestation_keys().await?;
    let text = if pem {
        let bytes = serde_json::to_vec(&jwks).expect("json");
        let keys = kiln_provenance::dsse::keys_from_jwks(&bytes)
            .map_err(|e| Failure { code: exit::UNAVAILABLE, message: format!("the server's key set: {e}") })?;
        keys.iter()
            .map(|k| format!("# keyid {}\n{}", k.keyid, kiln_provenance::dsse::pem(&k.key)))
            .collect::<Vec<_>>()
            .join("")
    } else {
        serde_json::to_string_pretty(&jwks).expect("json")
    };
    write_or_print(output.as_deref(), &text)?;
    Ok(exit::OK)
}

/// `kiln verify FILE --repo R …`.
pub(super) async fn verify(a: VerifyArgs) -> CmdResult {
    if let Some(path) = &a.test_result {
        return verify_tests(&a, path).await;
    }
    let envelope_path = a.provenance.clone().unwrap_or_else(|| {
        let mut p = a.file.clone().into_os_string();
        p.push(".intoto.json");
        p.into()
    });
    let envelope = std::fs::read(&envelope_path).map_err(|e| {
        usage(format!(
            "cannot read the provenance {}: {e} (get it with `kiln artifact provenance RUN JOB NAME -o {}`)",
            envelope_path.display(),
            envelope_path.display()
        ))
    })?;
    let (digest, keys) = digest_and_keys(&a).await?;
    let name = match &a.name {
        Some(n) => n.clone(),
        None => only_subject(&envelope).ok_or_else(|| {
            usage("the provenance names several subjects (or none readable): say which with --name NAME")
        })?,
    };
    let policy = Policy {
        repository: a.repo.clone(),
        git_ref: a.git_ref.clone(),
        workflow: a.workflow.clone(),
        builders: a.builders.clone(),
        allow_untrusted: a.allow_untrusted && !a.trusted_only,
    };
    match check(&envelope, &name, &digest, &keys, &policy) {
        Ok(v) => {
            kiln_cmd::outln!(
                "verified: {} ({}) built from {} at {} by {} on a {} executor (run {})",
                a.file.display(),
                digest,
                a.repo,
                v.commit,
                v.builder,
                v.executor,
                v.run
            );
            Ok(exit::OK)
        }
        Err(r) => Err(Failure { code: r.failure.exit_code(), message: format!("not verified: {r}") }),
    }
}

/// `kiln verify FILE --test-result ENVELOPE --repo R`.
async fn verify_tests(a: &VerifyArgs, path: &Path) -> CmdResult {
    let envelope = std::fs::read(path).map_err(|e| {
        usage(format!(
            "cannot read the test attestation {}: {e} (get it with `kiln tests attestation RUN JOB -o {}`)",
            path.display(),
            path.display()
        ))
    })?;
    let (digest, keys) = digest_and_keys(a).await?;
    match kiln_provenance::verify::verify_test_result(&envelope, &digest, &keys, &a.repo) {
        Ok(v) => {
            kiln_cmd::outln!(
                "verified: {} ({digest}, `{}`) passed the tests of {}: {} passed{}",
                a.file.display(),
                v.subject,
                a.repo,
                v.passed,
                if v.warned > 0 { format!(", {} quarantined failures (warned)", v.warned) } else { String::new() }
            );
            Ok(exit::OK)
        }
        Err(r) => Err(Failure { code: r.failure.exit_code(), message: format!("not verified: {r}") }),
    }
}

/// The name of the statement's subject when it has exactly one (read
/// before verification only to choose what to check; the verification
/// then checks it under the signature).
fn only_subject(envelope: &[u8]) -> Option<String> {
    use base64::Engine;
    let env: kiln_provenance::dsse::Envelope = serde_json::from_slice(envelope).ok()?;
    let payload = base64::engine::general_purpose::STANDARD.decode(&env.payload).ok()?;
    let st: kiln_provenance::statement::Statement = serde_json::from_slice(&payload).ok()?;
    // A directory artifact's manifest is a second subject, not a choice.
    let suffix = format!("/{}", kiln_provenance::statement::MANIFEST_SUBJECT);
    let named: Vec<&str> = st.subject.iter().map(|s| s.name.as_str()).filter(|n| !n.ends_with(&suffix)).collect();
    match named.as_slice() {
        [one] => Some(one.to_string()),
        _ => None,
    }
}

/// The file's sha256 and the key set (`--keys`, else the server's).
async fn digest_and_keys(a: &VerifyArgs) -> Result<(String, Vec<kiln_provenance::dsse::PublicKey>), Failure> {
    let digest = sha256_file(&a.file).map_err(|e| usage(format!("cannot read {}: {e}", a.file.display())))?;
    let jwks: Vec<u8> = match &a.keys {
        Some(p) => std::fs::read(p).map_err(|e| usage(format!("cannot read the keys {}: {e}", p.display())))?,
        None => serde_json::to_vec(&client(&a.conn)?.attestation_keys().await?).expect("json"),
    };
    let keys = kiln_provenance::dsse::keys_from_jwks(&jwks).map_err(|e| usage(format!("the key set: {e}")))?;
    Ok((digest, keys))
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}
