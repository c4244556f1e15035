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

/// The tree `downloads` publishes (run here too, for the expected tree).
const MAKE_SITE: &str = r#"set -e
mkdir -p site/css site/empty site/deep/er/still
printf '<h1>hi</h1>\n' > site/index.html
printf 'body{}\n' > site/css/main.css
printf '#!/bin/sh\necho run\n' > site/run.sh && chmod 755 site/run.sh
head -c 300000 /dev/urandom > site/deep/er/still/blob.bin
ln -s css/main.css site/style.css
"#;

/// Every entry below `dir`: (relative path, mode, contents or link target).
fn tree_of(dir: &std::path::Path) -> Vec<(String, u32, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                out.push((rel, 0, std::fs::read_link(&p).unwrap().display().to_string().into_bytes()));
            } else if m.is_dir() {
                out.push((rel, m.permissions().mode() & 0o777, vec![]));
                stack.push(p);
            } else {
                out.push((rel, m.permissions().mode() & 0o777, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Only the regular files of `dir` (path, sha256 of the contents): what
/// Python's zipfile extracts faithfully (it writes a link as a file).
fn files_of(t: &[(String, u32, Vec<u8>)], dir: &std::path::Path) -> Vec<(String, String)> {
    t.iter()
        .filter(|(p, ..)| dir.join(p).symlink_metadata().is_ok_and(|m| m.is_file()))
        .map(|(p, _, c)| (p.clone(), hex::encode(Sha256::digest(c))))
        .collect()
}

/// Issue 41, items 4 and 5: a directory artifact is downloaded extracted
/// (`--extract DIR`, byte for byte with modes and links), as a `.tar.gz`
/// that plain `tar -xzf` unpacks to the same tree, as a `.zip` Python
/// unpacks, and over HTTP by `?format=` or `Accept` (a token of another
/// repository gets 404); and cargo's shape, a file hard-linked to another
/// name in the workspace, is published and restored by the next job.
#[tokio::test(flavor = "multi_thread")]
async fn a_directory_artifact_downloads_as_a_normal_archive_or_extracted() {
    let wf = format!(
        r#"version: 1
jobs:
  - name: build
    steps:
      - |
{}
        mkdir -p target/release/deps
        printf 'echo hello from app\n' > target/release/deps/app-0123abcd
        ln target/release/deps/app-0123abcd target/release/app
        test "$(stat -c %h target/release/app)" = 2
    artifacts:
      publish:
        - {{name: site, path: site}}
        - {{name: app, path: target/release/app}}
  - name: use
    steps:
      - sh bin/app
    artifacts:
      restore:
        - {{from_job: build, name: app, path: bin/app}}
"#,
        MAKE_SITE.lines().map(|l| format!("        {l}")).collect::<Vec<_>>().join("\n")
    );
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    server.add_repo("dl", &repo);
    let c = Client::new(&server.url, &server.token);
    let _a = server.agent("a", &[]).unwrap();
    let run = c.submit_run("dl", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let done = wait_run(&c, &run.run_id, 180).await;
    let logs = server.cli().args(["logs", &run.run_id]).output().unwrap();
    let log = String::from_utf8_lossy(&logs.stdout).to_string();
    assert_eq!(done.status, "success", "{log}\n{}", server.log());
    assert!(log.contains("hello from app"), "the hard-linked file was published and restored:\n{log}");

    // The expected tree: the same script, here. The random blob differs:
    // take it from the extracted copy, compared against the tar.gz's.
    let tmp = tempfile::tempdir().unwrap();
    let st = std::process::Command::new("sh").arg("-c").arg(MAKE_SITE).current_dir(tmp.path()).status().unwrap();
    assert!(st.success());
    let get = |args: &[&str]| {
        let mut cmd = server.cli();
        cmd.args(["artifact", "get", &run.run_id, "build", "site"]).args(args);
        cmd.output().unwrap()
    };

    // --extract DIR.
    let extracted = tmp.path().join("out/extracted");
    let out = get(&["--extract", extracted.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got = tree_of(&extracted);
    let mut want = tree_of(&tmp.path().join("site"));
    let blob = got.iter().find(|e| e.0 == "deep/er/still/blob.bin").unwrap().2.clone();
    assert_eq!(blob.len(), 300_000);
    want.iter_mut().filter(|e| e.0 == "deep/er/still/blob.bin").for_each(|e| e.2 = blob.clone());
    assert_eq!(got, want, "extracted byte for byte, with modes and the link");
    assert!(std::fs::read_dir(tmp.path().join("out")).unwrap().count() == 1, "nothing left beside DIR");

    // Into a directory that is not empty: refused, nothing written.
    let out = get(&["--extract", extracted.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not empty") && err.contains("nothing was written"), "{err}");
    assert_eq!(tree_of(&extracted), got);

    // -o PATH: a .tar.gz by default that plain tar unpacks to the same tree.
    let tgz = tmp.path().join("site.tar.gz");
    let out = get(&["-o", tgz.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let untarred = tmp.path().join("untarred");
    std::fs::create_dir(&untarred).unwrap();
    assert!(
        std::process::Command::new("tar").arg("-xzf").arg(&tgz).arg("-C").arg(&untarred).status().unwrap().success()
    );
    assert_eq!(tree_of(&untarred), got);

    // --format zip (also chosen by a PATH ending in .zip): Python unpacks it.
    let zip = tmp.path().join("site.zip");
    let out = get(&["-o", zip.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let unzipped = tmp.path().join("unzipped");
    let st = std::process::Command::new("python3").args(["-m", "zipfile", "-e"]).arg(&zip).arg(&unzipped).status();
    assert!(st.unwrap().success());
    let mut unzipped_files = files_of(&tree_of(&unzipped), &unzipped);
    unzipped_files.retain(|(p, _)| p != "style.css");
    assert_eq!(unzipped_files, files_of(&got, &extracted));
    let out = get(&["-o", "-", "--format", "zip"]);
    assert!(out.status.success() && out.stdout.starts_with(b"PK\x03\x04"), "a zip on standard output");

    // HTTP: ?format= or Accept, with the token; the JSON's links without one.
    let http = reqwest::Client::new();
    let url = format!("{}/v1/workflow-runs/{}/artifacts/build/site", server.url, run.run_id);
    let auth = format!("Bearer {}", server.token);
    let r = http.get(format!("{url}?format=tar.gz")).header("authorization", &auth).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/gzip");
    assert_eq!(r.headers()["content-disposition"], "attachment; filename=\"site.tar.gz\"");
    let body = r.bytes().await.unwrap();
    let again = tmp.path().join("http.tar.gz");
    std::fs::write(&again, &body).unwrap();
    let dir2 = tmp.path().join("http");
    std::fs::create_dir(&dir2).unwrap();
    assert!(std::process::Command::new("tar").arg("-xzf").arg(&again).arg("-C").arg(&dir2).status().unwrap().success());
    assert_eq!(tree_of(&dir2), got);
    let r = http.get(&url).header("authorization", &auth).header("accept", "application/zip").send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["content-type"].to_str().unwrap()), (200, "application/zip"));
    assert!(r.bytes().await.unwrap().starts_with(b"PK\x03\x04"));
    let r = http.get(format!("{url}?format=rar")).header("authorization", &auth).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("use `tar.gz` or `zip`"));
    let d = c.artifact(&run.run_id, "build", "site").await.unwrap();
    let link = d.tar_gz_url.expect("an archive has a .tar.gz link");
    let r = http.get(&link).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(&r.bytes().await.unwrap()[..2], &[0x1f, 0x8b], "gzip");
    assert!(d.zip_url.is_some());
    assert!(c.artifact(&run.run_id, "build", "app").await.unwrap().tar_gz_url.is_none(), "a file has none");
    let tampered = link.replace("cap=", "cap=x");
    assert_eq!(http.get(&tampered).send().await.unwrap().status(), 401);

    // Authorized as every read: no token 401, another repository's 404.
    let r = http.get(format!("{url}?format=tar.gz")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    server.add_repo("other", &repo);
    let t = c
        .create_token(&kiln_api::CreateToken {
            name: "other-trigger".into(),
            scope: "trigger".into(),
            repo: Some("other".into()),
            trusted: None,
        })
        .await
        .unwrap();
    let r =
        http.get(format!("{url}?format=tar.gz")).header("authorization", format!("Bearer {}", t.token)).send().await;
    assert_eq!(r.unwrap().status(), 404, "a token without access to the run learns nothing");
}
