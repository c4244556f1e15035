//! Command-line interface. `kiln --help` documents every flag.

use clap::{Args, Parser, Subcommand};
use kiln_bench::BenchArgs;
use kiln_cmd::{parse_bytes, parse_duration};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "kiln",
    version = env!("KILN_LONG_VERSION"),
    about = "Kiln: a self-hostable CI/CD server, agent and client in one binary",
    long_about = "Kiln runs CI pipelines defined in `.kiln/*.yaml` of a git repository.\n\n\
Quick start:  kiln up --data-dir ./kiln-data --agents 2\n\
then, in another shell on the same machine (the CLI finds a running local `kiln up`):\n\
  kiln repo add demo --url /path/to/repo\n\
  kiln run --repo demo --commit HEAD --follow\n\
From elsewhere: kiln login URL --token-file FILE (or the token on standard input).\n\n\
Exit codes: 0 success, 1 run failed or cancelled, 2 usage or invalid input,\n\
3 refused by the server, 4 authentication failed, 5 server unreachable or failing.\n\
A closed standard output (`kiln logs RUN | head -1`) ends a command quietly with 0.\n\n\
Server and token: flags, then KILN_SERVER / KILN_TOKEN, then the profile's context\n\
($XDG_CONFIG_HOME/kiln/config.toml, written by `kiln login`; KILN_CONTEXT or --context\n\
picks one), then a running local `kiln up`.\n\n\
Global flags: --server, --context, --token-file and --json may also come before the subcommand\n\
(`kiln --server URL runs`, `kiln --json runs`), for the commands that take them.\n\n\
Environment: KILN_SERVER (server URL), KILN_TOKEN (API token), KILN_CONTEXT, KILN_LOG (log filter,\n\
e.g. `info`, `debug`, `kiln_server=debug,sqlx=warn`; default `info` for up/server/agent,\n\
`warn` otherwise). Logs go to stderr, coloured only on a terminal (and never with NO_COLOR);\n\
`kiln up`, `kiln server` and `kiln agent` take --log-format and --otlp-endpoint (see their --help)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    // Global flags typed before the subcommand, kubectl-style (`kiln --server URL runs`,
    // `kiln --json runs`): clap hands their values to the subcommand's own flags of the same
    // name. Hidden here (the long help lists them; each command's help shows its own), and
    // refused by the commands that have no such flag (`crate::check_global_flags`).
    /// Server URL, as the command's own --server.
    #[arg(long = "server", id = "server", value_name = "URL", global = true, hide = true)]
    pub global_server: Option<String>,
    /// The profile's context, as the command's own --context.
    #[arg(long = "context", id = "context", value_name = "NAME", global = true, hide = true)]
    pub global_context: Option<String>,
    /// The token file, as the command's own --token-file.
    #[arg(long = "token-file", id = "token_file", value_name = "FILE", global = true, hide = true)]
    pub global_token_file: Option<PathBuf>,
    /// JSON output, as the command's own --json.
    #[arg(long = "json", id = "json", global = true, hide = true)]
    pub global_json: bool,
}

/// The daemons' diagnostic output: `kiln up`, `kiln server` and `kiln agent` only.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Logging and tracing")]
pub struct DaemonLog {
    /// How diagnostic log lines on stderr are written: `text` (for people) or `json` (one
    /// object per line with `timestamp`, `level`, `target`, `fields` and the spans, for a log
    /// pipeline). Or set KILN_LOG_FORMAT. Filter with KILN_LOG (e.g. `info,kiln_server=debug`).
    #[arg(long, env = "KILN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Export the daemon's spans (run lifecycle, claim, prepare, each step, upload,
    /// completion) over OpenTelemetry's OTLP to this collector, e.g. http://127.0.0.1:4318
    /// (`http`; the traces path /v1/traces is added to a bare URL) or http://127.0.0.1:4317
    /// (`grpc`). For `kiln up`, `kiln server` and `kiln agent`. Default: no export, no cost.
    /// Or set KILN_OTLP_ENDPOINT. The batch exporter honours OTEL_BSP_* (e.g.
    /// OTEL_BSP_SCHEDULE_DELAY in ms).
    #[arg(long, env = "KILN_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport for --otlp-endpoint: `http` (protobuf over HTTP) or `grpc`. Or set
    /// KILN_OTLP_PROTOCOL.
    #[arg(long, env = "KILN_OTLP_PROTOCOL", value_enum, default_value_t = OtlpProtocol::Http)]
    pub otlp_protocol: OtlpProtocol,
}

/// `--otlp-protocol`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    Http,
    Grpc,
}

/// `--log-format`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct Conn {
    /// Kiln server URL (or several replicas' URLs separated by commas). Default: the profile's
    /// context (`kiln login`), else a running local `kiln up` (./kiln-data, or the one
    /// registered under $XDG_STATE_HOME/kiln/up), else http://127.0.0.1:7070.
    #[arg(long, env = "KILN_SERVER", value_name = "URL", global = true)]
    pub server: Option<String>,
    /// The profile's context to use (`kiln context list`); default: its current one.
    #[arg(long, env = "KILN_CONTEXT", value_name = "NAME", global = true)]
    pub context: Option<String>,
    /// File holding the API token (e.g. the server's DATA_DIR/admin.token, or
    /// one from `kiln token create`). Or set KILN_TOKEN.
    #[arg(long, value_name = "FILE", env = "KILN_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// Refused: a token on the command line is readable by every local user
    /// (/proc/PID/cmdline). Use KILN_TOKEN or --token-file.
    #[arg(long, hide = true, value_name = "TOKEN", global = true)]
    pub token: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a server and N local agents in one process on embedded defaults (SQLite, local disk).
    Up(Box<UpArgs>),
    /// Run the Kiln server (API, dispatch, reconciler).
    Server(ServerArgs),
    /// Run an agent that claims jobs from a server and executes them.
    ///
    /// With `kiln-agent` installed beside this `kiln` from the same build, the process runs that
    /// (the agent alone: a smaller process, the same pid, flags and signals); without it, or
    /// with KILN_AGENT_IN_PROCESS=1, the agent runs in the kiln process.
    Agent(AgentArgs),
    /// Manage repositories.
    Repo {
        #[command(subcommand)]
        command: RepoCommand,
    },
    /// Manage teams: repositories belong to one; slots are shared between teams by weight, with
    /// quotas on running and queued jobs (docs/scheduling.md).
    Team {
        #[command(subcommand)]
        command: TeamCommand,
    },
    /// Manage deployment environments: who approves a run's deploy jobs (`environment:`),
    /// which refs may deploy, how long an approved deploy waits (docs/deployments.md).
    Env {
        #[command(subcommand)]
        command: EnvCommand,
    },
    /// An environment's deployments, newest first: run, commit, status, who started and who
    /// approved it, and the artifact generations (sha256) it deployed.
    Deploys(DeploysArgs),
    /// Approve a run's deployment to an environment: one approval covers every deploy job of
    /// the run there (each matrix expansion, each wave).
    Approve(DecideArgs),
    /// Reject a run's deployment to an environment: its deploy jobs there are cancelled and
    /// the run fails.
    Reject(DecideArgs),
    /// Roll an environment back to an earlier deployment: its deploy jobs run again from that
    /// deployment's frozen run with the same artifact generations (same sha256), nothing built.
    /// Without --to: the newest successful deployment by another run than the current one.
    Rollback(RollbackArgs),
    /// Promote a run's deploy rings now: its next promotion (bake and gate after a ring) is
    /// skipped and the next ring deploys. Also before the ring before it finished deploying.
    Promote(RingArgs),
    /// Pause a run's deploy rings: its next promotion holds (no bake ends, no gate is measured)
    /// until `kiln promote RUN`.
    Pause(RingArgs),
    /// A run's promotions between deploy rings: bake, gate measurements, who paused or
    /// promoted, and the automatic rollback after a failed gate.
    Rings(RingsArgs),
    /// Show the queue: per team, its share of the slots (entitled vs received), and its live
    /// jobs by priority lane and `runs-on` labels (ready, waiting on needs, running).
    Queue(QueueArgs),
    /// Move a queued or running run to another priority lane (`urgent`, `normal`,
    /// `background`; admin token): its waiting jobs are queued again in it.
    Priority(PriorityArgs),
    /// The server's provenance signing keys: `kiln keys export` writes them for offline checks.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Check an artifact against its signed provenance: the signature (the server's keys, or
    /// --keys for an offline check), the file's sha256, then the policy — repository, ref,
    /// workflow, builder, trust, build type and every external parameter. Exit 0 if it holds;
    /// otherwise a code per failed check (10 envelope, 11 unknown key, 12 signature, 13 digest,
    /// 14 subject, 15 repository, 16 ref, 17 workflow, 18 untrusted, 19 builder, 20 build type,
    /// 21 unknown external parameter) and a message naming it.
    Verify(VerifyArgs),
    /// Manage repository secrets (given to jobs that list them under `secrets:`).
    Secret {
        #[command(subcommand)]
        command: SecretCommand,
    },
    /// Send signed webhooks (or Slack messages) when runs of a repository end.
    Notify {
        #[command(subcommand)]
        command: NotifyCommand,
    },
    /// Test reports of runs, per-test history, quarantine and timing-based shards
    /// (`kiln tests RUN`, `kiln tests history REPO TEST_ID`, `kiln tests split`).
    Tests(TestsArgs),
    /// Manage API tokens: admin, read-only, and per-repository trigger tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Manage agent join tokens (what a machine registers as an agent with).
    #[command(name = "agent-token")]
    AgentToken {
        #[command(subcommand)]
        command: AgentTokenCommand,
    },
    /// List registered agents (name, state — busy, idle, offline or draining —, running
    /// jobs / capacity and which jobs, last seen, labels, version, pool), or remove one
    /// (`kiln agents rm ID`). Offline agents are forgotten after the server's --agent-expiry.
    Agents {
        #[command(subcommand)]
        command: Option<AgentsCommand>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// A live view of the eligible queue by `runs-on` label set, the agents
    /// (slots used / capacity, draining, last seen) and the running jobs with
    /// their phase (admin token). Redraws every --interval on a terminal;
    /// otherwise, or with --once, prints one snapshot and exits.
    Top(TopArgs),
    /// Show the audit log: who started, cancelled or retried what, token and
    /// agent changes, and every secret handed to a job.
    Audit(AuditArgs),
    /// Save a server and its API token as a context of the CLI's profile
    /// ($XDG_CONFIG_HOME/kiln/config.toml, mode 0600) after checking the token with the server.
    Login(LoginArgs),
    /// Remove a context (default: the current one) from the CLI's profile.
    Logout {
        /// The context to remove (default: the current one).
        #[arg(long, value_name = "NAME", env = "KILN_CONTEXT")]
        context: Option<String>,
    },
    /// List the profile's contexts, or pick the current one.
    Context {
        #[command(subcommand)]
        command: ContextCommand,
    },
    /// Start a workflow run for a commit.
    Run(RunArgs),
    /// Run a workflow on this machine, from the working tree of the git checkout you are in, with
    /// the server's own engine (an in-process server and agents); the same live view as
    /// `kiln run --follow`, exit 0 only on success.
    Exec(Box<ExecArgs>),
    /// List runs, newest first (every repository's, or one's).
    Runs(RunsArgs),
    /// List a repository's workflow files at a commit (`.kiln/*.yaml`): their triggers, whether
    /// they can be started by hand, and which `kiln run` without --workflow starts.
    Workflows(WorkflowsArgs),
    /// Show a run's status and jobs.
    Status(StatusArgs),
    /// Print a run's logs (all jobs, or one).
    Logs(LogsArgs),
    /// Cancel a run (or with --job one job of it; the rest of the run goes on).
    Cancel(CancelArgs),
    /// Start a new run with the same pinned definition as RUN (all its jobs; with
    /// --failed only the failed ones and their descendants; with --job that job and its descendants).
    Retry(RetryArgs),
    /// Wait until RUN ends; exit 0 if it succeeded, 1 if it failed or was cancelled.
    Wait(RunRef),
    /// Download artifacts of a run.
    Artifact {
        #[command(subcommand)]
        command: ArtifactCommand,
    },
    /// Validate a workflow file and print every problem with its line and column; without FILE,
    /// every workflow (`.kiln/*.yaml`, `.kiln/*.yml`) of the git checkout you are in.
    Validate {
        /// Path of the workflow file (default: every workflow of the current checkout; exit 2
        /// if any is invalid).
        file: Option<PathBuf>,
    },
    /// Print a shell completion script: `kiln completions bash > /etc/bash_completion.d/kiln`,
    /// `kiln completions zsh > "${fpath[1]}/_kiln"`, `kiln completions fish > ~/.config/fish/completions/kiln.fish`.
    Completions {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), generated from these definitions: `kiln man | man -l -`;
    /// with --dir, write a page per subcommand (kiln.1, kiln-run.1, kiln-repo-add.1, …).
    Man {
        /// Write kiln.1 and a page for every subcommand (kiln-SUB.1, kiln-SUB-SUB.1) into DIR
        /// (created if missing), e.g. /usr/local/share/man/man1; then `man kiln-run`.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Measure throughput and latency against an embedded `kiln up` (prints `name: value` lines).
    /// A developer tool, hidden from the main help.
    #[command(hide = true)]
    Bench(BenchArgs),
    /// Print the OpenAPI 3.1 document of the HTTP API (what a server serves at `/openapi.json`).
    /// Hidden from the main help: for tools and `scripts/test`'s validator.
    #[command(hide = true)]
    Openapi,
}

impl Command {
    pub fn is_daemon(&self) -> bool {
        self.daemon_log().is_some()
    }

    /// The logging and tracing flags of `kiln up`, `kiln server` and `kiln agent`.
    pub fn daemon_log(&self) -> Option<&DaemonLog> {
        match self {
            Command::Up(a) => Some(&a.log),
            Command::Server(a) => Some(&a.log),
            Command::Agent(a) => Some(&a.log),
            _ => None,
        }
    }
}

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Where the database, object store, tokens and the agents' own state live (0700); the
    /// agents' workspaces are elsewhere (their sandbox dirs, in the system temp dir).
    #[arg(long, default_value = "kiln-data")]
    pub data_dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// Number of local agents to run.
    #[arg(long, default_value_t = 2)]
    pub agents: u32,
    /// Metadata database URL: postgres://USER[:PASS]@HOST:PORT/DB for
    /// PostgreSQL, or sqlite:PATH (default: SQLite in DATA_DIR).
    #[arg(long, env = "KILN_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Lease TTL (e.g. 30s, 500ms); agents heartbeat every third of it.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_ttl: std::time::Duration,
    #[command(flatten)]
    pub server: ServerTuning,
    #[command(flatten)]
    pub agent: AgentTuning,
    #[command(flatten)]
    pub web: WebArgs,
    #[command(flatten)]
    pub log: DaemonLog,
}

/// How the server faces the network (`kiln server` and `kiln up`).
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Network")]
pub struct WebArgs {
    /// The URL clients and agents reach this server at, e.g. https://ci.example.com (behind a
    /// proxy, the proxy's). Download and upload links are built from it, never from a request's
    /// Host header. Default: derived from --listen (http, or https with --tls-cert).
    #[arg(long, env = "KILN_PUBLIC_URL", value_name = "URL")]
    pub public_url: Option<String>,
    /// The Prometheus server (http(s)://HOST:PORT[/PATH]) that `rings:` gates query between
    /// deploy rings (`gate: {prometheus: {query, success, …}}`). Without it, a workflow with a
    /// Prometheus gate is refused when a run is accepted.
    #[arg(long, env = "KILN_PROMETHEUS_URL", value_name = "URL", help_heading = "Deployments")]
    pub prometheus_url: Option<String>,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key). `kiln up`'s own agents
    /// trust it; other clients trust it through the system's roots or KILN_CA_CERT=FILE.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// A connection must send a complete request head within this; it also bounds the idle gap
    /// between requests on a keep-alive connection (slow or idle clients are closed).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub header_read_timeout: std::time::Duration,
    /// A connection on which no byte moved either way for this long is closed (log streams send
    /// a keep-alive every 15s and agent sessions ping every second, so they stay open; keep it
    /// above the agents' claim long-poll of 60s).
    #[arg(long, default_value = "120s", value_parser = parse_duration, value_name = "DURATION")]
    pub idle_timeout: std::time::Duration,
    /// Open connections at most; past it a new connection is answered 503 and closed.
    /// Default: a quarter of the open-file limit, between 64 and 4096.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Of --max-connections, the slots kept for authenticated calls (agents, API tokens) and
    /// /healthz, /readyz: a flood of unauthenticated callers (webhooks, the UI, /metrics) never
    /// takes them. Default: a quarter (at least half of a cap up to 16); 0 keeps none.
    #[arg(long, value_name = "N")]
    pub reserved_connections: Option<usize>,
    /// A request body must arrive whole within this of its request head, however steadily it
    /// trickles (past it: 408, connection closed). Artifact and cache uploads to the data plane
    /// are bounded by --idle-timeout instead.
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub body_read_timeout: std::time::Duration,
    /// Bytes of request bodies from callers not yet authenticated (webhook deliveries before
    /// their signature is checked, UI sign-ins) held at once; past it such a request is answered
    /// 503 with Retry-After before its body is read. At least 25MiB (the largest delivery).
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes, value_name = "BYTES")]
    pub unauthenticated_body_budget: u64,
}

/// What `kiln server` and `kiln up` both take: where bytes and secrets
/// live, leases, garbage collection, log archiving, registries.
#[derive(Args, Debug)]
#[command(next_help_heading = "Server: storage, scheduling, limits")]
pub struct ServerTuning {
    /// Object store URL (default: DATA_DIR/objects): file:///DIR, or
    /// s3://BUCKET[/PREFIX]?endpoint=URL&region=REGION for an S3-compatible
    /// store, with credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
    /// (agents never see them: they get short-lived presigned URLs and move
    /// bytes to and from the store directly).
    #[arg(long, env = "KILN_OBJECT_STORE", value_name = "URL")]
    pub object_store: Option<String>,
    /// The key repository secrets are sealed with at rest (default:
    /// DATA_DIR/secrets.key, created on first start). Keep it out of the
    /// database's backups; every replica needs the same file.
    #[arg(long, env = "KILN_SECRETS_KEY_FILE")]
    pub secrets_key_file: Option<PathBuf>,
    /// How long an agent's leases survive once its session connection drops (the agent was
    /// killed or its host is gone): then its jobs are fenced and re-dispatched. A live agent
    /// reconnects and heartbeats within it (reconnects start at 100ms); fencing keeps a
    /// falsely-suspected agent from publishing anything.
    #[arg(long, default_value = "500ms", value_parser = parse_duration, value_name = "DURATION")]
    pub loss_grace: std::time::Duration,
    /// An offline agent (no connection to any server replica, running nothing) is forgotten
    /// this long after it was last seen: it leaves `kiln agents` and the Agents page, and the
    /// audit log says `agent.expire`. A connected agent's "last seen" moves every few seconds.
    /// An agent that comes back later registers again by itself. `0` keeps offline agents
    /// until they are removed (`kiln agents rm`, the Agents page).
    #[arg(long, default_value = "24h", value_parser = parse_duration, value_name = "DURATION")]
    pub agent_expiry: std::time::Duration,
    /// Quarantined tests may be at most this percentage of a repository's suite (the tests of
    /// its latest run with reports); at least one test may always be quarantined. The next
    /// `kiln tests quarantine` past it is refused, naming the cap.
    #[arg(long, default_value = "2", value_parser = parse_percent, value_name = "PERCENT")]
    pub quarantine_max_percent: f64,
    /// A ready job moves up one priority lane (background → normal → urgent) every time it
    /// waits this long, so a lower lane is never starved (docs/scheduling.md states the bound).
    #[arg(long, default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    pub aging_step: std::time::Duration,
    /// Server saturation: with this many jobs queued (ready or waiting on their needs), new
    /// API runs are refused with 429 and Retry-After — `background` ones from 80 % of it,
    /// `normal` ones at it; `urgent` ones only by their team's --max-queued. Webhook and
    /// schedule runs are never refused: they wait and are created once there is room.
    /// Default: no server-wide limit.
    #[arg(long, value_name = "JOBS")]
    pub max_queued_jobs: Option<u64>,
    /// With PostgreSQL: how often this replica re-reads the ready jobs
    /// regardless of notifications from other replicas (the safety net for
    /// lost ones; default 5s).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub dispatch_sweep: Option<std::time::Duration>,
    /// With PostgreSQL: `shared` offers each ready job through one of the replicas whose
    /// agents claim (the others try it only when their agents are idle and it waited 2s;
    /// a replica that died hands its share on within about 4s); `every`: every replica
    /// offers every ready job to its agents (claims of one job race across replicas; for
    /// comparison). The claim transaction decides ownership either way.
    #[arg(long, default_value = "shared", value_parser = ["shared", "every"], value_name = "MODE")]
    pub dispatch_offer: String,
    /// Unbound artifact bytes of ended attempts are deleted after this.
    #[arg(long, default_value = "15m", value_parser = parse_duration, value_name = "DURATION")]
    pub artifact_gc_grace: std::time::Duration,
    /// How often the artifact garbage collector runs.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub gc_interval: std::time::Duration,
    /// Base delay of the retry backoff (exponential, with jitter).
    #[arg(long, default_value = "500ms", value_parser = parse_duration, value_name = "DURATION")]
    pub retry_base: std::time::Duration,
    /// Base delay of the retry backoff of notification deliveries (`kiln notify`): a
    /// receiver that fails is tried again after about BASE, 2×BASE, 4×BASE… (with jitter,
    /// at most 10m apart).
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION", env = "KILN_NOTIFY_RETRY_BASE")]
    pub notify_retry_base: std::time::Duration,
    /// Attempts of a notification delivery before it is given up (shown as failed in
    /// `kiln notify log`).
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub notify_max_attempts: u32,
    /// The longest wait between two attempts to plan an accepted webhook delivery that meets
    /// transient trouble (the repository cannot be fetched, a registry is down, the server is
    /// degraded). Such a delivery is retried until it is planned, never dropped.
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub delivery_retry_max: std::time::Duration,
    /// A delivery not yet planned this long after it arrived is delayed: counted by the
    /// `kiln_deliveries_delayed` metric (alert KilnDeliveriesDelayed), marked in `kiln repo
    /// deliveries`, and its commit gets a pending status saying why.
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub delivery_alert_after: std::time::Duration,
    /// A finished job's log moves from the database's hot journal to the
    /// object store (immutable segment + index) this long after the job ended.
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub log_archive_after: std::time::Duration,
    /// Where agents push the images of Dockerfile jobs (`HOST[:PORT]/PATH`, e.g.
    /// registry.example.com/kiln-builds): each goes to PATH/JOB_ID and the job runs it by its
    /// manifest digest, so a retry or replacement on any agent pulls the same bytes. The agents'
    /// engines must be able to push there (their own registry credentials). Without it, a built
    /// image stays in the engine of the agent that built it.
    #[arg(long, value_name = "REGISTRY/PATH", value_parser = parse_build_registry)]
    pub build_registry: Option<String>,
    /// A registry (HOST:PORT) spoken to over plain HTTP when resolving image tags; repeatable.
    /// Meant for loopback/test registries.
    #[arg(long = "insecure-registry", value_name = "HOST:PORT")]
    pub insecure_registries: Vec<String>,
    /// Credentials for resolving image tags in a registry (basic auth, or exchanged for a bearer
    /// token), repeatable or comma-separated in KILN_REGISTRY_AUTH. Other registries are anonymous.
    #[arg(
        long = "registry-auth",
        value_name = "HOST=USER:PASSWORD",
        env = "KILN_REGISTRY_AUTH",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub registry_auth: Vec<String>,
    /// How often the data directory's disk use and the memory are sampled for the degradation
    /// level (spec 004: warning at 80 % of the disk or under 2 GiB of memory, degraded at 90 % /
    /// 1 GiB — runs with a `size: large` job are refused —, critical at 95 % / 500 MiB — new runs
    /// are refused with 503 and Retry-After). The level is in /readyz and /metrics.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub resource_interval: std::time::Duration,
    #[command(flatten)]
    pub storage: StorageLevels,
    /// Timeout of a job whose workflow sets none (frozen into the run when it is accepted).
    #[arg(long, default_value = "60m", value_parser = parse_duration, value_name = "DURATION")]
    pub job_timeout: std::time::Duration,
    /// A job that stays queued this long — no agent claimed it, e.g. none has the labels its
    /// `runs-on` asks for — fails, saying why, and its run moves on. `off` disables.
    #[arg(long, default_value = "24h", value_parser = kiln_cmd::parse_duration_or_off, value_name = "DURATION")]
    pub queue_timeout: std::time::Duration,
    /// The longest `timeout` a job may ask for; a run asking for more is refused (422).
    #[arg(long, default_value = "7d", value_parser = parse_duration, value_name = "DURATION")]
    pub max_job_timeout: std::time::Duration,
    /// The run-level timeout of a workflow that sets no top-level `timeout` (frozen into
    /// the run when it is accepted): a run not finished this long after it was accepted
    /// (queued time included) is cancelled with every job still waiting or running, and
    /// says so. `off` disables.
    #[arg(long, default_value = "24h", value_parser = kiln_cmd::parse_duration_or_off, value_name = "DURATION")]
    pub run_timeout: std::time::Duration,
    /// How long a published artifact's bytes are kept after its job completed when its
    /// `publish` entry sets no `expire-in` (frozen into the run when it is accepted). The
    /// garbage collector then deletes them; a download answers 410 `expired`.
    #[arg(long, default_value = "30d", value_parser = parse_duration, value_name = "DURATION")]
    pub artifact_expire_in: std::time::Duration,
    /// Agent pools that take untrusted work (fork pull requests, runs of trigger tokens not made
    /// --trusted): only agents of these pools (their join token's `--pool`) running the container
    /// executor claim it; other agents never do, and untrusted jobs wait (saying why) until one
    /// connects. E.g. `kiln agent-token create --pool forks` and `kiln agent --executor
    /// container` with that token.
    #[arg(long, value_delimiter = ',', default_value = "forks", value_name = "POOL[,POOL]")]
    pub untrusted_pools: Vec<String>,
    /// UNSAFE: let host-executor agents of --untrusted-pools take untrusted work too. Their steps
    /// run as processes on the agent's machine, with its network, files and kernel: anyone who
    /// can open a pull request runs code there. Only for a single-user machine with nothing to
    /// protect.
    #[arg(long)]
    pub untrusted_on_host_agents: bool,
}

/// `--storage-levels` and `--memory-levels`, shared by `kiln server` /
/// `kiln up` (whose local agents use the same) and `kiln agent`.
#[derive(Args, Debug)]
#[command(next_help_heading = "Resource levels")]
pub struct StorageLevels {
    /// Percent of the disk used (the server's data directory, an agent's workspaces) at which
    /// the warning, degraded and critical levels start, or `off` (disk use never degrades). At
    /// critical the server refuses new runs and an agent stops claiming, until space returns.
    #[arg(
        long = "storage-levels",
        env = "KILN_STORAGE_LEVELS",
        default_value = "80,90,95",
        value_parser = kiln_core::degradation::parse_storage_levels,
        value_name = "W,D,C"
    )]
    pub levels: [f64; 3],
    /// Available memory (MemAvailable) below which the warning, degraded and critical levels
    /// start, or `off` (memory never degrades). Levels act as for disk use.
    #[arg(
        long = "memory-levels",
        env = "KILN_MEMORY_LEVELS",
        default_value = "2GiB,1GiB,500MiB",
        value_parser = kiln_cmd::parse_memory_levels,
        value_name = "W,D,C"
    )]
    pub memory: [u64; 3],
}

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Where the database, object store and tokens live.
    #[arg(long, default_value = "kiln-data")]
    pub data_dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// Metadata database URL: postgres://USER[:PASS]@HOST:PORT/DB for
    /// PostgreSQL, or sqlite:PATH (default: SQLite in DATA_DIR).
    #[arg(long, env = "KILN_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Lease TTL (e.g. 30s); agents heartbeat every third of it.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_ttl: std::time::Duration,
    #[command(flatten)]
    pub tuning: ServerTuning,
    #[command(flatten)]
    pub web: WebArgs,
    #[command(flatten)]
    pub log: DaemonLog,
}

/// What `kiln agent` and `kiln up` (for its local agents) both take: labels,
/// capacity, executor, limits.
#[derive(Args, Debug)]
#[command(next_help_heading = "Agent: executor, capacity, limits")]
pub struct AgentTuning {
    /// Labels jobs can require with `runs-on`, e.g. os=linux,size=large.
    #[arg(long, value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Executor: host (processes on this machine) or container (a fresh container per attempt
    /// from the job's pinned image, through the Docker Engine API of --engine).
    #[arg(long, default_value = "host", value_parser = ["host", "container"])]
    pub executor: String,
    /// Docker Engine API endpoint of the container executor (Podman: `podman system service`);
    /// with the host executor, where jobs' `services:` run.
    #[arg(long, env = "KILN_ENGINE", default_value = "unix:///run/podman/podman.sock")]
    pub engine: String,
    /// Image for jobs without `image:` on the container executor (pin it as repo@sha256:…).
    /// Without it such jobs fail with a message saying so.
    #[arg(long, value_name = "REF")]
    pub default_image: Option<String>,
    /// Network of job containers: none (no network, the default) or bridge (the engine's default network).
    #[arg(long, default_value = "none", value_parser = ["none", "bridge"])]
    pub container_network: String,
    /// Container executor: keep a container created and started for the next job of each of the
    /// last N job shapes (image digest, size, network) this agent ran; each serves one job only,
    /// then is removed like any job's container. 0: every job's container is created when the
    /// job starts.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub warm_containers: usize,
    /// Time between SIGTERM and SIGKILL when a job is stopped (cancel, timeout, fencing, shutdown).
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub kill_grace: std::time::Duration,
    /// Longest a job's cache restore, and its cache save, may take; past it the restore is a
    /// clean miss (the job runs cold) and the save is skipped.
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub cache_timeout: std::time::Duration,
    /// Longest a job may spend preparing — checkout, image pull or build, artifact and cache
    /// restore, services becoming healthy — before its attempt fails as `timeout` (exit 124).
    /// `off` disables.
    #[arg(long, default_value = "15m", value_parser = kiln_cmd::parse_duration_or_off, value_name = "DURATION")]
    pub prepare_timeout: std::time::Duration,
    /// Longest a job may spend finalizing after its steps — cache save, artifact upload —
    /// before its attempt fails as `timeout` (exit 124). `off` disables.
    #[arg(long, default_value = "15m", value_parser = kiln_cmd::parse_duration_or_off, value_name = "DURATION")]
    pub finalize_timeout: std::time::Duration,
    /// Longest each `git fetch` of a checkout may take; a fetch past it is killed and tried
    /// again like any transient failure (3 tries), then the attempt fails as `timeout`. `off`
    /// disables.
    #[arg(long, default_value = "10m", value_parser = kiln_cmd::parse_duration_or_off, value_name = "DURATION")]
    pub git_timeout: std::time::Duration,
    /// Longest pulling a job's image may take before its attempt fails as `timeout` (exit 124).
    /// `off` disables.
    #[arg(long, default_value = "10m", value_parser = kiln_cmd::parse_duration_or_off, value_name = "DURATION")]
    pub pull_timeout: std::time::Duration,
    /// Longest building a job's Dockerfile image may take before its attempt fails as `timeout`
    /// (exit 124). `off` disables.
    #[arg(long, default_value = "10m", value_parser = kiln_cmd::parse_duration_or_off, value_name = "DURATION")]
    pub build_timeout: std::time::Duration,
    /// Longest uploading and sealing each declared artifact may take before its attempt fails as
    /// `timeout` (exit 124); nothing of it is bound. `off` disables.
    #[arg(long, default_value = "10m", value_parser = kiln_cmd::parse_duration_or_off, value_name = "DURATION")]
    pub upload_timeout: std::time::Duration,
    /// Node-local cache archives kept for reuse by later jobs on this agent (least recently used
    /// removed first; each also keeps one unpacked copy ready), e.g. 5GiB (the default).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub cache_local_budget: Option<u64>,
    /// Host executor, agent running as root: the unprivileged user steps run as (name, UID or
    /// UID:GID; default nobody; `root` opts out). A non-root agent's steps keep its own uid.
    #[arg(long, value_name = "USER")]
    pub step_user: Option<String>,
    /// The nice value (0-19) steps run at, at least: their processes and their sessions'
    /// scheduling groups. 19 (the default) lets the agent's own work (logs, heartbeats) and a
    /// server sharing the machine come first, while steps still get every idle cycle. 0: the
    /// agent's own.
    #[arg(long, default_value_t = kiln_agent::DEFAULT_STEP_NICE, value_parser = clap::value_parser!(i32).range(0..=19), value_name = "N")]
    pub step_nice: i32,
    /// Host executor: a variable every step gets, `NAME=VALUE`, or `NAME` to pass the agent's own
    /// value (repeatable; below the workflow's `env:`). What is passed reaches every job this
    /// agent runs: pass toolchain settings, not credentials (use the workflow's `secrets:`).
    /// KILN_*, HOME and TMPDIR are refused.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub step_env: Vec<String>,
    /// Host executor: a file of `NAME=VALUE` (or `NAME`) lines, as --env; `#` comments.
    #[arg(long, value_name = "FILE")]
    pub env_file: Vec<PathBuf>,
    /// Host executor: a directory put in front of every step's PATH (absolute; repeatable), e.g.
    /// a toolchain installed outside any home directory.
    #[arg(long = "path", value_name = "DIR")]
    pub step_path: Vec<PathBuf>,
    /// Host executor: do not pass the toolchains found in the step user's home directory
    /// (RUSTUP_HOME, CARGO_HOME and ~/.cargo/bin, PYENV_ROOT and its shims, NVM_DIR, SDKMAN_DIR
    /// and its candidates, ~/.local/bin), which steps otherwise get because their own HOME is
    /// private.
    #[arg(long)]
    pub no_user_toolchains: bool,
    /// Jobs to run at once.
    #[arg(long, default_value_t = 1)]
    pub max_jobs: u32,
    /// Cap on artifact upload bandwidth per second, across all jobs (e.g. 20MB, 20000000).
    #[arg(long, value_name = "BYTES_PER_S", value_parser = parse_bytes)]
    pub upload_rate_limit: Option<u64>,
    /// Per-attempt cap on stdout + stderr bytes kept in the log (default 100 MiB); the rest is
    /// drained, dropped and reported as truncated.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub log_limit: Option<u64>,
    /// Per-attempt stdout + stderr rate limit in bytes per second (default:
    /// unlimited); faster output is drained, dropped and marked as a gap.
    #[arg(long, value_name = "BYTES_PER_S", value_parser = parse_bytes)]
    pub log_rate_limit: Option<u64>,
    /// Unshipped log bytes an attempt keeps in memory (default 16 MiB). When they fill it, the
    /// step waits on its pipe while the server keeps taking chunks; after 500 ms without one
    /// taken (a slow or unreachable server), output spills to the attempt's on-disk spool.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub log_buffer: Option<u64>,
    /// Largest on-disk log spool per attempt (default 1 GiB); output beyond
    /// it is dropped and the drop recorded in the log.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub log_spool_limit: Option<u64>,
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// Server URL, or several replicas' URLs separated by commas
    /// (`http://a:7070,http://b:7070`): when one stops answering, the agent
    /// moves to the next. Required (or KILN_SERVER).
    #[arg(long, env = "KILN_SERVER", value_name = "URL")]
    pub server: Option<String>,
    /// File holding the agent token (the server's DATA_DIR/agent.token). Or set
    /// KILN_AGENT_TOKEN in the agent's environment. Tokens are never taken
    /// from the command line, where every local user can read them (/proc/PID/cmdline).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Refused (a token in argv is visible to every local user): use --token-file or KILN_AGENT_TOKEN.
    #[arg(long, hide = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Allow plain http:// to a server that is not on loopback. Without it the agent refuses to
    /// start: its token, secrets and artifacts would cross the network in clear. (A server with
    /// a private certificate: KILN_CA_CERT=FILE.)
    #[arg(long)]
    pub insecure: bool,
    /// Agent name shown in attempts.
    #[arg(long)]
    pub name: Option<String>,
    /// The agent's own state (0700): git mirrors, step process records, log spools.
    #[arg(long, default_value = "kiln-agent")]
    pub work_dir: PathBuf,
    /// Where attempts' workspaces live, apart from --work-dir so that a step cannot walk to the
    /// agent's state (default: a directory named after the agent's uid and work dir in the
    /// system temp dir; emptied when the agent starts, removed when it stops).
    #[arg(long, value_name = "DIR")]
    pub sandbox_dir: Option<PathBuf>,
    /// A path no host step may see, besides the agent's own (--work-dir, --token-file), e.g.
    /// the data directory of a `kiln server` on this machine: each step's mount namespace covers
    /// it (a directory with an empty read-only tmpfs, a file with /dev/null). Repeatable.
    #[arg(long, value_name = "PATH")]
    pub hide_path: Vec<PathBuf>,
    /// On SIGTERM the agent drains: it claims nothing more and lets running jobs finish for up to
    /// this long, then hands the rest back (they are retried elsewhere at once). SIGINT, SIGUSR1
    /// (e.g. a spot instance's preemption notice) or a second SIGTERM hand them back at once.
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub drain_timeout: std::time::Duration,
    /// Serve this agent's own Prometheus metrics (jobs running, claims, heartbeats, log bytes
    /// sent, spool bytes, step durations, disk level) at http://ADDR/metrics, e.g.
    /// 127.0.0.1:9100 (port 0: any free port, logged at start). Off by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub storage: StorageLevels,
    #[command(flatten)]
    pub tuning: AgentTuning,
    #[command(flatten)]
    pub log: DaemonLog,
}

#[derive(Subcommand, Debug)]
pub enum RepoCommand {
    /// Register a repository (local path, file:// or remote git URL), and
    /// optionally connect it to its forge (webhooks in, commit statuses out).
    Add {
        /// The repository's name in Kiln (1-100 characters of [A-Za-z0-9._-]).
        name: String,
        /// Where to clone it from: a local path, file:// URL or remote git URL (probed now).
        #[arg(long)]
        url: String,
        /// Agent pools whose agents may receive this repository's secrets
        /// (comma-separated; default: `default`, the pool of DATA_DIR/agent.token).
        #[arg(long, value_delimiter = ',')]
        secret_pools: Option<Vec<String>>,
        /// The team whose share of the slots its jobs run in (default: `default`; see `kiln team`).
        #[arg(long)]
        team: Option<String>,
        #[command(flatten)]
        forge: ForgeArgs,
        #[command(flatten)]
        conn: Conn,
    },
    /// Change a repository's forge connection, trigger policy, webhook secret,
    /// secret pools or visibility (what is not given is kept).
    Set {
        /// The repository's name.
        name: String,
        /// Agent pools whose agents may receive this repository's secrets (comma-separated).
        #[arg(long, value_delimiter = ',')]
        secret_pools: Option<Vec<String>>,
        /// Serve its status badge (GET /v1/repos/NAME/badge.svg) to anyone, without a token.
        #[arg(long, conflicts_with = "private")]
        public: bool,
        /// Serve its badge only to tokens that may read it (the default).
        #[arg(long)]
        private: bool,
        /// Move it to this team (its queued jobs count for the new team from their next claim).
        #[arg(long)]
        team: Option<String>,
        #[command(flatten)]
        forge: ForgeArgs,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove a repository that has no runs (its secrets, webhook deliveries
    /// and schedules go with it; its trigger tokens are revoked).
    #[command(alias = "remove")]
    Rm {
        /// The repository's name.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show a repository's settings.
    Show {
        /// The repository's name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Print what to paste into the forge's webhook settings.
    #[command(name = "hook-info")]
    HookInfo {
        /// The repository's name.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the repository's latest webhook deliveries and what became of them.
    Deliveries {
        /// The repository's name.
        name: String,
        /// How many deliveries at most, newest first.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// List repositories.
    #[command(alias = "ls")]
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
}

/// The forge connection of `kiln repo add` and `kiln repo set`. Secrets are
/// read from files (`-`: standard input), never from the command line.
#[derive(clap::Args, Debug, Default)]
pub struct ForgeArgs {
    /// Refused: a secret on the command line is visible to every local user
    /// (/proc/PID/cmdline). Use --webhook-secret-file.
    #[arg(long, hide = true)]
    pub webhook_secret: Option<String>,
    /// File holding the webhook secret the forge signs deliveries with
    /// (`-`: standard input; at least 16 characters, e.g. `openssl rand -hex 32`).
    #[arg(long, value_name = "FILE")]
    pub webhook_secret_file: Option<PathBuf>,
    /// The forge: github (also GitHub Enterprise), gitlab, or gitea (also Forgejo).
    #[arg(long, value_parser = ["github", "gitlab", "gitea", "forgejo"])]
    pub forge: Option<String>,
    /// The forge's API base URL: default https://api.github.com; GitHub
    /// Enterprise https://HOST/api/v3; GitLab and Gitea the instance URL.
    #[arg(long, value_name = "URL")]
    pub forge_url: Option<String>,
    /// The repository on the forge: OWNER/NAME (GitLab: the project path or id).
    #[arg(long, value_name = "OWNER/NAME")]
    pub forge_repo: Option<String>,
    /// File holding the token for the forge's commit status API (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    pub forge_token_file: Option<PathBuf>,
    /// File holding a token (password) for cloning an http(s) --url (`-`:
    /// standard input). Stored sealed and never shown; git gets it through
    /// its environment, never its command line. Sent with the URL's username
    /// (`https://oauth2@gitlab.example/...`), else `x-access-token`. Do not
    /// write a credential into --url: it would show in /proc/PID/cmdline.
    #[arg(long, value_name = "FILE")]
    pub clone_token_file: Option<PathBuf>,
    /// The default branch (its pushes are trusted; schedules run on it). Default: main.
    #[arg(long)]
    pub default_branch: Option<String>,
    /// More branch patterns whose pushes are trusted (comma-separated globs,
    /// e.g. `release/*`); tags and the default branch always are.
    #[arg(long, value_delimiter = ',')]
    pub protected_refs: Option<Vec<String>>,
    /// When a pull request from the repository itself (never a fork's) is
    /// trusted: write-access (the payload says the author can write; default),
    /// same-repo, or never.
    #[arg(long, value_parser = ["write-access", "same-repo", "never"])]
    pub pull_request_trust: Option<String>,
    /// Poll the remote's branch and tag heads this often and start the push
    /// runs of missed webhooks (tip only), e.g. 5m; 0 turns polling off.
    #[arg(long, value_name = "DURATION")]
    pub poll_interval: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum NotifyCommand {
    /// POST a JSON body signed with HMAC-SHA256 (header X-Kiln-Signature-256:
    /// sha256=HEX) to URL whenever a run of REPO ends with one of the --on events;
    /// a failing receiver is retried with backoff. See docs/notifications.md.
    Add {
        /// The repository.
        repo: String,
        /// The receiver: an http:// or https:// URL (a Slack incoming webhook with --format slack).
        #[arg(long, value_name = "URL")]
        url: String,
        /// File holding the signing secret (`-`: standard input; 16 to 1024 characters, e.g.
        /// `openssl rand -hex 32 > notify.secret`). Stored sealed and never shown again.
        #[arg(long, value_name = "FILE")]
        secret_file: Option<PathBuf>,
        /// Refused: a secret on the command line is visible to every local user
        /// (/proc/PID/cmdline). Use --secret-file.
        #[arg(long, hide = true)]
        secret: Option<String>,
        /// Which run ends to send (comma-separated): failure, fixed (succeeded after the
        /// previous run of the same workflow and branch failed), success, cancelled, always.
        #[arg(long, value_delimiter = ',', required = true, value_name = "EVENTS")]
        on: Vec<String>,
        /// The body: kiln (JSON with the run's fields) or slack (`{"text": …}` for a Slack
        /// incoming webhook).
        #[arg(long, default_value = "kiln", value_parser = ["kiln", "slack"])]
        format: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// List REPO's notifications (never their secrets).
    #[command(alias = "list")]
    Ls {
        /// The repository.
        repo: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove notification ID of REPO (its delivery log stays).
    #[command(alias = "remove")]
    Rm {
        /// The repository.
        repo: String,
        /// The notification's id (from `kiln notify ls`).
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show REPO's notification delivery log, newest first: run, event, status,
    /// attempts, last HTTP status or error, when delivered.
    Log {
        /// The repository.
        repo: String,
        /// How many deliveries at most.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
}

/// `kiln tests`: a run's tests, or one of the subcommands.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct TestsArgs {
    #[command(subcommand)]
    pub command: Option<TestsCommand>,
    /// The run: REPO#NUMBER (hello#123), NUMBER with --repo, its id, or a unique id prefix of 8+
    /// characters. Its tests are each job's last attempt's, failed ones first, with
    /// their message; flaky ones are marked once the run has ended.
    pub run: Option<String>,
    /// The repository a bare run NUMBER is of.
    #[arg(long, value_name = "REPO")]
    pub repo: Option<String>,
    /// Only failed and errored tests.
    #[arg(long)]
    pub failed: bool,
    /// Print the API's answer as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Subcommand, Debug)]
pub enum TestsCommand {
    /// A test's results in REPO's runs, newest first, and its flake rate over the default
    /// branch's runs.
    History {
        /// The repository.
        repo: String,
        /// The test's id as `kiln tests RUN` shows it (`suite :: class :: name`).
        test_id: String,
        /// How many results at most.
        #[arg(long, default_value_t = 30)]
        limit: u32,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Quarantine a test of REPO: while quarantined, a job whose only failures are
    /// quarantined tests (with a complete report) succeeds, saying "quarantined failures: N".
    /// Every quarantine has an owner and expires; at expiry the test fails its job again and
    /// the audit log and metrics say so. At most --quarantine-max-percent of the suite
    /// (default 2%) may be quarantined.
    Quarantine {
        /// The repository.
        repo: String,
        /// The test's id as `kiln tests RUN` shows it.
        test_id: String,
        /// Who fixes it (required): a person, a team, an email.
        #[arg(long, value_name = "WHO")]
        owner: String,
        /// Why it is quarantined.
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// A link to the issue tracking the fix.
        #[arg(long, value_name = "URL")]
        link: Option<String>,
        /// When it expires: a duration like 14d (default), 36h, 2w; at most 90d.
        #[arg(long, default_value = "14d", value_name = "DURATION")]
        expires: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Print (or write with -o) the signed Test Result statement of job JOB of RUN: a DSSE
    /// envelope holding an in-toto Test Result statement (passed, warned = quarantined, failed
    /// tests) over the artifacts the job restored, written when its reports were bound. Check
    /// that a file passed them with `kiln verify FILE --test-result THIS --repo R`.
    Attestation {
        /// The run: REPO#NUMBER (hello#123), NUMBER with --repo, its id, or a unique id prefix of 8+ characters.
        run: String,
        /// The repository a bare run NUMBER is of.
        #[arg(long, value_name = "REPO")]
        repo: Option<String>,
        /// The job's name (or id).
        job: String,
        /// Write it to this file instead of standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        conn: Conn,
    },
    /// End a test's quarantine: its failures fail jobs again.
    Unquarantine {
        /// The repository.
        repo: String,
        /// The test's id.
        test_id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// List REPO's quarantined tests (and those that ended in the last 30 days).
    #[command(alias = "list")]
    Ls {
        /// The repository.
        repo: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// In a job's step: read the suite's test ids on standard input (one per line) and print
    /// the next batch of the run's queue GROUP, leased to this attempt. The first shard to ask
    /// fills the queue (heaviest tests first, by recorded duration); a shard whose agent is
    /// lost gives its batches back, so every test runs exactly once in the run's reports.
    /// Exits 3 when no batch is left: `while kiln tests next --group unit < all.txt > b.txt;
    /// do …; done`. Needs `reports:` on the job (a batch is done when its reports are bound).
    Next {
        /// The queue's name within the run (the shards of one suite share it).
        #[arg(long, value_name = "GROUP")]
        group: String,
        /// Tests per batch (default: about a fortieth of the suite's recorded time).
        #[arg(long, value_name = "N")]
        batch_size: Option<u32>,
    },
    /// Read test ids on standard input (one per line) and print this shard's share:
    /// bin-packed by recorded durations (this branch's, else the default branch's; a test
    /// without one weighs the median, and standard error says how many had none), or dealt
    /// round-robin with --by count. In a job that declares `reports:`, the timings come from
    /// the file $KILN_TEST_TIMINGS names; elsewhere from the server (--repo, --ref).
    Split {
        /// How many shards.
        #[arg(long)]
        total: usize,
        /// This shard: 0 to TOTAL-1 (e.g. from a matrix value).
        #[arg(long)]
        index: usize,
        /// timings (default) or count.
        #[arg(long, default_value = "timings", value_parser = ["timings", "count"])]
        by: String,
        /// A timings file (as $KILN_TEST_TIMINGS: `{"durations_ms": {ID: MS}}`).
        #[arg(long, value_name = "FILE", env = "KILN_TEST_TIMINGS")]
        timings: Option<PathBuf>,
        /// Without a timings file: the repository whose recorded durations to use.
        #[arg(long, value_name = "REPO")]
        repo: Option<String>,
        /// With --repo: the branch whose durations to prefer (default: the default branch's).
        #[arg(long = "ref", value_name = "REF")]
        git_ref: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create an API token and print it (shown once; the server keeps a hash).
    Create {
        /// A name to recognise it by in listings and the audit log.
        #[arg(long)]
        name: String,
        /// `admin` (everything), `read` (every read but secrets, tokens,
        /// agents and the audit log) or `trigger` (start and read runs of one
        /// repository, given with --repo).
        #[arg(long, value_parser = ["admin", "read", "trigger"])]
        scope: String,
        /// The repository of a trigger token.
        #[arg(long)]
        repo: Option<String>,
        /// Runs this token starts are trusted (may read secrets). Default:
        /// yes for admin, no for trigger tokens.
        #[arg(long)]
        trusted: Option<bool>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List API tokens (never their secrets).
    #[command(alias = "list")]
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Revoke an API token (by id); it stops working at once on this server,
    /// within 2 s on other replicas.
    Revoke {
        /// The token's id (from `kiln token ls`).
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Subcommand, Debug)]
pub enum AgentTokenCommand {
    /// Create a join token and print it (shown once). Agents started with it
    /// (`kiln agent --token-file`) join POOL; a repository hands its secrets
    /// only to the pools it names (`kiln repo add --secret-pools`).
    Create {
        /// A name to recognise it by in listings and the audit log.
        #[arg(long)]
        name: String,
        /// The pool its agents join.
        #[arg(long, default_value = "default")]
        pool: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// List join tokens (never their secrets).
    #[command(alias = "list")]
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Revoke a join token: no new agent registers with it (agents already
    /// registered keep their session until removed with `kiln agents rm`).
    Revoke {
        /// The join token's id (from `kiln agent-token ls`).
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Subcommand, Debug)]
pub enum AgentsCommand {
    /// List registered agents (one per agent process start).
    #[command(alias = "list")]
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove an agent: its credential stops working and its running jobs
    /// are handed to other agents. Revoke its join token too to keep it out.
    Rm {
        /// The agent's id (from `kiln agents`).
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Args, Debug)]
pub struct AuditArgs {
    /// Entries to show, newest first.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Subcommand, Debug)]
pub enum EnvCommand {
    /// Create an environment. Without --approvers and --min-approvals its deploy jobs need no
    /// approval (they still run one run at a time, in acceptance order).
    Create {
        /// The environment's name (1-64 of letters, digits, `-`, `_`, `.`), as jobs name it in
        /// `environment:`.
        name: String,
        #[command(flatten)]
        rules: EnvRules,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the environments and their rules.
    #[command(alias = "list")]
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show one environment's rules.
    Show {
        /// The environment's name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Change an environment's rules (what is not given is kept; `--approvers ''` and
    /// `--refs ''` clear the list).
    Set {
        /// The environment's name.
        name: String,
        #[command(flatten)]
        rules: EnvRules,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove an environment (refused while deploy jobs to it are queued or running).
    #[command(alias = "remove")]
    Rm {
        /// The environment's name.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(clap::Args, Debug, Default)]
pub struct EnvRules {
    /// API token names that may approve (`admin`: the server's admin.token), comma-separated;
    /// without: any admin token, when --min-approvals asks for approvals.
    #[arg(long, value_name = "NAME,…", value_delimiter = ',')]
    pub approvers: Option<Vec<String>>,
    /// Distinct approvers a run needs (default 1 when --approvers is given, else 0: none).
    #[arg(long, value_name = "N")]
    pub min_approvals: Option<u32>,
    /// Whoever started a run may not approve it.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub prevent_self_review: Option<bool>,
    /// Refs that may deploy, comma-separated: branch names (`main`, `release/*`) or full
    /// refs (`refs/tags/v*`); a run from another ref is refused when submitted (422).
    #[arg(long, value_name = "PATTERN,…", value_delimiter = ',')]
    pub refs: Option<Vec<String>>,
    /// How long an approved deploy job waits before it may start (`10m`, `0`).
    #[arg(long, value_name = "DURATION", value_parser = kiln_cmd::parse_duration_or_off)]
    pub wait: Option<std::time::Duration>,
    /// How long an approval stands (default 30d).
    #[arg(long, value_name = "DURATION", value_parser = kiln_cmd::parse_duration)]
    pub approval_expiry: Option<std::time::Duration>,
    /// How many of its newest deployments keep their artifacts pinned against expiry, so a
    /// rollback to them deploys the same bytes (default 10; the current one is always kept).
    #[arg(long, value_name = "N")]
    pub keep_deployments: Option<u32>,
    /// Deploy only artifacts whose signed provenance satisfies POLICY, a comma-separated list
    /// of checks: `trusted` (built by a trusted run), `repo=NAME`, `ref=REF` (a full ref,
    /// `refs/heads/main`), `workflow=PATH`, `builder=ID` (repeatable: any of). A deploy job
    /// restoring an artifact that fails is cancelled naming the check, and its run fails.
    /// `none` removes the policy.
    #[arg(long, value_name = "POLICY")]
    pub require_provenance: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct DeploysArgs {
    /// The environment.
    pub env: String,
    /// At most this many (newest first).
    #[arg(long, default_value_t = 20)]
    pub limit: u32,
    /// Print JSON (`GET /v1/environments/{env}/deployments`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(clap::Args, Debug)]
pub struct RollbackArgs {
    /// The environment.
    pub env: String,
    /// The deployment to return to (an id from `kiln deploys ENV`).
    #[arg(long, value_name = "DEPLOYMENT")]
    pub to: Option<String>,
    /// Why (kept with the rollback's approval and in the audit log).
    #[arg(long)]
    pub comment: Option<String>,
    /// Print JSON (`POST /v1/environments/{env}/rollback`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(clap::Args, Debug)]
pub struct RingArgs {
    /// The run: its id, a unique prefix of 8 or more characters, or REPO#NUMBER.
    pub run: String,
    /// Print JSON (`POST /v1/workflow-runs/{run}/promote` or `/pause`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(clap::Args, Debug)]
pub struct RingsArgs {
    /// The run: its id, a unique prefix of 8 or more characters, or REPO#NUMBER.
    pub run: String,
    /// Print JSON (`GET /v1/workflow-runs/{run}/rings`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(clap::Args, Debug)]
pub struct DecideArgs {
    /// The run: its id (or a unique prefix), `REPO#NUMBER`, or a number with --repo.
    pub run: String,
    /// The environment (needed when the run deploys to more than one).
    #[arg(long)]
    pub env: Option<String>,
    /// Why (kept with the decision and in the audit log).
    #[arg(long)]
    pub comment: Option<String>,
    /// The repository of a run given by number.
    #[arg(long)]
    pub repo: Option<String>,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Subcommand, Debug)]
pub enum TeamCommand {
    /// Create a team. Move repositories into it with `kiln repo set REPO --team NAME`.
    Add {
        /// The team's name (1-64 of letters, digits, `-`, `_`, `.`).
        name: String,
        /// Its share of the slots relative to the other teams' (1-1000).
        #[arg(long, default_value_t = 1)]
        weight: u32,
        /// Jobs it may hold at once; a claimed job that has not started yet counts.
        #[arg(long, value_name = "N")]
        max_running: Option<u32>,
        /// Queued jobs past which its new API runs are refused (429) and its webhook and
        /// schedule runs wait until it is under the cap.
        #[arg(long, value_name = "N")]
        max_queued: Option<u32>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the teams: weight, quotas, repositories.
    #[command(alias = "list")]
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Change a team's weight or quotas (applies within a second, no restart); `none` removes
    /// a quota.
    Set {
        /// The team's name.
        name: String,
        /// Its share of the slots relative to the other teams' (1-1000).
        #[arg(long)]
        weight: Option<u32>,
        /// Jobs it may hold at once, or `none`.
        #[arg(long, value_name = "N|none", value_parser = parse_quota)]
        max_running: Option<Quota>,
        /// Queued jobs past which new API runs are refused, or `none`.
        #[arg(long, value_name = "N|none", value_parser = parse_quota)]
        max_queued: Option<Quota>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove a team that has no repositories (`default` stays).
    #[command(alias = "remove")]
    Rm {
        /// The team's name.
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
}

/// A quota as `kiln team set` takes it: a number of jobs, or `none`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota(pub Option<u32>);

fn parse_quota(s: &str) -> Result<Quota, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Quota(None));
    }
    s.parse::<u32>().map(|n| Quota(Some(n))).map_err(|_| format!("`{s}`: a number of jobs, or `none`"))
}

#[derive(clap::Args, Debug)]
pub struct QueueArgs {
    /// Print JSON (`GET /v1/queue`) instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(clap::Args, Debug)]
pub struct PriorityArgs {
    /// The run: its id (or a unique prefix), `REPO#NUMBER`, or a number with --repo.
    pub run: String,
    /// `urgent`, `normal` or `background`.
    #[arg(value_parser = ["urgent", "normal", "background"])]
    pub priority: String,
    /// The repository of a run given by number.
    #[arg(long)]
    pub repo: Option<String>,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Subcommand, Debug)]
pub enum SecretCommand {
    /// Create or replace secret NAME of REPO (`kiln secret set REPO NAME`), or of a deployment
    /// environment (`kiln secret set NAME --env ENV`). The value is read from standard input
    /// (one trailing newline removed), so it stays out of shell history:
    /// `printf %s "$TOKEN" | kiln secret set myrepo DEPLOY_TOKEN`.
    Set {
        /// The repository; with --env, the secret's name.
        #[arg(value_name = "REPO|NAME")]
        repo: String,
        /// The secret's name (an environment variable name); not with --env.
        name: Option<String>,
        /// An environment's secret instead: given (with the repository's) only to the approved
        /// deploy jobs of trusted runs deploying to ENV that list it under `secrets:`; it wins
        /// over a repository secret of the same name.
        #[arg(long, value_name = "ENV")]
        env: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the secret names of REPO, or of environment ENV with --env (values are never shown).
    #[command(alias = "ls")]
    List {
        /// The repository (not with --env).
        repo: Option<String>,
        /// List environment ENV's secrets instead.
        #[arg(long, value_name = "ENV")]
        env: Option<String>,
        /// Print JSON instead of names.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Delete secret NAME of REPO (`kiln secret rm REPO NAME`), or of an environment
    /// (`kiln secret rm NAME --env ENV`).
    Rm {
        /// The repository; with --env, the secret's name.
        #[arg(value_name = "REPO|NAME")]
        repo: String,
        /// The secret's name; not with --env.
        name: Option<String>,
        /// Delete environment ENV's secret instead.
        #[arg(long, value_name = "ENV")]
        env: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Seal every secret under a new key, in one transaction, and replace
    /// the key file (run on the server's machine; running servers pick the
    /// new key up at their next read of a secret).
    #[command(name = "rotate-key")]
    RotateKey {
        /// The server's data directory.
        #[arg(long, default_value = "kiln-data")]
        data_dir: PathBuf,
        /// The server's database (default: SQLite in DATA_DIR).
        #[arg(long, env = "KILN_DATABASE_URL")]
        database_url: Option<String>,
        /// The key file (default: DATA_DIR/secrets.key).
        #[arg(long, env = "KILN_SECRETS_KEY_FILE")]
        secrets_key_file: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ArtifactCommand {
    /// Download the artifact NAME that job JOB of RUN published (its bound generation), verifying its sha256.
    ///
    /// A file is written as it is. A directory or glob artifact is written with `-o PATH` as a normal
    /// archive (`.tar.gz` by default, `.zip` with `--format zip` or a PATH ending in `.zip`) holding the
    /// tree's contents, or with `--extract DIR` unpacked into DIR (which must not exist or be empty):
    /// nothing outside DIR is written, no entry is written through a link, and DIR appears only once
    /// all of it verified.
    #[command(group(clap::ArgGroup::new("to").required(true).args(["output", "extract"])))]
    Get {
        /// The run: REPO#NUMBER (hello#123), NUMBER with --repo, its id, or a unique id prefix of 8+ characters.
        run: String,
        /// The repository a bare run NUMBER is of.
        #[arg(long, value_name = "REPO")]
        repo: Option<String>,
        /// The job's name (or id).
        job: String,
        /// The artifact's name (as published by the job).
        name: String,
        /// Where to write it (`-` for standard output): a file as it is, a directory or glob as an archive
        /// (see --format).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Unpack the artifact into DIR (it must not exist, or be empty); a file artifact is written as DIR/NAME.
        #[arg(long, value_name = "DIR")]
        extract: Option<PathBuf>,
        /// The archive format of a directory or glob artifact written with -o: `tar.gz` or `zip`
        /// (default: `zip` for a PATH ending in `.zip`, else `tar.gz`).
        #[arg(long, value_parser = ["tar.gz", "zip"])]
        format: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Print (or write with -o) the signed provenance of artifact NAME of job JOB of RUN: a DSSE
    /// envelope holding an in-toto SLSA v1 statement the server wrote when it bound the artifact.
    /// Check it with `kiln verify FILE --provenance THIS --repo R`.
    Provenance {
        /// The run: REPO#NUMBER (hello#123), NUMBER with --repo, its id, or a unique id prefix of 8+ characters.
        run: String,
        /// The repository a bare run NUMBER is of.
        #[arg(long, value_name = "REPO")]
        repo: Option<String>,
        /// The job's name (or id).
        job: String,
        /// The artifact's name (as published by the job).
        name: String,
        /// Write it to this file instead of standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the artifacts a run's jobs published: name, job, size, sha256, kind (file or archive), expiry.
    List {
        /// The run: REPO#NUMBER (hello#123), NUMBER with --repo, its id, or a unique id prefix of 8+ characters.
        run: String,
        /// The repository a bare run NUMBER is of.
        #[arg(long, value_name = "REPO")]
        repo: Option<String>,
        /// Only this job's artifacts (name or id).
        job: Option<String>,
        /// Print the artifacts as JSON (`[{"job", "name", "size", "sha256", "kind", "expires_at", "expired", …}]`).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Write the server's provenance public keys (JWKS; with --pem, PEM blocks) to a file or
    /// standard output, for `kiln verify --keys FILE` without the server, or another verifier.
    Export {
        /// Write them here instead of standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// PEM (SubjectPublicKeyInfo) blocks instead of a JWKS document.
        #[arg(long)]
        pem: bool,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The artifact's bytes (a file; a directory artifact as the archive `kiln artifact get -o` wrote
    /// is not its bound bytes: verify the archive the job published).
    pub file: PathBuf,
    /// The provenance envelope (`kiln artifact provenance … -o FILE`; default: FILE.intoto.json).
    #[arg(long, value_name = "ENVELOPE")]
    pub provenance: Option<PathBuf>,
    /// Check a Test Result attestation instead (`kiln tests attestation RUN JOB -o FILE`):
    /// signed by the server, about these bytes, of --repo, and the tests passed (quarantined
    /// failures count as warnings). Exit 22 when they failed. Not with --provenance, --ref,
    /// --workflow, --builder, --name, --trusted-only, --allow-untrusted (a test result does not
    /// carry trust: check the provenance of the same bytes for it).
    #[arg(long, value_name = "ENVELOPE", conflicts_with_all = ["provenance", "git_ref", "workflow", "builders", "name", "trusted_only", "allow_untrusted"])]
    pub test_result: Option<PathBuf>,
    /// The repository (its name in Kiln) the artifact must be built from.
    #[arg(long)]
    pub repo: String,
    /// The ref it must be built from, e.g. refs/heads/main (default: any).
    #[arg(long = "ref", value_name = "REF")]
    pub git_ref: Option<String>,
    /// The workflow file that must have built it, e.g. .kiln/release.yaml (default: any).
    #[arg(long)]
    pub workflow: Option<String>,
    /// A builder id allowed (repeatable), e.g. https://ci.example.com/builders/default (default: any
    /// builder the keys sign for).
    #[arg(long = "builder", value_name = "ID")]
    pub builders: Vec<String>,
    /// Refuse provenance of untrusted runs (fork pull requests): the default, said explicitly.
    #[arg(long, conflicts_with = "allow_untrusted")]
    pub trusted_only: bool,
    /// Accept provenance of untrusted runs.
    #[arg(long)]
    pub allow_untrusted: bool,
    /// The artifact's name as the statement names it (default: the statement's only subject).
    #[arg(long)]
    pub name: Option<String>,
    /// Verify offline with these keys (`kiln keys export -o FILE`, JWKS) instead of the server's.
    #[arg(long, value_name = "FILE")]
    pub keys: Option<PathBuf>,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args, Debug)]
pub struct LoginArgs {
    /// The server's URL, e.g. https://ci.example.com or http://127.0.0.1:7070.
    pub url: String,
    /// File holding the API token (e.g. the server's DATA_DIR/admin.token, or one from
    /// `kiln token create`); `-` or none: read it from standard input. Never on the command line.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The context's name; an existing context of that name is replaced. It becomes the current one.
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub context: String,
}

#[derive(Subcommand, Debug)]
pub enum ContextCommand {
    /// List the contexts (name, server; `*` marks the current one).
    #[command(alias = "ls")]
    List {
        /// Print JSON instead of a table (never the tokens).
        #[arg(long)]
        json: bool,
    },
    /// Make context NAME the current one.
    Use {
        /// The context's name (from `kiln context list`).
        name: String,
    },
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Repository name.
    #[arg(long)]
    pub repo: String,
    /// Commit SHA or ref (branch, tag, HEAD); resolved once, at acceptance.
    /// HEAD is the branch the repository's HEAD points to: the run's ref is
    /// `refs/heads/BRANCH`, as with `--commit BRANCH`.
    #[arg(long, default_value = "HEAD")]
    pub commit: String,
    /// Workflow file inside the repository. Without it: `.kiln/pipeline.yaml` if the commit has
    /// one, else its only workflow, else every workflow whose `on:` declares `manual` (each is a
    /// run of its own); otherwise the workflows are listed for you to pick (`kiln workflows`).
    #[arg(long, value_name = "PATH")]
    pub workflow: Option<String>,
    /// Workflow input, repeatable: --input suite=integration
    #[arg(long = "input", value_name = "K=V")]
    pub inputs: Vec<String>,
    /// Idempotency key: resubmitting with the same key returns the same run.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// The run's priority lane over what its workflow and trigger say: `urgent`, `normal` or
    /// `background` (admin token). Default: the workflow's `priority:`, else `normal`.
    #[arg(long, value_parser = ["urgent", "normal", "background"])]
    pub priority: Option<String>,
    /// Stream logs until the run finishes; exit 0 only if it succeeded. While a job
    /// has not started, say on stderr what it waits for (a line each time that changes).
    #[arg(long)]
    pub follow: bool,
    /// Print the run as JSON (with --follow: the final run object).
    #[arg(long)]
    pub json: bool,
    /// With --follow: prefix each log line with the time the server received it
    /// (RFC 3339 in UTC, millisecond precision, e.g. 2026-12-01T17:30:00.123Z).
    #[arg(long, requires = "follow")]
    pub timestamps: bool,
    #[command(flatten)]
    pub conn: Conn,
}

/// `kiln exec`: a local run of a workflow, on the server's engine in this process.
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Workflow file (a path in the checkout, e.g. .kiln/ci.yaml). Default: .kiln/pipeline.yaml, or
    /// the only workflow in .kiln/; with several and no pipeline.yaml they are listed to pick from.
    #[arg(value_name = "WORKFLOW")]
    pub workflow: Option<PathBuf>,
    /// Run only this job and what it needs (repeatable; a matrix job's name runs all its
    /// combinations). The snapshot's workflow file then holds only those jobs. Default: every job.
    #[arg(long = "job", value_name = "JOB")]
    pub jobs: Vec<String>,
    /// Workflow input, repeatable: --input suite=integration
    #[arg(long = "input", value_name = "K=V")]
    pub inputs: Vec<String>,
    /// The event the run is started as (what `event` is in expressions and which `on:` filters
    /// apply). Default: manual when the workflow may be started by hand, else push.
    #[arg(long, value_parser = ["push", "pull_request", "schedule", "manual"])]
    pub event: Option<String>,
    /// The ref the run is for (refs/heads/NAME, refs/tags/NAME, or a branch name). Default: the
    /// branch checked out (none when HEAD is detached).
    #[arg(long = "ref", value_name = "REF")]
    pub git_ref: Option<String>,
    /// Run this commit (SHA, branch, tag, HEAD~1, …) instead of the working tree. Default: the
    /// working tree as it is, uncommitted and untracked (not ignored) files included, frozen in
    /// a synthetic snapshot commit; your index and files are not touched.
    #[arg(long, value_name = "REV")]
    pub commit: Option<String>,
    /// A secret the workflow's jobs ask for (`secrets: [NAME]`), read from FILE (its final
    /// newline dropped); repeatable. Secrets also come from KILN_SECRET_<NAME> variables, and
    /// from nowhere else. Masked in the output as on a server.
    #[arg(long = "secret-file", value_name = "NAME=FILE")]
    pub secret_files: Vec<String>,
    /// Local agents (one job each at a time). Default: the widest level of the job graph (the
    /// most jobs that can run at once), at most 8.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub agents: Option<u32>,
    /// Also serve the API and web UI on this address while the run lasts (e.g. 127.0.0.1:7070),
    /// and print its URL and admin token. Without it the in-process server listens only on a
    /// loopback port of its own agents, which is not printed.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Keep the run's sandboxes (workspaces, HOME, TMPDIR of each job) and print where they are.
    /// Without it they are removed as on any agent.
    #[arg(long)]
    pub keep: bool,
    /// Print the final run object as JSON on standard output (the object of `kiln status --json`
    /// and the API); the live view then goes to standard error.
    #[arg(long)]
    pub json: bool,
    /// Prefix each log line with the time the in-process server received it.
    #[arg(long)]
    pub timestamps: bool,
    #[command(flatten)]
    pub server: ServerTuning,
    #[command(flatten)]
    pub agent: AgentTuning,
}

#[derive(Args, Debug)]
pub struct WorkflowsArgs {
    /// Repository name.
    pub repo: String,
    /// Commit SHA or ref (branch, tag, HEAD).
    #[arg(long, default_value = "HEAD")]
    pub commit: String,
    /// Print the list as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args, Debug)]
pub struct RunsArgs {
    /// Only this repository's runs.
    #[arg(long)]
    pub repo: Option<String>,
    /// Only runs with this status.
    #[arg(long, value_parser = ["queued", "running", "cancelling", "success", "failed", "cancelled"])]
    pub status: Option<String>,
    /// Only runs of this branch, however they were started (`--commit HEAD`,
    /// `--commit BRANCH`, a push): BRANCH or refs/heads/BRANCH.
    #[arg(long)]
    pub branch: Option<String>,
    /// Only runs started by this event: `push`, `pull_request`, `manual` (`kiln run`, the UI's
    /// button), `schedule`, `retry` (`kiln retry`) or `rollback` (`kiln rollback`).
    #[arg(long, value_parser = ["push", "pull_request", "manual", "schedule", "retry", "rollback"])]
    pub event: Option<String>,
    /// How many runs at most (1-500).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub limit: u32,
    /// Print the API's run summaries as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args, Debug)]
pub struct TopArgs {
    /// How often to refresh the view on a terminal (e.g. `2s`, `500ms`; at least 100ms).
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub interval: std::time::Duration,
    /// Print one snapshot as plain text and exit (what happens anyway when
    /// standard output is not a terminal).
    #[arg(long)]
    pub once: bool,
    /// Print one snapshot as JSON (the API's `GET /v1/overview`) and exit.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The run: REPO#NUMBER (hello#123), NUMBER with --repo, its id, or a unique id prefix of 8+ characters.
    pub run: String,
    /// The repository a bare run NUMBER is of (`kiln logs 123 --repo hello` is `kiln logs hello#123`).
    #[arg(long, value_name = "REPO")]
    pub repo: Option<String>,
    /// Print the run object of the API as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args, Debug)]
pub struct LogsArgs {
    /// The run: REPO#NUMBER (hello#123), NUMBER with --repo, its id, or a unique id prefix of 8+ characters.
    pub run: String,
    /// The repository a bare run NUMBER is of (`kiln logs 123 --repo hello` is `kiln logs hello#123`).
    #[arg(long, value_name = "REPO")]
    pub repo: Option<String>,
    /// Only this job (name or id); a matrix job's base name (`test`) selects all its
    /// expansions (`test (py=3.10)`, …), in order, each with its header.
    pub job: Option<String>,
    /// Keep streaming until the jobs finish, then exit with the result: 0 if
    /// the run (or JOB) succeeded, 1 if it failed or was cancelled. While a job
    /// has not started, say on stderr what it waits for (a line each time that changes).
    #[arg(long, short)]
    pub follow: bool,
    /// Prefix each line with the time the server received it (RFC 3339 in UTC, millisecond
    /// precision, e.g. 2026-12-01T17:30:00.123Z; agents ship output every 100 ms).
    #[arg(long, short)]
    pub timestamps: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args, Debug)]
pub struct RetryArgs {
    /// The run: REPO#NUMBER (hello#123), NUMBER with --repo, its id, or a unique id prefix of 8+ characters.
    pub run: String,
    /// The repository a bare run NUMBER is of (`kiln logs 123 --repo hello` is `kiln logs hello#123`).
    #[arg(long, value_name = "REPO")]
    pub repo: Option<String>,
    /// Run again only the jobs that failed, were cancelled or skipped, and their descendants;
    /// the jobs that succeeded are pinned: `success` with the same artifacts, not run again.
    #[arg(long)]
    pub failed: bool,
    /// Run again only this job (its name, or a matrix job's name without its values for every
    /// instance) and the jobs that need it, directly or not; the other jobs that succeeded are
    /// pinned, not run again. Refused while RUN is still running; a job that succeeded may be named.
    #[arg(long, value_name = "NAME", conflicts_with = "failed")]
    pub job: Option<String>,
    /// Stream the new run's logs until it finishes; exit 0 only if it succeeded.
    #[arg(long)]
    pub follow: bool,
    /// With --follow: prefix each log line with its time (RFC 3339, UTC).
    #[arg(long, requires = "follow")]
    pub timestamps: bool,
    /// Print JSON: `{"run_id"}` (with --follow: the final run object).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args, Debug)]
pub struct CancelArgs {
    /// The run: REPO#NUMBER (hello#123), NUMBER with --repo, its id, or a unique id prefix of 8+ characters.
    pub run: String,
    /// The repository a bare run NUMBER is of (`kiln logs 123 --repo hello` is `kiln logs hello#123`).
    #[arg(long, value_name = "REPO")]
    pub repo: Option<String>,
    /// Cancel only this job (its name, or a matrix job's name without its values for every
    /// instance): a waiting job at once, a running one is stopped; the jobs that need it are
    /// skipped, the rest of the run goes on, and the run ends `failed`.
    #[arg(long, value_name = "NAME")]
    pub job: Option<String>,
    /// Print the run object of the API as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

#[derive(Args, Debug)]
pub struct RunRef {
    /// The run: REPO#NUMBER (hello#123), NUMBER with --repo, its id, or a unique id prefix of 8+ characters.
    pub run: String,
    /// The repository a bare run NUMBER is of (`kiln logs 123 --repo hello` is `kiln logs hello#123`).
    #[arg(long, value_name = "REPO")]
    pub repo: Option<String>,
    /// Print the run object of the API as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: Conn,
}

/// `--build-registry`: `HOST[:PORT]/PATH` in the lowercase characters an
/// image repository may use, no tag, digest or scheme.
fn parse_build_registry(s: &str) -> Result<String, String> {
    let s = s.trim().trim_end_matches('/');
    let ok_chars = s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/:".contains(c));
    let (host, path) = s.split_once('/').unwrap_or((s, ""));
    if s.contains("://") || !ok_chars || host.is_empty() || path.is_empty() || path.contains(':') || s.contains("//") {
        return Err(format!(
            "`{s}` is not HOST[:PORT]/PATH (lowercase, no scheme, tag or digest), e.g. registry.example.com/kiln-builds"
        ));
    }
    Ok(s.to_string())
}

/// A percentage: `2`, `2.5` or `2%`, from 0 to 100.
fn parse_percent(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().trim_end_matches('%').trim().parse().map_err(|_| format!("`{s}` is not a percentage"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("`{s}` is not between 0 and 100"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    #[test]
    fn build_registries_are_host_and_path() {
        assert_eq!(super::parse_build_registry("127.0.0.1:5000/kiln-builds/").unwrap(), "127.0.0.1:5000/kiln-builds");
        for bad in ["https://r.example/x", "r.example", "r.example/Builds", "r.example/x:tag", "r.example//x"] {
            assert!(super::parse_build_registry(bad).is_err(), "{bad} accepted");
        }
    }

    use super::*;

    #[test]
    fn clap_definition_is_valid() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// Every visible argument and subcommand says what it is for.
    #[test]
    fn every_argument_is_documented() {
        use clap::CommandFactory;
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if a.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.is_hide_set() || sub.get_name() == "help" {
                    continue;
                }
                let name = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() {
                    missing.push(format!("{name} (about)"));
                }
                walk(sub, &name, missing);
            }
        }
        let mut missing = vec![];
        walk(&Cli::command(), "kiln", &mut missing);
        assert!(missing.is_empty(), "undocumented: {missing:#?}");
    }

    /// `bench` is a developer tool: hidden from the main help.
    #[test]
    fn bench_is_hidden() {
        use clap::CommandFactory;
        let help = Cli::command().render_help().to_string();
        assert!(!help.contains("bench"), "{help}");
        assert!(help.contains("completions") && help.contains("runs") && help.contains("wait"), "{help}");
    }
}
