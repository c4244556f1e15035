//! Build caches end to end (issue 15): `kiln up` with a real agent, a real
//! git repository and the local blob store. A cold run saves, the next one
//! restores; changing an input file changes the key; an untrusted run reads
//! the protected namespace but its own writes are invisible to trusted runs;
//! a corrupted stored archive (and node-local copy) is a clean miss that
//! re-saves.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnUp, TestRepo};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

const WF: &str = r#"version: 1
jobs:
  - name: build
    cache: {kind: deps, version: "1", inputs: [lock.txt], paths: [deps]}
    steps:
      - 'if [ -f deps/built ]; then echo "restored: $(cat deps/built)"; else mkdir -p deps/sub && echo "fresh-$KILN_RUN_ID" > deps/built && head -c 100000 /dev/urandom > deps/sub/blob && echo "cold build"; fi'
"#;

async fn run(up: &KilnUp, c: &Client, event: Option<&str>) -> (kiln_api::Run, String) {
    let body = SubmitRun { commit_sha: "main".into(), event: event.map(str::to_string), ..Default::default() };
    let r = c.submit_run("app", &body, None).await.unwrap();
    let run = kiln_testkit::wait_run(c, &r.run_id, 120).await;
    let out = up.cli().args(["logs", &r.run_id]).output().unwrap();
    let log = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(run.status.as_str(), "success", "{log}\n{}", up.log());
    (run, log)
}

fn cache(r: &kiln_api::Run) -> kiln_api::CacheInfo {
    r.jobs[0].cache.clone().expect("the job reports its cache")
}

fn files_under(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                files_under(&p, out);
            } else {
                out.push(p);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn caches_restore_rekey_stay_in_their_trust_tier_and_survive_corruption() {
    // The one local (host) agent also runs the pull-request runs: this test
    // is about cache namespaces, not placement (the unsafe opt-in).
    let up =
        KilnUp::start_with(BIN.as_ref(), 1, &["--untrusted-pools", "default", "--untrusted-on-host-agents"]).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", WF), ("lock.txt", "v1\n")]).unwrap();
    let out = up.cli().args(["repo", "add", "app", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success());
    let c = Client::new(&up.url, &up.token);

    // Cold, then warm.
    let (r1, log1) = run(&up, &c, None).await;
    assert!(log1.contains("cold build"), "{log1}");
    let c1 = cache(&r1);
    assert_eq!((c1.result.as_str(), c1.saved.as_deref()), ("miss", Some("saved")), "{c1:?}");
    let (r2, log2) = run(&up, &c, None).await;
    assert!(log2.contains(&format!("restored: fresh-{}", r1.id)), "{log2}");
    let c2 = cache(&r2);
    assert_eq!(c2.result, "hit", "{c2:?}");
    assert_eq!(c2.key, c1.key, "same inputs, same key");

    // The agent prepares an unpacked copy in the background; the next
    // restore checks it against the manifest and moves it into place...
    let prepared = || {
        let mut files = Vec::new();
        files_under(&up.data_dir().join("agents"), &mut files);
        files.into_iter().find(|p| p.ends_with("0/built") && p.display().to_string().contains("/caches/trees/"))
    };
    let built = kiln_testkit::wait_for(std::time::Duration::from_secs(30), prepared).expect("a prepared copy");
    let (r2a, log2a) = run(&up, &c, None).await;
    assert!(log2a.contains("prepared copy"), "{log2a}");
    assert!(log2a.contains(&format!("restored: fresh-{}", r1.id)), "{log2a}");
    assert_eq!(cache(&r2a).result, "hit");
    // ...but one changed on disk is not used: the archive is unpacked instead.
    let built = kiln_testkit::wait_for(std::time::Duration::from_secs(30), prepared).unwrap_or(built);
    std::fs::write(&built, "poisoned-tree\n").unwrap();
    let (r2t, log2t) = run(&up, &c, None).await;
    assert!(!log2t.contains("poisoned"), "{log2t}");
    assert!(!log2t.contains("prepared copy"), "{log2t}");
    assert!(log2t.contains(&format!("restored: fresh-{}", r1.id)), "{log2t}");
    assert_eq!(cache(&r2t).result, "hit");

    // A node-local copy replaced by another valid archive (what a step that
    // could write the agent's directory might do) is not used: only bytes
    // with the server's digest are restored.
    let poison = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(poison.path().join("deps")).unwrap();
    std::fs::write(poison.path().join("deps/built"), "poisoned\n").unwrap();
    let mut archive = Vec::new();
    kiln_cache::pack(&[("deps".to_string(), poison.path().join("deps"))], &mut archive, 3).unwrap();
    let mut copies = Vec::new();
    files_under(&up.data_dir().join("agents"), &mut copies);
    let copies: Vec<_> = copies.into_iter().filter(|p| p.parent().is_some_and(|d| d.ends_with("caches"))).collect();
    assert!(!copies.is_empty(), "the agent kept a node-local copy");
    for p in &copies {
        std::fs::write(p, &archive).unwrap();
    }
    let (r2b, log2b) = run(&up, &c, None).await;
    assert!(!log2b.contains("poisoned"), "{log2b}");
    assert!(log2b.contains(&format!("restored: fresh-{}", r1.id)), "{log2b}");
    assert_eq!(cache(&r2b).result, "hit");

    // An input changes: a new key, a miss.
    repo.commit(&[("lock.txt", "v2\n")], "bump").unwrap();
    let (r3, log3) = run(&up, &c, None).await;
    assert!(log3.contains("cold build"), "{log3}");
    assert_ne!(cache(&r3).key, c1.key);
    assert_eq!(cache(&r3).result, "miss");

    // An untrusted run may read the protected namespace...
    let (r4, log4) = run(&up, &c, Some("pull_request")).await;
    assert_eq!(r4.trust, "untrusted");
    assert!(log4.contains(&format!("restored: fresh-{}", r3.id)), "{log4}");
    assert_eq!(cache(&r4).namespace.as_deref(), Some("protected"));
    // ...but what it writes, trusted runs never see.
    repo.commit(&[("lock.txt", "v3\n")], "bump again").unwrap();
    let (r5, log5) = run(&up, &c, Some("pull_request")).await;
    assert!(log5.contains("cold build"), "{log5}");
    assert_eq!(cache(&r5).saved.as_deref(), Some("saved"));
    // Stored bytes are content addressed (issue 45): r6's archive is the
    // content object that appears with it.
    let content = |up: &KilnUp| {
        let mut v = Vec::new();
        files_under(&up.data_dir().join("objects/objects/cas"), &mut v);
        v
    };
    let before = content(&up);
    let (r6, log6) = run(&up, &c, None).await;
    assert!(log6.contains("cold build"), "a trusted run must not restore an untrusted run's cache: {log6}");
    assert_eq!(cache(&r6).result, "miss");
    assert_eq!(cache(&r6).saved.as_deref(), Some("saved"));

    // Damage the stored archive of r6 and the agent's node-local copies.
    let all = content(&up);
    let stored: Vec<_> = all.iter().filter(|p| !before.contains(p)).collect();
    assert!(!stored.is_empty(), "r6's archive is in the object store");
    for p in stored {
        let mut bytes = std::fs::read(p).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(p, bytes).unwrap();
    }
    let mut local = Vec::new();
    files_under(&up.data_dir().join("agents"), &mut local);
    for p in local.iter().filter(|p| p.parent().is_some_and(|d| d.ends_with("caches"))) {
        std::fs::write(p, b"garbage").unwrap();
    }
    let (r7, log7) = run(&up, &c, None).await;
    assert!(log7.contains("cold build"), "a damaged cache is a clean miss: {log7}");
    let c7 = cache(&r7);
    assert_eq!(c7.result, "error", "{c7:?}");
    assert_eq!(c7.saved.as_deref(), Some("saved"), "the damaged entry was dropped and re-saved: {c7:?}");
    let (r8, log8) = run(&up, &c, None).await;
    assert!(log8.contains(&format!("restored: fresh-{}", r7.id)), "{log8}");
    assert_eq!(cache(&r8).result, "hit");
    let metrics = scrape(&up.url, &up.token).await;
    for line in [
        "kiln_cache_lookups_total{result=\"hit\"} ",
        "kiln_cache_integrity_failures_total 1",
        "kiln_cache_evictions_total 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}

const PREFIX_WF: &str = r#"version: 1
jobs:
  - name: deps
    cache: {kind: dependencies, version: "1", inputs: [lock.txt], paths: [deps], restore-prefix: true}
    steps:
      - |
        mkdir -p deps && echo "$KILN_RUN_ID" >> deps/history && echo "history: $(tr '\n' ' ' < deps/history)"
"#;

/// A job caching an absolute path, which only a container can be given.
const ABSOLUTE_WF: &str = r#"version: 1
jobs:
  - name: absolute
    cache: {kind: dependencies, version: "1", paths: [/kiln-e2e-absolute-cache]}
    steps:
      - echo "must not run on a host agent"
"#;

/// `restore-prefix` on a dependency cache: an input change restores the
/// newest entry saved for other inputs (result `prefix`) and then saves the
/// exact key, which the next run hits (with a time-saved estimate). A job
/// caching an absolute path is placed on container agents only (issue 40,
/// item 9): under `kiln up`'s host agents it waits, saying why, and
/// nothing is written on the host.
#[tokio::test(flavor = "multi_thread")]
async fn restore_prefix_falls_back_then_saves_the_exact_key() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", PREFIX_WF), ("lock.txt", "v1\n")]).unwrap();
    let out = up.cli().args(["repo", "add", "app", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success());
    let c = Client::new(&up.url, &up.token);
    let job = |r: &kiln_api::Run, name: &str| {
        r.jobs.iter().find(|j| j.name == name).and_then(|j| j.cache.clone()).expect("the job reports its cache")
    };

    let (r1, log1) = run(&up, &c, None).await;
    assert!(log1.contains(&format!("history: {} ", r1.id)), "{log1}");
    assert_eq!((job(&r1, "deps").result.as_str(), job(&r1, "deps").saved.as_deref()), ("miss", Some("saved")));
    let abs_repo = TestRepo::new(&[(".kiln/pipeline.yaml", ABSOLUTE_WF)]).unwrap();
    let out = up.cli().args(["repo", "add", "abs", "--url"]).arg(abs_repo.path()).output().unwrap();
    assert!(out.status.success());
    let abs = c.submit_run("abs", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let mut r = c.get_run(&abs.run_id).await.unwrap();
    for _ in 0..300 {
        if r.jobs[0].message.as_deref().is_some_and(|m| m.contains("caches an absolute path")) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        r = c.get_run(&abs.run_id).await.unwrap();
    }
    let why = r.jobs[0].message.clone().unwrap_or_default();
    assert!(why.contains("waiting for an agent that runs a container executor"), "says why: {why}");
    assert!(r.jobs[0].attempts.is_empty(), "no host agent took it: {r:#?}");
    c.cancel_run(&abs.run_id).await.unwrap();
    assert!(!std::path::Path::new("/kiln-e2e-absolute-cache").exists(), "nothing written on the host");

    // Another lock file: no exact entry, the prefix restores r1's, and the
    // exact key is saved after.
    repo.commit(&[("lock.txt", "v2\n")], "bump").unwrap();
    let (r2, log2) = run(&up, &c, None).await;
    assert!(log2.contains(&format!("history: {} {} ", r1.id, r2.id)), "{log2}");
    let c2 = job(&r2, "deps");
    assert_eq!((c2.result.as_str(), c2.saved.as_deref()), ("prefix", Some("saved")), "{c2:?}");
    assert!(log2.contains("restored by prefix"), "{log2}");
    assert_ne!(c2.key, job(&r1, "deps").key);

    // Same lock file: an exact hit of r2's entry, with an estimate.
    let (r3, log3) = run(&up, &c, None).await;
    assert!(log3.contains(&format!("history: {} {} {} ", r1.id, r2.id, r3.id)), "{log3}");
    let c3 = job(&r3, "deps");
    assert_eq!((c3.result.as_str(), c3.key.as_str()), ("hit", c2.key.as_str()), "{c3:?}");
    assert!(c3.seconds_saved.is_some_and(|s| s >= 0.0), "a hit gets a time-saved estimate: {c3:?}");
    assert!(c3.steps_seconds.is_some(), "{c3:?}");
    let metrics = scrape(&up.url, &up.token).await;
    for line in [
        "kiln_cache_lookups_total{result=\"prefix\"} 1",
        "kiln_cache_lookups_total{result=\"hit\"} 1",
        "kiln_cache_time_saved_seconds_total ",
        "kiln_cache_saved_bytes_total ",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    assert!(!metrics.contains("kiln_cache_saved_bytes_total 0\n"), "{metrics}");
}

/// `--cache-timeout`: a restore that cannot finish in time is a clean miss
/// (the job runs cold, nothing half-restored), and the save is skipped.
#[tokio::test(flavor = "multi_thread")]
async fn a_cache_operation_past_its_timeout_is_a_clean_miss() {
    let s = kiln_testkit::KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", WF), ("lock.txt", "v1\n")]).unwrap();
    s.add_repo("app", &repo);
    let c = Client::new(&s.url, &s.token);
    let go = || async {
        let r =
            c.submit_run("app", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
        let run = kiln_testkit::wait_run(&c, &r.run_id, 120).await;
        let out = s.cli().args(["logs", &r.run_id]).output().unwrap();
        let log = String::from_utf8_lossy(&out.stdout).to_string();
        assert_eq!(run.status.as_str(), "success", "{log}");
        (run, log)
    };
    let agent = s.agent("patient", &[]).unwrap();
    let (r1, _) = go().await;
    assert_eq!(cache(&r1).saved.as_deref(), Some("saved"));
    drop(agent);
    let _hasty = s.agent("hasty", &["--cache-timeout", "1ms"]).unwrap();
    let (r2, log2) = go().await;
    assert!(log2.contains("cold build"), "{log2}");
    assert!(!log2.contains("restored: fresh"), "{log2}");
    let c2 = cache(&r2);
    assert_eq!(c2.result, "error", "{c2:?}");
    assert!(c2.message.as_deref().unwrap_or_default().contains("timed out"), "{c2:?}");
    assert!(c2.saved.as_deref().unwrap_or_default().contains("timed out"), "{c2:?}");
}

/// The server's `/metrics` text (it needs an admin or read token).
async fn scrape(url: &str, token: &str) -> String {
    let res = reqwest::Client::new().get(format!("{url}/metrics")).bearer_auth(token).send().await.unwrap();
    res.text().await.unwrap()
}

/// Issue 41, item 4: a real Python venv as the cache. Its `bin/python3 ->
/// /usr/bin/python3` (absolute, out of the workspace) comes back as that
/// link, so the second run's venv works; a fifo in it is left out, the
/// first run's log says so, and the second run's hit is `partial`.
#[tokio::test(flavor = "multi_thread")]
async fn a_python_venv_is_restored_with_its_links_and_what_was_left_out_is_said() {
    let wf = r#"version: 1
jobs:
  - name: py
    cache: {kind: venv, version: "1", inputs: [requirements.txt], paths: [venv]}
    steps:
      - |
        set -e
        if [ -e venv/pyvenv.cfg ]; then echo "venv restored"; else python3 -m venv venv && mkfifo venv/ctl.fifo && echo "venv made"; fi
        echo "link: $(readlink venv/bin/python3)"
        venv/bin/python -c 'import sys; print("prefix", sys.prefix)'
"#;
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf), ("requirements.txt", "\n")]).unwrap();
    assert!(up.cli().args(["repo", "add", "app", "--url"]).arg(repo.path()).status().unwrap().success());
    let c = Client::new(&up.url, &up.token);

    let (r1, log1) = run(&up, &c, None).await;
    assert!(log1.contains("venv made"), "{log1}");
    assert!(log1.contains("cache: left out 1 entry (1 fifo); first: venv/ctl.fifo"), "{log1}");
    let c1 = cache(&r1);
    assert_eq!((c1.result.as_str(), c1.saved.as_deref()), ("miss", Some("saved")), "{c1:?}");
    assert_eq!(c1.left_out.as_deref(), Some("1 entry (1 fifo); first: venv/ctl.fifo"));
    let link1 = log1.lines().find_map(|l| l.split("link: ").nth(1)).expect("the link").trim().to_string();
    assert!(link1.starts_with('/'), "a venv's python is an absolute link: {link1}");

    let (r2, log2) = run(&up, &c, None).await;
    assert!(log2.contains("venv restored"), "{log2}");
    assert!(log2.contains(&format!("link: {link1}")), "the same link came back:\n{log2}");
    let prefix = log2.lines().find_map(|l| l.split("prefix ").nth(1)).expect("the venv ran").trim().to_string();
    assert!(prefix.ends_with("/venv"), "the restored venv's python runs in it: {prefix}\n{log2}");
    assert!(log2.contains("partial hit") && log2.contains("left out 1 entry (1 fifo)"), "{log2}");
    let c2 = cache(&r2);
    assert_eq!(c2.result, "partial", "a hit that left things out is not a plain hit: {c2:?}");
    assert_eq!(c2.left_out.as_deref(), Some("1 entry (1 fifo); first: venv/ctl.fifo"));
}
