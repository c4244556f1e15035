//! The S3 object store end to end: real `kiln server` replicas and `kiln
//! agent` processes, a real S3-compatible server (Garage on loopback), real
//! PostgreSQL. Agents hold no store credentials: they move bytes with
//! presigned URLs; nothing passes through the servers' disks.

use kiln_api::{Client, SubmitRun};
use kiln_blob::{S3BlobStore, S3Config};
use kiln_testkit::{
    GARAGE_KEY_ID, GARAGE_SECRET, KilnAgent, KilnServer, TempGarage, TempPostgres, TestRepo, garage_available,
    handoff_workflow, postgres_available, wait_for, wait_run,
};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

fn creds() -> [(&'static str, &'static str); 2] {
    [("AWS_ACCESS_KEY_ID", GARAGE_KEY_ID), ("AWS_SECRET_ACCESS_KEY", GARAGE_SECRET)]
}

/// The test's own view of the bucket (as an operator with the keys).
fn bucket(g: &TempGarage, prefix: &str) -> S3BlobStore {
    S3BlobStore::with_keys(S3Config::parse(&g.url(prefix)).unwrap(), GARAGE_KEY_ID, GARAGE_SECRET).unwrap()
}

async fn wait_job<F: Fn(&kiln_api::Job) -> bool>(c: &Client, run: &str, job: usize, f: F) -> kiln_api::Run {
    for _ in 0..2400 {
        if let Ok(r) = c.get_run(run).await
            && f(&r.jobs[job])
        {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {job} of run {run} never reached the expected state: {:#?}", c.get_run(run).await.unwrap());
}

/// One server on S3: an artifact crosses from `compile` to `test` through
/// the bucket (agents upload and download with presigned URLs), `kiln
/// artifact get` fetches the same bytes, the finished logs are archived into
/// the bucket and replay from there; the server's data dir holds no bytes.
#[tokio::test(flavor = "multi_thread")]
async fn artifacts_and_log_archives_live_in_the_bucket() {
    if !garage_available() {
        return;
    }
    let g = TempGarage::start().unwrap();
    let store = g.url("kiln-e2e");
    let server =
        KilnServer::start_env(BIN.as_ref(), &["--object-store", &store, "--log-archive-after", "300ms"], &creds())
            .unwrap();
    let wf = "version: 1\njobs:\n  - name: compile\n    steps:\n      - mkdir -p target && head -c 70000000 /dev/urandom > target/app.jar && true > target/empty && sha256sum target/app.jar | tee target/app.sha\n    artifacts:\n      publish:\n        - {name: app, path: target/app.jar}\n        - {name: sum, path: target/app.sha}\n        - {name: empty, path: target/empty}\n  - name: test\n    artifacts:\n      restore:\n        - {from_job: compile, name: app, path: target/app.jar}\n        - {from_job: compile, name: sum, path: target/app.sha}\n        - {from_job: compile, name: empty, path: target/empty}\n    steps:\n      - sha256sum -c target/app.sha && test ! -s target/empty && echo verified\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    server.add_repo("s3", &repo);
    // The agent's environment has no store credentials (and they would not help).
    let agent = server.agent("a", &[]).unwrap();
    let c = Client::new(&server.url, &server.token);
    let r = c.submit_run("s3", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let run = wait_run(&c, &r.run_id, 180).await;
    assert_eq!(run.status, "success", "{run:#?}\nserver:\n{}\nagent:\n{}", server.log(), agent.log());
    let app = run.jobs[0].artifacts.iter().find(|a| a.name == "app").unwrap().clone();
    assert_eq!(app.size, 70_000_000, "two 64 MiB-part upload");

    // The download URL is the store's own, presigned; the bytes are exact.
    let dl = c.artifact(&r.run_id, "compile", "app").await.unwrap();
    assert!(dl.url.starts_with(&g.endpoint()) && dl.url.contains("X-Amz-Signature"), "{}", dl.url);
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("app.jar");
    let get = server.cli().args(["artifact", "get", &r.run_id, "compile", "app", "-o"]).arg(&dest).output().unwrap();
    assert!(get.status.success(), "{}", String::from_utf8_lossy(&get.stderr));
    let sha = std::process::Command::new("sha256sum").arg(&dest).output().unwrap();
    assert!(String::from_utf8_lossy(&sha.stdout).starts_with(&app.sha256));
    let logs = server.cli().args(["logs", &r.run_id, "test"]).output().unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout).to_string();
    assert!(logs.contains("verified"), "{logs}");

    // Logs move to the bucket: the journal empties, replay is unchanged.
    let data = server.data_dir();
    let test_job = run.jobs[1].id.clone();
    wait_for(Duration::from_secs(30), || (kiln_testkit::journal_rows(&data, &test_job) == 0).then_some(()))
        .unwrap_or_else(|| panic!("the log was never archived:\n{}", server.log()));
    let again = server.cli().args(["logs", &r.run_id, "test"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&again.stdout), logs, "replay from the bucket");
    assert_eq!(kiln_testkit::files_under(&data.join("objects")), 0, "no bytes on the server's disk");

    // What the bucket holds is exactly the bound bytes, under the prefix.
    let key = dl.url.split_once("/kiln-e2e/").and_then(|(_, k)| k.split('?').next()).unwrap();
    // Content addressed (issue 45): the key is the bytes' sha256, checked by
    // the server reading them back before the copy.
    assert_eq!(key, format!("cas/sha256/{}", app.sha256), "{key}");
    assert_eq!(bucket(&g, "kiln-e2e").hash(key).await.unwrap().sha256, app.sha256);
}

/// spec 000 §15 "runner vanishes mid-upload" at scale: PostgreSQL, the S3
/// store and two server replicas. Agent A (talking to replica A) is paused
/// between parts of a presigned multipart upload and replica A is SIGKILLed;
/// replica B fences epoch 1, agent B (whose first URL is the dead replica)
/// runs epoch 2 and the successor consumes exactly epoch 2's bytes. Agent A
/// comes back: every call of epoch 1 is refused, the part URLs it could still
/// use lead into an upload that is aborted when the generation is collected.
#[tokio::test(flavor = "multi_thread")]
async fn runner_vanishes_on_postgres_and_s3_with_a_replica_killed() {
    if !garage_available() || !postgres_available() {
        return;
    }
    let g = TempGarage::start().unwrap();
    let pg = TempPostgres::start().unwrap();
    let db = pg.create_database().await.unwrap();
    let store = g.url("");
    let flags = [
        "--database-url",
        &db,
        "--object-store",
        &store,
        "--lease-ttl",
        "3s",
        "--artifact-gc-grace",
        "1s",
        "--gc-interval",
        "300ms",
        "--retry-base",
        "100ms",
    ];
    let a = KilnServer::start_env(BIN.as_ref(), &flags, &creds()).unwrap();
    let b = a.replica(&flags).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &handoff_workflow(150_000_000))]).unwrap();
    a.add_repo("vanish", &repo);
    let (ab, ba) = (format!("{},{}", a.url, b.url), format!("{},{}", b.url, a.url));
    let c = Client::new(&ba, &b.token);

    // Agent A reads its parts slowly (20 MB/s) and talks to replica A.
    let agent_a =
        KilnAgent::spawn(&a.bin, &ab, &a.agent_token, "agent-a", &["--upload-rate-limit", "20000000"]).unwrap();
    let run =
        c.submit_run("vanish", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let r = wait_job(&c, &run.run_id, 0, |j| j.current_epoch == 1).await;
    let compile = r.jobs[0].id.clone();
    // Between parts: part 1 of 3 is in the store, part 2 not yet sent.
    wait_for(Duration::from_secs(120), || agent_a.log().contains("uploaded part 1/3").then_some(()))
        .unwrap_or_else(|| panic!("agent A never uploaded a part:\n{}", agent_a.log()));
    agent_a.signal("STOP");
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();

    // Replica B fences epoch 1 when its lease runs out.
    // A run's view is read in three statements, not one snapshot (noted in
    // issue 46's closing note): the attempt may read `lost` while the job
    // still read `running` a moment earlier. No agent may claim it (agent A
    // is stopped, none other runs), so the job must become `ready`.
    let r = wait_job(&c, &run.run_id, 0, |j| {
        j.attempts.first().is_some_and(|at| at.outcome == "lost") && j.status != "running"
    })
    .await;
    assert_eq!(r.jobs[0].status, "ready", "fenced before a replacement is authorized");
    // Agent B knows the dead replica first; it moves on to B and finishes the run.
    let agent_b = KilnAgent::spawn(&b.bin, &ab, &b.agent_token, "agent-b", &[]).unwrap();
    let done = wait_run(&c, &run.run_id, 300).await;
    assert_eq!(done.status, "success", "{done:#?}\nB:\n{}\nagent B:\n{}", b.log(), agent_b.log());

    // Agent A comes back: every call of epoch 1 is refused by the survivor.
    agent_a.signal("CONT");
    // As agent A would send them: with epoch 1's own attempt token.
    let key = std::fs::read_to_string(b.data_dir().join("blob.key")).unwrap();
    let token = kiln_server::credentials::AgentKeys::new(key.trim().as_bytes()).attempt_token(&compile, 1);
    let agent_api = Client::new(&b.url, &token);
    assert!(agent_api.heartbeat(&compile, 1).await.unwrap_err().is_stale_epoch());
    let completion = kiln_api::Completion::success();
    assert!(agent_api.complete(&compile, 1, &completion).await.unwrap_err().is_stale_epoch());
    let up = kiln_api::CreateUpload { name: "app".into(), size: 1, sha256: Some("0".repeat(64)), kind: None };
    assert!(agent_api.create_upload(&compile, 1, &up).await.unwrap_err().is_stale_epoch());
    wait_for(Duration::from_secs(30), || agent_a.log().contains("fenced").then_some(()))
        .unwrap_or_else(|| panic!("agent A should notice it was fenced:\n{}", agent_a.log()));

    // The record: epoch 1 lost on agent A, epoch 2 won on agent B, bound.
    let r = c.get_run(&run.run_id).await.unwrap();
    let job = &r.jobs[0];
    let outcomes: Vec<_> = job.attempts.iter().map(|a| (a.epoch, a.outcome.as_str(), a.runner.as_str())).collect();
    assert_eq!(outcomes, vec![(1, "lost", "agent-a"), (2, "success", "agent-b")]);
    let art = &job.artifacts[0];
    assert_eq!((art.name.as_str(), art.epoch, art.size), ("app", 2, 150_000_000));
    let logs = b.cli().args(["logs", &run.run_id, "integration-test"]).output().unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(logs.contains(&format!("consumed {}", art.sha256)), "{logs}");
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("app.jar");
    let get = b.cli().args(["artifact", "get", &run.run_id, "compile", "app", "-o"]).arg(&dest).output().unwrap();
    assert!(get.status.success(), "{}", String::from_utf8_lossy(&get.stderr));
    let sha = std::process::Command::new("sha256sum").arg(&dest).output().unwrap();
    assert!(String::from_utf8_lossy(&sha.stdout).starts_with(&art.sha256));

    // Epoch 1's generation is collected: its multipart upload is aborted, so
    // a part URL agent A might still hold leads nowhere, and no object exists.
    use sqlx::Row;
    let pool = sqlx::PgPool::connect(&db).await.unwrap();
    let row = wait_for_async(|| async {
        let row = sqlx::query(
            "SELECT object_key, upload_id, state FROM artifact_generations WHERE job_id = $1 AND epoch = 1",
        )
        .bind(&compile)
        .fetch_one(&pool)
        .await
        .unwrap();
        (row.get::<String, _>("state") == "deleted").then_some(row)
    })
    .await
    .unwrap_or_else(|| panic!("epoch 1's generation was not collected:\n{}", b.log()));
    let (key, upload): (String, String) = (row.get("object_key"), row.get("upload_id"));
    assert!(!upload.is_empty(), "epoch 1 had started a multipart upload");
    let bkt = bucket(&g, "");
    assert_eq!(bkt.head(&key).await.unwrap(), None);
    let late = bkt.presign_part(&key, &upload, 1, "1B2M2Y8AsgTpgAmY7PhCfg==", Duration::from_secs(60)).await.unwrap();
    let put = reqwest::Client::new()
        .put(&late.url)
        .header("content-md5", "1B2M2Y8AsgTpgAmY7PhCfg==")
        .body(Vec::<u8>::new())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 404, "the aborted upload takes no more parts");
    // Epoch 2's object is the bound one.
    let bound: String = sqlx::query_scalar(
        "SELECT COALESCE(content_key, object_key) FROM artifact_generations WHERE job_id = $1 AND epoch = 2",
    )
    .bind(&compile)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(bkt.hash(&bound).await.unwrap().sha256, art.sha256);
    assert_eq!(kiln_testkit::files_under(&b.data_dir().join("objects")), 0, "no bytes on the servers' disk");
    drop(agent_b);
}

async fn wait_for_async<T, F, Fut>(mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for _ in 0..600 {
        if let Some(v) = f().await {
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// The presigned-part protocol over HTTP, driven by hand as an agent would:
/// what the server grants, what it refuses, and what the store refuses.
#[tokio::test(flavor = "multi_thread")]
async fn presigned_parts_are_granted_only_for_the_live_attempt_and_exact_bytes() {
    use base64::Engine;
    if !garage_available() {
        return;
    }
    let g = TempGarage::start().unwrap();
    let server = KilnServer::start_env(BIN.as_ref(), &["--object-store", &g.url("p")], &creds()).unwrap();
    let wf = "version: 1\njobs:\n  - name: build\n    steps: [\"true\"]\n    artifacts:\n      publish:\n        - {name: out, path: out.bin}\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    server.add_repo("manual", &repo);
    let c = Client::new(&server.url, &server.token);
    let r = c.submit_run("manual", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap();
    let agent = Client::new(&server.url, &server.agent_token);
    let reg = agent
        .register_agent(&kiln_api::RegisterAgent {
            name: "hand".into(),
            labels: Default::default(),
            max_jobs: 1,
            version: None,
            executor: None,
            fresh_start: false,
        })
        .await
        .unwrap();
    let claim =
        kiln_api::ClaimRequest { session_id: reg.session_id.clone(), claim_request_id: "c1".into(), wait_ms: 20_000 };
    let a = agent
        .with_token(&reg.credential)
        .claim(&reg.agent_id, &claim)
        .await
        .unwrap()
        .assignment
        .expect("an assignment");
    let (job, epoch) = (a.job_id.clone(), a.epoch);
    let agent = agent.with_token(&a.attempt_token);

    let bytes: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&bytes))
    };
    let md5 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(<md5::Md5 as md5::Digest>::digest(b));
    let up = kiln_api::CreateUpload { name: "out".into(), size: bytes.len() as u64, sha256: None, kind: None };
    let session = agent.create_upload(&job, epoch, &up).await.unwrap();
    assert!(session.presigned && session.part_url.is_empty(), "{session:?}");
    let gen_id = session.generation_id.clone();
    let ask = |size: u64, content_md5: String, part: u64| {
        let agent = &agent;
        let (job, gen_id) = (job.clone(), gen_id.clone());
        async move { agent.part_url(&job, epoch, &gen_id, part, &kiln_api::PartUrlRequest { size, content_md5 }).await }
    };
    // Refused by the server: wrong size, a part that does not exist, no MD5.
    assert_eq!(ask(999, md5(&bytes), 0).await.unwrap_err().status(), Some(400));
    assert_eq!(ask(bytes.len() as u64, md5(&bytes), 1).await.unwrap_err().status(), Some(400));
    assert_eq!(ask(bytes.len() as u64, "bm90IGFuIG1kNQ==".into(), 0).await.unwrap_err().status(), Some(400));
    // Sealing before the part is there is refused and changes nothing.
    let early = agent.seal(&job, epoch, &gen_id, Some(&sha), vec![]).await.unwrap_err();
    assert_eq!(early.status(), Some(422), "{early}");
    // Granted: the store takes exactly the signed bytes.
    let part = ask(bytes.len() as u64, md5(&bytes), 0).await.unwrap();
    assert!(part.url.starts_with(&g.endpoint()), "{}", part.url);
    let mut bad = bytes.clone();
    bad[0] ^= 0xff;
    let refused = agent.put_presigned(&part, reqwest::Body::from(bad)).await.unwrap_err();
    assert_eq!(refused.status(), Some(400), "{refused}");
    let etag = agent.put_presigned(&part, reqwest::Body::from(bytes.clone())).await.unwrap();
    let parts = vec![kiln_api::UploadedPart { part: 0, etag: etag.clone() }];
    let sealed = agent.seal(&job, epoch, &gen_id, Some(&sha), parts.clone()).await.unwrap();
    assert_eq!((sealed.size, sealed.sha256.as_str(), sealed.state.as_str()), (1_000_000, sha.as_str(), "sealed"));
    // A repeated seal (lost response) answers the same.
    let again = agent.seal(&job, epoch, &gen_id, Some(&sha), parts).await.unwrap();
    assert_eq!(again.state, "sealed");
    let done = kiln_api::Completion::success();
    agent.complete(&job, epoch, &done).await.unwrap();
    // The attempt ended: no more part URLs for it.
    let second = agent.create_upload(&job, epoch, &up).await.unwrap_err();
    assert!(second.is_stale_epoch(), "{second}");
    assert!(ask(bytes.len() as u64, md5(&bytes), 0).await.unwrap_err().is_stale_epoch());
    let run = wait_run(&c, &r.run_id, 60).await;
    assert_eq!(run.status, "success");
    assert_eq!(run.jobs[0].artifacts[0].sha256, sha);
    let dl = c.artifact(&r.run_id, "build", "out").await.unwrap();
    assert_eq!(reqwest::get(&dl.url).await.unwrap().bytes().await.unwrap().to_vec(), bytes);
}

/// Issue 40, item 9: a cache entry whose bytes in the bucket are damaged
/// (here: gone) is verified by the server and dropped on S3 as on local
/// disk: the restore is a clean miss, the job saves afresh, and the run
/// after that restores the new entry.
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_cache_entry_in_the_bucket_is_verified_and_dropped() {
    if !garage_available() {
        return;
    }
    let g = TempGarage::start().unwrap();
    let server = KilnServer::start_env(BIN.as_ref(), &["--object-store", &g.url("kiln-cache")], &creds()).unwrap();
    let wf = "version: 1\njobs:\n  - name: build\n    cache: {kind: deps, version: \"1\", paths: [deps]}\n    steps:\n      - 'if [ -f deps/built ]; then echo \"restored: $(cat deps/built)\"; else mkdir -p deps && echo \"fresh-$KILN_RUN_ID\" > deps/built && echo \"cold build\"; fi'\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf)]).unwrap();
    server.add_repo("cache", &repo);
    let agent = server.agent("a", &[]).unwrap();
    let c = Client::new(&server.url, &server.token);
    let run = || async {
        let sub = SubmitRun { commit_sha: "main".into(), ..Default::default() };
        let r = c.submit_run("cache", &sub, None).await.unwrap();
        let run = wait_run(&c, &r.run_id, 120).await;
        let out = server.cli().args(["logs", &r.run_id]).output().unwrap();
        let log = String::from_utf8_lossy(&out.stdout).to_string();
        assert_eq!(run.status, "success", "{log}\n{}", server.log());
        (run, log)
    };
    let (r1, log1) = run().await;
    assert!(log1.contains("cold build"), "{log1}");
    let (_, log2) = run().await;
    assert!(log2.contains(&format!("restored: fresh-{}", r1.id)), "{log2}");

    // The entry's object leaves the bucket; the agent's node-local copies
    // are damaged too, so the restore must come from the bucket.
    let key = sealed_object_of(&server.data_dir(), &r1.id);
    bucket(&g, "kiln-cache").delete(&key).await.unwrap();
    let mut local = Vec::new();
    collect_files(&agent.work_dir(), &mut local);
    for p in local.iter().filter(|p| p.parent().is_some_and(|d| d.ends_with("caches"))) {
        std::fs::write(p, b"garbage").unwrap();
    }
    let (r3, log3) = run().await;
    assert!(log3.contains("cold build"), "a damaged entry is a clean miss: {log3}");
    let c3 = r3.jobs[0].cache.clone().unwrap();
    assert_eq!(c3.saved.as_deref(), Some("saved"), "dropped and saved afresh: {c3:?}\n{}", server.log());
    assert!(server.log().contains("damaged: dropped"), "{}", server.log());
    let (_, log4) = run().await;
    assert!(log4.contains(&format!("restored: fresh-{}", r3.id)), "{log4}");
}

/// The object key of `run`'s sealed generation (its cache archive), read
/// from the server's SQLite database.
fn sealed_object_of(data: &std::path::Path, run: &str) -> String {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg("import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute(\"SELECT COALESCE(content_key, object_key) FROM artifact_generations WHERE run_id=? AND state='sealed'\", (sys.argv[2],)).fetchone()[0])")
        .arg(data.join("kiln.db"))
        .arg(run)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn collect_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                collect_files(&p, out);
            } else {
                out.push(p);
            }
        }
    }
}
