use super::{DeployPolicy, check_artifact};
use crate::dsse::{self, IN_TOTO, PublicKey};
use crate::statement::{self, BuildFacts, Subject};
use p256::ecdsa::SigningKey;

fn key() -> SigningKey {
    loop {
        if let Ok(k) = SigningKey::from_bytes(&rand::random::<[u8; 32]>().into()) {
            return k;
        }
    }
}

const SHA: &str = "aa11";

fn facts() -> BuildFacts {
    BuildFacts {
        repository: "shop".into(),
        git_ref: Some("refs/heads/main".into()),
        commit: "c0ffee".into(),
        workflow_path: ".kiln/ci.yaml".into(),
        workflow_sha256: "ff".into(),
        event: "push".into(),
        trust: "trusted".into(),
        executor: "host".into(),
        pool: "default".into(),
        builder_id: "https://ci.example/builders/default".into(),
        ..Default::default()
    }
}

/// A signed statement about `app` (sha256 [`SHA`]) built as `facts` say.
fn envelope(k: &SigningKey, facts: &BuildFacts) -> Vec<u8> {
    let st = statement::provenance(vec![Subject::sha256("app", SHA)], facts);
    serde_json::to_vec(&dsse::sign(IN_TOTO, &statement::to_bytes(&st), k, "k1")).unwrap()
}

fn keys(k: &SigningKey) -> Vec<PublicKey> {
    vec![PublicKey { keyid: "k1".into(), key: *k.verifying_key() }]
}

fn policy(text: &str) -> DeployPolicy {
    DeployPolicy::parse(text).unwrap().unwrap()
}

#[test]
fn policies_parse_to_a_canonical_form() {
    for (text, canonical) in [
        ("trusted", "trusted"),
        (" ref=refs/heads/main , trusted ", "trusted,ref=refs/heads/main"),
        ("repository=shop,workflow=.kiln/ci.yaml", "repo=shop,workflow=.kiln/ci.yaml"),
        ("builder=a,builder=b,builder=a", "builder=a,builder=b"),
        (
            "builder=b,workflow=w,ref=refs/tags/v1,repo=r,trusted",
            "trusted,repo=r,ref=refs/tags/v1,workflow=w,builder=b",
        ),
    ] {
        let p = policy(text);
        assert_eq!(p.to_string(), canonical, "{text}");
        assert_eq!(policy(canonical), p, "the canonical form parses back: {canonical}");
    }
    assert_eq!(DeployPolicy::parse("none").unwrap(), None);
    assert_eq!(DeployPolicy::parse("  ").unwrap(), None);
}

#[test]
fn bad_policies_say_what_is_wrong() {
    for (text, says) in [
        ("trusted,,ref=refs/heads/main", "empty item"),
        ("trusted,", "empty item"),
        ("signed", "unknown provenance check `signed`"),
        ("ref=main", "ref=refs/heads/main"),
        ("ref=", "needs a value"),
        ("repo", "needs a value"),
        ("trusted=yes", "takes no value"),
        ("ref=refs/heads/a,ref=refs/heads/b", "`ref` is given twice"),
        ("repo=a,repository=b", "`repo` is given twice"),
        ("workflow=a b", "no spaces"),
    ] {
        let e = DeployPolicy::parse(text).unwrap_err();
        assert!(e.contains(says), "{text}: {e}");
    }
}

#[test]
fn each_check_passes_and_fails() {
    let k = key();
    let good = envelope(&k, &facts());
    let untrusted = envelope(&k, &BuildFacts { trust: "untrusted".into(), ..facts() });
    let feature = envelope(&k, &BuildFacts { git_ref: Some("refs/heads/feature".into()), ..facts() });
    let other_repo = envelope(&k, &BuildFacts { repository: "other".into(), ..facts() });
    let other_wf = envelope(&k, &BuildFacts { workflow_path: ".kiln/x.yaml".into(), ..facts() });
    let other_builder = envelope(&k, &BuildFacts { builder_id: "https://evil/builders/x".into(), ..facts() });
    let all =
        "trusted,repo=shop,ref=refs/heads/main,workflow=.kiln/ci.yaml,builder=https://ci.example/builders/default";
    // (policy, envelope, the failed check or None)
    let cases: Vec<(&str, &[u8], Option<&str>)> = vec![
        (all, &good, None),
        ("trusted", &good, None),
        ("trusted", &untrusted, Some("trusted")),
        ("ref=refs/heads/main", &untrusted, None),
        ("ref=refs/heads/main", &feature, Some("ref")),
        ("trusted", &feature, None),
        ("repo=shop", &other_repo, Some("repo")),
        ("ref=refs/heads/main", &other_repo, None),
        ("workflow=.kiln/ci.yaml", &other_wf, Some("workflow")),
        ("builder=https://ci.example/builders/default", &other_builder, Some("builder")),
        ("builder=https://ci.example/builders/default,builder=https://evil/builders/x", &other_builder, None),
        (all, &feature, Some("ref")),
    ];
    for (text, env, want) in cases {
        let got = check_artifact(&policy(text), "app", "gen1", SHA, Some(env), &keys(&k));
        match (want, got) {
            (None, Ok(())) => {}
            (Some(check), Err(r)) => {
                assert_eq!(r.check, check, "{text}: {r}");
                let msg = r.to_string();
                assert!(
                    msg.starts_with(&format!(
                        "provenance check `{check}` failed for artifact `app` (generation gen1): "
                    )),
                    "{msg}"
                );
            }
            (want, got) => panic!("{text}: expected {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn the_message_says_what_was_found_and_what_is_required() {
    let k = key();
    let feature = envelope(&k, &BuildFacts { git_ref: Some("refs/heads/feature".into()), ..facts() });
    let r = check_artifact(&policy("ref=refs/heads/main"), "app", "g", SHA, Some(&feature), &keys(&k)).unwrap_err();
    assert!(r.detail.contains("refs/heads/feature") && r.detail.contains("refs/heads/main"), "{r}");
    let untrusted = envelope(&k, &BuildFacts { trust: "untrusted".into(), ..facts() });
    let r = check_artifact(&policy("trusted"), "app", "g", SHA, Some(&untrusted), &keys(&k)).unwrap_err();
    assert!(r.detail.contains("trust `untrusted`"), "{r}");
}

#[test]
fn whatever_the_policy_the_statement_must_hold() {
    let k = key();
    let good = envelope(&k, &facts());
    let p = policy("ref=refs/heads/main");
    // No statement at all.
    assert_eq!(check_artifact(&p, "app", "g", SHA, None, &keys(&k)).unwrap_err().check, "provenance");
    // Signed by a key the server does not hold; a key of that id that does not match.
    let other = vec![PublicKey { keyid: "k2".into(), key: *key().verifying_key() }];
    assert_eq!(check_artifact(&p, "app", "g", SHA, Some(&good), &other).unwrap_err().check, "key");
    assert_eq!(check_artifact(&p, "app", "g", SHA, Some(&good), &keys(&key())).unwrap_err().check, "signature");
    // Other bytes than the attested ones.
    assert_eq!(check_artifact(&p, "app", "g", "bb22", Some(&good), &keys(&k)).unwrap_err().check, "digest");
    // A statement about another artifact.
    assert_eq!(check_artifact(&p, "web", "g", SHA, Some(&good), &keys(&k)).unwrap_err().check, "subject");
    // A policy without `repo=` still checks the signature.
    let p = policy("trusted");
    assert_eq!(check_artifact(&p, "app", "g", SHA, Some(&good), &other).unwrap_err().check, "key");
    assert_eq!(check_artifact(&p, "app", "g", SHA, Some(b"{}"), &keys(&k)).unwrap_err().check, "envelope");
}
