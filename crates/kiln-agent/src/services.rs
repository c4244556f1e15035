//! A job's `services:` on the agent: started from their pinned images before
//! the first step, healthy or the attempt fails as infrastructure (with the
//! service's log in the job's `services` stream); their output follows in
//! that stream while the job runs; removed when the steps are done. A
//! container job joins the services' network and reaches each by name; a
//! host job gets loopback ports (`KILN_SERVICE_<NAME>_PORT`).

use crate::control::Control;
use crate::logs::{LogStreamer, Stream};
use crate::ran::Ran;
use kiln_api::types::{Assignment, ServiceSpec};
use kiln_sandbox::{Engine, HealthCheck, PinnedImage, ServiceError, ServiceRequest, Services, repository_of};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Started services, their output on its way into the log.
pub(crate) struct Running {
    engine: Engine,
    set: Services,
    output: Option<mpsc::Receiver<Vec<u8>>>,
    stopped: watch::Sender<bool>,
    /// Environment for the steps (host jobs: the published ports).
    pub env: BTreeMap<String, String>,
}

fn request(s: &ServiceSpec) -> ServiceRequest {
    let image = match &s.digest {
        Some(d) => PinnedImage::Registry { repository: repository_of(&s.image), digest: d.clone() },
        None => PinnedImage::Unpinned { reference: s.image.clone() },
    };
    ServiceRequest {
        name: s.name.clone(),
        image,
        env: s.env.clone(),
        ports: s.ports.clone(),
        command: s.command.clone(),
        health: s.health_cmd.as_ref().map(|cmd| HealthCheck {
            cmd: cmd.clone(),
            interval: Duration::from_millis(s.health_interval_ms.max(100)),
            retries: s.health_retries.max(1),
        }),
    }
}

/// `KILN_SERVICE_DB_PORT` for service `db` (its first port), and
/// `KILN_SERVICE_DB_PORT_5432` for each.
fn port_env(host_ports: &BTreeMap<String, Vec<(u16, u16)>>) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for (name, ports) in host_ports {
        let var = format!("KILN_SERVICE_{}", name.to_ascii_uppercase().replace('-', "_"));
        if let Some((_, host)) = ports.first() {
            env.insert(format!("{var}_PORT"), host.to_string());
            env.insert(format!("{var}_HOST"), "127.0.0.1".into());
        }
        for (container, host) in ports {
            env.insert(format!("{var}_PORT_{container}"), host.to_string());
        }
    }
    env
}

/// Start the job's services (none: `Ok(None)`). `engine` is the container
/// executor's; a host job connects to the agent's services engine. `internal`:
/// the services' network has no outbound access (container jobs whose
/// agent gives jobs no network). `services_engine`: the agent's
/// `--engine` for host jobs; `agent_name` labels what is started (for
/// reaping after a crash).
pub(crate) async fn start(
    services_engine: Option<&str>,
    agent_name: &str,
    a: &Assignment,
    engine: Option<&Engine>,
    internal: bool,
    ctl: &Control,
    logs: &LogStreamer,
) -> Result<Option<Running>, Ran> {
    if a.services.is_empty() {
        return Ok(None);
    }
    let publish = engine.is_none();
    let engine = match engine {
        Some(e) => e.clone(),
        None => {
            let Some(url) = services_engine else {
                return Err(Ran::Infra(
                    "the job declares `services`, which run in containers: this agent has no container engine (kiln agent --engine)".into(),
                ));
            };
            let e = Engine::connect(url).map_err(|e| Ran::Infra(format!("services need a container engine: {e}")))?;
            e.ping().await.map_err(|e| Ran::Infra(format!("services need a container engine: {e}")))?;
            e
        }
    };
    let requests: Vec<ServiceRequest> = a.services.iter().map(request).collect();
    let names: Vec<&str> = requests.iter().map(|r| r.name.as_str()).collect();
    logs.system(&format!("starting services: {}", names.join(", ")));
    let labels = BTreeMap::from([
        (kiln_sandbox::LABEL_AGENT.to_string(), agent_name.to_string()),
        (kiln_sandbox::LABEL_JOB.to_string(), a.job_id.clone()),
        (kiln_sandbox::LABEL_EPOCH.to_string(), a.epoch.to_string()),
        (kiln_sandbox::LABEL_RUN.to_string(), a.run_id.clone()),
    ]);
    let network = format!("kiln-{}-{}", a.job_id, a.epoch);
    let mut progress = |m: &str| logs.system_note(&format!("services: {m}"));
    let mut set = engine
        .start_services(&network, &labels, &requests, publish, internal, &mut progress)
        .await
        .map_err(|e| Ran::Infra(format!("cannot start the job's services: {e}")))?;
    let healthy = tokio::select! {
        r = set.wait_healthy(&requests) => r,
        _ = ctl.stopped() => {
            set.remove().await;
            return Err(Ran::Stopped);
        }
    };
    if let Err(e) = healthy {
        if let ServiceError::Unhealthy { name, log, .. } = &e {
            let mut text = String::new();
            for line in log.lines() {
                text.push_str(&format!("[{name}] {line}\n"));
            }
            logs.write(Stream::Services, text.as_bytes());
        }
        set.remove().await;
        return Err(Ran::Infra(format!("{e} (its log is in the job's `services` stream)")));
    }
    logs.system(&format!("services ready: {}", names.join(", ")));
    let (tx, rx) = mpsc::channel::<Vec<u8>>(64);
    set.follow_logs(tx);
    let env = port_env(&set.host_ports);
    Ok(Some(Running { engine, set, output: Some(rx), stopped: watch::channel(false).0, env }))
}

impl Running {
    /// The network a container job joins.
    pub(crate) fn network(&self) -> &str {
        self.set.network()
    }

    /// Copies the services' output into the `services` stream until they
    /// are stopped (then what is still on its way, for at most 2 s). Run it
    /// beside the steps.
    pub(crate) fn pump<'a>(&mut self, logs: &'a LogStreamer) -> impl std::future::Future<Output = ()> + 'a {
        let mut rx = self.output.take();
        let mut stopped = self.stopped.subscribe();
        async move {
            let Some(rx) = rx.as_mut() else { return };
            loop {
                tokio::select! {
                    b = rx.recv() => match b {
                        Some(bytes) => logs.write(Stream::Services, &bytes),
                        None => return,
                    },
                    _ = stopped.wait_for(|s| *s) => break,
                }
            }
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                while let Some(bytes) = rx.recv().await {
                    logs.write(Stream::Services, &bytes);
                }
            })
            .await;
        }
    }

    /// Remove the services (their output then ends), once the job's
    /// container has left their network.
    pub(crate) async fn stop(mut self) {
        self.engine.settle().await;
        self.set.remove().await;
        let _ = self.stopped.send(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ports_become_environment_variables() {
        let ports = BTreeMap::from([("my-db".to_string(), vec![(5432, 40001), (8080, 40002)])]);
        let env = port_env(&ports);
        assert_eq!(env.get("KILN_SERVICE_MY_DB_PORT").map(String::as_str), Some("40001"));
        assert_eq!(env.get("KILN_SERVICE_MY_DB_PORT_8080").map(String::as_str), Some("40002"));
        assert_eq!(env.get("KILN_SERVICE_MY_DB_HOST").map(String::as_str), Some("127.0.0.1"));
    }

    #[test]
    fn pinned_images_are_pulled_by_digest() {
        let spec = ServiceSpec {
            name: "db".into(),
            image: "127.0.0.1:5000/kiln-test/base:latest".into(),
            digest: Some("sha256:ab".into()),
            env: BTreeMap::new(),
            ports: vec![],
            command: vec![],
            health_cmd: None,
            health_interval_ms: 0,
            health_retries: 0,
        };
        assert_eq!(request(&spec).image.reference(), "127.0.0.1:5000/kiln-test/base@sha256:ab");
    }
}
