//! Image resolution at planning against real registries (Debian's
//! docker-registry, started by `scripts/container-env`): tags, multi-platform
//! indexes, basic auth, unknown images, unreachable registries.
//!
//! Without the registries these tests skip with a message, unless
//! `KILN_REQUIRE_CONTAINERS=1` (set by `scripts/test`): then they fail.

use kiln_server::{RegistryConfig, ResolveError, Resolver};
use std::process::Command;

fn registry() -> String {
    std::env::var("KILN_TEST_REGISTRY").unwrap_or_else(|_| "127.0.0.1:5000".into())
}

fn auth_registry() -> String {
    std::env::var("KILN_TEST_AUTH_REGISTRY").unwrap_or_else(|_| "127.0.0.1:5001".into())
}

fn available() -> bool {
    let up = |r: String| {
        Command::new("curl")
            .args(["-sS", "--max-time", "3", "-o", "/dev/null", &format!("http://{r}/v2/")])
            .status()
            .is_ok_and(|s| s.success())
    };
    if up(registry()) && up(auth_registry()) {
        return true;
    }
    if std::env::var("KILN_REQUIRE_CONTAINERS").is_ok_and(|v| v == "1") {
        panic!("KILN_REQUIRE_CONTAINERS=1 but the test registries do not answer; run scripts/container-env");
    }
    eprintln!("SKIPPED: the test registries do not answer; run scripts/container-env");
    false
}

/// `curl` a manifest: (digest header, body).
fn manifest(registry: &str, name: &str, reference: &str, accept: &str, creds: Option<&str>) -> (String, String) {
    let mut c = Command::new("curl");
    c.args(["-fsS", "-D", "-", "-H", &format!("Accept: {accept}")]);
    if let Some(u) = creds {
        c.args(["-u", u]);
    }
    let out = c.arg(format!("http://{registry}/v2/{name}/manifests/{reference}")).output().unwrap();
    assert!(out.status.success(), "{name}:{reference}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let digest = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("docker-content-digest:").map(|d| d.trim().to_string()))
        .unwrap();
    (digest, body.to_string())
}

const IMAGE: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";
const INDEX: &str =
    "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json";

fn resolver() -> Resolver {
    let mut cfg = RegistryConfig { insecure: vec![registry(), auth_registry()], ..Default::default() };
    cfg.credentials.insert(auth_registry(), ("kiln".into(), "kiln-test".into()));
    Resolver::new(cfg)
}

#[tokio::test]
async fn a_tag_resolves_to_the_registrys_manifest_digest() {
    if !available() {
        return;
    }
    let (want, _) = manifest(&registry(), "kiln-test/tool", "latest", IMAGE, None);
    let got = resolver().resolve(&format!("{}/kiln-test/tool:latest", registry()), "linux", "amd64").await.unwrap();
    assert_eq!(got, want);
    // A reference already pinned by digest resolves to itself.
    let pinned = format!("{}/kiln-test/tool@{want}", registry());
    assert_eq!(resolver().resolve(&pinned, "linux", "amd64").await.unwrap(), want);
}

#[tokio::test]
async fn a_multi_platform_index_resolves_to_the_jobs_platform_manifest() {
    if !available() {
        return;
    }
    let (index_digest, body) = manifest(&registry(), "kiln-test/multi", "latest", INDEX, None);
    let index: serde_json::Value = serde_json::from_str(&body).unwrap();
    let entry = |arch: &str| {
        index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["platform"]["architecture"] == arch)
            .map(|m| m["digest"].as_str().unwrap().to_string())
            .unwrap()
    };
    let r = resolver();
    let reference = format!("{}/kiln-test/multi:latest", registry());
    let amd64 = r.resolve(&reference, "linux", "amd64").await.unwrap();
    let arm64 = r.resolve(&reference, "linux", "arm64").await.unwrap();
    assert_eq!(amd64, entry("amd64"));
    assert_eq!(arm64, entry("arm64"));
    assert_ne!(amd64, index_digest, "the platform manifest, not the index");
    assert_eq!(r.resolve(&reference, "linux", "x86_64").await.unwrap(), amd64, "arch aliases");
    let err = r.resolve(&reference, "linux", "riscv64").await.unwrap_err();
    assert!(matches!(&err, ResolveError::Refused(m) if m.contains("linux/riscv64")), "{err}");
}

#[tokio::test]
async fn basic_auth_is_used_and_required() {
    if !available() {
        return;
    }
    let (want, _) = manifest(&auth_registry(), "kiln-test/base", "latest", IMAGE, Some("kiln:kiln-test"));
    let reference = format!("{}/kiln-test/base:latest", auth_registry());
    assert_eq!(resolver().resolve(&reference, "linux", "amd64").await.unwrap(), want);
    let anonymous = Resolver::new(RegistryConfig { insecure: vec![auth_registry()], ..Default::default() });
    let err = anonymous.resolve(&reference, "linux", "amd64").await.unwrap_err();
    assert!(matches!(err, ResolveError::Refused(_)), "{err}");
    let mut wrong = RegistryConfig { insecure: vec![auth_registry()], ..Default::default() };
    wrong.credentials.insert(auth_registry(), ("kiln".into(), "wrong".into()));
    let err = Resolver::new(wrong).resolve(&reference, "linux", "amd64").await.unwrap_err();
    assert!(matches!(err, ResolveError::Refused(_)), "{err}");
}

#[tokio::test]
async fn unknown_images_are_refused_and_unreachable_registries_are_unavailable() {
    if !available() {
        return;
    }
    let r = resolver();
    for reference in [
        format!("{}/kiln-test/tool:no-such-tag", registry()),
        format!("{}/kiln-test/no-such-image:latest", registry()),
        "not a reference!".to_string(),
    ] {
        let err = r.resolve(&reference, "linux", "amd64").await.unwrap_err();
        assert!(matches!(err, ResolveError::Refused(_)), "{reference}: {err}");
    }
    let down = Resolver::new(RegistryConfig { insecure: vec!["127.0.0.1:5999".into()], ..Default::default() });
    let err = down.resolve("127.0.0.1:5999/kiln-test/base:latest", "linux", "amd64").await.unwrap_err();
    assert!(matches!(err, ResolveError::Unavailable(_)), "{err}");
}

/// A loopback HTTP server answering every request with `answer` (a whole
/// response, head and body); the number of requests it received.
fn serve(answer: String) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = [0u8; 8192];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(answer.as_bytes());
        }
    });
    (addr, hits)
}

const INTERNAL: &str = "INTERNAL-METADATA-ai-key-0123456789";

fn internal_service() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    serve(format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{INTERNAL}",
        INTERNAL.len()
    ))
}

/// Issue 39, item 5: a fork's `image:` names a registry (allowed, an
/// `--insecure-registry`) that redirects the manifest request, or sends its
/// token request, to a plain-http internal address (a cloud metadata
/// service, an admin port). The server never contacts the internal address
/// and never puts a remote answer's words into its message.
#[tokio::test]
async fn a_registry_cannot_send_the_resolver_to_an_internal_address() {
    let (internal, hits) = internal_service();
    let redirects = [
        format!("http://{internal}/latest/meta-data"),
        format!("https://{internal}/latest/meta-data"),
        format!("http://localhost:{}/x", internal.rsplit_once(':').unwrap().1),
    ];
    for location in &redirects {
        let (front, _) = serve(format!(
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ));
        let r = Resolver::new(RegistryConfig { insecure: vec![front.clone()], ..Default::default() });
        let err = r.resolve(&format!("{front}/evil/app:latest"), "linux", "amd64").await.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ResolveError::Refused(_)), "{location}: {text}");
        assert!(!text.contains(INTERNAL), "{location}: the internal answer was echoed: {text}");
    }
    let (front, _) = serve(format!(
        "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"http://{internal}/token\",service=\"x\"\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    ));
    let r = Resolver::new(RegistryConfig { insecure: vec![front.clone()], ..Default::default() });
    let err = r.resolve(&format!("{front}/evil/app:latest"), "linux", "amd64").await.unwrap_err();
    assert!(!err.to_string().contains(INTERNAL), "{err}");
    assert!(matches!(err, ResolveError::Refused(_)), "{err}");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0, "the internal address was contacted");

    // A registry named by an internal address that nobody configured is not
    // contacted either, over http or https.
    for reference in [format!("{internal}/evil/app:latest"), format!("localhost:{}/evil/app:latest", &internal[10..])] {
        let err = Resolver::new(RegistryConfig::default()).resolve(&reference, "linux", "amd64").await.unwrap_err();
        assert!(matches!(err, ResolveError::Refused(_)), "{reference}: {err}");
        assert!(!err.to_string().contains(INTERNAL), "{err}");
    }
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0, "the internal address was contacted");
}

/// A registry's own error answer (its body) never reaches the message:
/// only the status code and a fixed description.
#[tokio::test]
async fn a_registrys_answer_is_never_echoed() {
    let (reg, hits) = internal_service();
    let r = Resolver::new(RegistryConfig { insecure: vec![reg.clone()], ..Default::default() });
    let err = r.resolve(&format!("{reg}/evil/app:latest"), "linux", "amd64").await.unwrap_err();
    assert!(hits.load(std::sync::atomic::Ordering::SeqCst) >= 1, "the configured registry is asked");
    assert!(!err.to_string().contains(INTERNAL), "{err}");
    assert!(err.to_string().contains("400"), "{err}");
}
