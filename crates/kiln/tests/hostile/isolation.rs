//! Issue 39, items 8, 9 and 10: what a step can reach of Kiln and of other
//! jobs, as the attacker tries it, with real `kiln up`, `kiln server` and
//! `kiln agent` processes (and Podman for the container executor).
//!
//! - item 8: under a non-root `kiln up` (the README's quick start as a
//!   normal user) a step read `DATA_DIR/admin.token`; now each step's mount
//!   namespace hides the data directory, the agent's work dir and its token
//!   file.
//! - item 9: a job's `/tmp` and `/dev/shm` were the host's: an untrusted
//!   job left `/tmp/x -> /dev/shm/leak`, a later trusted job wrote its secret
//!   through it, a later untrusted job read it. Now each job has its own.
//! - item 10: a container job kept the engine's default capabilities; now
//!   all but a short list are dropped, with `no-new-privileges` and a pids
//!   limit.

use crate::{bin, containers_available, engine_url, registry};
use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnServer, KilnUp, TestRepo};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The `kiln` under test: this build, or `KILN_HOSTILE_BIN` (how these
/// tests were checked against the build before the fix).
fn unique() -> String {
    let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{}-{n}", std::process::id())
}

fn one_job(steps: &[&str]) -> String {
    let steps: Vec<String> =
        steps.iter().map(|s| format!("      - |\n        {}", s.replace('\n', "\n        "))).collect();
    format!("version: 1\njobs:\n  - name: probe\n    steps:\n{}\n", steps.join("\n"))
}

/// Registers `repo` under a new name, runs `main` to its end; the run and
/// its whole log.
async fn run_repo(url: &str, token: &str, repo: &TestRepo) -> (kiln_api::Run, String) {
    let c = Client::new(url, token);
    let name = format!("r{}", unique().replace('-', ""));
    c.create_repo(&kiln_api::CreateRepo {
        team: None,
        forge: Default::default(),
        name: name.clone(),
        clone_url: repo.path().display().to_string(),
        webhook_secret: None,
        secret_pools: None,
    })
    .await
    .unwrap();
    let r = c.submit_run(&name, &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let run = kiln_testkit::wait_run(&c, &r.run_id, 120).await;
    let out = Command::new(bin())
        .env("KILN_SERVER", url)
        .env("KILN_TOKEN", token)
        .args(["logs", &r.run_id])
        .output()
        .unwrap();
    (run, String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// Kills a process also when an assertion fails.
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a step prints about Kiln's files under `data` (and its agents'
/// work dirs): `READ <f>` for each it could read, `entries=<n>` for the
/// data directory's listing, `open-fd: <path>` for a descriptor it
/// inherited into the data directory (the server's database).
fn key_probe(data: &Path) -> String {
    format!(
        r#"D="{data}"
for f in admin.token agent.token blob.key kiln.db kiln.db-wal agents/local-1/agent.lock; do
  if [ -r "$D/$f" ] && [ -s "$D/$f" ] && cat "$D/$f" >/dev/null 2>&1; then echo "READ $f"; else echo "hidden $f"; fi
done
if ls -A "$D" >/dev/null 2>&1; then echo "listed entries=$(ls -A "$D" | wc -l)"; else echo "denied listing"; fi
ls -A "$D/agents/local-1" 2>/dev/null | sed 's/^/agent-dir: /'
for fd in /proc/$$/fd/*; do readlink "$fd"; done | grep -F "$D" | sed 's/^/open-fd: /'
echo "uid=$(id -u)"
echo done-probing"#,
        data = data.display()
    )
}

/// Item 8: `kiln up` as a normal user (uid 4243 here, as a user following
/// the README's quick start), a step of it (the agent's own uid) tries
/// `cat DATA_DIR/admin.token`, the agent token, the blob key and the
/// database, lists the data dir and the agent's work dir. It finds nothing:
/// the step's mount namespace covers them. Its `/tmp` is its job's own too
/// (item 9 on a non-root agent): what it writes there never reaches the
/// host's `/tmp`.
#[tokio::test(flavor = "multi_thread")]
async fn a_non_root_kiln_ups_step_finds_none_of_its_keys() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to start kiln up as another uid");
        return;
    }
    const UID: u32 = 4243;
    // The user's home: a copy of the binary it can run, a git config that
    // trusts the (root-owned) test repository, its data dir and temp dir.
    let (home, bin) = crate::executable_copy();
    let user_home = home.path().join("user");
    std::fs::create_dir(&user_home).unwrap();
    std::fs::write(user_home.join(".gitconfig"), "[safe]\n\tdirectory = *\n").unwrap();
    for p in [&user_home, &user_home.join(".gitconfig")] {
        std::os::unix::fs::chown(p, Some(UID), Some(UID)).unwrap();
    }
    // The system temp dir, as on a real machine (the sandbox root is made
    // there): under the host's /tmp, which steps no longer see.
    let tmp = tempfile::Builder::new().prefix("kiln-iso-").tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let data = user_home.join("kiln-data");
    let marker = format!("kiln-iso-nonroot-{}", unique());

    let out_path = home.path().join("up.out");
    let up = Command::new("setpriv")
        .args(["--reuid", &UID.to_string(), "--regid", &UID.to_string(), "--clear-groups", "--"])
        .arg(&bin)
        .args(["up", "--listen", "127.0.0.1:0", "--agents", "1", "--data-dir"])
        .arg(&data)
        .env_clear()
        .env("KILN_STORAGE_LEVELS", "off")
        .env("HOME", &user_home)
        .env("XDG_STATE_HOME", user_home.join(".state"))
        .env("TMPDIR", tmp.path())
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("KILN_LOG", "info")
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(home.path().join("up.log")).unwrap())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let _up = Kill(up);
    let (url, token) = kiln_testkit::wait_for(Duration::from_secs(60), || {
        let out = std::fs::read_to_string(&out_path).ok()?;
        let line = out.lines().find_map(|l| l.strip_prefix("export "))?;
        let val = |k: &str| line.split_whitespace().find_map(|kv| kv.strip_prefix(k)).map(str::to_string);
        Some((val("KILN_SERVER=")?, val("KILN_TOKEN=")?))
    })
    .unwrap_or_else(|| {
        panic!("kiln up did not start: {}", std::fs::read_to_string(home.path().join("up.log")).unwrap())
    });

    // git in the step: the checkout's objects are its own (the mirror it
    // would borrow them from is in the hidden work dir).
    let probe = key_probe(&data)
        + &format!("\necho planted > /tmp/{marker}\ngit -C \"$KILN_WORKSPACE\" log -1 --format=git-log-%H-ok");
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &one_job(&[&probe]))]).unwrap();
    Command::new("chmod").arg("-R").arg("a+rX").arg(repo.path()).status().unwrap();
    let (run, log) = run_repo(&url, &token, &repo).await;
    let up_log = std::fs::read_to_string(home.path().join("up.log")).unwrap_or_default();
    assert_eq!(run.status.as_str(), "success", "{log}\n{up_log}");
    assert!(log.contains("done-probing"), "{log}");
    assert!(log.contains(&format!("uid={UID}\n")), "the step runs as the user of kiln up:\n{log}");
    assert!(log.contains(&format!("git-log-{}-ok", run.commit_sha)), "git in the step:\n{log}");
    for f in ["admin.token", "agent.token", "blob.key", "kiln.db", "agents/local-1/agent.lock"] {
        assert!(log.contains(&format!("hidden {f}\n")), "the step read {f}:\n{log}");
    }
    assert!(!log.contains("READ "), "{log}");
    assert!(log.contains("listed entries=0\n"), "the step listed the data dir:\n{log}");
    assert!(!log.contains("agent-dir: "), "the step listed the agent's work dir:\n{log}");
    assert!(!log.contains("open-fd: "), "the step inherited a descriptor into the data dir:\n{log}");
    for f in ["admin.token", "agent.token", "blob.key"] {
        let secret = std::fs::read_to_string(data.join(f)).unwrap();
        assert!(!log.contains(secret.trim()), "{f} is in the log");
    }
    assert!(up_log.contains("the agent's files hidden"), "{up_log}");
    assert!(!Path::new("/tmp").join(&marker).exists(), "the step wrote the host's /tmp");
}

/// Item 8 under root: `kiln up`'s steps run as `nobody` and the data dir is
/// 0700 (they were denied before); now they do not even find it: the
/// path is an empty directory in their namespace.
#[tokio::test(flavor = "multi_thread")]
async fn a_root_kiln_ups_step_finds_an_empty_data_dir() {
    let up = KilnUp::start(&bin(), 1).unwrap();
    let data = up.data_dir();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &one_job(&[&key_probe(&data)]))]).unwrap();
    let (run, log) = run_repo(&up.url, &up.token, &repo).await;
    assert_eq!(run.status.as_str(), "success", "{log}");
    assert!(!log.contains("READ ") && !log.contains("uid=0\n") && !log.contains("open-fd: "), "{log}");
    // `ls` succeeds on the empty tmpfs (it was denied the 0700 directory).
    assert!(log.contains("listed entries=0\n"), "{log}");
    assert_eq!(std::fs::metadata(&data).unwrap().permissions().mode() & 0o777, 0o700);
}

/// Item 8, a standalone `kiln agent` as a normal user (uid 4244). First
/// without `--hide-path`: a step of it tries the agent's `--token-file` and
/// its work dir and reads neither (the agent hides them by itself), while
/// the stand-in for the data directory of a `kiln server` of the same user
/// is still readable (the probe does read what is not hidden). Then the
/// same agent with `--hide-path` that directory: nothing is read. (Before
/// the fix the first step read the token; the flag did not exist.)
#[tokio::test(flavor = "multi_thread")]
async fn a_non_root_agent_hides_its_token_file_work_dir_and_hide_paths() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to start an agent as another uid");
        return;
    }
    const UID: u32 = 4244;
    let server = KilnServer::start(&bin(), &[]).unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = home.path().join("kiln");
    std::fs::copy(self::bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let user = home.path().join("user");
    let data = user.join("server-data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(user.join(".gitconfig"), "[safe]\n\tdirectory = *\n").unwrap();
    std::fs::write(data.join("admin.token"), "kiln_admin_STANDIN").unwrap();
    let token_file = user.join("agent.token");
    std::fs::write(&token_file, &server.agent_token).unwrap();
    let tmp = user.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    Command::new("chown").arg("-R").arg(format!("{UID}:{UID}")).arg(&user).status().unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let work = user.join("work");
    let step = format!(
        r#"for f in "{token}" "{work}/agent.lock" "{data}/admin.token"; do
  if [ -s "$f" ] && cat "$f" >/dev/null 2>&1; then echo "READ $f"; else echo "hidden $f"; fi
done
echo "entries=$(ls -A "{data}" | wc -l) work=$(ls -A "{work}" | wc -l) uid=$(id -u)""#,
        token = token_file.display(),
        data = data.display(),
        work = work.display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &one_job(&[&step]))]).unwrap();
    Command::new("chmod").arg("-R").arg("a+rX").arg(repo.path()).status().unwrap();
    for (name, hide) in [("plain", None), ("hider", Some(&data))] {
        let log_path = home.path().join(format!("{name}.log"));
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid", &UID.to_string(), "--regid", &UID.to_string(), "--clear-groups", "--"])
            .arg(&bin)
            .args(["agent", "--server", &server.url, "--name", name, "--token-file"])
            .arg(&token_file)
            .arg("--work-dir")
            .arg(&work);
        if let Some(p) = hide {
            cmd.arg("--hide-path").arg(p);
        }
        let agent = cmd
            .env_clear()
            .env("KILN_STORAGE_LEVELS", "off")
            .env("HOME", &user)
            .env("TMPDIR", &tmp)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("KILN_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap();
        let agent = Kill(agent);
        let (run, log) = run_repo(&server.url, &server.token, &repo).await;
        drop(agent);
        let agent_log = std::fs::read_to_string(&log_path).unwrap_or_default();
        assert_eq!(run.status.as_str(), "success", "{name}: {log}\n{agent_log}");
        assert!(log.contains(&format!("uid={UID}")), "{name}: the step runs as the agent's user:\n{log}");
        assert!(!log.contains(&format!("READ {}", token_file.display())), "{name}: the step read the token:\n{log}");
        assert!(!log.contains(&format!("READ {}/", work.display())), "{name}: the step read the work dir:\n{log}");
        assert!(log.contains(" work=0 "), "{name}: the step listed the work dir:\n{log}");
        assert!(!log.contains(server.agent_token.trim()), "{name}: {log}");
        if hide.is_some() {
            assert!(!log.contains("READ ") && !log.contains("STANDIN"), "{name}: {log}");
            assert!(log.contains("entries=0 "), "{name}: the step listed the hidden path:\n{log}");
        } else {
            // Not hidden without the flag: the probe reads what it can.
            assert!(log.contains(&format!("READ {}/admin.token", data.display())), "{name}: {log}");
        }
    }
    // A path that does not exist is refused, not ignored.
    let out = Command::new(self::bin())
        .env("KILN_STORAGE_LEVELS", "off")
        .env("KILN_AGENT_TOKEN", "x")
        .args(["agent", "--server", &server.url, "--hide-path", "/no/such/kiln/path"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--hide-path /no/such/kiln/path"));
}

/// Item 9: the `/tmp` hand-off, three runs on one agent. Run 1 (an
/// untrusted job) leaves `/tmp/x -> /dev/shm/leak` and a file in
/// `/dev/shm`; run 2 (the trusted job) sees neither and writes its secret
/// "through" `/tmp/x`, into its own `/tmp`; run 3 (untrusted again) reads
/// nothing. None of it reaches the host's `/tmp` or `/dev/shm`. Steps of
/// one job share their `/tmp`.
#[tokio::test(flavor = "multi_thread")]
async fn a_link_left_in_tmp_carries_nothing_to_the_next_job() {
    // The agent's sandboxes under the host's /tmp, as by default on a real
    // machine: the job's own directories stay visible at their paths.
    let tmp = tempfile::Builder::new().prefix("kiln-iso-").tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let up = KilnUp::start_env(&bin(), 1, &[], &[("TMPDIR", tmp.path().to_str().unwrap())]).unwrap();
    let n = unique();
    let (x, leak, planted) = (format!("/tmp/x-{n}"), format!("/dev/shm/leak-{n}"), format!("/dev/shm/planted-{n}"));
    let plant = format!("ln -s {leak} {x} && echo planted > {planted} && ls -l {x}");
    let share = format!("echo next-step-sees=$(cat {planted})");
    let a = TestRepo::new(&[(".kiln/pipeline.yaml", &one_job(&[&plant, &share]))]).unwrap();
    let (run, log_a) = run_repo(&up.url, &up.token, &a).await;
    assert_eq!(run.status.as_str(), "success", "{log_a}");
    assert!(log_a.contains("next-step-sees=planted"), "the steps of one job share /tmp and /dev/shm:\n{log_a}");

    let trusted = format!(
        "echo checking; if [ -L {x} ]; then echo \"LINK\"\"-FOUND\"; fi; if [ -e {planted} ]; then echo \"SHM\"\"-FOUND\"; fi\n\
         echo TRUSTED-SECRET-{n} > {x}; echo wrote"
    );
    let b = TestRepo::new(&[(".kiln/pipeline.yaml", &one_job(&[&trusted]))]).unwrap();
    let (run, log_b) = run_repo(&up.url, &up.token, &b).await;
    assert_eq!(run.status.as_str(), "success", "{log_b}");
    assert!(log_b.contains("wrote"), "{log_b}");
    assert!(!log_b.contains("LINK-FOUND"), "the next job found the link:\n{log_b}");
    assert!(!log_b.contains("SHM-FOUND"), "the next job found the /dev/shm file:\n{log_b}");

    let read = format!("cat {leak} {x} /dev/shm/* 2>/dev/null || true; ls -A /dev/shm /tmp; echo read-done");
    let c = TestRepo::new(&[(".kiln/pipeline.yaml", &one_job(&[&read]))]).unwrap();
    let (run, log_c) = run_repo(&up.url, &up.token, &c).await;
    assert_eq!(run.status.as_str(), "success", "{log_c}");
    assert!(log_c.contains("read-done"), "{log_c}");
    assert!(!log_c.contains(&format!("TRUSTED-SECRET-{n}")), "the secret reached a later job:\n{log_c}");
    for p in [&x, &leak, &planted] {
        assert!(std::fs::symlink_metadata(p).is_err(), "{p} is on the host");
    }
}

// ---- item 10: the container executor ----

/// Item 10: a container step as root tries what a hostile one would: its
/// capabilities are the short list only (no raw sockets, no mknod, no
/// chroot, no file capabilities), `no_new_privs` is set, `mount` is
/// refused, a fork bomb stops at the pids limit (and the step goes on), and
/// no host path beyond its workspace and output dir is mounted.
#[tokio::test(flavor = "multi_thread")]
async fn a_container_step_keeps_only_the_minimal_capabilities_and_cannot_fork_bomb() {
    if !containers_available() {
        return;
    }
    let server = KilnServer::start(&bin(), &["--insecure-registry", &registry()]).unwrap();
    let name = format!("ctr-caps-{}", std::process::id());
    let engine = engine_url();
    let agent = server.agent(&name, &["--executor", "container", "--engine", &engine]).unwrap();
    struct Reap(String);
    impl Drop for Reap {
        fn drop(&mut self) {
            let label = format!("label=kiln.agent={}", self.0);
            if let Ok(out) = Command::new("podman").args(["ps", "-a", "-q", "--filter", &label]).output() {
                for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("podman").args(["rm", "-f", "-t", "0", id]).output();
                }
            }
        }
    }
    let _reap = Reap(name);
    let reg = registry();
    let data = server.data_dir();
    let wf = format!(
        r#"version: 1
jobs:
  - name: probe
    image: {reg}/kiln-test/base:latest
    steps:
      - grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status | tr '\t' ' '; echo "uid=$(id -u)"
      - mkdir -p /tmp/m; if mount -t tmpfs none /tmp/m 2>/dev/null; then echo "mounted""-anyway"; else echo mount-refused; fi
      - |
        ( i=0; while [ $i -lt 1500 ]; do sleep 120 & echo $! >> /tmp/pids; i=$((i+1)); done ) 2>/dev/null || true
        set -- /proc/[0-9]*
        echo "procs=$#"
        while read p; do kill $p 2>/dev/null || true; done < /tmp/pids
        echo after-bomb
      - test ! -e "{data}" && echo "no data dir"
      - mount | grep -v -E ' / | /proc| /sys| /dev| /run| /etc/(hosts|hostname|resolv.conf)|/workspace| /kiln/outputs ' | grep -v -E 'cgroup|mqueue|shm|devpts|tmpfs' || echo "no other host mounts"
"#,
        data = data.display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    let (run, log) = run_repo(&server.url, &server.token, &repo).await;
    assert_eq!(run.status.as_str(), "success", "{log}\nagent:\n{}", agent.log());
    assert!(log.contains("uid=0"), "the base image runs as root:\n{log}");
    // CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID NET_BIND_SERVICE.
    assert!(log.contains("CapEff: 00000000000004fb"), "{log}");
    assert!(log.contains("CapBnd: 00000000000004fb"), "{log}");
    assert!(log.contains("NoNewPrivs: 1"), "{log}");
    // (The step's header shows its command: the marker is split there.)
    assert!(log.contains("mount-refused") && !log.contains("mounted-anyway"), "{log}");
    let procs: usize = log
        .lines()
        .find_map(|l| l.trim().strip_prefix("procs="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no procs= line:\n{log}"));
    assert!(procs <= 1024 + 4, "the fork bomb went past the pids limit (1024): {procs} processes");
    assert!(log.contains("after-bomb"), "{log}");
    assert!(log.contains("no data dir") && log.contains("no other host mounts"), "{log}");
}
