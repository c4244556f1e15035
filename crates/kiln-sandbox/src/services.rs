//! A job's service containers (`services:` in the workflow): started from
//! their pinned images on a network of the attempt's own, reachable from
//! the job's container by name (a network alias), or on loopback ports for
//! a host job; health-checked before the first step; removed at the end.
//!
//! Everything created carries the attempt's labels (`kiln.agent`, …) and
//! `kiln.service`, so an agent that was killed removes what it left on its
//! next start ([`Engine::reap`], [`Engine::reap_networks`]).

use crate::container::{Engine, EngineError, LABEL_AGENT, PinnedImage, remove_container};
use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, NetworkCreateRequest, NetworkingConfig, PortBinding,
};
use bollard::query_parameters::{CreateContainerOptions, ListNetworksOptions, LogsOptions};
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::sync::mpsc;

/// Label naming the service a container is.
pub const LABEL_SERVICE: &str = "kiln.service";
/// The most of a failed service's log attached to the job's log.
pub const FAILED_LOG_TAIL: usize = 64 * 1024;

/// One service to start.
#[derive(Debug, Clone)]
pub struct ServiceRequest {
    /// Its name: a DNS label, the network alias the job reaches it by.
    pub name: String,
    pub image: PinnedImage,
    pub env: BTreeMap<String, String>,
    pub ports: Vec<u16>,
    /// Replaces the image's command when not empty.
    pub command: Vec<String>,
    pub health: Option<HealthCheck>,
}

/// `cmd` (with `sh -c`) inside the service every `interval` until it exits
/// 0, at most `retries` times.
#[derive(Debug, Clone)]
pub struct HealthCheck {
    pub cmd: String,
    pub interval: Duration,
    pub retries: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("service `{name}`: {source}")]
    Engine {
        name: String,
        #[source]
        source: EngineError,
    },
    #[error("service `{name}` did not become healthy: {why}")]
    Unhealthy { name: String, why: String, log: String },
}

/// The started services of one attempt.
pub struct Services {
    docker: Docker,
    network: String,
    started: Vec<(String, String)>,
    /// Per service, (container port, loopback port on the host).
    pub host_ports: BTreeMap<String, Vec<(u16, u16)>>,
}

impl Engine {
    /// Create the network `network` and start `services` on it, each with
    /// `labels` (plus [`LABEL_SERVICE`]). With `publish`, each port is
    /// published on 127.0.0.1 at a port the engine picks (for host jobs).
    /// An `internal` network has no outbound access.
    /// On an error, whatever was started is removed again.
    pub async fn start_services(
        &self,
        network: &str,
        labels: &BTreeMap<String, String>,
        services: &[ServiceRequest],
        publish: bool,
        internal: bool,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Services, ServiceError> {
        let docker = self.docker.clone();
        let mut set = Services {
            docker: docker.clone(),
            network: network.to_string(),
            started: Vec::new(),
            host_ports: BTreeMap::new(),
        };
        let net_err = |e: bollard::errors::Error| ServiceError::Engine {
            name: services.first().map(|s| s.name.clone()).unwrap_or_default(),
            source: EngineError::Api(format!("cannot create the services' network: {e}")),
        };
        docker
            .create_network(NetworkCreateRequest {
                name: network.to_string(),
                driver: Some("bridge".into()),
                internal: Some(internal),
                labels: Some(labels.clone().into_iter().collect()),
                ..Default::default()
            })
            .await
            .map_err(net_err)?;
        for svc in services {
            if let Err(e) = set.start_one(self, labels, svc, publish, progress).await {
                set.remove().await;
                return Err(e);
            }
        }
        Ok(set)
    }

    /// Remove the networks labelled `kiln.agent=<agent>` (after
    /// [`Engine::reap`] removed their containers). Returns how many.
    pub async fn reap_networks(&self, agent: &str) -> Result<usize, EngineError> {
        let filters = HashMap::from([("label".to_string(), vec![format!("{LABEL_AGENT}={agent}")])]);
        let nets = self
            .docker
            .list_networks(Some(ListNetworksOptions { filters: Some(filters) }))
            .await
            .map_err(|e| EngineError::Api(e.to_string()))?;
        let mut n = 0;
        for net in nets {
            if let Some(name) = net.name
                && self.docker.remove_network(&name).await.is_ok()
            {
                n += 1;
            }
        }
        Ok(n)
    }
}

impl Services {
    /// The network the job's container joins.
    pub fn network(&self) -> &str {
        &self.network
    }

    async fn start_one(
        &mut self,
        engine: &Engine,
        labels: &BTreeMap<String, String>,
        svc: &ServiceRequest,
        publish: bool,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> Result<(), ServiceError> {
        let err = |source: EngineError| ServiceError::Engine { name: svc.name.clone(), source };
        let image = engine.ensure_image(&svc.image, progress).await.map_err(err)?;
        let mut labels = labels.clone();
        labels.insert(LABEL_SERVICE.into(), svc.name.clone());
        let port_key = |p: u16| format!("{p}/tcp");
        let bindings = publish.then(|| {
            svc.ports
                .iter()
                .map(|p| {
                    let b = PortBinding { host_ip: Some("127.0.0.1".into()), host_port: Some(String::new()) };
                    (port_key(*p), Some(vec![b]))
                })
                .collect::<HashMap<_, _>>()
        });
        let endpoint = EndpointSettings { aliases: Some(vec![svc.name.clone()]), ..Default::default() };
        let body = ContainerCreateBody {
            image: Some(image),
            cmd: (!svc.command.is_empty()).then(|| svc.command.clone()),
            env: Some(svc.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(labels.into_iter().collect()),
            hostname: Some(svc.name.clone()),
            exposed_ports: publish.then(|| svc.ports.iter().map(|p| port_key(*p)).collect()),
            host_config: Some(HostConfig {
                network_mode: Some(self.network.clone()),
                port_bindings: bindings,
                init: Some(true),
                security_opt: Some(vec!["no-new-privileges".into()]),
                ..Default::default()
            }),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(self.network.clone(), endpoint)])),
            }),
            ..Default::default()
        };
        let api = |e: bollard::errors::Error| err(EngineError::Api(e.to_string()));
        let created = self.docker.create_container(None::<CreateContainerOptions>, body).await.map_err(api)?;
        self.started.push((svc.name.clone(), created.id.clone()));
        self.docker.start_container(&created.id, None).await.map_err(api)?;
        if publish && !svc.ports.is_empty() {
            let info = self.docker.inspect_container(&created.id, None).await.map_err(api)?;
            let ports = info.network_settings.and_then(|n| n.ports).unwrap_or_default();
            let mut mapped = Vec::new();
            for p in &svc.ports {
                let host = ports
                    .get(&port_key(*p))
                    .and_then(|b| b.as_ref())
                    .and_then(|b| b.iter().find_map(|x| x.host_port.as_deref()?.parse::<u16>().ok()));
                match host {
                    Some(h) => mapped.push((*p, h)),
                    None => return Err(err(EngineError::Api(format!("port {p} was not published")))),
                }
            }
            self.host_ports.insert(svc.name.clone(), mapped);
        }
        Ok(())
    }

    /// Wait until every service's health check passes (a service without
    /// one: until its container runs). The first that fails, or whose
    /// container exits, is the error, with the end of its log.
    pub async fn wait_healthy(&self, services: &[ServiceRequest]) -> Result<(), ServiceError> {
        let checks = services.iter().map(|svc| async move {
            let Some(id) = self.id_of(&svc.name) else { return Ok(()) };
            let Some(h) = &svc.health else {
                return match self.running(id).await {
                    Ok(true) => Ok(()),
                    _ => Err(self.unhealthy(svc, id, "its container exited".into()).await),
                };
            };
            let mut last = String::new();
            for n in 0..h.retries {
                if n > 0 {
                    tokio::time::sleep(h.interval).await;
                }
                if !self.running(id).await.unwrap_or(false) {
                    return Err(self.unhealthy(svc, id, "its container exited".into()).await);
                }
                match self.exec(id, &h.cmd).await {
                    Ok((0, _)) => return Ok(()),
                    Ok((code, out)) => last = format!("`{}` exited {code}{}", h.cmd, tail_note(&out)),
                    Err(e) => last = format!("cannot run `{}`: {e}", h.cmd),
                }
            }
            Err(self
                .unhealthy(svc, id, format!("{} checks every {:?} failed; the last: {last}", h.retries, h.interval))
                .await)
        });
        for r in futures::future::join_all(checks).await {
            r?;
        }
        Ok(())
    }

    async fn unhealthy(&self, svc: &ServiceRequest, id: &str, why: String) -> ServiceError {
        ServiceError::Unhealthy { name: svc.name.clone(), why, log: self.tail(id, FAILED_LOG_TAIL).await }
    }

    fn id_of(&self, name: &str) -> Option<&str> {
        self.started.iter().find(|(n, _)| n == name).map(|(_, id)| id.as_str())
    }

    async fn running(&self, id: &str) -> Result<bool, bollard::errors::Error> {
        let info = self.docker.inspect_container(id, None).await?;
        Ok(info.state.and_then(|s| s.running).unwrap_or(false))
    }

    /// Run `sh -c cmd` in the container: exit code and output.
    async fn exec(&self, id: &str, cmd: &str) -> Result<(i64, String), bollard::errors::Error> {
        let exec = self
            .docker
            .create_exec(
                id,
                CreateExecOptions {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(vec!["sh".to_string(), "-c".into(), cmd.to_string()]),
                    ..Default::default()
                },
            )
            .await?;
        let mut out = Vec::new();
        if let StartExecResults::Attached { mut output, .. } = self
            .docker
            .start_exec(&exec.id, Some(StartExecOptions { detach: false, tty: false, output_capacity: None }))
            .await?
        {
            while let Some(Ok(chunk)) = output.next().await {
                if out.len() < 4096 {
                    out.extend_from_slice(&chunk.into_bytes());
                }
            }
        }
        let code = self.docker.inspect_exec(&exec.id).await?.exit_code.unwrap_or(-1);
        Ok((code, String::from_utf8_lossy(&out).into_owned()))
    }

    /// The last `max` bytes of a container's output.
    async fn tail(&self, id: &str, max: usize) -> String {
        let opts = LogsOptions { stdout: true, stderr: true, tail: "500".into(), ..Default::default() };
        let mut logs = self.docker.logs(id, Some(opts));
        let mut out = Vec::new();
        while let Some(Ok(chunk)) = logs.next().await {
            out.extend_from_slice(&chunk.into_bytes());
        }
        let start = out.len().saturating_sub(max);
        String::from_utf8_lossy(&out[start..]).into_owned()
    }

    /// Follow every service's output, each line prefixed with `[name] `,
    /// into `tx` until the containers stop (or `tx` closes).
    pub fn follow_logs(&self, tx: mpsc::Sender<Vec<u8>>) {
        for (name, id) in &self.started {
            let (docker, id, name, tx) = (self.docker.clone(), id.clone(), name.clone(), tx.clone());
            tokio::spawn(async move {
                let opts =
                    LogsOptions { follow: true, stdout: true, stderr: true, tail: "all".into(), ..Default::default() };
                let mut logs = docker.logs(&id, Some(opts));
                let mut partial: Vec<u8> = Vec::new();
                while let Some(Ok(chunk)) = logs.next().await {
                    partial.extend_from_slice(&chunk.into_bytes());
                    let mut lines = Vec::new();
                    while let Some(i) = partial.iter().position(|b| *b == b'\n') {
                        lines.extend_from_slice(format!("[{name}] ").as_bytes());
                        lines.extend(partial.drain(..=i));
                    }
                    if !lines.is_empty() && tx.send(lines).await.is_err() {
                        return;
                    }
                }
                if !partial.is_empty() {
                    let mut line = format!("[{name}] ").into_bytes();
                    line.extend(partial);
                    line.push(b'\n');
                    let _ = tx.send(line).await;
                }
            });
        }
    }

    /// Kill and remove every service container, then the network.
    pub async fn remove(&mut self) {
        for (_, id) in self.started.drain(..) {
            remove_container(&self.docker, &id).await;
        }
        if let Err(e) = self.docker.remove_network(&self.network).await {
            tracing::warn!(network = %self.network, error = %e, "cannot remove the services' network");
        }
    }
}

fn tail_note(out: &str) -> String {
    let t = out.trim();
    if t.is_empty() {
        String::new()
    } else {
        let start = t.char_indices().rev().nth(300).map_or(0, |(i, _)| i);
        format!(": {}", &t[start..])
    }
}
