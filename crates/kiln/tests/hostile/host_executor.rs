//! Findings 3, 4 (file modes) and 8: what a step on the host executor can
//! reach of Kiln itself, with real `kiln up` / `kiln server` / `kiln agent`
//! processes. The test runner is root, so `kiln up`'s agents are root agents
//! (steps as `nobody` in their own PID and mount namespaces); one test runs
//! a `kiln agent` as an unprivileged uid (steps in a user namespace).

use crate::bin;
use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnServer, KilnUp, TestRepo};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

const SECRETS: [&str; 3] = ["admin.token", "agent.token", "blob.key"];

/// The `kiln` under test: this build, or `KILN_HOSTILE_BIN` (how these tests
/// were checked against an earlier build, where each of them fails).
fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).mode() & 0o7777
}

/// Registers `repo` as `name`, runs `main` to its end; returns the run and
/// its whole log (`kiln logs`).
async fn run_on(url: &str, token: &str, bin_cli: std::process::Command, repo: &TestRepo) -> (kiln_api::Run, String) {
    let c = Client::new(url, token);
    let name = format!("r{}", rand_suffix());
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
    let run = kiln_testkit::wait_run(&c, &r.run_id, 90).await;
    let mut cli = bin_cli;
    let out = cli.args(["logs", &r.run_id]).output().unwrap();
    (run, String::from_utf8_lossy(&out.stdout).into_owned())
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos()
}

fn pipeline(env: &[(&str, &str)], steps: &[&str]) -> String {
    let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}: \"{v}\"")).collect();
    let steps: Vec<String> =
        steps.iter().map(|s| format!("      - |\n        {}", s.replace('\n', "\n        "))).collect();
    format!("version: 1\njobs:\n  - name: probe\n    env: {{{}}}\n    steps:\n{}\n", env.join(", "), steps.join("\n"))
}

/// Every host process's command line, as the test (root) reads them.
fn all_cmdlines() -> Vec<(i32, String)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&raw).replace('\0', " ")))
        })
        .collect()
}

/// Finding 3: under `kiln up`, a step read admin.token, agent.token,
/// blob.key and kiln.db through `$KILN_WORKSPACE/../..`, and other
/// repositories' mirrors. Now the workspace is outside the data dir, the
/// data dir is 0700 and the step runs as an unprivileged user: even told
/// the data dir's absolute path, it reads nothing, and walking up from its
/// workspace finds no key.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_step_cannot_read_kilns_keys_database_or_mirrors() {
    let up = KilnUp::start(&bin(), 1).unwrap();
    let data = up.data_dir();
    let agent_dir = data.join("agents/local-1");
    // Another repository's run first, so its mirror exists.
    let other = TestRepo::new(&[(".kiln/pipeline.yaml", &pipeline(&[], &["echo other"]))]).unwrap();
    let (run, _) = run_on(&up.url, &up.token, up.cli(), &other).await;
    assert_eq!(run.status.as_str(), "success");

    let probe = r#"for f in admin.token agent.token blob.key kiln.db kiln.db-wal objects agents/local-1/mirrors; do
  if cat "$DATA/$f" >/dev/null 2>&1 || ls "$DATA/$f" >/dev/null 2>&1; then echo "READ $f"; else echo "denied $f"; fi
done
d="$KILN_WORKSPACE"
while [ "$d" != / ]; do
  d=$(dirname "$d")
  for f in admin.token agent.token blob.key kiln.db mirrors pgids agents; do
    if [ -e "$d/$f" ]; then echo "FOUND $d/$f"; fi
  done
done
echo "uid=$(id -u)"
echo done-probing"#;
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &pipeline(&[("DATA", &data.display().to_string())], &[probe]))])
        .unwrap();
    let (run, log) = run_on(&up.url, &up.token, up.cli(), &repo).await;
    assert_eq!(run.status.as_str(), "success", "{log}");
    assert!(log.contains("done-probing"), "{log}");
    for f in ["admin.token", "agent.token", "blob.key", "kiln.db", "objects", "agents/local-1/mirrors"] {
        assert!(log.contains(&format!("denied {f}\n")), "the step read {f}:\n{log}");
    }
    assert!(!log.contains("READ "), "{log}");
    assert!(!log.contains("FOUND "), "walking up from the workspace reached Kiln's files:\n{log}");
    assert!(!log.contains("uid=0\n"), "the step ran as root:\n{log}");
    for f in SECRETS {
        let secret = std::fs::read_to_string(data.join(f)).unwrap();
        assert!(!log.contains(secret.trim()), "{f} leaked into the log");
    }
    // The workspace is not under the data dir or the agent's work dir.
    assert!(std::fs::read_dir(&agent_dir).unwrap().flatten().all(|e| e.file_name() != "ws"));
}

/// Finding 3: a step could write the agent's `pgids/` records, which the
/// agent SIGKILLs on restart. The records live in the agent's 0700 work
/// dir, which the step can neither reach by walking up nor open by name.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_step_cannot_write_the_agents_process_records() {
    let up = KilnUp::start(&bin(), 1).unwrap();
    let pgids = up.data_dir().join("agents/local-1/pgids");
    let step = format!(
        r#"for d in "{pgids}" "$KILN_WORKSPACE/../../pgids" "$KILN_WORKSPACE/../../../pgids" "$KILN_WORKSPACE/../../../../pgids"; do
  if echo 1 > "$d/1" 2>/dev/null; then echo "WROTE $d"; else echo "denied $d"; fi
done"#,
        pgids = pgids.display()
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &pipeline(&[], &[&step]))]).unwrap();
    let (run, log) = run_on(&up.url, &up.token, up.cli(), &repo).await;
    assert_eq!(run.status.as_str(), "success", "{log}");
    assert!(log.contains(&format!("denied {}", pgids.display())), "{log}");
    assert!(!log.contains("WROTE"), "{log}");
    assert!(!pgids.join("1").exists(), "a forged record is in the agent's state");
    assert_eq!(mode(&up.data_dir().join("agents/local-1")), 0o700);
}

/// Finding 3: the agent token was visible to every local user in
/// /proc/PID/cmdline (`--token $(cat …)`). `--token` is refused now; the
/// token comes from `--token-file` or `KILN_AGENT_TOKEN`, and no process
/// of a running server + agent (+ a `kiln up`) has a token in its argv.
#[tokio::test(flavor = "multi_thread")]
async fn no_token_is_in_any_command_line() {
    let server = KilnServer::start(&bin(), &[]).unwrap();
    let agent = server.agent("argv-agent", &[]).unwrap();
    let up = KilnUp::start(&bin(), 1).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &pipeline(&[], &["sleep 0.2; echo hi"]))]).unwrap();
    let (run, log) = run_on(&server.url, &server.token, server.cli(), &repo).await;
    assert_eq!(run.status.as_str(), "success", "{log}\n{}", agent.log());

    let tokens = [&server.agent_token, &server.token, &up.token];
    for (pid, cmdline) in all_cmdlines() {
        for t in tokens {
            assert!(!cmdline.contains(t.as_str()), "process {pid} has a token in its command line: {cmdline}");
        }
    }
    // And the old way is refused with a message saying what to do instead.
    let out = std::process::Command::new(bin())
        .env("KILN_STORAGE_LEVELS", "off") // the host disk's fill is not under test
        .args(["agent", "--server", &server.url, "--name", "x", "--token", &server.agent_token])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--token-file") && err.contains("KILN_AGENT_TOKEN"), "{err}");
    assert!(!err.contains(&server.agent_token), "the refusal does not echo the token");
}

/// Finding 4 (file modes): `kiln.db` and its WAL were 0644, the data dir,
/// objects and workspaces 0755. Now: the data dir, the object store, the
/// agents' work dirs and every directory under them 0700; database, WAL and
/// tokens 0600; the sandbox root 0711 (steps as another user traverse to
/// their own attempt, list nothing), each attempt's dir 0700.
#[tokio::test(flavor = "multi_thread")]
async fn data_dir_database_tokens_and_workspaces_are_private() {
    let up = KilnUp::start(&bin(), 1).unwrap();
    let data = up.data_dir();
    let marker = up.data.path().join("ws-modes");
    let step = format!(
        "stat -c '%a' \"$KILN_WORKSPACE/..\" > {m}.attempt; stat -c '%a' \"$KILN_WORKSPACE/../..\" > {m}.root; \
         echo \"$KILN_WORKSPACE\" > {m}.path",
        m = marker.display()
    );
    // The step (nobody) cannot write into the test's 0700 temp dir: let it.
    std::fs::set_permissions(up.data.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &pipeline(&[], &[&step]))]).unwrap();
    let (run, log) = run_on(&up.url, &up.token, up.cli(), &repo).await;
    std::fs::set_permissions(up.data.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(run.status.as_str(), "success", "{log}");

    assert_eq!(mode(&data), 0o700, "data dir");
    for f in SECRETS.iter().chain(&["kiln.db"]) {
        assert_eq!(mode(&data.join(f)), 0o600, "{f}");
    }
    for f in ["kiln.db-wal", "kiln.db-shm"] {
        if data.join(f).exists() {
            assert_eq!(mode(&data.join(f)), 0o600, "{f}");
        }
    }
    let mut dirs = vec![data.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            if meta.is_dir() {
                assert_eq!(meta.mode() & 0o077, 0, "{} is open to other users", e.path().display());
                dirs.push(e.path());
            }
        }
    }
    let read = |ext: &str| std::fs::read_to_string(format!("{}.{ext}", marker.display())).unwrap().trim().to_string();
    assert_eq!(read("attempt"), "700", "the attempt's sandbox");
    assert_eq!(read("root"), "711", "the sandbox root");
    assert!(!PathBuf::from(read("path")).starts_with(&data), "the workspace is outside the data dir");
}

/// Finding 8: publishing a hard link to `agent.token` made the server's
/// token file 0444 (a root agent chmodded whatever the link named). A file
/// with other links is refused, and the linked file keeps its mode and
/// bytes; a symbolic link out of the workspace is refused too.
#[tokio::test(flavor = "multi_thread")]
async fn publishing_a_link_to_a_file_outside_the_workspace_is_refused_and_changes_nothing() {
    let up = KilnUp::start(&bin(), 1).unwrap();
    // A file outside the workspace that the step user may link (hard links
    // need read and write access under fs.protected_hardlinks): the stand-in
    // for any file on the agent's filesystem.
    let outside = tempfile::tempdir().unwrap();
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, b"not yours").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o666)).unwrap();

    for (kind, make, path) in [
        ("hard", format!("ln {} out/victim", victim.display()), "out/victim"),
        ("symbolic", format!("ln -s {} out/victim", victim.display()), "out/victim"),
        ("directory", format!("ln -s {} out/up", outside.path().display()), "out/up/victim"),
    ] {
        let yaml = format!(
            "version: 1\njobs:\n  - name: publish\n    steps:\n      - mkdir -p out && {make} && ls -l out\n    \
             artifacts:\n      publish:\n        - name: loot\n          path: {path}\n"
        );
        let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &yaml)]).unwrap();
        let (run, log) = run_on(&up.url, &up.token, up.cli(), &repo).await;
        assert_eq!(run.status.as_str(), "failed", "{kind} link published:\n{log}");
        let message = run.jobs[0].attempts.last().and_then(|a| a.message.clone()).unwrap_or_default();
        assert!(
            message.contains("hard links") || message.contains("symbolic link") || message.contains("outside"),
            "{kind}: {message}"
        );
        assert!(run.jobs[0].artifacts.is_empty(), "{kind}: nothing published");
        assert_eq!(mode(&victim), 0o666, "{kind}: the linked file's mode changed");
        assert_eq!(std::fs::read(&victim).unwrap(), b"not yours", "{kind}: its bytes changed");
        assert_eq!(
            std::fs::metadata(&victim).unwrap().nlink(),
            1,
            "{kind}: the step's link is gone with its workspace"
        );
    }
}

/// Finding 8's class, on the restore side: an artifact restored under a
/// directory that is a symbolic link out of the workspace (committed in the
/// repository) used to make the directories outside the workspace before
/// the check refused it. Now nothing is made outside.
#[tokio::test(flavor = "multi_thread")]
async fn restoring_through_a_symlink_makes_nothing_outside_the_workspace() {
    let up = KilnUp::start(&bin(), 1).unwrap();
    let outside = tempfile::tempdir().unwrap();
    let yaml = "version: 1\njobs:\n  - name: compile\n    steps:\n      - mkdir -p target && echo bytes > target/app\n    \
         artifacts:\n      publish:\n        - name: app\n          path: target/app\n  - name: consume\n    \
         artifacts:\n      restore:\n        - from_job: compile\n          name: app\n          path: up/made/app\n    \
         steps:\n      - cat up/made/app\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", yaml)]).unwrap();
    std::os::unix::fs::symlink(outside.path(), repo.path().join("up")).unwrap();
    repo.commit(&[], "a symlink out of the workspace").unwrap();
    let (run, log) = run_on(&up.url, &up.token, up.cli(), &repo).await;
    assert_eq!(run.status.as_str(), "failed", "{log}");
    let consume = run.jobs.iter().find(|j| j.name == "consume").unwrap();
    let message = consume.attempts.last().and_then(|a| a.message.clone()).unwrap_or_default();
    assert!(message.contains("symbolic link"), "{message}");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "something was made outside the workspace");
}

/// Finding 3, non-root agent: `setsid sleep &` survived the job (no PID
/// namespace without root). Now a non-root agent's steps run in a user +
/// PID namespace with their own /proc: the daemon dies with the step, and
/// the step sees no process of the agent (nor its command line).
#[tokio::test(flavor = "multi_thread")]
async fn a_non_root_agents_step_leaves_no_daemon_and_sees_no_agent_process() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to start an agent as another uid");
        return;
    }
    const UID: u32 = 4242;
    let server = KilnServer::start(&bin(), &[]).unwrap();
    // The agent's files: a copy of the binary it can execute, a home with a
    // git config that trusts the (root-owned) test repository, its token.
    let (home, bin) = crate::executable_copy();
    let agent_home = home.path().join("agent");
    std::fs::create_dir(&agent_home).unwrap();
    std::fs::write(agent_home.join(".gitconfig"), "[safe]\n\tdirectory = *\n").unwrap();
    for p in [&agent_home, &agent_home.join(".gitconfig")] {
        std::os::unix::fs::chown(p, Some(UID), Some(UID)).unwrap();
    }
    let marker = format!("4242.{}", rand_suffix() % 1000);
    let step = format!(
        "setsid sleep {marker} >/dev/null 2>&1 </dev/null &\nsleep 0.3\necho \"uid=$(id -u) procs=$(ls /proc | grep -c '^[0-9]')\"\n\
         cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'token-fil[e]' || true"
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &pipeline(&[], &[&step]))]).unwrap();
    let readable = |p: &Path| {
        std::process::Command::new("chmod").arg("-R").arg("a+rX").arg(p).status().unwrap();
    };
    readable(repo.path());

    let log_path = home.path().join("agent.log");
    /// Kills the agent also when an assertion fails.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let agent = std::process::Command::new("setpriv")
        .args(["--reuid", &UID.to_string(), "--regid", &UID.to_string(), "--clear-groups", "--"])
        .arg(&bin)
        .args(["agent", "--server", &server.url, "--name", "nonroot", "--work-dir"])
        .arg(agent_home.join("work"))
        .env_clear()
        // After env_clear: the host disk's fill is not under test (a CI host
        // over 90 % full made this agent refuse every claim).
        .env("KILN_STORAGE_LEVELS", "off")
        .env("HOME", &agent_home)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("KILN_LOG", "info")
        // (The environment, not a file: an earlier build reads it too.)
        .env("KILN_AGENT_TOKEN", &server.agent_token)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let _agent = Kill(agent);
    let (run, log) = run_on(&server.url, &server.token, server.cli(), &repo).await;
    let agent_log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert_eq!(run.status.as_str(), "success", "{log}\n{agent_log}");
    assert!(log.contains(&format!("uid={UID} ")), "{log}");
    // The daemon died with the step (bounded wait: the kernel kills the
    // namespace when its first process exits).
    let survivor = kiln_testkit::wait_for(Duration::from_secs(5), || {
        let alive: Vec<_> = all_cmdlines().into_iter().filter(|(_, c)| c.contains(&marker)).collect();
        alive.is_empty().then_some(())
    });
    let leftovers: Vec<_> = all_cmdlines().into_iter().filter(|(_, c)| c.contains(&marker)).collect();
    for (pid, _) in &leftovers {
        // (An earlier build's survivor: do not leave it running.)
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::Signal::SIGKILL);
    }
    assert!(survivor.is_some(), "`setsid sleep &` survived the job: {leftovers:?}");
    // Its own /proc: a handful of its own processes, none of the agent's.
    let procs: usize = log.split("procs=").nth(1).and_then(|s| s.split_whitespace().next()?.parse().ok()).unwrap();
    assert!(procs < 10, "the step sees {procs} processes:\n{log}");
    // (`token-fil[e]` matches the agent's argv, not this script's own text.)
    assert!(log.lines().any(|l| l.trim() == "0"), "the step saw the agent's command line:\n{log}");
    assert!(agent_log.contains("user, PID and mount namespaces"), "{agent_log}");
}

/// Issue 20: a host job slot keeps its sandbox from one job to the next
/// (the same workspace directory, renamed in between) and puts it back in
/// place. Nothing a job does
/// reaches the next one: its `$HOME`, `$TMPDIR` and output file are emptied
/// as soon as it ends, and the next job's workspace is its commit's tree
/// exactly (git sees it clean, with its own objects: steps run as `nobody`),
/// whatever the job added, changed, linked, hid in `.git` or made
/// unreadable, and also when the next job is of another commit.
#[tokio::test(flavor = "multi_thread")]
async fn a_kept_job_slot_gives_the_next_job_nothing_of_the_last() {
    let up = KilnUp::start(&bin(), 1).unwrap();
    let probe = "echo \"ws=$KILN_WORKSPACE\"; echo \"inode=$(stat -c %i .)\"\n\
        echo \"status=[$(git status --porcelain | tr '\\n' ' ')] head=$(git rev-parse HEAD)\"\n\
        echo \"files=[$(ls -A | tr '\\n' ' ')] mode=$(stat -c %a .)\"\n\
        echo \"home=[$(ls -A \"$HOME\" | tr '\\n' ' ')] tmp=[$(ls -A \"$TMPDIR\" | tr '\\n' ' ')] output=$(wc -c < \"$KILN_OUTPUT\")\"\n\
        echo \"tracked=$(cat tracked.txt) hooks=$(ls .git/hooks 2>&1 | wc -l)\"\n\
        echo secret > \"$HOME/.netrc\"; echo t > \"$TMPDIR/t\"; echo dirty >> tracked.txt; echo new > added\n\
        mkdir -p build/deep && echo o > build/deep/o && chmod 000 build; ln -s /etc evil; echo a=1 >> \"$KILN_OUTPUT\"\n\
        mkdir -p .git/hooks && echo 'exit 1' > .git/hooks/pre-commit; chmod 777 .";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &pipeline(&[], &[probe])), ("tracked.txt", "v1")]).unwrap();
    let line = |log: &str, key: &str| {
        // The step's own output lines (its header shows the command's first line).
        log.lines()
            .find_map(|l| l.strip_prefix(key).map(|v| format!("{key}{v}")))
            .unwrap_or_else(|| panic!("no line starting with {key} in {log}"))
    };
    let (first, log1) = run_on(&up.url, &up.token, up.cli(), &repo).await;
    assert_eq!(first.status.as_str(), "success", "{log1}");
    let ws = PathBuf::from(line(&log1, "ws=").trim_start_matches("ws=").trim());
    // Emptied when the job ends, not when the next one starts; and the
    // slot's directory is renamed: the path the job's log shows is gone.
    let root = ws.parent().unwrap().parent().unwrap().to_path_buf();
    let mut left = vec![];
    for _ in 0..200 {
        left = std::fs::read_dir(&root)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("slot-0-"))
            .flat_map(|e| std::fs::read_dir(e.path().join("home")).unwrap().flatten().map(|h| h.path()))
            .collect();
        if left.is_empty() && !ws.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, Vec::<PathBuf>::new(), "the job's home is emptied after it");
    assert!(!ws.exists(), "the slot's directory has a new name once the job ended");

    let (second, log2) = run_on(&up.url, &up.token, up.cli(), &repo).await;
    assert_eq!(second.status.as_str(), "success", "{log2}");
    assert_eq!(line(&log2, "inode="), line(&log1, "inode="), "the same slot's workspace, kept");
    assert_ne!(line(&log2, "ws="), line(&log1, "ws="), "under a new name");
    for key in ["status=", "files=", "home=", "tracked="] {
        assert_eq!(line(&log2, key), line(&log1, key), "{key} as for the first job:\n{log2}");
    }
    assert!(line(&log1, "status=").starts_with("status=[] "), "{log1}");
    assert!(line(&log1, "home=").ends_with("output=0"), "{log1}");

    // Another commit in the same kept sandbox.
    let sha = repo.commit(&[("tracked.txt", "v2")], "two").unwrap();
    let (third, log3) = run_on(&up.url, &up.token, up.cli(), &repo).await;
    assert_eq!(third.status.as_str(), "success", "{log3}");
    // (A commit this agent has not checked out before gets a fresh
    // workspace: there is no pristine tree of it to bring the kept one to.)
    assert_eq!(line(&log3, "status="), format!("status=[] head={sha}"), "{log3}");
    assert_eq!(line(&log3, "tracked="), line(&log1, "tracked=").replace("v1", "v2"));
    for key in ["files=", "home="] {
        assert_eq!(line(&log3, key), line(&log1, key), "{log3}");
    }
}
