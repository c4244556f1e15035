//! A throwaway PostgreSQL server for tests: `initdb` + `pg_ctl` on a
//! temporary directory and a free loopback port.
//!
//! Cheap enough for one server per test process (nextest runs each test in
//! its own process): `initdb` runs once per machine into a cached template
//! data directory, and each server starts from a copy of it (~0.3 s). A
//! server is stopped on `Drop` and, for the process-wide [`shared`] server
//! that is never dropped, by a watchdog that stops it when the test process
//! exits (however it exits). Each test gets fresh databases with
//! [`TempPostgres::create_database`].
//!
//! PostgreSQL refuses to run as root: as root, the server runs as the system
//! user `postgres` (created if missing) through `runuser`.
//!
//! Without the binaries the tests that need PostgreSQL skip with a message,
//! unless `KILN_REQUIRE_POSTGRES=1` (set by scripts/test), where they fail.

use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

const USER: &str = "postgres";

/// A running PostgreSQL server on 127.0.0.1; superuser `postgres`, trust auth.
pub struct TempPostgres {
    dir: tempfile::TempDir,
    port: u16,
    bin: PathBuf,
    /// Closing this pipe (drop, or the process ending) makes the watchdog
    /// stop the server and remove its directory.
    watchdog: Option<(Child, ChildStdin)>,
}

/// The directory holding `initdb` and `pg_ctl`, if PostgreSQL is installed.
fn find_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.push("/usr/local/bin".into());
    if let Ok(rd) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path().join("bin")).collect();
        versions.sort();
        dirs.extend(versions.into_iter().rev());
    }
    dirs.into_iter().find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file() && d.join("postgres").is_file())
}

/// Whether tests needing PostgreSQL can run. Without the binaries: a skip
/// message, or a panic under `KILN_REQUIRE_POSTGRES=1`.
pub fn postgres_available() -> bool {
    if find_bin().is_some() {
        return true;
    }
    if std::env::var("KILN_REQUIRE_POSTGRES").is_ok_and(|v| v == "1") {
        panic!("PostgreSQL (initdb, pg_ctl) is required (KILN_REQUIRE_POSTGRES=1) but not installed");
    }
    eprintln!("skipped: PostgreSQL (initdb, pg_ctl) is not installed; set KILN_REQUIRE_POSTGRES=1 to fail instead");
    false
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

/// A command run as the server's user (`postgres` when we are root).
fn as_pg(bin: &Path, prog: &str) -> Command {
    let prog = bin.join(prog);
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", USER, "--"]).arg(prog);
        c
    } else {
        Command::new(prog)
    }
}

fn run(mut c: Command, what: &str) -> Result<()> {
    let out = c.output().with_context(|| format!("run {what}"))?;
    if !out.status.success() {
        bail!("{what} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn ensure_user() -> Result<()> {
    if !is_root() || Command::new("id").arg(USER).output().is_ok_and(|o| o.status.success()) {
        return Ok(());
    }
    let mut c = Command::new("useradd");
    c.args(["-r", "-M", "-s", "/usr/sbin/nologin", USER]);
    run(c, "useradd postgres")
}

fn chown_pg(path: &Path) -> Result<()> {
    if is_root() {
        let mut c = Command::new("chown");
        c.args(["-R", &format!("{USER}:")]).arg(path);
        run(c, "chown")?;
    }
    Ok(())
}

/// The cached, initialised data directory every server is copied from.
fn template(bin: &Path) -> Result<PathBuf> {
    let version = Command::new(bin.join("postgres")).arg("-V").output().context("postgres -V")?;
    let version: String = String::from_utf8_lossy(&version.stdout)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' })
        .collect();
    let root = std::env::temp_dir().join(format!("kiln-pg-template-{}", version.trim_matches('-')));
    let data = root.join("data");
    if data.join("PG_VERSION").is_file() && root.join("ready").is_file() {
        return Ok(data);
    }
    // Build it beside, then rename into place: concurrent test processes
    // race harmlessly (one rename wins, the others use it).
    let tmp = std::env::temp_dir().join(format!("kiln-pg-template-build-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    chown_pg(&tmp)?;
    let mut c = as_pg(bin, "initdb");
    c.arg("-D")
        .arg(tmp.join("data"))
        .args(["-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"])
        .args(["--wal-segsize=1"]);
    run(c, "initdb")?;
    let conf = "\n# kiln tests: throwaway data, speed over durability\nfsync = off\nsynchronous_commit = off\n\
                full_page_writes = off\nlisten_addresses = '127.0.0.1'\nmax_connections = 200\n\
                shared_buffers = 32MB\nlog_min_messages = warning\n";
    std::fs::OpenOptions::new().append(true).open(tmp.join("data/postgresql.conf"))?.write_all(conf.as_bytes())?;
    std::fs::write(tmp.join("ready"), "")?;
    if std::fs::rename(&tmp, &root).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
        if !root.join("ready").is_file() {
            bail!("could not place the PostgreSQL template at {}", root.display());
        }
    }
    Ok(data)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl TempPostgres {
    /// Start a server from the cached template on a free port. Throwaway
    /// data: fsync and synchronous commit are off (see [`Self::start_durable`]).
    pub fn start() -> Result<TempPostgres> {
        Self::start_with("")
    }

    /// [`Self::start`] with PostgreSQL's durable defaults (fsync, synchronous
    /// commit, full page writes): what a benchmark must measure against, since
    /// a deployment commits to disk.
    pub fn start_durable() -> Result<TempPostgres> {
        Self::start_with(" -c fsync=on -c synchronous_commit=on -c full_page_writes=on")
    }

    /// Start with extra `postgres` command-line options (they override the
    /// template's `postgresql.conf`).
    fn start_with(options: &str) -> Result<TempPostgres> {
        let bin = find_bin().context("PostgreSQL binaries (initdb, pg_ctl) not found")?;
        ensure_user()?;
        let template = template(&bin)?;
        let dir = tempfile::Builder::new().prefix("kiln-pg-").tempdir()?;
        let mut c = Command::new("cp");
        c.arg("-a").arg(&template).arg(dir.path().join("data"));
        run(c, "copy the PostgreSQL template")?;
        chown_pg(dir.path())?;
        let mut last = None;
        for _ in 0..3 {
            let port = free_port()?;
            let mut c = as_pg(&bin, "pg_ctl");
            c.arg("-D")
                .arg(dir.path().join("data"))
                .arg("-l")
                .arg(dir.path().join("server.log"))
                .args(["-w", "-t", "60", "-o"])
                .arg(format!("-p {port} -k {}{options}", dir.path().display()))
                .arg("start")
                .stdout(Stdio::null());
            match run(c, "pg_ctl start") {
                Ok(()) => {
                    let mut pg = TempPostgres { dir, port, bin, watchdog: None };
                    pg.watchdog = Some(pg.spawn_watchdog()?);
                    return Ok(pg);
                }
                // Most likely the port was taken in between: try another.
                Err(e) => last = Some(e),
            }
        }
        let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
        Err(last.expect("an attempt").context(log))
    }

    /// The process-wide server (started on first use), or `None` when
    /// PostgreSQL is not installed (see [`postgres_available`]).
    pub fn shared() -> Option<&'static TempPostgres> {
        static SHARED: OnceLock<Option<TempPostgres>> = OnceLock::new();
        SHARED.get_or_init(|| postgres_available().then(|| TempPostgres::start().expect("start PostgreSQL"))).as_ref()
    }

    /// `sh` waiting on a pipe; EOF (we dropped it or exited) stops the server.
    fn spawn_watchdog(&self) -> Result<(Child, ChildStdin)> {
        let data = self.dir.path().join("data");
        let stop = format!(
            "cat >/dev/null; {}'{}' -D '{}' -m immediate -w stop >/dev/null 2>&1; rm -rf '{}'",
            if is_root() { format!("runuser -u {USER} -- ") } else { String::new() },
            self.bin.join("pg_ctl").display(),
            data.display(),
            self.dir.path().display(),
        );
        // Its own session: the test runner may kill the test's process group
        // as the test ends, and the watchdog must outlive the test.
        let mut child = Command::new("setsid")
            .args(["sh", "-c", &stop])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawn the PostgreSQL watchdog")?;
        let stdin = child.stdin.take().expect("stdin");
        Ok((child, stdin))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Create a fresh, empty database and return its URL.
    pub async fn create_database(&self) -> Result<String> {
        use sqlx::Connection;
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!("kiln_{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        let mut conn = sqlx::PgConnection::connect(&self.url("postgres")).await.context("connect to PostgreSQL")?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .context("create database")?;
        conn.close().await?;
        Ok(self.url(&name))
    }

    /// Stop the server (`pg_ctl stop -m fast`: connections are closed, the
    /// data stays) to simulate a database outage; [`TempPostgres::resume`]
    /// starts it again on the same port.
    pub fn stop(&self) -> Result<()> {
        let mut c = as_pg(&self.bin, "pg_ctl");
        c.arg("-D").arg(self.dir.path().join("data")).args(["-m", "fast", "-w", "-t", "60", "stop"]);
        run(c, "pg_ctl stop")
    }

    /// Start the server stopped by [`TempPostgres::stop`] again, on the same
    /// data directory and port.
    pub fn resume(&self) -> Result<()> {
        let mut c = as_pg(&self.bin, "pg_ctl");
        c.arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(["-w", "-t", "60", "-o"])
            .arg(format!("-p {} -k {}", self.port, self.dir.path().display()))
            .arg("start")
            .stdout(Stdio::null());
        run(c, "pg_ctl start")
    }

    /// The server's log (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        // Stop now, then let the watchdog (which finds it stopped) exit.
        let mut c = as_pg(&self.bin, "pg_ctl");
        c.arg("-D").arg(self.dir.path().join("data")).args(["-m", "immediate", "-w", "stop"]).stdout(Stdio::null());
        let _ = c.stderr(Stdio::null()).status();
        if let Some((mut child, stdin)) = self.watchdog.take() {
            drop(stdin);
            let _ = child.wait();
        }
    }
}
