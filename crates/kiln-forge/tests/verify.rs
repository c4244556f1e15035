//! Webhook signatures and tokens, and delivery metadata.

use http::{HeaderMap, HeaderName, HeaderValue};
use kiln_forge::{Forge, VerifyError, delivery_meta, sign, verify};

const SECRET: &[u8] = b"It's a Secret to Everybody";
const BODY: &[u8] = br#"{"ref":"refs/heads/main","after":"0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c"}"#;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
    }
    h
}

fn signed(forge: Forge, secret: &[u8], body: &[u8]) -> HeaderMap {
    let (name, value) = sign(forge, secret, body);
    headers(&[(name, &value)])
}

#[test]
fn sign_round_trips_with_verify() {
    for forge in Forge::ALL {
        let h = signed(forge, SECRET, BODY);
        assert_eq!(verify(forge, &h, BODY, SECRET), Ok(()), "{forge}");
        // A signature is not portable to another forge's header.
        for other in Forge::ALL.into_iter().filter(|&f| f != forge) {
            assert!(verify(other, &h, BODY, SECRET).is_err(), "{forge} as {other}");
        }
    }
}

#[test]
fn github_documented_header() {
    // docs.github.com "Validating webhook deliveries": this secret and body.
    let h =
        headers(&[("X-Hub-Signature-256", "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")]);
    assert_eq!(verify(Forge::Github, &h, b"Hello, World!", SECRET), Ok(()));
}

#[test]
fn tampered_body_is_rejected() {
    for forge in [Forge::Github, Forge::Gitea] {
        let h = signed(forge, SECRET, BODY);
        let mut tampered = BODY.to_vec();
        tampered[10] ^= 1;
        assert!(matches!(verify(forge, &h, &tampered, SECRET), Err(VerifyError::Mismatch(_))), "{forge}");
        assert!(verify(forge, &h, &BODY[..BODY.len() - 1], SECRET).is_err());
        assert!(verify(forge, &h, b"", SECRET).is_err());
    }
}

#[test]
fn wrong_secret_is_rejected() {
    for forge in Forge::ALL {
        let h = signed(forge, b"another secret", BODY);
        assert!(matches!(verify(forge, &h, BODY, SECRET), Err(VerifyError::Mismatch(_))), "{forge}");
        // A prefix of the secret is not the secret.
        let h = signed(forge, &SECRET[..SECRET.len() - 1], BODY);
        assert!(verify(forge, &h, BODY, SECRET).is_err(), "{forge}");
    }
}

#[test]
fn missing_header_is_rejected() {
    for forge in Forge::ALL {
        assert!(
            matches!(verify(forge, &HeaderMap::new(), BODY, SECRET), Err(VerifyError::MissingHeader(_))),
            "{forge}"
        );
    }
    // GitHub's legacy SHA-1 header alone is not enough.
    let h = headers(&[("X-Hub-Signature", "sha1=0123456789abcdef0123456789abcdef01234567")]);
    assert!(matches!(verify(Forge::Github, &h, BODY, SECRET), Err(VerifyError::MissingHeader(_))));
}

#[test]
fn malformed_headers_are_rejected() {
    let (_, good) = sign(Forge::Github, SECRET, BODY);
    let hex = good.strip_prefix("sha256=").unwrap().to_owned();
    let github_bad = [
        format!("sha1={}", &hex[..40]),
        format!("sha1={hex}"),
        hex.clone(),
        format!("sha256={}", &hex[..62]),
        format!("sha256={hex}00"),
        format!("sha256={}zz", &hex[..62]),
        format!("SHA256={hex}"),
        "sha256=".to_owned(),
    ];
    for value in &github_bad {
        let h = headers(&[("x-hub-signature-256", value)]);
        assert!(matches!(verify(Forge::Github, &h, BODY, SECRET), Err(VerifyError::MalformedHeader(_))), "{value}");
    }
    let gitea_bad = [format!("sha256={hex}"), hex[..63].to_owned(), format!("{}g", &hex[..63]), String::new()];
    for name in ["x-gitea-signature", "x-forgejo-signature"] {
        for value in &gitea_bad {
            let h = headers(&[(name, value)]);
            assert!(
                matches!(verify(Forge::Gitea, &h, BODY, SECRET), Err(VerifyError::MalformedHeader(_))),
                "{name}: {value}"
            );
        }
    }
    // The header twice: refused even if one copy is right.
    let h = headers(&[("x-hub-signature-256", &good), ("x-hub-signature-256", &good)]);
    assert!(verify(Forge::Github, &h, BODY, SECRET).is_err());
    let h = headers(&[("x-gitlab-token", "x"), ("x-gitlab-token", "It's a Secret to Everybody")]);
    assert!(verify(Forge::Gitlab, &h, BODY, SECRET).is_err());
    // A non-UTF-8 token.
    let mut h = HeaderMap::new();
    h.insert("x-gitlab-token", HeaderValue::from_bytes(&[0xff, 0xfe]).unwrap());
    assert!(verify(Forge::Gitlab, &h, BODY, SECRET).is_err());
}

#[test]
fn empty_secret_never_verifies() {
    for forge in Forge::ALL {
        let h = signed(forge, b"", BODY);
        assert_eq!(verify(forge, &h, BODY, b""), Err(VerifyError::EmptySecret), "{forge}");
    }
    let h = headers(&[("x-gitlab-token", "")]);
    assert_eq!(verify(Forge::Gitlab, &h, BODY, b""), Err(VerifyError::EmptySecret));
}

#[test]
fn gitlab_token_is_the_secret() {
    let h = headers(&[("X-Gitlab-Token", "It's a Secret to Everybody")]);
    assert_eq!(verify(Forge::Gitlab, &h, BODY, SECRET), Ok(()));
    // The token does not depend on the body.
    assert_eq!(verify(Forge::Gitlab, &h, b"anything", SECRET), Ok(()));
    for wrong in ["It's a Secret to Everybody!", "it's a secret to everybody", "x"] {
        let h = headers(&[("X-Gitlab-Token", wrong)]);
        assert!(verify(Forge::Gitlab, &h, BODY, SECRET).is_err(), "{wrong}");
    }
}

#[test]
fn forgejo_signatures() {
    let (_, sig) = sign(Forge::Gitea, SECRET, BODY);
    // Forgejo alone, Gitea alone, and both (as Forgejo sends them).
    for pairs in [
        vec![("X-Forgejo-Signature", sig.as_str())],
        vec![("X-Gitea-Signature", sig.as_str())],
        vec![("X-Forgejo-Signature", sig.as_str()), ("X-Gitea-Signature", sig.as_str())],
    ] {
        assert_eq!(verify(Forge::Gitea, &headers(&pairs), BODY, SECRET), Ok(()));
    }
    // Both present: each must match.
    let (_, other) = sign(Forge::Gitea, b"other", BODY);
    let h = headers(&[("X-Forgejo-Signature", &sig), ("X-Gitea-Signature", &other)]);
    assert!(verify(Forge::Gitea, &h, BODY, SECRET).is_err());
    let h = headers(&[("X-Forgejo-Signature", &other), ("X-Gitea-Signature", &sig)]);
    assert!(verify(Forge::Gitea, &h, BODY, SECRET).is_err());
}

#[test]
fn delivery_meta_reads_the_headers() {
    let cases = [
        (Forge::Github, "X-GitHub-Delivery", "X-GitHub-Event", "push"),
        (Forge::Gitlab, "X-Gitlab-Event-UUID", "X-Gitlab-Event", "Push Hook"),
        (Forge::Gitea, "X-Gitea-Delivery", "X-Gitea-Event", "push"),
        (Forge::Gitea, "X-Forgejo-Delivery", "X-Forgejo-Event", "pull_request"),
    ];
    for (forge, id_h, ev_h, ev) in cases {
        let h = headers(&[(id_h, "72d3162e-cc78-11e3-81ab-4c9367dc0958"), (ev_h, ev)]);
        let m = delivery_meta(forge, &h, BODY).unwrap();
        assert_eq!(m.id, "72d3162e-cc78-11e3-81ab-4c9367dc0958", "{forge}");
        assert_eq!(m.event, ev);
    }
}

#[test]
fn delivery_id_falls_back_to_the_body_hash() {
    let h = headers(&[("X-GitHub-Event", "push")]);
    let m = delivery_meta(Forge::Github, &h, b"abc").unwrap();
    assert_eq!(m.id, "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    // X-Gitlab-Webhook-UUID names the hook, not the delivery: not an id.
    let h = headers(&[("X-Gitlab-Event", "Push Hook"), ("X-Gitlab-Webhook-UUID", "hook-1")]);
    let m = delivery_meta(Forge::Gitlab, &h, b"abc").unwrap();
    assert!(m.id.starts_with("sha256:"));
}

#[test]
fn delivery_meta_rejects_bad_headers() {
    // No event header.
    for forge in Forge::ALL {
        assert!(delivery_meta(forge, &HeaderMap::new(), BODY).is_err());
    }
    let long = "a".repeat(201);
    for id in [long.as_str(), "", "tab\there"] {
        let h = headers(&[("X-GitHub-Event", "push"), ("X-GitHub-Delivery", id)]);
        assert!(delivery_meta(Forge::Github, &h, BODY).is_err(), "{id:?}");
    }
    let ok = "a".repeat(200);
    let h = headers(&[("X-GitHub-Event", "push"), ("X-GitHub-Delivery", &ok)]);
    assert!(delivery_meta(Forge::Github, &h, BODY).is_ok());
    let mut h = headers(&[("X-GitHub-Event", "push")]);
    h.insert("x-github-delivery", HeaderValue::from_bytes("idé".as_bytes()).unwrap());
    assert!(delivery_meta(Forge::Github, &h, BODY).is_err());
}

#[test]
fn forge_names() {
    for (s, f) in
        [("github", Forge::Github), ("gitlab", Forge::Gitlab), ("gitea", Forge::Gitea), ("forgejo", Forge::Gitea)]
    {
        assert_eq!(s.parse::<Forge>(), Ok(f));
    }
    assert!("bitbucket".parse::<Forge>().is_err());
    assert_eq!(Forge::Gitlab.to_string(), "gitlab");
    assert_eq!(serde_json::to_string(&Forge::Github).unwrap(), "\"github\"");
    assert_eq!(serde_json::from_str::<Forge>("\"gitea\"").unwrap(), Forge::Gitea);
}
