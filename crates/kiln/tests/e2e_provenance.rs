//! Signed provenance end to end (issue 45) with the real `kiln` binary and
//! a real agent: a job's artifact is bound with a statement the server
//! signed; `kiln artifact provenance`, `kiln keys export` and `kiln
//! verify` (online and offline) accept it; tampering fails the check it
//! should, with its exit code; an independent DSSE implementation
//! (securesystemslib) verifies the server's envelope with the exported key.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnUp, TestRepo, wait_run};
use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

const WORKFLOW: &str = r#"version: 1
jobs:
  - name: build
    steps:
      - mkdir -p out && echo "release bytes" > out/app.txt
    artifacts:
      publish:
        - {name: app, path: out/app.txt}
"#;

fn cli(up: &KilnUp, args: &[&str]) -> (i32, String) {
    let o = up.cli().args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_artifact_verifies_against_its_signed_provenance_and_tampering_fails_its_check() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", WORKFLOW)]).unwrap();
    let (code, out) = cli(&up, &["repo", "add", "shop", "--url", &repo.path().display().to_string()]);
    assert_eq!(code, 0, "{out}");
    let c = Client::new(&up.url, &up.token);
    let id = c.submit_run("shop", &SubmitRun { commit_sha: "HEAD".into(), ..Default::default() }, None).await.unwrap();
    let run = wait_run(&c, &id.run_id, 120).await;
    assert_eq!(run.status, "success", "{}", up.log());
    let git_ref = run.git_ref.clone().expect("a HEAD run names its branch");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.txt");
    let at = |name: &str| dir.path().join(name).display().to_string();
    let f = file.display().to_string();
    let (code, out) = cli(&up, &["artifact", "get", &id.run_id, "build", "app", "-o", &f]);
    assert_eq!(code, 0, "{out}");
    let (code, out) =
        cli(&up, &["artifact", "provenance", &id.run_id, "build", "app", "-o", &format!("{f}.intoto.json")]);
    assert_eq!(code, 0, "{out}");

    // Who may read it: a trigger token of the repository, not of another.
    only_its_readers(&up, &format!("{}/v1/workflow-runs/{}/artifacts/build/app/provenance", up.url, id.run_id)).await;

    // Online: the server's keys; the policy as a deployer writes it.
    let (code, out) =
        cli(&up, &["verify", &f, "--repo", "shop", "--ref", &git_ref, "--workflow", ".kiln/pipeline.yaml"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("verified:") && out.contains("on a host executor"), "{out}");
    let builder = format!("{}/builders/default", up.url);
    let (code, out) = cli(&up, &["verify", &f, "--repo", "shop", "--builder", &builder]);
    assert_eq!(code, 0, "{out}");

    // Offline: exported keys, no server.
    let (code, out) = cli(&up, &["keys", "export", "-o", &at("keys.json")]);
    assert_eq!(code, 0, "{out}");
    let offline = std::process::Command::new(BIN)
        .args(["verify", &f, "--repo", "shop", "--keys", &at("keys.json"), "--server", "http://127.0.0.1:9"])
        .env_remove("KILN_TOKEN")
        .output()
        .unwrap();
    assert!(offline.status.success(), "{}", String::from_utf8_lossy(&offline.stderr));

    // Each tampering fails its own check.
    let refused = |args: &[&str], code: i32, needle: &str| {
        let (got, out) = cli(&up, args);
        assert_eq!(got, code, "{args:?}: {out}");
        assert!(out.contains(needle), "{args:?}: {out}");
    };
    refused(&["verify", &f, "--repo", "other"], 15, "repository check failed");
    refused(&["verify", &f, "--repo", "shop", "--ref", "refs/heads/dev"], 16, "ref check failed");
    refused(&["verify", &f, "--repo", "shop", "--workflow", ".kiln/release.yaml"], 17, "workflow check failed");
    refused(&["verify", &f, "--repo", "shop", "--builder", "https://elsewhere/builders/x"], 19, "builder check failed");
    refused(&["verify", &f, "--repo", "shop", "--name", "site"], 14, "subject check failed");
    // Another key set (the OIDC keys are not the attestation keys).
    let oidc = reqwest::get(format!("{}/.well-known/jwks.json", up.url)).await.unwrap().text().await.unwrap();
    std::fs::write(at("oidc.json"), oidc).unwrap();
    refused(&["verify", &f, "--repo", "shop", "--keys", &at("oidc.json")], 11, "key check failed");
    // A changed byte.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[0] ^= 1;
    std::fs::write(at("changed.txt"), &bytes).unwrap();
    let changed = at("changed.txt");
    refused(
        &["verify", &changed, "--provenance", &format!("{f}.intoto.json"), "--repo", "shop"],
        13,
        "digest check failed",
    );

    // An independent implementation verifies the server's envelope.
    let (code, pem) = cli(&up, &["keys", "export", "--pem"]);
    assert_eq!(code, 0, "{pem}");
    sslib_verifies(&format!("{f}.intoto.json"), &pem, dir.path());
}

/// `path` (of repository `shop`) answers a trigger token of `shop` (200),
/// not one of another repository (404), nor no token (401).
async fn only_its_readers(up: &KilnUp, path: &str) {
    let other = TestRepo::new(&[(".kiln/pipeline.yaml", WORKFLOW)]).unwrap();
    let name = format!("other-{}", std::process::id() ^ path.len() as u32);
    let (code, out) = cli(up, &["repo", "add", &name, "--url", &other.path().display().to_string()]);
    assert_eq!(code, 0, "{out}");
    for (repo, want) in [("shop", 200), (name.as_str(), 404)] {
        let o =
            up.cli().args(["token", "create", "--name", repo, "--scope", "trigger", "--repo", repo]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let token = String::from_utf8(o.stdout).unwrap();
        let got = reqwest::Client::new().get(path).bearer_auth(token.trim()).send().await.unwrap().status();
        assert_eq!(got.as_u16(), want, "a trigger token of {repo}: {path}");
    }
    assert_eq!(reqwest::get(path).await.unwrap().status().as_u16(), 401, "{path}");
}

fn sslib_verifies(envelope: &str, pem_with_ids: &str, dir: &Path) {
    let default = format!("{}/.cache/kiln-tools/sslib-venv/bin/python", std::env::var("HOME").unwrap_or_default());
    let py = std::env::var("KILN_SSLIB_PYTHON").unwrap_or(default);
    if !std::process::Command::new(&py)
        .args(["-c", "import securesystemslib"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        assert_ne!(std::env::var("KILN_REQUIRE_SSLIB").as_deref(), Ok("1"), "securesystemslib is required");
        eprintln!("skipped the securesystemslib check: not installed");
        return;
    }
    // `# keyid ID` then the PEM block, per key; the newest signs.
    let keyid = pem_with_ids.lines().filter_map(|l| l.strip_prefix("# keyid ")).next_back().unwrap().trim().to_string();
    let pem: String = pem_with_ids.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");
    let pem_path = dir.join("key.pem");
    std::fs::write(&pem_path, pem).unwrap();
    let script = r#"
import json, sys
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey
env_path, pem_path, keyid = sys.argv[1:4]
key = SSlibKey.from_crypto(load_pem_public_key(open(pem_path, "rb").read()), keyid=keyid, scheme="ecdsa-sha2-nistp256")
env = Envelope.from_dict(json.load(open(env_path)))
env.verify([key], 1)
print("verified", json.loads(env.payload)["predicate"]["buildDefinition"]["externalParameters"]["repository"])
"#;
    let o = std::process::Command::new(&py).args(["-c", script, envelope]).arg(&pem_path).arg(&keyid).output().unwrap();
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && out.contains("verified shop"), "{out}");
}

/// Artifacts a chaos job publishes.
const PER_JOB: usize = 25;

fn chaos_workflow() -> String {
    let mut publish = String::new();
    let mut step = String::from("mkdir -p out && sleep 0.$((RANDOM % 5))");
    for i in 0..PER_JOB {
        publish += &format!("        - {{name: a{i}, path: out/a{i}.txt}}\n");
        step += &format!(" && echo \"$KILN_RUN_ID {i}\" > out/a{i}.txt");
    }
    format!("version: 1\njobs:\n  - name: build\n    steps:\n      - {step}\n    artifacts:\n      publish:\n{publish}")
}

/// One SQL answer from the server's SQLite database.
fn sql(data: &Path, query: &str) -> String {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg("import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute(sys.argv[2]).fetchone()[0])")
        .arg(data.join("kiln.db"))
        .arg(query)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Spec 003 / issue 45 "chaos": more than 1,000 artifacts bound while the
/// server is SIGKILLed and restarted and agents are SIGKILLed mid-job:
/// every bound artifact has exactly one statement, which verifies (key,
/// signature, subject digest, repository) and names the epoch that bound
/// it; no unbound generation — a fenced attempt's included — has one.
#[tokio::test(flavor = "multi_thread")]
async fn under_kills_every_bound_artifact_has_exactly_one_valid_statement() {
    use kiln_testkit::{KilnAgent, KilnServer};
    use std::time::{Duration, Instant};
    const RUNS: usize = 48;
    let flags = ["--lease-ttl", "3s", "--loss-grace", "300ms", "--retry-base", "100ms"];
    let mut server = KilnServer::start(BIN.as_ref(), &flags).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &chaos_workflow())]).unwrap();
    server.add_repo("chaos", &repo);
    let (url, token, agent_token) = (server.url.clone(), server.token.clone(), server.agent_token.clone());
    let spawn = |name: &str| KilnAgent::spawn(BIN.as_ref(), &url, &agent_token, name, &[]).unwrap();
    let mut agents: Vec<KilnAgent> = (0..3).map(|i| spawn(&format!("a{i}"))).collect();
    let c = Client::new(&url, &token);
    let mut ids = Vec::new();
    for _ in 0..RUNS {
        let body = SubmitRun { commit_sha: "main".into(), ..Default::default() };
        ids.push(c.submit_run("chaos", &body, None).await.unwrap().run_id);
    }
    // Faults while the runs go: agents SIGKILLed (their attempts fenced,
    // some mid-upload), the server SIGKILLed and restarted. Eight rounds,
    // then more while runs are left until one has caught an attempt after
    // its upload (what the test is about: on a loaded host the first
    // rounds may all land before uploads).
    let caught_after_upload = |data: &Path| {
        sql(
            data,
            "SELECT COUNT(*) FROM artifact_generations g JOIN attempts a ON a.job_id = g.job_id \
             AND a.epoch = g.epoch WHERE a.outcome NOT IN ('success', 'running')",
        ) != "0"
    };
    let runs_left =
        |data: &Path| sql(data, "SELECT COUNT(*) FROM runs WHERE status IN ('queued', 'running', 'cancelling')") != "0";
    let mut journal = Vec::new();
    for round in 0..32 {
        let data = server.data_dir();
        if round >= 8 && (caught_after_upload(&data) || !runs_left(&data)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
        if round % 3 == 2 {
            journal.push(format!("SIGKILL server (round {round})"));
            server = server.kill_and_restart(&flags).unwrap();
        } else {
            let i = round % agents.len();
            journal.push(format!("SIGKILL agent {i} (round {round})"));
            agents[i].signal("KILL");
            let _ = agents[i].child.wait();
            agents[i] = spawn(&format!("a{i}-{round}"));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut runs = Vec::new();
    for id in &ids {
        loop {
            match c.get_run(id).await {
                Ok(r) if matches!(r.status.as_str(), "success" | "failed" | "cancelled") => {
                    runs.push(r);
                    break;
                }
                _ => {}
            }
            assert!(Instant::now() < deadline, "run {id} never ended\n{journal:?}\n{}", server.log());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let keys =
        kiln_provenance::dsse::keys_from_jwks(&serde_json::to_vec(&c.attestation_keys().await.unwrap()).unwrap())
            .unwrap();
    let policy = kiln_provenance::verify::Policy { repository: "chaos".into(), ..Default::default() };
    let mut bound = 0;
    for r in &runs {
        for a in r.jobs.iter().flat_map(|j| &j.artifacts) {
            let env = c.artifact_provenance(&r.id, "build", &a.name).await.unwrap();
            let v =
                kiln_provenance::verify::verify(&serde_json::to_vec(&env).unwrap(), &a.name, &a.sha256, &keys, &policy)
                    .unwrap_or_else(|e| panic!("run {} {}: {e:?}", r.id, a.name));
            assert_eq!(v.run, r.id);
            let epoch = &v.statement.predicate["buildDefinition"]["internalParameters"]["epoch"];
            assert_eq!(epoch.as_i64(), Some(a.epoch), "the statement names the epoch that bound it");
            bound += 1;
        }
    }
    let data = server.data_dir();
    let statements: usize = sql(&data, "SELECT COUNT(*) FROM artifact_provenance").parse().unwrap();
    let bindings: usize = sql(&data, "SELECT COUNT(DISTINCT generation_id) FROM artifact_bindings").parse().unwrap();
    let unbound = sql(
        &data,
        "SELECT COUNT(*) FROM artifact_provenance p WHERE NOT EXISTS \
         (SELECT 1 FROM artifact_bindings b WHERE b.generation_id = p.generation_id)",
    );
    let fenced = sql(
        &data,
        "SELECT COUNT(*) FROM artifact_provenance p JOIN jobs j ON j.id = p.job_id \
         JOIN attempts a ON a.job_id = p.job_id AND a.epoch = p.epoch WHERE a.outcome != 'success'",
    );
    let generations: usize = sql(&data, "SELECT COUNT(*) FROM artifact_generations").parse().unwrap();
    let lost: usize = sql(&data, "SELECT COUNT(*) FROM attempts WHERE outcome != 'success'").parse().unwrap();
    println!(
        "chaos_runs: {RUNS}\nchaos_bound_artifacts: {bound}\nchaos_generations: {generations}\nchaos_lost_attempts: {lost}\nchaos_faults: {journal:?}"
    );
    assert!(bound >= 1000, "{bound} bound artifacts\n{journal:?}");
    assert_eq!((statements, bindings), (bound, bound), "exactly one statement per bound artifact");
    assert_eq!(unbound, "0", "no statement without a binding");
    assert_eq!(fenced, "0", "no statement of an attempt that did not succeed");
    assert!(lost > 0 && generations > bound, "the faults fenced attempts that had uploaded: {lost} lost\n{journal:?}");
}

const TESTED: &str = r#"version: 1
jobs:
  - name: build
    steps:
      - mkdir -p out/site && echo "release bytes" > out/app.txt && echo a > out/site/a.txt && echo b > out/site/b.txt
    artifacts:
      publish:
        - {name: app, path: out/app.txt}
        - {name: site, path: out/site}
  - name: test
    needs: [build]
    reports: {junit: junit.xml}
    artifacts:
      restore:
        - {from_job: build, name: app, path: app.txt}
    steps:
      - |
        test "$(cat app.txt)" = "release bytes"
        printf '<testsuite name="s"><testcase classname="app" name="reads"/><testcase classname="app" name="size"/></testsuite>' > junit.xml
  - name: test-bad
    needs: [build]
    reports: {junit: junit.xml}
    artifacts:
      restore:
        - {from_job: build, name: app, path: app.txt}
    steps:
      - printf '<testsuite name="s"><testcase classname="app" name="fast"><failure message="too slow"/></testcase></testsuite>' > junit.xml
"#;

/// Issue 45: a job with `reports:` gets a signed in-toto Test Result
/// statement over what it restored; `kiln verify --test-result` says
/// "these bytes passed these tests", and refuses changed bytes, another
/// repository and failed tests, each with its exit code.
#[tokio::test(flavor = "multi_thread")]
async fn restored_bytes_verify_against_the_tests_that_ran_on_them() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", TESTED)]).unwrap();
    let (code, out) = cli(&up, &["repo", "add", "shop", "--url", &repo.path().display().to_string()]);
    assert_eq!(code, 0, "{out}");
    let c = Client::new(&up.url, &up.token);
    let id = c.submit_run("shop", &SubmitRun { commit_sha: "HEAD".into(), ..Default::default() }, None).await.unwrap();
    let run = wait_run(&c, &id.run_id, 120).await;
    let status = |n: &str| run.jobs.iter().find(|j| j.name == n).unwrap().status.clone();
    assert_eq!((status("build"), status("test")), ("success".into(), "success".into()), "{}", up.log());
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name).display().to_string();
    let (code, out) = cli(&up, &["artifact", "get", &id.run_id, "build", "app", "-o", &at("app.txt")]);
    assert_eq!(code, 0, "{out}");
    for (job, file) in [("test", "good.json"), ("test-bad", "bad.json")] {
        let (code, out) = cli(&up, &["tests", "attestation", &id.run_id, job, "-o", &at(file)]);
        assert_eq!(code, 0, "{out}");
    }
    let (code, out) = cli(&up, &["keys", "export", "-o", &at("keys.json")]);
    assert_eq!(code, 0, "{out}");
    let verify = |file: &str, att: &str, repo: &str| {
        cli(&up, &["verify", &at(file), "--test-result", &at(att), "--repo", repo, "--keys", &at("keys.json")])
    };
    let (code, out) = verify("app.txt", "good.json", "shop");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("passed the tests of shop: 2 passed"), "{out}");
    let (code, out) = verify("app.txt", "bad.json", "shop");
    assert_eq!(code, 22, "{out}");
    assert!(out.contains("test result check failed") && out.contains("app :: fast"), "{out}");
    let (code, out) = verify("app.txt", "good.json", "other");
    assert_eq!(code, 15, "{out}");
    std::fs::write(at("changed.txt"), "release bytez\n").unwrap();
    let (code, out) = verify("changed.txt", "good.json", "shop");
    assert_eq!(code, 13, "{out}");
    // A test result is not provenance: --ref and the like are refused.
    let (code, out) = cli(
        &up,
        &["verify", &at("app.txt"), "--test-result", &at("good.json"), "--repo", "shop", "--ref", "refs/heads/main"],
    );
    assert_eq!(code, 2, "{out}");
    // A directory artifact's provenance names its archive and the manifest
    // at its head (checked here with zstd and tar, not Kiln's code).
    let env = c.artifact_provenance(&id.run_id, "build", "site").await.unwrap();
    let payload = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.decode(env["payload"].as_str().unwrap()).unwrap()
    };
    let st: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    let subjects: Vec<(String, String)> = st["subject"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap().to_string(), s["digest"]["sha256"].as_str().unwrap().to_string()))
        .collect();
    let site =
        run.jobs.iter().find(|j| j.name == "build").unwrap().artifacts.iter().find(|a| a.name == "site").unwrap();
    assert_eq!(subjects.len(), 2, "{subjects:?}");
    assert_eq!(subjects[0], ("site".to_string(), site.sha256.clone()));
    assert_eq!(subjects[1].0, "site/.kiln-cache/manifest.json");
    let raw = c.artifact(&id.run_id, "build", "site").await.unwrap();
    let bytes = c.download(&raw.url).await.unwrap().bytes().await.unwrap();
    std::fs::write(at("site.kca"), &bytes).unwrap();
    let sh = format!("zstd -dc {} | tar -xO .kiln-cache/manifest.json | sha256sum", at("site.kca"));
    let out = std::process::Command::new("sh").args(["-c", &sh]).output().unwrap();
    let manifest = String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string();
    assert_eq!(subjects[1].1, manifest, "the manifest's own sha256");
    // The archive verifies by its one artifact subject (no --name needed).
    std::fs::write(at("site.json"), serde_json::to_vec(&env).unwrap()).unwrap();
    let (code, out) = cli(
        &up,
        &["verify", &at("site.kca"), "--provenance", &at("site.json"), "--repo", "shop", "--keys", &at("keys.json")],
    );
    assert_eq!(code, 0, "{out}");
    // Who may read it: a trigger token of the repository, not of another.
    only_its_readers(&up, &format!("{}/v1/workflow-runs/{}/jobs/test/test-attestation", up.url, id.run_id)).await;
    // No reports, no attestation.
    let (code, out) = cli(&up, &["tests", "attestation", &id.run_id, "build"]);
    assert_ne!(code, 0);
    assert!(out.contains("declares no `reports:`"), "{out}");
}
