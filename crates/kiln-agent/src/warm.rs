//! Warm containers: spec 003's warm pool at the scale of one agent.
//!
//! Creating and starting a job's container costs the engine a few hundred
//! milliseconds (Podman + runc: the container's storage, namespaces,
//! cgroup, the init and idle process). After a container job of a pinned
//! image, the agent creates and starts the next container for that image,
//! limits and network in the background, with its own empty sandbox
//! directory (`ws/` bound at `/workspace`, `outputs/` at the outputs
//! directory). The next job of the same shape takes it: its sandbox
//! directory is renamed into the attempt's place (the bind mounts follow the
//! directory, not its name) and its steps are exec'd into it at once.
//!
//! A warm container is used by one job only, like a cold one: it is never
//! given back, and the job's cleanup removes it. It is fresh (no step ever
//! ran in it), so no job sees another's files, processes or environment.
//! It holds no credential: its environment is `CI=true`, each step's own
//! environment is set per exec. Its image is the digest an earlier attempt
//! verified (`repo@sha256:…`: the engine resolves it to that image only).
//! It carries `kiln.agent` (reaped with the agent's other containers when a
//! new agent process starts) and `kiln.warm`, not the job's labels (which
//! the engine cannot add later): the agent logs which job took which one.
//!
//! Only jobs whose container needs nothing chosen at run time are served
//! warm: a registry image pinned at acceptance, no services (their network
//! is the attempt's own), no absolute cache paths (mounted per attempt).

use crate::outputs;
use kiln_sandbox::{ContainerConfig, Engine, LABEL_AGENT, Limits, Network};
use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Label on warm containers (value: the image reference).
pub(crate) const LABEL_WARM: &str = "kiln.warm";

/// What a warm container must match to serve a job.
#[derive(Debug, Clone)]
pub(crate) struct WarmKey {
    /// `repository@sha256:…`, as [`Engine::ensure_image`] returns it.
    pub reference: String,
    pub limits: Limits,
    pub network: Network,
}

impl PartialEq for WarmKey {
    fn eq(&self, o: &Self) -> bool {
        self.reference == o.reference && self.limits == o.limits && self.network == o.network
    }
}

/// A started container nobody used, and its sandbox directory.
#[derive(Debug)]
pub(crate) struct Warm {
    pub id: String,
    /// Holds `ws/` (at `/workspace`) and `outputs/` (at [`outputs::CONTAINER_DIR`]).
    pub dir: PathBuf,
    /// `ws/`'s device and inode: the directory the container has bound.
    pub ws_ino: (u64, u64),
}

impl Warm {
    /// Whether `ws` is still the directory the container has bound.
    pub(crate) fn binds(&self, ws: &Path) -> bool {
        std::fs::symlink_metadata(ws).is_ok_and(|m| m.is_dir() && (m.dev(), m.ino()) == self.ws_ino)
    }
}

struct Slot {
    key: WarmKey,
    task: tokio::task::JoinHandle<Option<Warm>>,
}

/// An agent's warm containers: at most `capacity` (ready or being started).
pub(crate) struct WarmPool {
    engine: Engine,
    agent: String,
    /// Where their sandbox directories are made (the agent's sandbox root:
    /// the same filesystem as the attempts', for the rename).
    root: PathBuf,
    capacity: usize,
    slots: Mutex<Vec<Slot>>,
}

impl WarmPool {
    pub(crate) fn new(engine: Engine, agent: String, root: PathBuf, capacity: usize) -> Arc<WarmPool> {
        Arc::new(WarmPool { engine, agent, root, capacity, slots: Mutex::default() })
    }

    /// A warm container for `key` (waiting for one being started), if any.
    pub(crate) async fn take(&self, key: &WarmKey) -> Option<Warm> {
        let slot = {
            let mut slots = self.slots.lock().expect("warm slots");
            let i = slots.iter().position(|s| &s.key == key)?;
            slots.remove(i)
        };
        slot.task.await.ok().flatten()
    }

    /// Starts a container for `key` in the background unless one is there
    /// already; the oldest of another key makes room when the pool is full.
    pub(crate) fn refill(self: &Arc<Self>, key: &WarmKey) {
        if self.capacity == 0 {
            return;
        }
        let evicted = {
            let mut slots = self.slots.lock().expect("warm slots");
            if slots.iter().any(|s| &s.key == key) {
                return;
            }
            let evicted = if slots.len() >= self.capacity { Some(slots.remove(0)) } else { None };
            let pool = self.clone();
            let k = key.clone();
            slots.push(Slot { key: key.clone(), task: tokio::spawn(async move { pool.start(&k).await }) });
            evicted
        };
        if let Some(old) = evicted {
            let pool = self.clone();
            tokio::spawn(async move { pool.discard(old.task.await.ok().flatten()) });
        }
    }

    /// Removes a warm container and its directory (in the background).
    pub(crate) fn discard(&self, warm: Option<Warm>) {
        if let Some(w) = warm {
            self.engine.discard(w.id);
            tokio::task::spawn_blocking(move || kiln_sandbox::remove_tree(&w.dir));
        }
    }

    /// Removes a warm container whose directory is someone else's now.
    pub(crate) fn discard_container(&self, id: String) {
        self.engine.discard(id);
    }

    /// Removes every warm container (the agent stops).
    pub(crate) async fn drain(&self) {
        let slots = std::mem::take(&mut *self.slots.lock().expect("warm slots"));
        for s in slots {
            if let Ok(Some(w)) = s.task.await {
                self.engine.discard(w.id);
                let _ = tokio::task::spawn_blocking(move || kiln_sandbox::remove_tree(&w.dir)).await;
            }
        }
    }

    async fn start(&self, key: &WarmKey) -> Option<Warm> {
        let dir = self.root.join(format!(".warm-{}", uuid::Uuid::new_v4()));
        let made = async {
            std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
            let ws = dir.join("ws");
            std::fs::DirBuilder::new().mode(0o700).create(&ws)?;
            let out = outputs::prepare(&dir, true, None)?;
            let m = std::fs::symlink_metadata(&ws)?;
            std::io::Result::Ok((ws, out.dir, (m.dev(), m.ino())))
        }
        .await;
        let (ws, out_dir, ws_ino) = match made {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot make a warm container's directory");
                let _ = kiln_sandbox::remove_tree(&dir);
                return None;
            }
        };
        let cfg = ContainerConfig {
            image: key.reference.clone(),
            workspace: ws,
            mounts: vec![(out_dir, outputs::CONTAINER_DIR.to_string())],
            labels: BTreeMap::from([
                (LABEL_AGENT.to_string(), self.agent.clone()),
                (LABEL_WARM.to_string(), key.reference.clone()),
            ]),
            limits: key.limits,
            network: key.network.clone(),
            kill_grace: kiln_sandbox::DEFAULT_KILL_GRACE,
        };
        let mut made_id = None;
        match self.engine.start_idle(&cfg, |id| made_id = Some(id.to_string())).await {
            Ok(id) => Some(Warm { id, dir, ws_ino }),
            Err(e) => {
                tracing::warn!(image = %key.reference, error = %e, "cannot start a warm container");
                if let Some(id) = made_id {
                    self.engine.discard(id);
                }
                let _ = kiln_sandbox::remove_tree(&dir);
                None
            }
        }
    }
}
