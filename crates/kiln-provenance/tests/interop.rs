//! The envelopes verify with an independent implementation: PyPI's
//! securesystemslib (its DSSE `Envelope.verify` with the exported PEM
//! key), not only with Kiln's own code; and a tampered one does not.
//! `scripts/test` installs it (KILN_SSLIB_PYTHON); without it the test is
//! skipped unless KILN_REQUIRE_SSLIB=1.

use kiln_provenance::dsse;
use kiln_provenance::statement::{self, BuildFacts, Subject};
use p256::ecdsa::SigningKey;
use std::process::Command;

const VERIFY: &str = r#"
import json, sys
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey
from securesystemslib.exceptions import VerificationError
from cryptography.hazmat.primitives.serialization import load_pem_public_key
env_path, pem_path, keyid = sys.argv[1:4]
public = load_pem_public_key(open(pem_path, "rb").read())
key = SSlibKey.from_crypto(public, keyid=keyid, scheme="ecdsa-sha2-nistp256")
env = Envelope.from_dict(json.load(open(env_path)))
try:
    env.verify([key], 1)
except VerificationError as e:
    print("refused:", e)
    sys.exit(1)
st = json.loads(env.payload)
print("verified", st["subject"][0]["digest"]["sha256"], st["predicateType"])
"#;

fn python() -> Option<String> {
    let default = format!("{}/.cache/kiln-tools/sslib-venv/bin/python", std::env::var("HOME").unwrap_or_default());
    let py = std::env::var("KILN_SSLIB_PYTHON").unwrap_or(default);
    let ok = Command::new(&py).args(["-c", "import securesystemslib"]).output().is_ok_and(|o| o.status.success());
    match ok {
        true => Some(py),
        false if std::env::var("KILN_REQUIRE_SSLIB").as_deref() == Ok("1") => {
            panic!("securesystemslib is required (KILN_REQUIRE_SSLIB=1) but {py} cannot import it")
        }
        false => None,
    }
}

#[test]
fn securesystemslib_verifies_kiln_envelopes_and_refuses_a_tampered_one() {
    let Some(py) = python() else {
        eprintln!("skipped: securesystemslib is not installed");
        return;
    };
    let key = loop {
        if let Ok(k) = SigningKey::from_bytes(&rand::random::<[u8; 32]>().into()) {
            break k;
        }
    };
    let kid = dsse::thumbprint(key.verifying_key());
    let digest = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
    let facts = BuildFacts { repository: "shop".into(), trust: "trusted".into(), ..BuildFacts::default() };
    let st = statement::provenance(vec![Subject::sha256("app.jar", digest)], &facts);
    let env = dsse::sign(dsse::IN_TOTO, &statement::to_bytes(&st), &key, &kid);
    let dir = std::env::temp_dir().join(format!("kiln-dsse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (env_path, pem_path) = (dir.join("env.json"), dir.join("key.pem"));
    std::fs::write(&env_path, serde_json::to_vec(&env).unwrap()).unwrap();
    std::fs::write(&pem_path, dsse::pem(key.verifying_key())).unwrap();
    let run = |env: &std::path::Path| {
        let o = Command::new(&py).args(["-c", VERIFY]).arg(env).arg(&pem_path).arg(&kid).output().unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
    };
    let (ok, out) = run(&env_path);
    assert!(ok, "securesystemslib refused Kiln's envelope: {out}");
    assert!(out.contains(&format!("verified {digest} https://slsa.dev/provenance/v1")), "{out}");
    // The payload rewritten, the signature kept: refused there too.
    let mut tampered = env.clone();
    let st = statement::provenance(vec![Subject::sha256("app.jar", &"0".repeat(64))], &facts);
    use base64::Engine;
    tampered.payload = base64::engine::general_purpose::STANDARD.encode(statement::to_bytes(&st));
    let t_path = dir.join("tampered.json");
    std::fs::write(&t_path, serde_json::to_vec(&tampered).unwrap()).unwrap();
    let (ok, out) = run(&t_path);
    assert!(!ok && out.contains("refused"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
