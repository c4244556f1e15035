//! `kiln bench`'s flags (embedded in the `kiln` binary's clap definition).

use clap::Args;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// What to measure: dispatch (no-op throughput, trigger-to-start and claim latency
    /// against a real `kiln server` and --agents `kiln agent` processes, per --configs;
    /// --embedded: against an in-process `kiln up` instead), artifacts
    /// (1 GiB upload + seal vs cp + sha256sum), failover (SIGKILL / SIGSTOP
    /// of an agent to its job claimed elsewhere), logs (200 MB of stdout
    /// ingested, durable before acknowledgement, vs a file write + fsync), or all;
    /// control-plane: simulated agents over HTTP drive claim → heartbeat →
    /// complete at spec 000 §3's peak rates against the real server and store;
    /// containers (a one-step job in a container vs on the host; needs --engine and --image, not in all);
    /// webhooks (1,000 signed deliveries in 10 s with repeats and forgeries, ack latency and webhook-to-start vs the API);
    /// cache (a 500 MB, 20,000-file cache saved and restored through real agents vs tar --zstd; --object-store; not in all);
    /// reports (a 10 MB JUnit file and a 10 MB TAP stream parsed vs quick-xml's bare event loop, and the static test split's balance);
    /// provenance (the SLSA statement and DSSE signature the server makes per bound artifact, vs building
    /// the statement alone);
    /// rollback (`kiln rollback production` to its deploy job's claim, 100 times, vs a retry of a one-job run to its claim);
    /// memory (resident memory of a real server and agent idle, after 200 runs, a 200 MB log and 100 artifacts, vs a `sleep`);
    /// checkout (a repository of --checkout-files files to the first step: a new agent, a one-file change,
    /// the same commit again, `checkout: {reuse: true}`, beside git's bare clone, fetch, shared clone and
    /// incremental checkout; not in all);
    /// exec (`kiln exec` of a one-job, one-step workflow: process start to the step's command, and
    /// the bundled examples/hello pipeline end to end, vs `sh -c true`; not in all);
    /// fairness (team a's --fair-jobs backlog on --fair-slots slots, team b's job submitted 20 times during it: b's waits
    /// beside oldest-first's, a's makespan alone and with b; then claims per second of no-op jobs from 1 team vs 50; not in all).
    #[arg(default_value = "dispatch", value_parser = ["dispatch", "artifacts", "failover", "logs", "control-plane", "all", "containers", "webhooks", "cache", "reports", "fairness", "provenance", "rollback", "memory", "checkout", "exec"])]
    pub suite: String,
    /// control-plane: claims (and completions) per second to drive.
    #[arg(long, default_value_t = 230.0)]
    pub claims_per_s: f64,
    /// control-plane: heartbeats per second from all held leases together.
    #[arg(long, default_value_t = 2760.0)]
    pub heartbeats_per_s: f64,
    /// control-plane: seconds of claiming.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// control-plane: how long a virtual agent holds each lease before completing.
    #[arg(long, default_value = "5s", value_parser = kiln_cmd::parse_duration)]
    pub hold: std::time::Duration,
    /// control-plane: metadata database (default: SQLite in a temporary dir; with
    /// --replicas above 1, or `postgres`: a throwaway PostgreSQL server the bench starts).
    /// fairness: also measure the throughput phase on it (`postgres`: a throwaway server)
    /// with --replicas (at least 2) `kiln server` processes.
    /// logs: also run the single stream on a server on this PostgreSQL (`postgres`: a
    /// throwaway server), round by round beside the SQLite one.
    /// artifacts: the server's metadata on it (`postgres`: a throwaway server), with what the
    /// uploads cost PostgreSQL.
    /// dispatch: measure with the server on PostgreSQL (`postgres`: a throwaway durable server,
    /// a fresh database per deployment; its processes' CPU printed as `cpu_ms_per_run_postgres_*`).
    #[arg(long)]
    pub database_url: Option<String>,
    /// control-plane: server replicas (`kiln server` processes) on the same database.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// control-plane: instead of running, fit a cost per operation (CPU of the servers and of
    /// PostgreSQL, commits, WAL bytes; per accept, claim, completion, heartbeat and idle second)
    /// to the `control_window_*` lines of earlier outputs saved in these files (repeatable).
    #[arg(long)]
    pub fit: Vec<std::path::PathBuf>,
    /// control-plane: the replicas' `--dispatch-offer` (`shared`: each ready job offered by one
    /// replica; `every`: every replica offers every ready job, as before, for comparison).
    #[arg(long, default_value = "shared", value_parser = ["shared", "every"])]
    pub dispatch_offer: String,
    /// artifacts: the object store to measure (as `kiln server
    /// --object-store`; default: the local directory). For S3 the
    /// credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
    #[arg(long, env = "KILN_OBJECT_STORE")]
    pub object_store: Option<String>,
    /// checkout: the repository sizes, in files (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "30000,100000")]
    pub checkout_files: Vec<u32>,
    /// Runs submitted at once for the throughput figure.
    #[arg(long, default_value_t = 200)]
    pub runs: u32,
    /// Sequential runs for the trigger-to-start latency figure.
    #[arg(long, default_value_t = 30)]
    pub sequential: u32,
    /// Local agents.
    #[arg(long, default_value_t = 2)]
    pub agents: u32,
    /// fairness: agent slots (one job each).
    #[arg(long, default_value_t = 4)]
    pub fair_slots: u32,
    /// fairness: team a's backlog, in jobs (0: skip the A/B scenario, measure throughput only).
    #[arg(long, default_value_t = 500)]
    pub fair_jobs: u32,
    /// fairness: how long each backlog job (and b's) sleeps, in seconds.
    #[arg(long, default_value_t = 1.0)]
    pub fair_job_secs: f64,
    /// fairness: no-op jobs of the claim-throughput phase (1 team, then 50).
    #[arg(long, default_value_t = 1000)]
    pub fair_noop_jobs: u32,
    /// dispatch: every job also publishes one small artifact (uploaded, sealed, content
    /// addressed, bound with its signed provenance); `dispatch_artifact_per_job: true` says so.
    #[arg(long)]
    pub artifact_per_job: bool,
    /// dispatch: jobs each agent runs at once (`kiln agent --max-jobs`); the figures are
    /// suffixed `_plain` etc. as usual, and `dispatch_agent_max_jobs` says which was used.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub agent_max_jobs: u32,
    /// dispatch: the deployments to measure, each with fresh processes and its figures
    /// suffixed `_<config>`: `plain` (text logs, nothing scraped), `observed` (`--log-format
    /// json` on server and agents, the server's /metrics scraped every second, as Prometheus
    /// would), `otlp` (observed, and spans exported with `--otlp-endpoint` over OTLP/HTTP to
    /// a loopback sink the bench runs). `*_overhead_pct` is the throughput lost against `plain`, `*_cpu_overhead_pct` the CPU time per run (server, agents and their steps) added: the steadier figure on a shared host.
    #[arg(long, value_delimiter = ',', default_value = "plain,observed,otlp", value_parser = ["plain", "observed", "otlp"])]
    pub configs: Vec<String>,
    /// dispatch: measure every configuration this many times, interleaved (plain, observed,
    /// otlp, plain, …), and print the median round's throughput and the pooled latencies:
    /// on a shared host one round's noise can exceed the overhead being measured.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// dispatch: measure an in-process `kiln up` (server and agents in the bench's own
    /// process, no logs, no observability) instead of real processes: the earlier figure.
    #[arg(long)]
    pub embedded: bool,
    /// containers: Docker Engine API endpoint.
    #[arg(long, env = "KILN_ENGINE", default_value = "unix:///run/podman/podman.sock")]
    pub engine: String,
    /// containers: the job's image (a loopback registry is spoken to over plain HTTP).
    #[arg(long, default_value = "127.0.0.1:5000/kiln-test/base:latest")]
    pub image: String,
}
