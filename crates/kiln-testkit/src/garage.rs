//! A throwaway Garage server (an S3-compatible object store) for tests: one
//! node on loopback ports with a bucket and a key, in a temporary directory.
//!
//! Garage is found as `$KILN_GARAGE`, `garage` on `PATH`, or where
//! `scripts/test` installs it (`~/.cache/kiln-tools/garage/bin/garage`).
//! Without it the tests that need S3 skip with a message, unless
//! `KILN_REQUIRE_S3=1` (set by scripts/test), where they fail.
//!
//! The server runs under a watchdog shell holding a pipe from the test
//! process: when the pipe closes (drop, or the process ending however it
//! ends) the watchdog kills Garage and removes its directory.

use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// The access key every test Garage is given (Garage's key id format).
pub const GARAGE_KEY_ID: &str = "GK0123456789abcdef01234567";
pub const GARAGE_SECRET: &str = "5ec2e7a15ec2e7a15ec2e7a15ec2e7a15ec2e7a15ec2e7a15ec2e7a15ec2e7a1";
pub const GARAGE_BUCKET: &str = "kiln";
pub const GARAGE_REGION: &str = "garage";

pub struct TempGarage {
    dir: tempfile::TempDir,
    bin: PathBuf,
    s3_port: u16,
    watchdog: Option<(Child, ChildStdin)>,
}

fn find_garage() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KILN_GARAGE").map(PathBuf::from).filter(|p| p.is_file()) {
        return Some(p);
    }
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cache/kiln-tools/garage/bin"));
    }
    dirs.into_iter().map(|d| d.join("garage")).find(|p| p.is_file())
}

/// Whether tests needing S3 can run (see the module docs).
pub fn garage_available() -> bool {
    if find_garage().is_some() {
        return true;
    }
    if std::env::var("KILN_REQUIRE_S3").is_ok_and(|v| v == "1") {
        panic!("Garage (S3) is required (KILN_REQUIRE_S3=1) but not installed: run scripts/test or set KILN_GARAGE");
    }
    eprintln!("skipped: Garage (S3) is not installed; set KILN_REQUIRE_S3=1 to fail instead");
    false
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl TempGarage {
    pub fn start() -> Result<TempGarage> {
        // Its ports are picked free here and bound by Garage a moment later:
        // on a busy test run another process can take one in between. Then
        // it starts again, on new ports.
        let mut tries = 0;
        loop {
            match Self::start_once() {
                Err(e) if tries < 3 && format!("{e:#}").contains("Address already in use") => tries += 1,
                r => return r,
            }
        }
    }

    fn start_once() -> Result<TempGarage> {
        let bin = find_garage().context("Garage not found (KILN_GARAGE, PATH, ~/.cache/kiln-tools/garage/bin)")?;
        let dir = tempfile::Builder::new().prefix("kiln-garage-").tempdir()?;
        let (rpc, s3_port) = (free_port()?, free_port()?);
        let d = dir.path().display();
        std::fs::write(
            dir.path().join("garage.toml"),
            format!(
                "metadata_dir = \"{d}/meta\"\ndata_dir = \"{d}/data\"\ndb_engine = \"sqlite\"\n\
                 replication_factor = 1\ncompression_level = \"none\"\nrpc_bind_addr = \"127.0.0.1:{rpc}\"\nrpc_public_addr = \"127.0.0.1:{rpc}\"\n\
                 rpc_secret = \"{}\"\n[s3_api]\ns3_region = \"{GARAGE_REGION}\"\napi_bind_addr = \"127.0.0.1:{s3_port}\"\n\
                 root_domain = \".s3.garage.localhost\"\n",
                "4b696c6e".repeat(8),
            ),
        )?;
        let script = format!(
            "'{bin}' -c '{d}/garage.toml' server >'{d}/server.log' 2>&1 & p=$!; cat >/dev/null; kill -9 $p; wait $p; rm -rf '{d}'",
            bin = bin.display()
        );
        let mut child = Command::new("setsid")
            .args(["sh", "-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawn Garage")?;
        let stdin = child.stdin.take().expect("stdin");
        let g = TempGarage { dir, bin, s3_port, watchdog: Some((child, stdin)) };
        g.setup().with_context(|| format!("set up Garage; its log:\n{}", g.log()))?;
        Ok(g)
    }

    fn garage(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.bin)
            .arg("-c")
            .arg(self.dir.path().join("garage.toml"))
            .args(args)
            .output()
            .with_context(|| format!("run garage {args:?}"))?;
        if !out.status.success() {
            bail!(
                "garage {args:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn setup(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        // `node id` reads a local file; `status` needs the RPC port up.
        loop {
            match self.garage(&["status"]) {
                Ok(_) => break,
                r if Instant::now() > deadline => bail!("Garage did not come up: {r:?}"),
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        let node = self.garage(&["node", "id", "-q"])?.trim().split('@').next().unwrap_or("").to_string();
        self.garage(&["layout", "assign", "-z", "dc1", "-c", "1G", &node])?;
        self.garage(&["layout", "apply", "--version", "1"])?;
        self.garage(&["bucket", "create", GARAGE_BUCKET])?;
        self.garage(&["key", "import", "--yes", "-n", "kiln-test", GARAGE_KEY_ID, GARAGE_SECRET])?;
        self.garage(&["bucket", "allow", "--read", "--write", "--owner", GARAGE_BUCKET, "--key", "kiln-test"])?;
        // The S3 endpoint answers once the layout is live.
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.s3_port)).is_err() {
            if Instant::now() > deadline {
                bail!("Garage's S3 port {} never opened", self.s3_port);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// `http://127.0.0.1:PORT`
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3_port)
    }

    /// The `--object-store` URL of the test bucket (under `prefix`, if any).
    pub fn url(&self, prefix: &str) -> String {
        let p = if prefix.is_empty() { String::new() } else { format!("/{prefix}") };
        format!("s3://{GARAGE_BUCKET}{p}?endpoint={}&region={GARAGE_REGION}", self.endpoint())
    }

    /// Environment for a process that talks to this Garage.
    pub fn env(&self) -> [(&'static str, &'static str); 2] {
        [("AWS_ACCESS_KEY_ID", GARAGE_KEY_ID), ("AWS_SECRET_ACCESS_KEY", GARAGE_SECRET)]
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for TempGarage {
    fn drop(&mut self) {
        if let Some((mut child, stdin)) = self.watchdog.take() {
            drop(stdin);
            let _ = child.wait();
        }
    }
}
