//! [`ContainerExecutor`]: steps inside a fresh container, through the Docker
//! Engine API (Podman's `podman system service` or dockerd).
//!
//! One container per attempt, created from a pinned image (`repo@sha256:…`
//! or a local image id), with the workspace bind-mounted at
//! [`CONTAINER_WORKSPACE`] and nothing else of the host: no engine socket,
//! no agent token, no host environment. Its main process is an init
//! (`catatonit`) over an idle shell that ignores SIGTERM; every step is an
//! exec of `sh -e -c <command>` in the workspace. Limits (CPU, memory,
//! pids) and the network mode come from [`ContainerConfig`].
//!
//! Kill: SIGTERM to every process of the container but its init
//! (`kill -TERM -1`, from inside), SIGKILL of the whole container after the
//! grace period. `cleanup` SIGKILLs whatever steps left running (from
//! inside, within milliseconds) and removes the container in the background
//! (an agent that dies first leaves it to [`Engine::reap`]). Containers
//! carry the labels `kiln.agent`, `kiln.job`, `kiln.epoch` (and `kiln.run`):
//! [`Engine::reap`] removes the ones a dead agent process left behind.
//!
//! [`Engine`] also prepares images: [`Engine::ensure_image`] runs from the
//! engine's local store when the pinned digest is present (the registry may
//! then be unreachable) and pulls `repo@digest` otherwise; [`Engine::build`]
//! builds a Dockerfile through the engine's build API.

use crate::{Executor, OutputStream, SandboxError, StepEvent, StepExit, StepHandle, StepRequest};
use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, KillContainerOptions, PushImageOptions, RemoveContainerOptions,
    RemoveImageOptions, TagImageOptions,
};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Where the workspace is mounted inside the container (also the working
/// directory of every step and `KILN_WORKSPACE`).
pub const CONTAINER_WORKSPACE: &str = "/workspace";

/// Label keys on every container of an attempt.
pub const LABEL_AGENT: &str = "kiln.agent";
pub const LABEL_JOB: &str = "kiln.job";
pub const LABEL_EPOCH: &str = "kiln.epoch";
pub const LABEL_RUN: &str = "kiln.run";

const EVENT_QUEUE: usize = 64;
/// Largest piece of output read from the engine at once.
const OUTPUT_CAPACITY: usize = 64 * 1024;
/// The container's idle main process: a shell that ignores SIGTERM (so
/// `kill -TERM -1` reaches only steps), under the engine's init.
/// SIGUSR1 (forwarded by the init) makes it SIGKILL every other process of
/// the container: what steps left running dies before `cleanup` returns.
const IDLE: &str = "trap '' TERM INT HUP; trap 'kill -KILL -1' USR1; while :; do sleep 3600 & wait $!; done";

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("container engine at {url}: {message}")]
    Connect { url: String, message: String },
    #[error("container engine: {0}")]
    Api(String),
    #[error("image {0} is not available: {1}")]
    Pull(String, String),
    #[error("image {reference}: the engine holds {found}, not the pinned digest {expected}")]
    DigestMismatch { reference: String, expected: String, found: String },
    #[error("image build failed: {0}")]
    Build(String),
}

fn api(e: bollard::errors::Error) -> EngineError {
    EngineError::Api(e.to_string())
}

/// A pull that runs longer than this reports its bytes in the job's log,
/// then every [`PULL_PROGRESS_EVERY`].
const PULL_PROGRESS_FIRST: std::time::Duration = std::time::Duration::from_secs(2);
const PULL_PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// A connection to a Docker Engine API (cheap to clone).
#[derive(Clone)]
pub struct Engine {
    pub(crate) docker: Docker,
    url: String,
    /// Container removals still running in the background (see `cleanup`).
    removals: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("url", &self.url).finish()
    }
}

/// The image a job runs in, as the server pinned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinnedImage {
    /// A registry image: `repository@digest` (digest = `sha256:…` of the manifest).
    Registry { repository: String, digest: String },
    /// An image in the engine's local store, by id (`sha256:…`): a Dockerfile build.
    Local { id: String },
    /// Not pinned (an agent's default image): used as the engine resolves it.
    Unpinned { reference: String },
}

impl PinnedImage {
    /// The reference handed to the engine.
    pub fn reference(&self) -> String {
        match self {
            PinnedImage::Registry { repository, digest } => format!("{repository}@{digest}"),
            PinnedImage::Local { id } => id.clone(),
            PinnedImage::Unpinned { reference } => reference.clone(),
        }
    }
}

/// The repository part of an image reference, fully qualified as the OCI
/// distribution reference grammar (and Docker) normalise it:
/// `busybox:1.36` → `docker.io/library/busybox`,
/// `127.0.0.1:5000/a/b:tag` → `127.0.0.1:5000/a/b`; a digest is dropped too.
pub fn repository_of(reference: &str) -> String {
    let no_digest = reference.split('@').next().unwrap_or(reference);
    let last_slash = no_digest.rfind('/').map(|i| i + 1).unwrap_or(0);
    let repo = match no_digest[last_slash..].rfind(':') {
        Some(i) => &no_digest[..last_slash + i],
        None => no_digest,
    };
    let first = repo.split('/').next().unwrap_or("");
    let has_registry = repo.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if has_registry {
        repo.to_string()
    } else if repo.contains('/') {
        format!("docker.io/{repo}")
    } else {
        format!("docker.io/library/{repo}")
    }
}

impl Engine {
    /// `unix:///run/podman/podman.sock`, a socket path, or `tcp://host:port` / `http://…`.
    pub fn connect(url: &str) -> Result<Engine, EngineError> {
        let err = |m: String| EngineError::Connect { url: url.to_string(), message: m };
        // Podman 4 speaks API 1.41; bollard sends its version in the path.
        let version = bollard::ClientVersion { major_version: 1, minor_version: 41 };
        let docker = if let Some(path) = url.strip_prefix("unix://") {
            Docker::connect_with_unix(path, 600, &version)
        } else if url.starts_with('/') {
            Docker::connect_with_unix(url, 600, &version)
        } else if url.starts_with("tcp://") || url.starts_with("http://") {
            Docker::connect_with_http(&url.replacen("tcp://", "http://", 1), 600, &version)
        } else {
            return Err(err("use unix:///path/to/engine.sock or tcp://host:port".into()));
        }
        .map_err(|e| err(e.to_string()))?;
        Ok(Engine { docker, url: url.to_string(), removals: Arc::default() })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// A plain HTTP client for the engine's API and the base URL of its
    /// versioned routes, for requests bollard cannot express.
    fn raw(&self) -> Result<(reqwest::Client, String), EngineError> {
        let err = |m: String| EngineError::Connect { url: self.url.clone(), message: m };
        let socket =
            self.url.strip_prefix("unix://").or_else(|| self.url.starts_with('/').then_some(self.url.as_str()));
        let (builder, base) = match socket {
            Some(path) => (reqwest::Client::builder().unix_socket(path), "http://engine/v1.41".to_string()),
            None => (reqwest::Client::builder(), format!("{}/v1.41", self.url.replacen("tcp://", "http://", 1))),
        };
        Ok((builder.build().map_err(|e| err(e.to_string()))?, base))
    }

    /// Waits for the container removals `cleanup` left running in the
    /// background (call before exiting; an agent that dies first leaves
    /// them to [`Engine::reap`]).
    pub async fn settle(&self) {
        let pending = std::mem::take(&mut *self.removals.lock().expect("removals"));
        for h in pending {
            let _ = h.await;
        }
    }

    fn remove_in_background(&self, id: String) {
        let docker = self.docker.clone();
        let handle = tokio::spawn(async move { remove_container(&docker, &id).await });
        let mut pending = self.removals.lock().expect("removals");
        pending.retain(|h| !h.is_finished());
        pending.push(handle);
    }

    /// Checks that the engine answers.
    pub async fn ping(&self) -> Result<(), EngineError> {
        tokio::time::timeout(Duration::from_secs(10), self.docker.ping())
            .await
            .map_err(|_| EngineError::Connect { url: self.url.clone(), message: "no answer within 10 s".into() })?
            .map(|_| ())
            .map_err(|e| EngineError::Connect { url: self.url.clone(), message: e.to_string() })
    }

    /// The local image's id, if the engine has it (by reference or id).
    pub async fn local_image(&self, reference: &str) -> Result<Option<bollard::models::ImageInspect>, EngineError> {
        match self.docker.inspect_image(reference).await {
            Ok(i) => Ok(Some(i)),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
            Err(e) => Err(api(e)),
        }
    }

    /// Makes the pinned image available locally and returns the reference
    /// to create containers from. A locally present image is used as is (no
    /// registry contact); otherwise it is pulled by digest, and the engine
    /// must then hold exactly that digest. `progress` receives pull messages.
    pub async fn ensure_image(
        &self,
        image: &PinnedImage,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> Result<String, EngineError> {
        let reference = image.reference();
        let check = |found: &bollard::models::ImageInspect| -> Result<(), EngineError> {
            match image {
                PinnedImage::Registry { repository, digest } => {
                    let digests = found.repo_digests.clone().unwrap_or_default();
                    if digests.iter().any(|d| d.rsplit_once('@').is_some_and(|(_, dg)| dg == digest)) {
                        Ok(())
                    } else {
                        Err(EngineError::DigestMismatch {
                            reference: repository.clone(),
                            expected: digest.clone(),
                            found: digests.join(", "),
                        })
                    }
                }
                PinnedImage::Local { id } => {
                    let got = found.id.clone().unwrap_or_default();
                    if &got == id {
                        Ok(())
                    } else {
                        Err(EngineError::DigestMismatch { reference: id.clone(), expected: id.clone(), found: got })
                    }
                }
                PinnedImage::Unpinned { .. } => Ok(()),
            }
        };
        if let Some(found) = self.local_image(&reference).await? {
            check(&found)?;
            progress(&format!("using {reference} from the engine's image store"));
            return Ok(reference);
        }
        if let PinnedImage::Local { id } = image {
            return Err(EngineError::Pull(
                id.clone(),
                "a locally built image that this engine does not have (it was built on another agent)".into(),
            ));
        }
        progress(&format!("pulling {reference}"));
        let opts = CreateImageOptions { from_image: Some(reference.clone()), ..Default::default() };
        let mut pull = self.docker.create_image(Some(opts), None, None);
        let mut last = String::new();
        // Bytes per layer as the engine reports them (`progressDetail`):
        // summed into one line every few seconds while the pull runs long.
        let mut layers: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
        let started = std::time::Instant::now();
        let mut next_report = started + PULL_PROGRESS_FIRST;
        while let Some(item) = pull.next().await {
            match item {
                Ok(info) => {
                    if let Some(detail) = info.error_detail.and_then(|d| d.message) {
                        return Err(EngineError::Pull(reference, detail));
                    }
                    if let (Some(id), Some(d)) = (&info.id, &info.progress_detail)
                        && let (Some(cur), Some(total)) = (d.current, d.total)
                        && total > 0
                    {
                        layers.insert(id.clone(), (cur.min(total), total));
                    }
                    // Per-layer byte counts change constantly: only a new
                    // kind of status is worth a line of its own.
                    if let Some(status) = info.status
                        && status != last
                        && info.progress_detail.as_ref().is_none_or(|d| d.current.is_none())
                    {
                        progress(&status);
                        last = status;
                    }
                    if std::time::Instant::now() >= next_report && !layers.is_empty() {
                        let (cur, total) = layers.values().fold((0, 0), |(c, t), (lc, lt)| (c + lc, t + lt));
                        let mib = |b: i64| b as f64 / (1024.0 * 1024.0);
                        progress(&format!(
                            "pulling {reference}: {:.1} MiB of {:.1} MiB in {} layer(s), {}s so far",
                            mib(cur),
                            mib(total),
                            layers.len(),
                            started.elapsed().as_secs()
                        ));
                        next_report += PULL_PROGRESS_EVERY;
                    }
                }
                Err(e) => return Err(EngineError::Pull(reference, e.to_string())),
            }
        }
        match self.local_image(&reference).await? {
            Some(found) => check(&found).map(|()| reference),
            None => Err(EngineError::Pull(reference, "the engine reported no image after the pull".into())),
        }
    }

    /// Pushes the local image `id` to `repository` (a registry's
    /// `host[:port]/path`) under `tag` and returns the manifest digest the
    /// registry stored (issue 40, item 7: a built image another agent can
    /// pull by digest). The engine's own registry configuration applies
    /// (credentials, plain-http registries).
    pub async fn push(&self, id: &str, repository: &str, tag: &str) -> Result<String, EngineError> {
        let reference = format!("{repository}:{tag}");
        let opts = TagImageOptions { repo: Some(repository.to_string()), tag: Some(tag.to_string()) };
        self.docker.tag_image(id, Some(opts)).await.map_err(api)?;
        let opts = PushImageOptions { tag: Some(tag.to_string()), ..Default::default() };
        let mut stream = self.docker.push_image(repository, Some(opts), None);
        let mut digest = None;
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| EngineError::Pull(reference.clone(), format!("push failed: {e}")))?;
            if let Some(detail) = info.error_detail.and_then(|d| d.message) {
                return Err(EngineError::Pull(reference, format!("push failed: {detail}")));
            }
            // `TAG: digest: sha256:… size: N` (Docker and Podman alike).
            if let Some(d) = info.status.as_deref().and_then(|s| s.split("digest: ").nth(1)) {
                digest = d.split_whitespace().next().map(str::to_string);
            }
        }
        if let Some(d) = digest.filter(|d| d.starts_with("sha256:")) {
            return Ok(d);
        }
        // An engine that did not say: the digest it recorded for the repository.
        let found = self.local_image(&reference).await?.and_then(|i| i.repo_digests).unwrap_or_default();
        found
            .iter()
            .find_map(|d| d.strip_prefix(&format!("{repository}@")).map(str::to_string))
            .ok_or_else(|| EngineError::Pull(reference, "the push reported no manifest digest".into()))
    }

    /// Removes an image from the engine's store (a damaged or mismatched
    /// copy, so that it is pulled again); absent already is fine.
    pub async fn remove_image(&self, reference: &str) -> Result<(), EngineError> {
        let opts = RemoveImageOptions { force: true, ..Default::default() };
        match self.docker.remove_image(reference, Some(opts), None).await {
            Ok(_) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
            Err(e) => Err(api(e)),
        }
    }

    /// Builds `dockerfile` (a path relative to `checkout`) with the context
    /// directory `context` (relative to `checkout`), tags it `tag`, and
    /// returns the image id (`sha256:…`). Build output goes to `output` as
    /// it arrives; the error of a failed build is its last message.
    /// Symlinks in the context are sent as symlinks, never followed.
    #[allow(clippy::too_many_arguments)]
    pub async fn build(
        &self,
        checkout: &Path,
        dockerfile: &str,
        context: &str,
        tag: &str,
        network: &Network,
        limits: &Limits,
        output: &mut (dyn FnMut(&[u8]) + Send),
    ) -> Result<String, EngineError> {
        // Both are opened below the checkout one name at a time, never
        // following a symbolic link (issue 39: a context that was a link to
        // `/` had the agent tar the host's files for the engine).
        let context_fd = open_below(checkout, context, true)
            .map_err(|why| EngineError::Build(format!("build context `{context}` {why}")))?;
        let dockerfile_fd = open_below(checkout, dockerfile, false)
            .map_err(|why| EngineError::Build(format!("`{dockerfile}` {why}")))?;
        // Inside the context (by its path): name it by its path there;
        // otherwise its bytes (read through the descriptor) are added.
        let (dockerfile_name, extra) = match dockerfile_in_context(dockerfile, context) {
            Some(rel) => (rel, None),
            None => {
                use std::io::Read;
                let mut bytes = Vec::new();
                std::fs::File::from(dockerfile_fd)
                    .take(MAX_DOCKERFILE + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|e| EngineError::Build(format!("cannot read `{dockerfile}`: {e}")))?;
                if bytes.len() as u64 > MAX_DOCKERFILE {
                    return Err(EngineError::Build(format!("`{dockerfile}` is larger than {MAX_DOCKERFILE} bytes")));
                }
                (".kiln.Dockerfile".to_string(), Some(bytes))
            }
        };
        let tar = tokio::task::spawn_blocking(move || {
            // The open directory itself, whatever its path now names.
            let dir = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&context_fd)));
            let tar = context_tar(&dir, extra.as_deref());
            drop(context_fd);
            tar
        })
        .await
        .map_err(|e| EngineError::Build(e.to_string()))?
        .map_err(|e| EngineError::Build(format!("cannot pack the build context: {e}")))?;
        // The job's limits (issue 40, item 7): its CPU share and its memory
        // without swap beyond it, as 64-bit numbers (bollard's build options
        // would carry 32-bit ones, 2 GiB at most), so the request is sent
        // here; the answer is the same stream of JSON messages.
        let query: Vec<(&str, String)> = vec![
            ("dockerfile", dockerfile_name),
            ("t", tag.to_string()),
            ("rm", "1".into()),
            ("forcerm", "1".into()),
            ("networkmode", network.mode().to_string()),
            ("cpuperiod", "100000".into()),
            ("cpuquota", ((limits.cpus * 100_000.0) as i64).to_string()),
            ("memory", limits.memory_bytes.to_string()),
            ("memswap", limits.memory_bytes.to_string()),
        ];
        let (client, base) = self.raw()?;
        let url = reqwest::Url::parse_with_params(&format!("{base}/build"), &query)
            .map_err(|e| EngineError::Build(format!("cannot name the build request: {e}")))?;
        let resp = client
            .post(url)
            .header("content-type", "application/x-tar")
            .body(tar)
            .send()
            .await
            .map_err(|e| EngineError::Build(format!("the engine did not take the build: {e}")))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            let msg = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_string))
                .unwrap_or(body);
            output(format!("{msg}\n").as_bytes());
            return Err(EngineError::Build(format!("the engine refused the build ({status}): {msg}")));
        }
        let mut body = resp.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        let mut last_line = String::new();
        loop {
            let chunk = body.next().await;
            if let Some(c) = &chunk {
                let c = c.as_ref().map_err(|e| EngineError::Build(format!("the build's output stopped: {e}")))?;
                buf.extend_from_slice(c);
            }
            // Every complete JSON message so far; a partial one waits.
            let mut used = 0;
            let mut messages = serde_json::Deserializer::from_slice(&buf).into_iter::<serde_json::Value>();
            while let Some(Ok(m)) = messages.next() {
                used = messages.byte_offset();
                let error = m.get("errorDetail").and_then(|d| d.get("message")).or_else(|| m.get("error"));
                if let Some(detail) = error.and_then(|e| e.as_str()) {
                    output(format!("{detail}\n").as_bytes());
                    return Err(EngineError::Build(detail.to_string()));
                }
                if let Some(s) = m.get("stream").and_then(|s| s.as_str()) {
                    output(s.as_bytes());
                    if let Some(l) = s.lines().rev().find(|l| !l.trim().is_empty()) {
                        last_line = l.trim().to_string();
                    }
                }
            }
            buf.drain(..used);
            if chunk.is_none() {
                break;
            }
        }
        match self.local_image(tag).await? {
            Some(img) => img.id.ok_or_else(|| EngineError::Build("the built image has no id".into())),
            None => Err(EngineError::Build(format!("the build produced no image ({last_line})"))),
        }
    }

    /// Creates and starts a job container from `cfg`: the workspace and
    /// mounts bound, limits and network applied, the idle main process
    /// under the engine's init. `created` gets the id as soon as the
    /// container exists (before it is started), so that a failed start
    /// still leaves it to whoever removes it. Returns the id.
    pub async fn start_idle(&self, cfg: &ContainerConfig, created: impl FnOnce(&str)) -> Result<String, String> {
        tokio::fs::create_dir_all(&cfg.workspace).await.map_err(|e| e.to_string())?;
        let ws = cfg.workspace.canonicalize().map_err(|e| e.to_string())?;
        let mut binds = vec![format!("{}:{CONTAINER_WORKSPACE}:rw", ws.display())];
        for (dir, at) in &cfg.mounts {
            if !at.starts_with('/') || at.contains(':') || at.contains(',') {
                return Err(format!("cannot mount a directory at `{at}`: not a plain absolute path"));
            }
            let dir = dir.canonicalize().map_err(|e| format!("{}: {e}", dir.display()))?;
            binds.push(format!("{}:{at}:rw", dir.display()));
        }
        let host = job_host_config(cfg, binds);
        let body = ContainerCreateBody {
            image: Some(cfg.image.clone()),
            entrypoint: Some(vec!["/bin/sh".into(), "-c".into(), IDLE.into()]),
            cmd: Some(vec![]),
            working_dir: Some(CONTAINER_WORKSPACE.into()),
            env: Some(vec!["CI=true".into()]),
            labels: Some(cfg.labels.clone().into_iter().collect()),
            hostname: Some("kiln".into()),
            host_config: Some(host),
            ..Default::default()
        };
        let t = std::time::Instant::now();
        let made = self
            .docker
            .create_container(None::<CreateContainerOptions>, body)
            .await
            .map_err(|e| format!("cannot create a container from {}: {e}", cfg.image))?;
        created(&made.id);
        let t_create = t.elapsed();
        self.docker.start_container(&made.id, None).await.map_err(|e| format!("cannot start the container: {e}"))?;
        tracing::debug!(container = %made.id, create_ms = ms(t_create), start_ms = ms(t.elapsed() - t_create),
            "container created and started");
        Ok(made.id)
    }

    /// Removes a container in the background (see [`Engine::settle`]).
    pub fn discard(&self, id: String) {
        self.remove_in_background(id);
    }

    /// SIGKILLs and removes every container labelled `kiln.agent=<agent>`
    /// (left by a previous process of this agent). Returns how many.
    pub async fn reap(&self, agent: &str) -> Result<usize, EngineError> {
        let ids = self.containers_labelled(LABEL_AGENT, agent).await?;
        for id in &ids {
            remove_container(&self.docker, id).await;
        }
        Ok(ids.len())
    }

    /// Containers carrying `label=value` (any state): their ids.
    ///
    /// A raw request: Podman reports states (`stopped`) that bollard's
    /// typed container list refuses to decode.
    pub async fn containers_labelled(&self, label: &str, value: &str) -> Result<Vec<String>, EngineError> {
        let filters = serde_json::json!({ "label": [format!("{label}={value}")] }).to_string();
        let path = format!("/v1.41/containers/json?all=1&filters={}", percent_encode(&filters));
        let body = self.raw_get(&path).await?;
        let list: Vec<serde_json::Value> =
            serde_json::from_slice(&body).map_err(|e| EngineError::Api(format!("container list: {e}")))?;
        Ok(list.iter().filter_map(|c| c.get("Id").and_then(|i| i.as_str()).map(str::to_string)).collect())
    }

    /// `GET path` over HTTP/1.0 (the engine closes the connection after the
    /// body, which is never chunked).
    async fn raw_get(&self, path: &str) -> Result<Vec<u8>, EngineError> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let request = format!("GET {path} HTTP/1.0\r\nHost: engine\r\n\r\n");
        let err = |e: std::io::Error| EngineError::Api(format!("{}: {e}", self.url));
        let mut response = Vec::new();
        let io = async {
            if let Some(sock) =
                self.url.strip_prefix("unix://").or(self.url.starts_with('/').then_some(self.url.as_str()))
            {
                let mut s = tokio::net::UnixStream::connect(sock).await?;
                s.write_all(request.as_bytes()).await?;
                s.read_to_end(&mut response).await?;
            } else {
                let addr = self.url.trim_start_matches("tcp://").trim_start_matches("http://").trim_end_matches('/');
                let mut s = tokio::net::TcpStream::connect(addr).await?;
                s.write_all(request.as_bytes()).await?;
                s.read_to_end(&mut response).await?;
            }
            Ok::<_, std::io::Error>(())
        };
        tokio::time::timeout(Duration::from_secs(30), io)
            .await
            .map_err(|_| EngineError::Api(format!("{}: no answer within 30 s", self.url)))?
            .map_err(err)?;
        let split = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| EngineError::Api("malformed HTTP response from the engine".into()))?;
        let head = String::from_utf8_lossy(&response[..split]);
        let status = head.split_whitespace().nth(1).unwrap_or("");
        if status != "200" {
            return Err(EngineError::Api(format!("GET {path}: {}", head.lines().next().unwrap_or(""))));
        }
        Ok(response[split + 4..].to_vec())
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Dockerfile outside the build context is sent at most this large.
const MAX_DOCKERFILE: u64 = 1 << 20;

/// The names of a relative path (`.` and empty ones dropped); `None` for a
/// path with a root or a `..`.
fn names_of(rel: &str) -> Option<Vec<&str>> {
    if rel.starts_with('/') {
        return None;
    }
    let names: Vec<&str> = rel.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    (!names.contains(&"..")).then_some(names)
}

/// The Dockerfile's path inside the context, if it is there (by name).
fn dockerfile_in_context(dockerfile: &str, context: &str) -> Option<String> {
    let (d, c) = (names_of(dockerfile)?, names_of(context)?);
    (d.len() > c.len() && d.starts_with(&c)).then(|| d[c.len()..].join("/"))
}

/// Opens `rel` below `dir` one name at a time without following a symbolic
/// link; the error says why (to follow the path's name in a message).
fn open_below(dir: &Path, rel: &str, want_dir: bool) -> Result<std::os::fd::OwnedFd, String> {
    use nix::fcntl::{OFlag, open, openat};
    use nix::sys::stat::Mode;
    let names = names_of(rel).ok_or_else(|| "leaves the checkout (an absolute path or `..`)".to_string())?;
    let dflags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut cur = open(dir, dflags, Mode::empty()).map_err(|e| format!("cannot be opened: {e}"))?;
    let last = names.len().checked_sub(1);
    for (i, name) in names.iter().enumerate() {
        let flags = match (Some(i) == last, want_dir) {
            (true, false) => OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            _ => dflags,
        };
        // `O_DIRECTORY | O_NOFOLLOW` on a link says ENOTDIR: look at it.
        let is_link = |cur: &std::os::fd::OwnedFd| {
            nix::sys::stat::fstatat(cur, *name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK)
        };
        cur = match openat(&cur, *name, flags | OFlag::O_NOFOLLOW, Mode::empty()) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ELOOP) => {
                return Err("is, or is reached through, a symbolic link: the checkout is never left".into());
            }
            Err(nix::errno::Errno::ENOTDIR) if is_link(&cur) => {
                return Err("is, or is reached through, a symbolic link: the checkout is never left".into());
            }
            Err(nix::errno::Errno::ENOENT) => return Err("is not in the checkout".into()),
            Err(nix::errno::Errno::ENOTDIR) => {
                return Err("is not a directory of the checkout, or is reached through a file".into());
            }
            Err(e) => return Err(format!("cannot be opened: {e}")),
        };
    }
    let st = nix::sys::stat::fstat(&cur).map_err(|e| format!("cannot be read: {e}"))?;
    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let is_file = st.st_mode & libc::S_IFMT == libc::S_IFREG;
    match want_dir {
        true if !is_dir => Err("is not a directory of the checkout".into()),
        false if !is_file => Err("is not a file of the checkout".into()),
        _ => Ok(cur),
    }
}

/// Packs a build context: regular files, directories and symlinks (as links).
fn context_tar(dir: &Path, extra_dockerfile: Option<&[u8]>) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Deterministic);
    b.append_dir_all(".", dir)?;
    if let Some(df) = extra_dockerfile {
        let mut h = tar::Header::new_gnu();
        h.set_size(df.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, ".kiln.Dockerfile", df)?;
    }
    b.into_inner()
}

pub(crate) async fn remove_container(docker: &Docker, id: &str) {
    // SIGKILL first: a forced remove would otherwise stop with SIGTERM and
    // the engine's stop timeout.
    let _ = docker.kill_container(id, Some(KillContainerOptions { signal: "SIGKILL".into() })).await;
    if let Err(e) =
        docker.remove_container(id, Some(RemoveContainerOptions { force: true, v: true, link: false })).await
        && !matches!(e, bollard::errors::Error::DockerResponseServerError { status_code: 404, .. })
    {
        tracing::warn!(container = id, error = %e, "cannot remove container");
    }
}

/// The container's network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// No network at all (loopback only).
    None,
    /// The engine's default network (outbound access).
    Bridge,
    /// A network of the attempt's own, shared with its services (see
    /// [`crate::Services`]).
    Named(String),
}

impl Network {
    fn mode(&self) -> String {
        match self {
            Network::None => "none".into(),
            Network::Bridge => "bridge".into(),
            Network::Named(n) => n.clone(),
        }
    }
}

impl std::str::FromStr for Network {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Network::None),
            "bridge" | "default" => Ok(Network::Bridge),
            _ => Err(format!("unknown container network `{s}` (use none or bridge)")),
        }
    }
}

/// Resource limits of a job's container.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub cpus: f64,
    pub memory_bytes: i64,
    pub pids: i64,
}

impl Limits {
    /// Per size class (`runs-on: {size: small|medium|large}`); `None` or an
    /// unknown class is `medium`. CPUs are capped to what the host has.
    pub fn for_size(size: Option<&str>) -> Limits {
        const GIB: i64 = 1024 * 1024 * 1024;
        let (cpus, memory_bytes, pids) = match size {
            Some("small") => (1.0, 2 * GIB, 512),
            Some("large") => (4.0, 8 * GIB, 4096),
            _ => (2.0, 4 * GIB, 1024),
        };
        let host = std::thread::available_parallelism().map(|n| n.get() as f64).unwrap_or(1.0);
        Limits { cpus: f64::min(cpus, host), memory_bytes, pids }
    }
}

/// The capabilities a job container's processes keep (issue 39, item 10):
/// everything else is dropped (`CapDrop: ALL`). What a root step of a
/// common image needs to install and run software: `apt-get`/`dpkg`
/// (files of other owners and their modes: CHOWN, DAC_OVERRIDE, FOWNER,
/// FSETID for set-group-id files; `_apt`'s privilege drop: SETUID, SETGID),
/// a step stopping the processes it started as another user (KILL), and a
/// test server on a port below 1024 (NET_BIND_SERVICE). Left out of the
/// engines' defaults: MKNOD, NET_RAW (raw packets, ARP/ICMP spoofing on the
/// job's network), SYS_CHROOT, SETPCAP, SETFCAP (file capabilities, e.g.
/// `setcap` in `iputils-ping`'s install, which falls back to set-user-id),
/// AUDIT_WRITE.
pub const JOB_CAPABILITIES: [&str; 8] =
    ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "NET_BIND_SERVICE"];

/// The engine settings of a job container: `binds` only (the workspace and
/// the job's own directories: its output dir and cache mounts, all in the
/// attempt's sandbox), the limits (CPU, memory without swap beyond it, a
/// pids limit), the network, an init, every capability dropped but
/// [`JOB_CAPABILITIES`], and `no-new-privileges` (a set-user-id binary of
/// the image gains nothing). Not privileged, no devices, the engine's
/// default seccomp profile and masked `/proc` paths. The image's `USER`,
/// when it names one, is kept: such steps run without any capability.
pub(crate) fn job_host_config(cfg: &ContainerConfig, binds: Vec<String>) -> HostConfig {
    HostConfig {
        binds: Some(binds),
        network_mode: Some(cfg.network.mode()),
        nano_cpus: Some((cfg.limits.cpus * 1e9) as i64),
        memory: Some(cfg.limits.memory_bytes),
        memory_swap: Some(cfg.limits.memory_bytes),
        pids_limit: Some(cfg.limits.pids),
        init: Some(true),
        cap_drop: Some(vec!["ALL".into()]),
        cap_add: Some(JOB_CAPABILITIES.iter().map(|c| c.to_string()).collect()),
        privileged: Some(false),
        security_opt: Some(vec!["no-new-privileges".into()]),
        ..Default::default()
    }
}

#[derive(Debug, Clone)]
pub struct ContainerConfig {
    /// The image reference returned by [`Engine::ensure_image`].
    pub image: String,
    /// Host directory mounted at [`CONTAINER_WORKSPACE`].
    pub workspace: PathBuf,
    /// More (host directory, absolute path in the container) read-write
    /// mounts: the job's absolute cache paths.
    pub mounts: Vec<(PathBuf, String)>,
    /// `kiln.agent`, `kiln.job`, `kiln.epoch`, `kiln.run`, …
    pub labels: BTreeMap<String, String>,
    pub limits: Limits,
    pub network: Network,
    /// Time between SIGTERM and SIGKILL when killing.
    pub kill_grace: Duration,
}

pub struct ContainerExecutor {
    engine: Engine,
    cfg: ContainerConfig,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    container: Option<String>,
    /// The container was adopted warm and no step ran in it yet.
    adopted: bool,
    killed: bool,
    running: Option<Running>,
}

#[derive(Clone)]
struct Running {
    killing: Arc<AtomicBool>,
    done: watch::Receiver<bool>,
}

impl ContainerExecutor {
    pub fn new(engine: Engine, cfg: ContainerConfig) -> Self {
        ContainerExecutor { engine, cfg, inner: Arc::default() }
    }

    /// The container's id once prepared.
    pub fn container_id(&self) -> Option<String> {
        self.inner.lock().expect("executor lock").container.clone()
    }

    /// A container already created and started from `cfg` by
    /// [`Engine::start_idle`] (a warm one, never used by any job): `prepare`
    /// has nothing left to do. Should it be gone by the first step (removed
    /// or killed behind the agent's back), a fresh one is created from `cfg`
    /// as `prepare` would have.
    pub fn adopt(engine: Engine, cfg: ContainerConfig, container: String) -> Self {
        let inner = Inner { container: Some(container), adopted: true, ..Default::default() };
        ContainerExecutor { engine, cfg, inner: Arc::new(Mutex::new(inner)) }
    }

    async fn create(&self) -> Result<(), SandboxError> {
        if self.inner.lock().expect("executor lock").container.is_some() {
            return Ok(());
        }
        self.create_fresh().await
    }

    async fn create_fresh(&self) -> Result<(), SandboxError> {
        let prep = |e: String| SandboxError::Prepare {
            path: self.cfg.workspace.display().to_string(),
            source: std::io::Error::other(e),
        };
        let id = self.engine.start_idle(&self.cfg, |id| {
            self.inner.lock().expect("executor lock").container = Some(id.to_string());
        });
        id.await.map_err(prep)?;
        Ok(())
    }

    async fn start(&self, step: &StepRequest) -> Result<StepHandle, SandboxError> {
        let spawn_err = |e: String| SandboxError::Spawn { step: step.name.clone(), source: std::io::Error::other(e) };
        let (container, killing, done_tx) = {
            let mut inner = self.inner.lock().expect("executor lock");
            if inner.killed {
                return Err(SandboxError::Killed);
            }
            if inner.running.is_some() {
                return Err(SandboxError::Busy);
            }
            let Some(c) = inner.container.clone() else {
                return Err(spawn_err("the sandbox was not prepared".into()));
            };
            let killing = Arc::new(AtomicBool::new(false));
            let (done_tx, done_rx) = watch::channel(false);
            inner.running = Some(Running { killing: killing.clone(), done: done_rx });
            (c, killing, done_tx)
        };
        let release = || self.inner.lock().expect("executor lock").running = None;
        let mut env = step.env.clone();
        if env.contains_key("KILN_WORKSPACE") {
            env.insert("KILN_WORKSPACE".into(), CONTAINER_WORKSPACE.into());
        }
        let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let exec = CreateExecOptions {
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            cmd: Some({
                let mut argv = if step.program.is_empty() {
                    vec!["sh".to_string(), "-e".into(), "-c".into()]
                } else {
                    step.program.clone()
                };
                argv.push(step.command.clone());
                argv
            }),
            env: Some(env),
            working_dir: Some(match &step.working_dir {
                Some(d) => format!("{CONTAINER_WORKSPACE}/{d}"),
                None => CONTAINER_WORKSPACE.into(),
            }),
            ..Default::default()
        };
        let docker = self.engine.docker.clone();
        let t = std::time::Instant::now();
        let adopted = std::mem::take(&mut self.inner.lock().expect("executor lock").adopted);
        let created = match docker.create_exec(&container, exec.clone()).await {
            Ok(c) => Ok(c),
            Err(e) if adopted => {
                // The warm container is gone or stopped: nothing of the job
                // ran in it. Replace it with a fresh one, as `prepare` would
                // have made.
                tracing::warn!(container = %container, error = %e, "the warm container cannot run steps; creating a fresh one");
                self.inner.lock().expect("executor lock").container = None;
                self.engine.remove_in_background(container);
                match self.create_fresh().await {
                    Ok(()) => {
                        let c = self.inner.lock().expect("executor lock").container.clone().unwrap_or_default();
                        docker.create_exec(&c, exec).await
                    }
                    Err(e) => {
                        release();
                        return Err(spawn_err(e.to_string()));
                    }
                }
            }
            Err(e) => Err(e),
        };
        let created = match created {
            Ok(c) => c,
            Err(e) => {
                release();
                return Err(spawn_err(e.to_string()));
            }
        };
        let t_create = t.elapsed();
        let opts = StartExecOptions { detach: false, tty: false, output_capacity: Some(OUTPUT_CAPACITY) };
        let output = match docker.start_exec(&created.id, Some(opts)).await {
            Ok(StartExecResults::Attached { output, .. }) => output,
            Ok(StartExecResults::Detached) => {
                release();
                return Err(spawn_err("the engine detached the step".into()));
            }
            Err(e) => {
                release();
                return Err(spawn_err(e.to_string()));
            }
        };
        let t_start = t.elapsed();
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let inner = self.inner.clone();
        let name = step.name.clone();
        tokio::spawn(async move {
            let mut output = output;
            let mut consumer = true;
            while let Some(item) = output.next().await {
                let (stream, bytes) = match item {
                    Ok(bollard::container::LogOutput::StdOut { message }) => (OutputStream::Stdout, message),
                    Ok(bollard::container::LogOutput::StdErr { message }) => (OutputStream::Stderr, message),
                    Ok(bollard::container::LogOutput::Console { message }) => (OutputStream::Stdout, message),
                    Ok(bollard::container::LogOutput::StdIn { .. }) => continue,
                    Err(e) => {
                        tracing::debug!(step = %name, error = %e, "step output stream ended with an error");
                        break;
                    }
                };
                if consumer && !bytes.is_empty() {
                    consumer = tx.send(StepEvent::Output { stream, data: bytes }).await.is_ok();
                }
            }
            let t_output = t.elapsed();
            let code = exit_code(&docker, &created.id).await;
            tracing::debug!(step = %name, exec_create_ms = ms(t_create), exec_start_ms = ms(t_start - t_create),
                output_ms = ms(t_output - t_start), exit_inspect_ms = ms(t.elapsed() - t_output), "step exec phases");
            let exit = match code {
                Some(c) if killing.load(Ordering::SeqCst) && c > 128 => StepExit::Signal((c - 128) as i32),
                Some(c) => StepExit::Code(c as i32),
                // The container is gone (killed): report the signal that ended it.
                None if killing.load(Ordering::SeqCst) => StepExit::Signal(libc::SIGKILL),
                None => StepExit::Code(-1),
            };
            inner.lock().expect("executor lock").running = None;
            let _ = done_tx.send(true);
            let _ = tx.send(StepEvent::Exited(exit)).await;
        });
        Ok(StepHandle::new(rx))
    }

    /// Terminates the running step; `for_good`: and every later one.
    async fn kill_running(&self, for_good: bool) {
        let (container, running) = {
            let mut inner = self.inner.lock().expect("executor lock");
            inner.killed |= for_good;
            (inner.container.clone(), inner.running.clone())
        };
        let (Some(container), Some(mut r)) = (container, running) else { return };
        let docker = &self.engine.docker;
        let id = container.as_str();
        let signal_all = |signal: &'static str| async move {
            // To everything but the init (and the idle shell, which ignores TERM).
            let exec = CreateExecOptions::<String> {
                cmd: Some(vec!["sh".into(), "-c".into(), format!("kill -{signal} -1")]),
                ..Default::default()
            };
            if let Ok(e) = docker.create_exec(id, exec).await {
                let _ = docker
                    .start_exec(&e.id, Some(StartExecOptions { detach: true, tty: false, output_capacity: None }))
                    .await;
            }
        };
        if !r.killing.swap(true, Ordering::SeqCst) {
            signal_all("TERM").await;
        }
        if !for_good {
            // A step's own timeout: the container stays for the next steps.
            if tokio::time::timeout(self.cfg.kill_grace, r.done.wait_for(|d| *d)).await.is_err() {
                signal_all("KILL").await;
            }
            let _ = r.done.wait_for(|d| *d).await;
            return;
        }
        if tokio::time::timeout(self.cfg.kill_grace, r.done.wait_for(|d| *d)).await.is_err() {
            tracing::info!(container = %container, "step ignored SIGTERM; killing its container");
            let _ = self
                .engine
                .docker
                .kill_container(&container, Some(KillContainerOptions { signal: "SIGKILL".into() }))
                .await;
        }
        let _ = r.done.wait_for(|d| *d).await;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The exec's exit code once it stopped running; `None` if the engine lost it.
async fn exit_code(docker: &Docker, exec_id: &str) -> Option<i64> {
    let mut pause = Duration::from_millis(2);
    for _ in 0..200 {
        match docker.inspect_exec(exec_id).await {
            Ok(i) if i.running != Some(true) => return i.exit_code,
            Ok(_) => {}
            Err(_) => return None,
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    None
}

impl Executor for ContainerExecutor {
    fn prepare(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        self.create().boxed()
    }

    fn exec<'a>(&'a self, step: &'a StepRequest) -> BoxFuture<'a, Result<StepHandle, SandboxError>> {
        self.start(step).boxed()
    }

    fn kill(&self) -> BoxFuture<'_, ()> {
        self.kill_running(true).boxed()
    }

    fn interrupt(&self) -> BoxFuture<'_, ()> {
        self.kill_running(false).boxed()
    }

    fn cleanup(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        async move {
            self.kill_running(true).await;
            let container = self.inner.lock().expect("executor lock").container.take();
            if let Some(id) = container {
                // What steps left running is SIGKILLed at once (SIGUSR1 to the
                // idle shell: `kill -KILL -1`, a few ms); stopping and removing
                // the container takes the engine 100-400 ms more, which need
                // not delay the job's completion.
                let docker = &self.engine.docker;
                let t = std::time::Instant::now();
                let _ = docker.kill_container(&id, Some(KillContainerOptions { signal: "SIGUSR1".into() })).await;
                tracing::debug!(container = %id, kill_ms = ms(t.elapsed()), "leftover processes killed");
                self.engine.remove_in_background(id);
            }
            Ok(())
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories_are_normalised() {
        assert_eq!(repository_of("127.0.0.1:5000/kiln-test/base:latest"), "127.0.0.1:5000/kiln-test/base");
        assert_eq!(repository_of("127.0.0.1:5000/kiln-test/base"), "127.0.0.1:5000/kiln-test/base");
        assert_eq!(repository_of("localhost/a:1@sha256:00"), "localhost/a");
        assert_eq!(repository_of("busybox:1.36"), "docker.io/library/busybox");
        assert_eq!(repository_of("user/app"), "docker.io/user/app");
        assert_eq!(
            repository_of("registry.example.com/ci/jdk17-maven:approved"),
            "registry.example.com/ci/jdk17-maven"
        );
    }

    #[test]
    fn a_job_container_keeps_only_the_minimal_capabilities_and_mounts_only_what_it_is_given() {
        let cfg = ContainerConfig {
            image: "img".into(),
            workspace: "/ws".into(),
            mounts: vec![],
            labels: BTreeMap::new(),
            limits: Limits::for_size(None),
            network: Network::None,
            kill_grace: Duration::from_secs(1),
        };
        let h = job_host_config(&cfg, vec!["/ws:/workspace:rw".into()]);
        assert_eq!(h.cap_drop.as_deref(), Some(&["ALL".to_string()][..]));
        let added = h.cap_add.unwrap();
        for absent in ["SYS_ADMIN", "NET_RAW", "MKNOD", "SYS_CHROOT", "SETFCAP", "SETPCAP", "SYS_PTRACE"] {
            assert!(!added.iter().any(|c| c == absent), "{absent} in {added:?}");
        }
        assert_eq!(h.security_opt, Some(vec!["no-new-privileges".to_string()]));
        assert_eq!(h.pids_limit, Some(1024));
        assert_eq!(h.privileged, Some(false));
        assert_eq!(h.binds, Some(vec!["/ws:/workspace:rw".to_string()]), "nothing of the host beyond what is given");
        assert!(h.mounts.is_none() && h.devices.is_none() && h.volumes_from.is_none());
    }

    #[test]
    fn size_classes() {
        assert!(Limits::for_size(Some("small")).memory_bytes < Limits::for_size(None).memory_bytes);
        assert!(Limits::for_size(Some("large")).pids > Limits::for_size(Some("medium")).pids);
        assert!(Limits::for_size(Some("large")).cpus <= std::thread::available_parallelism().unwrap().get() as f64);
    }
}
