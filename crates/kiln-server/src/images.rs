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
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
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
    client: Client,
    config: RegistryConfig,
}

impl Resolver {
    pub fn new(config: RegistryConfig) -> Resolver {
        let timeout = config.timeout.unwrap_or(Duration::from_secs(15));
        let protocol = if config.insecure.is_empty() {
            ClientProtocol::Https
        } else {
            ClientProtocol::HttpsExcept(config.insecure.clone())
        };
        let client = Client::new(ClientConfig {
            protocol,
            connect_timeout: Some(Duration::from_secs(5)),
            read_timeout: Some(timeout),
            ..Default::default()
        });
        Resolver { client, config }
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
        use oci_client::errors::OciDistributionError as E;
        let res = self.client.pull_manifest_raw(r, auth, MANIFEST_TYPES).await;
        let (bytes, _) = res.map_err(|e| match e {
            E::ImageManifestNotFoundError(_) => ResolveError::Refused("no such image or tag in the registry".into()),
            E::RegistryError { envelope, .. } => ResolveError::Refused(format!(
                "the registry refused: {}",
                envelope.errors.iter().map(|e| format!("{:?}: {}", e.code, e.message)).collect::<Vec<_>>().join("; ")
            )),
            E::AuthenticationFailure(m) => ResolveError::Refused(format!("authentication failed: {m}")),
            E::UnauthorizedError { .. } => ResolveError::Refused("not authorized to pull it".into()),
            E::ServerError { code, message, .. } if (400..500).contains(&code) => {
                ResolveError::Refused(format!("the registry answered {code}: {message}"))
            }
            E::RequestError(e) => ResolveError::Unavailable(format!("the registry is unreachable: {e}")),
            other => ResolveError::Unavailable(format!("the registry failed: {other}")),
        })?;
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        if let Some(want) = r.digest()
            && want != digest
        {
            return Err(ResolveError::Refused(format!("the registry served {digest} for {want}")));
        }
        Ok((bytes.to_vec(), digest))
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
    fn architectures_are_normalised() {
        assert_eq!(normalise_arch("x86_64"), "amd64");
        assert_eq!(normalise_arch("aarch64"), "arm64");
        assert_eq!(normalise_arch("amd64"), "amd64");
    }
}
