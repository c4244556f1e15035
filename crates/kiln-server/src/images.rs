//! Image resolution at planning (spec 000 §5, §11): every `image.ref` of a
//! workflow is resolved against its registry (OCI distribution API) to the
//! immutable digest of the manifest the job will run — for a multi-platform
//! index, the manifest of the job's platform (`runs-on` `os`/`arch`, default
//! linux/amd64). The digests are stored on the jobs in the acceptance
//! transaction and every attempt runs exactly them.

use kiln_workflow::{Image, Job, Workflow};

/// A job's platform (`runs-on` `os`/`arch`, default linux/amd64).
fn platform(job: &Job) -> (String, String) {
    let os = job.runs_on.get("os").cloned().unwrap_or_else(|| "linux".into());
    (os, normalise_arch(job.runs_on.get("arch").map(String::as_str).unwrap_or("amd64")))
}
use oci_client::Reference;
use oci_client::secrets::RegistryAuth;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// How registries are reached.
#[derive(Debug, Clone, Default)]
pub struct RegistryConfig {
    /// `HOST:PORT` of registries spoken to over plain HTTP (loopback test registries).
    pub insecure: Vec<String>,
    /// Credentials per registry host (`HOST[:PORT]` → (user, password)); the
    /// client uses them for basic auth or to obtain a bearer token. Others are anonymous.
    pub credentials: HashMap<String, (String, String)>,
    /// Per-request timeout.
    pub timeout: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The image or tag does not exist, access is denied, or the reference is malformed.
    #[error("{0}")]
    Refused(String),
    /// The registry could not be reached or failed: nothing was decided.
    #[error("{0}")]
    Unavailable(String),
}

pub struct Resolver {
    http: reqwest::Client,
    config: RegistryConfig,
    guard: Arc<Guard>,
    /// `Authorization` headers that worked, per (registry, repository).
    tokens: Mutex<HashMap<(String, String), String>>,
}

impl Resolver {
    pub fn new(config: RegistryConfig) -> Resolver {
        let timeout = config.timeout.unwrap_or(Duration::from_secs(15));
        let guard = Arc::new(Guard::new(&config));
        let redirects = guard.clone();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .read_timeout(timeout)
            .timeout(timeout * 2)
            .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
            .dns_resolver(guard.clone())
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= MAX_REDIRECTS {
                    return attempt.error(Blocked("too many redirects"));
                }
                match redirects.check_url(attempt.url()) {
                    Ok(()) => attempt.follow(),
                    Err(why) => attempt.error(Blocked(why)),
                }
            }))
            .build()
            .expect("an HTTP client");
        Resolver { http, config, guard, tokens: Mutex::new(HashMap::new()) }
    }

    /// The digest of every `image.ref` job of `wf`, by job name.
    ///
    /// Service images are pinned in place: each service's `digest` is set
    /// in `wf`, so the frozen definition names the bytes every attempt (and
    /// a retry) runs.
    pub async fn resolve_workflow(&self, wf: &mut Workflow) -> Result<BTreeMap<String, String>, ResolveError> {
        self.pin_services(wf).await?;
        // Resolve each distinct (reference, platform) once, concurrently.
        let mut wanted: BTreeMap<(String, String, String), Vec<String>> = BTreeMap::new();
        for job in &wf.jobs {
            if let Some(Image::Ref { reference }) = &job.image {
                if reference.contains("${{") {
                    // Reads outputs: evaluated at claim, where it must name
                    // an image by digest (`render_claimed_image`).
                    continue;
                }
                let (os, arch) = platform(job);
                wanted.entry((reference.clone(), os, arch)).or_default().push(job.name.clone());
            }
        }
        let lookups = wanted.keys().map(|(r, os, arch)| self.resolve(r, os, arch));
        let results = futures::future::join_all(lookups).await;
        let mut out = BTreeMap::new();
        for (((reference, ..), jobs), res) in wanted.into_iter().zip(results) {
            let digest = res.map_err(|e| match e {
                ResolveError::Refused(m) => {
                    ResolveError::Refused(format!("image `{reference}` of job `{}`: {m}", jobs[0]))
                }
                ResolveError::Unavailable(m) => {
                    ResolveError::Unavailable(format!("image `{reference}` of job `{}`: {m}", jobs[0]))
                }
            })?;
            for j in jobs {
                out.insert(j, digest.clone());
            }
        }
        Ok(out)
    }

    /// Set the digest of every job service's image (once per distinct
    /// reference and platform).
    async fn pin_services(&self, wf: &mut Workflow) -> Result<(), ResolveError> {
        let mut wanted: BTreeMap<(String, String, String), String> = BTreeMap::new();
        for job in &wf.jobs {
            for (name, svc) in &job.services {
                let (os, arch) = platform(job);
                wanted
                    .entry((svc.image.clone(), os, arch))
                    .or_insert_with(|| format!("service `{name}` of job `{}`", job.name));
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        let results = futures::future::join_all(wanted.keys().map(|(r, os, arch)| self.resolve(r, os, arch))).await;
        let mut pinned = BTreeMap::new();
        for (((reference, os, arch), whose), res) in wanted.into_iter().zip(results) {
            let digest = res.map_err(|e| match e {
                ResolveError::Refused(m) => ResolveError::Refused(format!("image `{reference}` of {whose}: {m}")),
                ResolveError::Unavailable(m) => {
                    ResolveError::Unavailable(format!("image `{reference}` of {whose}: {m}"))
                }
            })?;
            pinned.insert((reference, os, arch), digest);
        }
        for job in &mut wf.jobs {
            let (os, arch) = platform(job);
            for svc in job.services.values_mut() {
                svc.digest = pinned.get(&(svc.image.clone(), os.clone(), arch.clone())).cloned();
            }
        }
        Ok(())
    }

    /// The digest of the image manifest `reference` names for `os`/`arch`.
    pub async fn resolve(&self, reference: &str, os: &str, arch: &str) -> Result<String, ResolveError> {
        let arch = normalise_arch(arch);
        let parsed: Reference =
            reference.parse().map_err(|e| ResolveError::Refused(format!("not a valid image reference: {e}")))?;
        let auth = self
            .config
            .credentials
            .get(parsed.resolve_registry())
            .or_else(|| self.config.credentials.get(parsed.registry()))
            .map(|(u, p)| RegistryAuth::Basic(u.clone(), p.clone()))
            .unwrap_or(RegistryAuth::Anonymous);
        let (bytes, digest) = self.pull(&parsed, &auth).await?;
        let manifest: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ResolveError::Refused(format!("the registry returned an unreadable manifest: {e}")))?;
        let media = manifest.get("mediaType").and_then(|m| m.as_str()).unwrap_or("");
        let is_index =
            media.contains("index") || media.contains("manifest.list") || manifest.get("manifests").is_some();
        if !is_index {
            return Ok(digest);
        }
        let entries = manifest.get("manifests").and_then(|m| m.as_array()).cloned().unwrap_or_default();
        let chosen = entries.iter().find(|e| {
            let p = e.get("platform");
            let get = |k: &str| p.and_then(|p| p.get(k)).and_then(|v| v.as_str()).unwrap_or("");
            get("os") == os && normalise_arch(get("architecture")) == arch
        });
        let Some(entry) = chosen else {
            let have: Vec<String> = entries
                .iter()
                .filter_map(|e| e.get("platform"))
                .map(|p| {
                    format!(
                        "{}/{}",
                        p.get("os").and_then(|v| v.as_str()).unwrap_or("?"),
                        p.get("architecture").and_then(|v| v.as_str()).unwrap_or("?")
                    )
                })
                .collect();
            return Err(ResolveError::Refused(format!(
                "the image index has no manifest for {os}/{arch} (it has {})",
                have.join(", ")
            )));
        };
        let child = entry
            .get("digest")
            .and_then(|d| d.as_str())
            .ok_or_else(|| ResolveError::Refused("an image index entry has no digest".into()))?
            .to_string();
        // The platform manifest must exist too.
        let by_digest = parsed.clone_with_digest(child.clone());
        self.pull(&by_digest, &auth).await?;
        Ok(child)
    }

    /// The manifest's bytes and their sha256 (checked against the digest the
    /// reference names, if any).
    async fn pull(&self, r: &Reference, auth: &RegistryAuth) -> Result<(Vec<u8>, String), ResolveError> {
        let registry = r.resolve_registry();
        let scheme = if self.guard.insecure(registry) { "http" } else { "https" };
        let reference = r.digest().or(r.tag()).unwrap_or("latest");
        let url = format!("{scheme}://{registry}/v2/{}/manifests/{reference}", r.repository());
        let url: reqwest::Url =
            url.parse().map_err(|_| ResolveError::Refused("not a valid image reference (registry URL)".into()))?;
        self.guard.check_url(&url).map_err(|why| ResolveError::Refused(format!("the registry is {why}")))?;
        let key = (registry.to_string(), r.repository().to_string());
        let cached = self.tokens.lock().expect("tokens").get(&key).cloned();
        let mut res = self.get_manifest(&url, cached.as_deref()).await?;
        if res.status() == reqwest::StatusCode::UNAUTHORIZED {
            let challenge = res
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let header = self.authorize(&challenge, r, auth).await?;
            res = self.get_manifest(&url, Some(&header)).await?;
            if res.status().is_success() {
                self.tokens.lock().expect("tokens").insert(key, header);
            }
        }
        let status = res.status();
        match status.as_u16() {
            200..=299 => {}
            404 => return Err(ResolveError::Refused("no such image or tag in the registry".into())),
            401 | 403 => return Err(ResolveError::Refused(format!("not authorized to pull it (HTTP {status})"))),
            429 | 500..=599 => return Err(ResolveError::Unavailable(format!("the registry answered HTTP {status}"))),
            _ => return Err(ResolveError::Refused(format!("the registry answered HTTP {status}"))),
        }
        let bytes = read_capped(res, MAX_MANIFEST_BYTES).await?;
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        if let Some(want) = r.digest()
            && want != digest
        {
            return Err(ResolveError::Refused(format!("the registry served {digest} for {want}")));
        }
        Ok((bytes, digest))
    }

    async fn get_manifest(
        &self,
        url: &reqwest::Url,
        authorization: Option<&str>,
    ) -> Result<reqwest::Response, ResolveError> {
        let mut req = self.http.get(url.clone()).header(reqwest::header::ACCEPT, MANIFEST_TYPES.join(", "));
        if let Some(a) = authorization {
            req = req.header(reqwest::header::AUTHORIZATION, a);
        }
        req.send().await.map_err(|e| request_error(&e, "the registry"))
    }

    /// The `Authorization` header a `401`'s challenge asks for: basic with
    /// the configured credentials, or a bearer token from the challenge's
    /// token service (itself held to the same rules as the registry).
    async fn authorize(&self, challenge: &str, r: &Reference, auth: &RegistryAuth) -> Result<String, ResolveError> {
        use base64::Engine;
        let basic = match auth {
            RegistryAuth::Basic(u, p) => {
                Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))))
            }
            _ => None,
        };
        let (kind, params) = challenge.trim().split_once(' ').unwrap_or((challenge.trim(), ""));
        if kind.eq_ignore_ascii_case("basic") {
            return basic.ok_or_else(|| ResolveError::Refused("not authorized to pull it (HTTP 401)".into()));
        }
        if !kind.eq_ignore_ascii_case("bearer") {
            return Err(ResolveError::Refused("not authorized to pull it (HTTP 401)".into()));
        }
        let params = challenge_params(params);
        let realm = params.get("realm").ok_or_else(|| {
            ResolveError::Refused("the registry asked for a token without naming a token service".into())
        })?;
        let mut realm: reqwest::Url = realm
            .parse()
            .map_err(|_| ResolveError::Refused("the registry named a token service that is not a URL".into()))?;
        self.guard
            .check_url(&realm)
            .map_err(|why| ResolveError::Refused(format!("the registry's token service is {why}")))?;
        {
            let mut q = realm.query_pairs_mut();
            q.append_pair("scope", &format!("repository:{}:pull", r.repository()));
            if let Some(service) = params.get("service") {
                q.append_pair("service", service);
            }
        }
        let mut req = self.http.get(realm);
        if let Some(b) = &basic {
            req = req.header(reqwest::header::AUTHORIZATION, b);
        }
        let res = req.send().await.map_err(|e| request_error(&e, "the registry's token service"))?;
        let status = res.status();
        if !status.is_success() {
            return Err(if status.is_server_error() || status.as_u16() == 429 {
                ResolveError::Unavailable(format!("the registry's token service answered HTTP {status}"))
            } else {
                ResolveError::Refused(format!("authentication failed (the token service answered HTTP {status})"))
            });
        }
        let body = read_capped(res, 64 * 1024).await?;
        let token: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|_| ResolveError::Refused("the registry's token service sent no token".into()))?;
        let token = token
            .get("token")
            .or_else(|| token.get("access_token"))
            .and_then(|t| t.as_str())
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| ResolveError::Refused("the registry's token service sent no token".into()))?;
        Ok(format!("Bearer {token}"))
    }
}

/// The largest manifest read (OCI suggests registries cap them at 4 MiB).
const MAX_MANIFEST_BYTES: usize = 4 * 1024 * 1024;
/// Redirects followed for one request.
const MAX_REDIRECTS: usize = 5;

/// A response body, refused past `max` bytes. Never put into a message.
async fn read_capped(mut res: reqwest::Response, max: usize) -> Result<Vec<u8>, ResolveError> {
    let mut out = Vec::new();
    while let Some(chunk) = res.chunk().await.map_err(|e| request_error(&e, "the registry"))? {
        if out.len() + chunk.len() > max {
            return Err(ResolveError::Refused(format!("the registry's answer is larger than {max} bytes")));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// `key="value", key=value` pairs of a `WWW-Authenticate` challenge.
fn challenge_params(s: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some((k, v)) = rest.split_once('=') else { break };
        let k = k.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let v = v.trim_start();
        let (value, after) = if let Some(q) = v.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (&q[..end], &q[end + 1..]),
                None => (q, ""),
            }
        } else {
            match v.find(',') {
                Some(end) => (&v[..end], &v[end..]),
                None => (v, ""),
            }
        };
        out.insert(k, value.to_string());
        rest = after.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

/// What a failed request says: a fixed description by kind, never the
/// remote's words (issue 39: no echo of what an internal address answered).
fn request_error(e: &reqwest::Error, who: &str) -> ResolveError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(b) = s.downcast_ref::<Blocked>() {
            return ResolveError::Refused(format!("{who} led to {}, which is not followed", b.0));
        }
        source = s.source();
    }
    if e.is_redirect() {
        ResolveError::Refused(format!("{who} redirected too often"))
    } else if e.is_timeout() {
        ResolveError::Unavailable(format!("{who} did not answer in time"))
    } else if e.is_connect() {
        ResolveError::Unavailable(format!("{who} is unreachable (cannot connect)"))
    } else {
        ResolveError::Unavailable(format!("{who} failed (the request did not complete)"))
    }
}

/// Why an address is not contacted.
#[derive(Debug)]
struct Blocked(&'static str);

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Blocked {}

/// Where the resolver may go (issue 39: no server-side request forgery
/// through a fork's `image:`): https anywhere public; plain http only to an
/// `--insecure-registry` HOST:PORT; loopback, private, link-local and other
/// non-public addresses only for a host the operator named (an insecure
/// registry, or one with `--registry-auth`). Checked for the registry, every
/// redirect and the token service, by URL (literal addresses) and at DNS
/// resolution (names).
struct Guard {
    /// `host:port` spoken to over plain http (lowercase).
    insecure: HashSet<String>,
    /// `host[:port]` as configured, which may be internal addresses.
    authorities: HashSet<String>,
    /// The hosts of those (the DNS guard sees names, not ports).
    hosts: HashSet<String>,
}

impl Guard {
    fn new(config: &RegistryConfig) -> Guard {
        let insecure: HashSet<String> = config.insecure.iter().map(|h| h.trim().to_ascii_lowercase()).collect();
        let (mut authorities, mut hosts) = (HashSet::new(), HashSet::new());
        for h in config.insecure.iter().chain(config.credentials.keys()) {
            let h = h.trim().to_ascii_lowercase();
            hosts.insert(strip_port(&h).to_string());
            authorities.insert(h);
        }
        Guard { insecure, authorities, hosts }
    }

    fn insecure(&self, authority: &str) -> bool {
        self.insecure.contains(&authority.to_ascii_lowercase())
    }

    fn configured(&self, host: &str) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        self.hosts.contains(&host)
    }

    /// Whether `url` may be requested; else what it is, for the message.
    fn check_url(&self, url: &reqwest::Url) -> Result<(), &'static str> {
        let Some(host) = url.host_str() else { return Err("a URL without a host") };
        let authority = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        match url.scheme() {
            "https" => {}
            "http" if self.insecure(&authority) => {}
            "http" => return Err("a plain-http address that is not an --insecure-registry"),
            _ => return Err("an address that is not http(s)"),
        }
        // A configured host is trusted with internal addresses on its
        // configured port only (the DNS guard sees names, not ports).
        let exact = self.authorities.contains(&authority.to_ascii_lowercase());
        if self.configured(host) && !exact {
            return Err("another port of a configured registry's host");
        }
        let ip = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok();
        if let Some(ip) = ip
            && !is_public(ip)
            && !exact
        {
            return Err("an internal address (loopback, private or link-local) that is not a configured registry");
        }
        Ok(())
    }
}

impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        let internal_ok = self.configured(&host);
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = addrs.into_iter().filter(|a| internal_ok || is_public(a.ip())).collect();
            if allowed.is_empty() {
                return Err(Box::new(Blocked(
                    "a name with only internal addresses (loopback, private or link-local) that is not a configured registry",
                )) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

fn strip_port(h: &str) -> &str {
    if h.starts_with('[') {
        return h.split_once(']').map(|(a, _)| a.trim_start_matches('[')).unwrap_or(h);
    }
    match h.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => h,
    }
}

/// A globally routable address: not loopback, private (RFC 1918, unique
/// local), link-local, shared (CGNAT), unspecified, broadcast, multicast,
/// documentation or reserved; IPv4-mapped and NAT64 IPv6 judged by the IPv4
/// address inside.
fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            !(a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_broadcast()
                || a.is_multicast()
                || a.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                || o[0] >= 240)
        }
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let s = a.segments();
            if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
                let v4 = std::net::Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
                return is_public(IpAddr::V4(v4));
            }
            !(a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] & 0xffc0) == 0xfec0
                || (s[0] == 0x2001 && s[1] == 0x0db8)
                || s[0..6] == [0, 0, 0, 0, 0, 0])
        }
    }
}

fn normalise_arch(a: &str) -> String {
    match a {
        "x86_64" | "x86-64" => "amd64".into(),
        "aarch64" => "arm64".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_not_public() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(!is_public(a.parse().unwrap()), "{a}");
        }
        for a in ["1.1.1.1", "140.82.112.3", "2606:4700::1111"] {
            assert!(is_public(a.parse().unwrap()), "{a}");
        }
    }

    #[test]
    fn challenges_are_read() {
        let p = challenge_params(r#"realm="https://auth.docker.io/token",service="registry.docker.io", scope=x"#);
        assert_eq!(p["realm"], "https://auth.docker.io/token");
        assert_eq!(p["service"], "registry.docker.io");
        assert_eq!(p["scope"], "x");
    }

    #[test]
    fn architectures_are_normalised() {
        assert_eq!(normalise_arch("x86_64"), "amd64");
        assert_eq!(normalise_arch("aarch64"), "arm64");
        assert_eq!(normalise_arch("amd64"), "amd64");
    }
}
