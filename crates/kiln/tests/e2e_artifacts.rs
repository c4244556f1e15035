//! Artifacts for real projects (issue 16) end to end, with the real `kiln
//! server`, two `kiln agent` processes and real files: a directory of 1,000
//! files (nested, some executable) and a glob are each published as one
//! archive by one job on one agent and restored, file by file with their
//! modes, by the next job on the other agent; a single file keeps today's
//! behaviour (its own bytes and sha256); an artifact with a tiny
//! `expire-in` is expired by the collector once the run ended: 410 on get,
//! `expired: true` in the run and in `kiln artifact list`.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnServer, TestRepo, wait_run};
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

/// The tree `build` makes: file i at `d{i%10}/n{i%7}/f{i}.txt` holding
/// `file {i}`, mode 755 for every ninth, else 644.
const MAKE_TREE: &str = r#"for i in $(seq 0 999); do d=site/d$((i % 10))/n$((i % 7)); mkdir -p $d; echo "file $i" > $d/f$i.txt; if [ $((i % 9)) -eq 0 ]; then chmod 755 $d/f$i.txt; else chmod 644 $d/f$i.txt; fi; done"#;

/// `path mode sha256` of every file the tree holds, sorted (what `deploy`
/// lists of what it restored).
fn expected_listing() -> String {
    let mut lines: Vec<String> = (0..1000)
        .map(|i| {
            let mode = if i % 9 == 0 { 755 } else { 644 };
            let sha = hex::encode(Sha256::digest(format!("file {i}\n").as_bytes()));
            format!("./d{}/n{}/f{i}.txt {mode} {sha}", i % 10, i % 7)
        })
        .collect();
    lines.sort();
    lines.join("\n") + "\n"
}

fn workflow() -> String {
    format!(
        r#"version: 1
jobs:
  - name: build
    runs-on: {{role: build}}
    steps:
      - |
        set -e
        {MAKE_TREE}
        mkdir -p dist/a/deep dist/b
        echo x > dist/a/x-1.0.whl
        echo y > dist/a/deep/y-2.0.whl
        chmod 755 dist/a/deep/y-2.0.whl
        echo n > dist/notes.txt
        echo report > report.txt
    artifacts:
      publish:
        - {{name: site, path: site}}
        - {{name: wheels, path: "dist/**/*.whl"}}
        - {{name: report, path: report.txt, expire-in: 1s}}
  - name: deploy
    runs-on: {{role: deploy}}
    steps:
      - |
        set -e
        cd restored
        find . -type f | LC_ALL=C sort | while read -r f; do echo "$f $(stat -c %a "$f") $(sha256sum < "$f" | cut -d' ' -f1)"; done > ../listing.txt
        cd ..
        test "$(stat -c %a wheels/dist/a/deep/y-2.0.whl)" = 755
        test "$(cat wheels/dist/a/x-1.0.whl)" = x
        test ! -e wheels/dist/notes.txt
        echo "restored $(wc -l < listing.txt) files"
    artifacts:
      restore:
        - {{from_job: build, name: site, path: restored}}
        - {{from_job: build, name: wheels, path: wheels}}
      publish:
        - {{name: listing, path: listing.txt}}
"#
    )
}

/// Polls `f` every 200 ms until it returns Some or `secs` pass.
async fn poll<T, F, Fut>(secs: u64, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if let Some(v) = f().await {
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn directories_and_globs_cross_agents_and_expired_artifacts_answer_410() {
    let server = KilnServer::start(BIN.as_ref(), &["--gc-interval", "300ms", "--artifact-expire-in", "2h"]).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &workflow())]).unwrap();
    server.add_repo("trees", &repo);
    let c = Client::new(&server.url, &server.token);
    let builder = server.agent("builder", &["--labels", "role=build"]).unwrap();
    let deployer = server.agent("deployer", &["--labels", "role=deploy"]).unwrap();

    let run =
        c.submit_run("trees", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 300).await;
    assert_eq!(done.status, "success", "{done:#?}\nbuilder:\n{}\ndeployer:\n{}", builder.log(), deployer.log());
    assert_eq!(done.jobs[0].attempts[0].runner, "builder");
    assert_eq!(done.jobs[1].attempts[0].runner, "deployer", "restored on the other agent");

    // The restored tree, file by file with modes, as the deploying job saw it.
    let dir = tempfile::tempdir().unwrap();
    let listing = dir.path().join("listing.txt");
    let out =
        server.cli().args(["artifact", "get", &run.run_id, "deploy", "listing", "-o"]).arg(&listing).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&listing).unwrap(), expected_listing());

    // Kinds, and a single file's bytes and sha256 are its own.
    let build = &done.jobs[0];
    let kind = |n: &str| build.artifacts.iter().find(|a| a.name == n).map(|a| a.kind.clone()).unwrap();
    assert_eq!((kind("site"), kind("wheels"), kind("report")), ("archive".into(), "archive".into(), "file".into()));
    let report = build.artifacts.iter().find(|a| a.name == "report").unwrap();
    assert_eq!(report.sha256, hex::encode(Sha256::digest(b"report\n")));
    assert_eq!(report.size, 7);
    let site = build.artifacts.iter().find(|a| a.name == "site").unwrap();
    assert!(site.expires_at.is_some() && !site.expired, "the server default applies: {site:?}");

    // A capability handed out before the expiry (if the collector was not
    // first) stops working too.
    let early = c.artifact(&run.run_id, "build", "report").await.ok();

    // `report` expires (`expire-in: 1s`) once the run ended.
    let gone = poll(60, || async {
        match c.artifact(&run.run_id, "build", "report").await {
            Err(e) if e.status() == Some(410) => Some(e),
            _ => None,
        }
    })
    .await
    .unwrap_or_else(|| panic!("report never expired\n{}", server.log()));
    assert_eq!(gone.code(), Some("expired"), "{gone}");
    if let Some(d) = early {
        let e = c.download(&d.url).await.expect_err("an expired object's bytes are not served");
        assert_eq!((e.status(), e.code()), (Some(410), Some("expired")), "{e}");
    }
    // The others stay.
    c.artifact(&run.run_id, "build", "site").await.expect("site has not expired");

    let status = server.cli().args(["status", &run.run_id, "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let arts = &v["jobs"][0]["artifacts"];
    let by = |n: &str| arts.as_array().unwrap().iter().find(|a| a["name"] == n).unwrap().clone();
    assert_eq!(by("report")["expired"], true, "{arts:#}");
    assert_eq!(by("site")["expired"], false, "{arts:#}");
    assert!(by("report")["expires_at"].is_i64());

    let list = server.cli().args(["artifact", "list", &run.run_id]).output().unwrap();
    assert!(list.status.success());
    let text = String::from_utf8_lossy(&list.stdout);
    let line =
        |n: &str| text.lines().find(|l| l.starts_with(n)).unwrap_or_else(|| panic!("{n} in\n{text}")).to_string();
    assert!(line("report").contains("file") && line("report").trim_end().ends_with("expired"), "{text}");
    assert!(line("site").contains("archive") && !line("site").contains("expired"), "{text}");
    assert!(line("listing").contains("deploy"), "{text}");
    let json = server.cli().args(["artifact", "list", &run.run_id, "build", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let names: Vec<&str> = v.as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 3, "{v:#}");
    assert!(v.as_array().unwrap().iter().all(|a| a["job"] == "build"));

    let get = server
        .cli()
        .args(["artifact", "get", &run.run_id, "build", "report", "-o"])
        .arg(dir.path().join("report"))
        .output()
        .unwrap();
    assert!(!get.status.success());
    let err = String::from_utf8_lossy(&get.stderr);
    assert!(err.contains("has expired"), "{err}");
    assert!(!dir.path().join("report").exists());
}

/// A glob that matches nothing fails the job, naming the pattern.
#[tokio::test(flavor = "multi_thread")]
async fn a_glob_matching_nothing_fails_the_job_naming_the_pattern() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let wf = "version: 1\njobs:\n  - name: build\n    steps: [\"mkdir -p dist\"]\n    artifacts:\n      publish:\n        - {name: wheels, path: \"dist/*.whl\"}\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    server.add_repo("empty-glob", &repo);
    let c = Client::new(&server.url, &server.token);
    let _a = server.agent("a", &[]).unwrap();
    let run =
        c.submit_run("empty-glob", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 120).await;
    assert_eq!(done.status, "failed");
    let msg = done.jobs[0].message.clone().unwrap_or_default();
    assert!(msg.contains("`dist/*.whl` matched no files"), "{msg}");
}

/// Issue 40 (spec 000 §12, pinned through retries): a retry of the failed
/// jobs whose consumer runs after the parent's artifact would have expired
/// still restores the parent's exact bytes — the retry's pinned binding
/// keeps the generation. Once nothing holds it, it expires; a retry then
/// is refused (409, naming the artifact), not started with inputs that
/// answer 410.
#[tokio::test(flavor = "multi_thread")]
async fn a_retry_of_failed_jobs_keeps_its_inputs_past_the_parents_expiry() {
    let marker = tempfile::tempdir().unwrap();
    let ok = marker.path().join("ok");
    let wf = format!(
        "version: 1\njobs:\n  - name: build\n    runs-on: {{role: build}}\n    steps:\n      \
         - head -c 4096 /dev/urandom > out.bin && sha256sum out.bin | cut -d' ' -f1 > out.sha\n    \
         artifacts:\n      publish:\n        - {{name: out, path: out.bin, expire-in: 3s}}\n        \
         - {{name: sha, path: out.sha, expire-in: 3s}}\n  - name: test\n    runs-on: {{role: test}}\n    \
         steps:\n      - test \"$(sha256sum < out.bin | cut -d' ' -f1)\" = \"$(cat out.sha)\" && echo intact\n      \
         - test -e {}\n    artifacts:\n      restore:\n        - {{from_job: build, name: out, path: out.bin}}\n        \
         - {{from_job: build, name: sha, path: out.sha}}\n",
        ok.display()
    );
    let server = KilnServer::start(BIN.as_ref(), &["--gc-interval", "200ms"]).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    server.add_repo("keep", &repo);
    let c = Client::new(&server.url, &server.token);
    let _builder = server.agent("builder", &["--labels", "role=build"]).unwrap();
    let tester = server.agent("tester", &["--labels", "role=test"]).unwrap();
    let run = c.submit_run("keep", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await;
    let parent = run.unwrap().run_id;
    let done = wait_run(&c, &parent, 120).await;
    assert_eq!(done.status, "failed", "the test job fails first: {done:#?}");
    let built = c.artifact(&parent, "build", "out").await.unwrap().sha256;
    drop(tester);

    // The retry pins `build`; its `test` waits for an agent past the
    // parent's expiry (3 s, the collector runs every 200 ms).
    let retry = c.retry_run_with(&parent, &kiln_api::RetryRun { failed: true }).await.unwrap().run_id;
    tokio::time::sleep(Duration::from_secs(6)).await;
    std::fs::write(&ok, "").unwrap();
    let _tester = server.agent("tester-2", &["--labels", "role=test"]).unwrap();
    let r = wait_run(&c, &retry, 120).await;
    assert_eq!(r.status, "success", "{r:#?}\n{}", server.log());
    // The parent's exact bytes: the retry pinned the same artifact, and its
    // consumer checked what it restored against the parent's digest.
    assert_eq!(r.jobs[0].artifacts.iter().find(|a| a.name == "out").map(|a| a.sha256.clone()), Some(built));
    let logs = server.cli().args(["logs", &retry, "test"]).output().unwrap();
    assert!(String::from_utf8_lossy(&logs.stdout).contains("intact"), "{}", String::from_utf8_lossy(&logs.stdout));

    // Nothing holds it now: it expires (its retention again from the retry),
    // and a retry of the parent is refused, saying why.
    let gone = poll(60, || async {
        match c.artifact(&parent, "build", "out").await {
            Err(e) if e.status() == Some(410) => Some(()),
            _ => None,
        }
    })
    .await;
    assert!(gone.is_some(), "{}", server.log());
    let e = c.retry_run_with(&parent, &kiln_api::RetryRun { failed: true }).await.unwrap_err();
    assert_eq!(e.status(), Some(409), "{e}");
    assert!(e.to_string().contains("has expired") && e.to_string().contains("retry the whole run"), "{e}");
}
