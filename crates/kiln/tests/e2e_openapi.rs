//! The OpenAPI document (`GET /openapi.json`) against real answers: the
//! real `kiln up` (a real agent runs a pipeline), and this test as a second
//! agent speaking the agent protocol by hand. Every documented operation is
//! called at least once, and every answer is checked against the document:
//! its status is documented for that route (a success status explicitly,
//! an error at least as `default`), its media type is, and a JSON body
//! validates against the schema given for that route and status (JSON
//! Schema 2020-12, `#/components/schemas/…` resolved in the document).
//! Server-sent events are checked event by event against the schema their
//! description names. The document is also written to
//! `$KILN_OPENAPI_OUT` when set, for `scripts/test`'s independent validator.

use base64::Engine;
use kiln_testkit::{KilnUp, TestRepo};
use serde_json::{Value, json};
use sha2::Digest;
use std::collections::BTreeSet;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

/// A real answer.
struct Answer {
    status: u16,
    media: String,
    bytes: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.bytes)))
    }
}

/// Validates `instance` against `schema`, a schema of the document `doc`
/// (its `$ref`s point into `doc`'s components). The errors, if any.
fn schema_errors(doc: &Value, schema: &Value, instance: &Value) -> Vec<String> {
    let mut root = match schema {
        Value::Object(o) => o.clone(),
        Value::Bool(b) => return if *b { vec![] } else { vec!["schema `false`".into()] },
        other => panic!("not a schema: {other}"),
    };
    root.insert("components".into(), doc["components"].clone());
    let root = Value::Object(root);
    let validator = jsonschema::draft202012::new(&root).unwrap_or_else(|e| panic!("invalid schema {schema}: {e}"));
    validator.iter_errors(instance).map(|e| format!("{e} at {}", e.instance_path())).collect()
}

/// The schema of `#/components/schemas/NAME`.
fn component(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

struct Checker {
    http: reqwest::Client,
    base: String,
    doc: Value,
    /// `(METHOD, path template)` of every operation called.
    seen: BTreeSet<(String, String)>,
}

impl Checker {
    /// `method` on `path` (template `template`), checked against the document.
    async fn call(
        &mut self,
        method: &str,
        template: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let mut req = self.http.request(method.parse().unwrap(), format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        self.send(method, template, req).await
    }

    async fn send(&mut self, method: &str, template: &str, req: reqwest::RequestBuilder) -> Answer {
        let res = req.send().await.unwrap_or_else(|e| panic!("{method} {template}: {e}"));
        let status = res.status().as_u16();
        let media = res
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or_default().trim().to_string())
            .unwrap_or_default();
        let bytes = res.bytes().await.unwrap().to_vec();
        let answer = Answer { status, media, bytes };
        self.check(method, template, &answer);
        answer
    }

    /// The documented response of `method template` for `status`.
    fn response(&self, method: &str, template: &str, status: u16) -> Value {
        let op = &self.doc["paths"][template][method.to_lowercase()];
        assert!(op.is_object(), "{method} {template} is not in the OpenAPI document");
        let responses = &op["responses"];
        if let Some(r) = responses.get(status.to_string()) {
            return r.clone();
        }
        assert!(status >= 400, "{method} {template}: success status {status} is not documented");
        responses
            .get("default")
            .unwrap_or_else(|| panic!("{method} {template}: status {status} is not documented and there is no default"))
            .clone()
    }

    fn check(&mut self, method: &str, template: &str, a: &Answer) {
        self.seen.insert((method.to_string(), template.to_string()));
        let doc_response = self.response(method, template, a.status);
        let what = format!("{method} {template} → {}", a.status);
        let Some(content) = doc_response.get("content").and_then(Value::as_object) else {
            assert!(a.bytes.is_empty(), "{what}: a body where the document has none");
            return;
        };
        let media = content
            .get(&a.media)
            .unwrap_or_else(|| panic!("{what}: media type `{}` is not documented ({:?})", a.media, content.keys()));
        if a.media == "application/json" {
            let schema = media.get("schema").unwrap_or_else(|| panic!("{what}: no schema"));
            let errors = schema_errors(&self.doc, schema, &a.json());
            assert!(errors.is_empty(), "{what}: the answer does not match the document: {errors:#?}\n{}", a.json());
        }
    }

    /// An SSE route: its first events (or all, if it ends) within `events`,
    /// each checked against the schema `schemas` names for its event type.
    async fn events(
        &mut self,
        template: &str,
        path: &str,
        token: &str,
        want: usize,
        schemas: &[(&str, &str)],
    ) -> Vec<(String, Value)> {
        use futures::StreamExt;
        let res = self.http.get(format!("{}{path}", self.base)).bearer_auth(token).send().await.unwrap();
        let status = res.status().as_u16();
        let media = res.headers()[reqwest::header::CONTENT_TYPE].to_str().unwrap();
        let media = media.split(';').next().unwrap_or_default().trim().to_string();
        assert_eq!(status, 200, "GET {path}");
        self.check("GET", template, &Answer { status, media, bytes: vec![] }.with_no_body_check());
        let mut stream = res.bytes_stream();
        let mut text = String::new();
        let mut out = Vec::new();
        // Bounded: a stream that does not give its events fails the test.
        let read = async {
            while out.len() < want {
                let Some(chunk) = stream.next().await else { break };
                text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
                while let Some(end) = text.find("\n\n") {
                    let block: String = text.drain(..end + 2).collect();
                    let name = block.lines().find_map(|l| l.strip_prefix("event:")).map(|s| s.trim().to_string());
                    let data: String = block
                        .lines()
                        .filter_map(|l| l.strip_prefix("data:"))
                        .map(|s| s.strip_prefix(' ').unwrap_or(s))
                        .collect::<Vec<_>>()
                        .join("\n");
                    if let Some(name) = name {
                        out.push((name, serde_json::from_str::<Value>(&data).unwrap()));
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), read).await.expect("the event stream gave its events");
        for (name, data) in &out {
            let schema = schemas
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, s)| *s)
                .unwrap_or_else(|| panic!("GET {template}: event `{name}` is not described"));
            let errors = schema_errors(&self.doc, &component(schema), data);
            assert!(errors.is_empty(), "GET {template} event {name}: {errors:#?}\n{data}");
        }
        out
    }
}

impl Answer {
    /// An event stream's head: its body is read separately.
    fn with_no_body_check(mut self) -> Answer {
        self.bytes = b"x".to_vec();
        self
    }
}

fn workflow_repo() -> TestRepo {
    TestRepo::new(&[
        (
            ".kiln/pipeline.yaml",
            "version: 1\njobs:\n  - name: build\n    steps:\n      - mkdir -p out && echo hello > out/app.txt && echo built\n    \
             artifacts:\n      publish:\n        - {name: app.txt, path: out/app.txt}\n        - {name: site, path: out/}\n",
        ),
        (
            ".kiln/remote.yaml",
            "version: 1\njobs:\n  - name: remote\n    runs-on: {role: openapi}\n    steps:\n      - echo remote\n    \
             artifacts:\n      publish:\n        - {name: out.txt, path: out.txt}\n",
        ),
    ])
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn real_answers_of_every_route_match_the_openapi_document() {
    let up = KilnUp::start(BIN.as_ref(), 1).unwrap();
    let admin = up.token.clone();
    let http = reqwest::Client::new();

    // Served without a credential, as JSON.
    let res = http.get(format!("{}/openapi.json", up.url)).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let doc: Value = res.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let printed = std::process::Command::new(BIN).arg("openapi").output().unwrap();
    assert!(printed.status.success(), "{}", String::from_utf8_lossy(&printed.stderr));
    let printed: Value = serde_json::from_slice(&printed.stdout).unwrap();
    assert_eq!(printed, doc, "`kiln openapi` prints what the server serves");
    if let Ok(out) = std::env::var("KILN_OPENAPI_OUT") {
        std::fs::write(&out, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    }
    let mut c = Checker { http: http.clone(), base: up.url.clone(), doc, seen: BTreeSet::new() };
    let a = Some(admin.as_str());

    c.call("GET", "/openapi.json", "/openapi.json", None, None).await;
    // ---------- health, UI, OIDC ----------
    assert_eq!(c.call("GET", "/healthz", "/healthz", None, None).await.status, 200);
    assert_eq!(c.call("GET", "/readyz", "/readyz", None, None).await.status, 200);
    assert_eq!(c.call("GET", "/metrics", "/metrics", a, None).await.status, 200);
    assert_eq!(c.call("GET", "/", "/", None, None).await.status, 200);
    let d = c.call("GET", "/.well-known/openid-configuration", "/.well-known/openid-configuration", None, None).await;
    assert_eq!(d.status, 200);
    assert_eq!(c.call("GET", "/.well-known/jwks.json", "/.well-known/jwks.json", None, None).await.status, 200);
    let keys = "/.well-known/kiln-attestation-keys.json";
    assert_eq!(c.call("GET", keys, keys, None, None).await.status, 200);
    let signed_in = c.call("POST", "/v1/ui/session", "/v1/ui/session", None, Some(json!({ "token": admin }))).await;
    assert_eq!(signed_in.status, 204);
    let bad = c.call("POST", "/v1/ui/session", "/v1/ui/session", None, Some(json!({ "token": "kiln_nope" }))).await;
    assert_eq!(bad.status, 401, "a wrong token is an error body");
    assert_eq!(c.call("DELETE", "/v1/ui/session", "/v1/ui/session", None, None).await.status, 204);

    // ---------- repositories ----------
    let repo = workflow_repo();
    let clone_url = repo.path().to_string_lossy().into_owned();
    let r = c.call("POST", "/v1/repos", "/v1/repos", a, Some(json!({ "name": "spec", "clone_url": clone_url }))).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.bytes));
    let r = c.call("POST", "/v1/repos", "/v1/repos", a, Some(json!({ "name": "spec", "clone_url": clone_url }))).await;
    assert_eq!(r.status, 409, "a second repository of the same name");
    let r = c.call("POST", "/v1/repos", "/v1/repos", a, Some(json!({ "name": "spec" }))).await;
    assert!(matches!(r.status, 400 | 422), "a body without clone_url: {}", r.status);
    c.call("POST", "/v1/repos", "/v1/repos", a, Some(json!({ "name": "scratch", "clone_url": clone_url }))).await;
    assert_eq!(c.call("GET", "/v1/repos", "/v1/repos", a, None).await.status, 200);
    assert_eq!(c.call("GET", "/v1/repos", "/v1/repos", None, None).await.status, 401);
    assert_eq!(c.call("GET", "/v1/repos/{repo}", "/v1/repos/spec", a, None).await.status, 200);
    assert_eq!(c.call("GET", "/v1/repos/{repo}", "/v1/repos/nope", a, None).await.status, 404);
    let p =
        c.call("PATCH", "/v1/repos/{repo}", "/v1/repos/scratch", a, Some(json!({ "default_branch": "main" }))).await;
    assert_eq!(p.status, 200);
    c.call("GET", "/v1/repos/{repo}/hook-info", "/v1/repos/spec/hook-info", a, None).await;
    let d = c.call("GET", "/v1/repos/{repo}/deliveries", "/v1/repos/spec/deliveries?limit=5", a, None).await;
    assert_eq!(d.status, 200);
    let w = c.call("GET", "/v1/repos/{repo}/workflows", "/v1/repos/spec/workflows?ref=main", a, None).await;
    assert_eq!(w.status, 200);
    let i = c.call("GET", "/v1/repos/{repo}/workflow-inputs", "/v1/repos/spec/workflow-inputs?ref=main", a, None).await;
    assert_eq!(i.status, 200);
    // A webhook delivery without a signature is refused with an error body.
    let hook = c
        .call("POST", "/v1/repos/{repo}/webhooks/{forge}", "/v1/repos/spec/webhooks/github", None, Some(json!({})))
        .await;
    assert!(hook.status >= 400, "{}", hook.status);
    let s = c
        .call(
            "PUT",
            "/v1/repos/{repo}/secrets/{name}",
            "/v1/repos/spec/secrets/API_KEY",
            a,
            Some(json!({ "value": "s3cret" })),
        )
        .await;
    assert_eq!(s.status, 200);
    assert_eq!(c.call("GET", "/v1/repos/{repo}/secrets", "/v1/repos/spec/secrets", a, None).await.status, 200);
    let s = c.call("DELETE", "/v1/repos/{repo}/secrets/{name}", "/v1/repos/spec/secrets/API_KEY", a, None).await;
    assert_eq!(s.status, 200);

    // ---------- a run the real agent runs ----------
    let r = c
        .call(
            "POST",
            "/v1/repos/{repo}/workflow-runs",
            "/v1/repos/spec/workflow-runs",
            a,
            Some(json!({ "commit_sha": "main" })),
        )
        .await;
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.bytes));
    let run_id = r.json()["run_id"].as_str().unwrap().to_string();
    let bad = c
        .call(
            "POST",
            "/v1/repos/{repo}/workflow-runs",
            "/v1/repos/spec/workflow-runs",
            a,
            Some(json!({ "commit_sha": "main", "workflow_path": ".kiln/missing.yaml" })),
        )
        .await;
    assert_eq!(bad.status, 422, "{}", String::from_utf8_lossy(&bad.bytes));
    let run = kiln_testkit::wait_run(&kiln_api::Client::new(&up.url, &admin), &run_id, 120).await;
    assert_eq!(run.status, "success", "{run:?}\n{}", up.log());
    let job = run.jobs[0].id.clone();

    let got = c.call("GET", "/v1/workflow-runs/{run}", &format!("/v1/workflow-runs/{run_id}"), a, None).await;
    assert_eq!(got.status, 200);
    let got = got.json();
    assert_eq!(c.call("GET", "/v1/workflow-runs/{run}", "/v1/workflow-runs/0000000000", a, None).await.status, 404);
    // The schemas are strict enough to matter: a run without its status, or
    // with a status outside the contract, does not validate.
    let run_schema = c.response("GET", "/v1/workflow-runs/{run}", 200)["content"]["application/json"]["schema"].clone();
    assert!(schema_errors(&c.doc, &run_schema, &got).is_empty());
    let mut dropped = got.clone();
    dropped.as_object_mut().unwrap().remove("status");
    assert!(!schema_errors(&c.doc, &run_schema, &dropped).is_empty(), "a run without `status` validates");
    let mut bogus = got.clone();
    bogus["jobs"][0]["status"] = json!("exploded");
    assert!(!schema_errors(&c.doc, &run_schema, &bogus).is_empty(), "a job status outside the contract validates");
    let mut no_jobs = got.clone();
    no_jobs["jobs"][0].as_object_mut().unwrap().remove("attempts");
    assert!(!schema_errors(&c.doc, &run_schema, &no_jobs).is_empty(), "a job without `attempts` validates");

    let list = c
        .call("GET", "/v1/repos/{repo}/workflow-runs", "/v1/repos/spec/workflow-runs?status=success&limit=5", a, None)
        .await;
    assert_eq!(list.status, 200);
    assert_eq!(list.json()["runs"][0]["id"], run_id.as_str());
    let bad =
        c.call("GET", "/v1/repos/{repo}/workflow-runs", "/v1/repos/spec/workflow-runs?status=nope", a, None).await;
    assert!(bad.status >= 400);
    assert_eq!(c.call("GET", "/v1/workflow-runs", "/v1/workflow-runs?repo=spec", a, None).await.status, 200);
    let ev = c
        .events("/v1/workflow-runs/events", "/v1/workflow-runs/events?repo=spec", &admin, 1, &[("runs", "RunList")])
        .await;
    assert_eq!(ev[0].0, "runs");
    let ev = c
        .events(
            "/v1/workflow-runs/{run}/events",
            &format!("/v1/workflow-runs/{run_id}/events"),
            &admin,
            1,
            &[("run", "Run")],
        )
        .await;
    assert_eq!(ev[0].1["id"], run_id.as_str());
    let logs = c
        .events(
            "/v1/jobs/{job}/logs/events",
            &format!("/v1/jobs/{job}/logs/events?follow=false"),
            &admin,
            usize::MAX,
            &[("chunk", "LogEvent"), ("sealed", "LogSealed"), ("gap", "LogGap"), ("end", "LogEnd")],
        )
        .await;
    assert!(logs.iter().any(|(n, _)| n == "chunk"), "{logs:?}");
    assert_eq!(logs.last().unwrap().0, "end", "{logs:?}");

    // Artifacts: the download capability, the bytes it names, the archive.
    let art = c
        .call(
            "GET",
            "/v1/workflow-runs/{run}/artifacts/{job}/{name}",
            &format!("/v1/workflow-runs/{run_id}/artifacts/build/app.txt"),
            a,
            None,
        )
        .await;
    assert_eq!(art.status, 200, "{}", String::from_utf8_lossy(&art.bytes));
    let prov = c
        .call(
            "GET",
            "/v1/workflow-runs/{run}/artifacts/{job}/{name}/provenance",
            &format!("/v1/workflow-runs/{run_id}/artifacts/build/app.txt/provenance"),
            a,
            None,
        )
        .await;
    assert_eq!(prov.status, 200, "{}", String::from_utf8_lossy(&prov.bytes));
    assert_eq!(prov.json()["payloadType"], "application/vnd.in-toto+json");
    let url = art.json()["url"].as_str().unwrap().to_string();
    let bytes = c.send("GET", "/blob/objects/{generation}", http.get(&url)).await;
    assert_eq!((bytes.status, bytes.bytes.as_slice()), (200, b"hello\n".as_slice()), "{url}");
    let forged = c.send("GET", "/blob/objects/{generation}", http.get(url.replace("cap=", "cap=x"))).await;
    assert!(forged.status >= 400, "a forged capability");
    let site = c
        .call(
            "GET",
            "/v1/workflow-runs/{run}/artifacts/{job}/{name}",
            &format!("/v1/workflow-runs/{run_id}/artifacts/build/site"),
            a,
            None,
        )
        .await;
    let tgz = site.json()["tar_gz_url"].as_str().expect("an archive has a tar.gz link").to_string();
    let exported = c.send("GET", "/blob/objects/{generation}/export", http.get(&tgz)).await;
    assert_eq!((exported.status, exported.media.as_str()), (200, "application/gzip"));
    let direct = c
        .call(
            "GET",
            "/v1/workflow-runs/{run}/artifacts/{job}/{name}",
            &format!("/v1/workflow-runs/{run_id}/artifacts/build/site?format=zip"),
            a,
            None,
        )
        .await;
    assert_eq!((direct.status, direct.media.as_str()), (200, "application/zip"));
    let missing = c
        .call(
            "GET",
            "/v1/workflow-runs/{run}/artifacts/{job}/{name}",
            &format!("/v1/workflow-runs/{run_id}/artifacts/build/nope"),
            a,
            None,
        )
        .await;
    assert_eq!(missing.status, 404);

    let cancelled =
        c.call("POST", "/v1/workflow-runs/{run}/cancel", &format!("/v1/workflow-runs/{run_id}/cancel"), a, None).await;
    assert!(cancelled.status == 200 || cancelled.status == 409, "{}", cancelled.status);
    let retried =
        c.call("POST", "/v1/workflow-runs/{run}/retry", &format!("/v1/workflow-runs/{run_id}/retry"), a, None).await;
    assert_eq!(retried.status, 202);
    let refused = c
        .call(
            "POST",
            "/v1/workflow-runs/{run}/retry",
            &format!("/v1/workflow-runs/{run_id}/retry"),
            a,
            Some(json!({ "failed": true })),
        )
        .await;
    assert_eq!(refused.status, 409, "no failed job to retry");

    // One job: re-run (a new run), cancel (refused: the run has ended); the run's artifacts.
    let listed = c
        .call("GET", "/v1/workflow-runs/{run}/artifacts", &format!("/v1/workflow-runs/{run_id}/artifacts"), a, None)
        .await;
    assert_eq!(listed.status, 200);
    let rerun = c
        .call(
            "POST",
            "/v1/workflow-runs/{run}/jobs/{job}/retry",
            &format!("/v1/workflow-runs/{run_id}/jobs/build/retry"),
            a,
            None,
        )
        .await;
    assert_eq!(rerun.status, 202);
    let ended = c
        .call(
            "POST",
            "/v1/workflow-runs/{run}/jobs/{job}/cancel",
            &format!("/v1/workflow-runs/{run_id}/jobs/build/cancel"),
            a,
            None,
        )
        .await;
    assert_eq!(ended.status, 409, "the run has ended");

    // Notifications and the badge.
    let hook = json!({ "url": "http://127.0.0.1:9/hook", "secret": "0123456789abcdef0123456789abcdef", "events": ["failure"] });
    let made = c.call("POST", "/v1/repos/{repo}/notifications", "/v1/repos/spec/notifications", a, Some(hook)).await;
    assert_eq!(made.status, 201);
    let id = made.json()["id"].as_str().unwrap().to_string();
    let bad = json!({ "url": "ftp://x", "secret": "short", "events": ["never"] });
    let refused = c.call("POST", "/v1/repos/{repo}/notifications", "/v1/repos/spec/notifications", a, Some(bad)).await;
    assert!(refused.status >= 400, "{}", refused.status);
    assert_eq!(
        c.call("GET", "/v1/repos/{repo}/notifications", "/v1/repos/spec/notifications", a, None).await.status,
        200
    );
    let log = c
        .call(
            "GET",
            "/v1/repos/{repo}/notifications/deliveries",
            "/v1/repos/spec/notifications/deliveries?limit=5",
            a,
            None,
        )
        .await;
    assert_eq!(log.status, 200);
    let gone = c
        .call("DELETE", "/v1/repos/{repo}/notifications/{id}", &format!("/v1/repos/spec/notifications/{id}"), a, None)
        .await;
    assert_eq!(gone.status, 200);
    let badge = c.call("GET", "/v1/repos/{repo}/badge.svg", "/v1/repos/spec/badge.svg", a, None).await;
    assert_eq!((badge.status, badge.media.as_str()), (200, "image/svg+xml"));
    let hidden = c.call("GET", "/v1/repos/{repo}/badge.svg", "/v1/repos/spec/badge.svg", None, None).await;
    assert_eq!(hidden.status, 404, "a private repository's badge needs a reader");

    // Test reports, history, timings and quarantine (issue 43).
    let tests = c
        .call("GET", "/v1/workflow-runs/{run}/tests", &format!("/v1/workflow-runs/{run_id}/tests?failed=true"), a, None)
        .await;
    assert_eq!(tests.status, 200);
    // Issue 45: a job without `reports:` has no test attestation (404, the
    // error shape); e2e_provenance reads one.
    let att = c
        .call(
            "GET",
            "/v1/workflow-runs/{run}/jobs/{job}/test-attestation",
            &format!("/v1/workflow-runs/{run_id}/jobs/build/test-attestation"),
            a,
            None,
        )
        .await;
    assert_eq!(att.status, 404, "{}", String::from_utf8_lossy(&att.bytes));
    let history = c
        .call(
            "GET",
            "/v1/repos/{repo}/tests/history",
            "/v1/repos/spec/tests/history?id=s%20%3A%3A%20t&limit=5",
            a,
            None,
        )
        .await;
    assert_eq!(history.status, 200);
    let timings =
        c.call("GET", "/v1/repos/{repo}/tests/timings", "/v1/repos/spec/tests/timings?ref=main", a, None).await;
    assert_eq!(timings.status, 200);
    let q = json!({ "test_id": "s :: t", "owner": "alice", "reason": "flaky", "expires_in_secs": 3600 });
    let made = c.call("POST", "/v1/repos/{repo}/quarantine", "/v1/repos/spec/quarantine", a, Some(q)).await;
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.bytes));
    let ownerless = json!({ "test_id": "s :: u", "owner": "", "reason": "x" });
    let refused = c.call("POST", "/v1/repos/{repo}/quarantine", "/v1/repos/spec/quarantine", a, Some(ownerless)).await;
    assert_eq!(refused.status, 422);
    assert_eq!(c.call("GET", "/v1/repos/{repo}/quarantine", "/v1/repos/spec/quarantine", a, None).await.status, 200);
    let ended =
        c.call("DELETE", "/v1/repos/{repo}/quarantine", "/v1/repos/spec/quarantine?id=s%20%3A%3A%20t", a, None).await;
    assert_eq!(ended.status, 200);

    // Teams, the queue and lanes (issue 44).
    let team = json!({ "name": "spec-team", "weight": 2, "max_running": 4 });
    let made = c.call("POST", "/v1/teams", "/v1/teams", a, Some(team)).await;
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.bytes));
    assert_eq!(c.call("GET", "/v1/teams", "/v1/teams", a, None).await.status, 200);
    assert_eq!(c.call("GET", "/v1/teams/{team}", "/v1/teams/spec-team", a, None).await.status, 200);
    let lifted =
        c.call("PATCH", "/v1/teams/{team}", "/v1/teams/spec-team", a, Some(json!({ "max_running": null }))).await;
    assert_eq!(lifted.status, 200);
    assert_eq!(lifted.json()["max_running"], serde_json::Value::Null, "null lifts the quota");
    let queue = c.call("GET", "/v1/queue", "/v1/queue", a, None).await;
    assert_eq!(queue.status, 200);
    let ended = c
        .call(
            "POST",
            "/v1/workflow-runs/{run}/priority",
            &format!("/v1/workflow-runs/{run_id}/priority"),
            a,
            Some(json!({ "priority": "urgent" })),
        )
        .await;
    assert_eq!(ended.status, 409, "a finished run keeps its lane");
    assert_eq!(c.call("DELETE", "/v1/teams/{team}", "/v1/teams/spec-team", a, None).await.status, 200);

    // Deployment environments and approvals (issue 46).
    let env = json!({ "name": "spec-env", "approvers": ["admin"], "refs": ["main"], "wait_secs": 0 });
    let made = c.call("POST", "/v1/environments", "/v1/environments", a, Some(env)).await;
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.bytes));
    assert_eq!(c.call("GET", "/v1/environments", "/v1/environments", a, None).await.status, 200);
    assert_eq!(c.call("GET", "/v1/environments/{env}", "/v1/environments/spec-env", a, None).await.status, 200);
    let changed = c
        .call("PATCH", "/v1/environments/{env}", "/v1/environments/spec-env", a, Some(json!({ "min_approvals": 1 })))
        .await;
    assert_eq!(changed.status, 200);
    let deployed = c
        .call("GET", "/v1/environments/{env}/deployments", "/v1/environments/spec-env/deployments?limit=5", a, None)
        .await;
    assert_eq!(deployed.status, 200);
    let nothing = c
        .call("POST", "/v1/environments/{env}/rollback", "/v1/environments/spec-env/rollback", a, Some(json!({})))
        .await;
    assert_eq!(nothing.status, 409, "nothing deployed to return to: {}", String::from_utf8_lossy(&nothing.bytes));
    // Rings (issue 46): the run has none; promote and pause say so.
    let rings = format!("/v1/workflow-runs/{run_id}/rings");
    assert_eq!(c.call("GET", "/v1/workflow-runs/{run}/rings", &rings, a, None).await.status, 200);
    for (route, verb) in [("/v1/workflow-runs/{run}/promote", "promote"), ("/v1/workflow-runs/{run}/pause", "pause")] {
        let r = c.call("POST", route, &format!("/v1/workflow-runs/{run_id}/{verb}"), a, None).await;
        assert_eq!(r.status, 409, "no rings to {verb}: {}", String::from_utf8_lossy(&r.bytes));
    }
    let approvals = format!("/v1/workflow-runs/{run_id}/approvals");
    assert_eq!(c.call("GET", "/v1/workflow-runs/{run}/approvals", &approvals, a, None).await.status, 200);
    let refused = c
        .call(
            "POST",
            "/v1/workflow-runs/{run}/approvals",
            &approvals,
            a,
            Some(json!({ "environment": "spec-env", "decision": "approve" })),
        )
        .await;
    assert_eq!(refused.status, 409, "an ended run takes no decision: {}", String::from_utf8_lossy(&refused.bytes));
    // Its secrets (names only) and provenance policy.
    let (one, all) = ("/v1/environments/{env}/secrets/{name}", "/v1/environments/{env}/secrets");
    let put = c.call("PUT", one, "/v1/environments/spec-env/secrets/DEPLOY_KEY", a, Some(json!({ "value": "s3cret" })));
    assert_eq!(put.await.status, 200);
    assert_eq!(c.call("GET", all, "/v1/environments/spec-env/secrets", a, None).await.status, 200);
    assert_eq!(c.call("DELETE", one, "/v1/environments/spec-env/secrets/DEPLOY_KEY", a, None).await.status, 200);
    let policy = json!({ "require_provenance": "trusted,ref=refs/heads/main" });
    let changed = c.call("PATCH", "/v1/environments/{env}", "/v1/environments/spec-env", a, Some(policy)).await;
    assert_eq!(changed.status, 200);
    assert_eq!(c.call("DELETE", "/v1/environments/{env}", "/v1/environments/spec-env", a, None).await.status, 200);

    // ---------- the agent protocol, by hand ----------
    let join = std::fs::read_to_string(up.data_dir().join("agent.token")).unwrap().trim().to_string();
    let reg = c
        .call(
            "POST",
            "/v1/agents/register",
            "/v1/agents/register",
            Some(join.as_str()),
            Some(json!({ "name": "spec-agent", "labels": { "role": "openapi" }, "max_jobs": 1 })),
        )
        .await;
    assert_eq!(reg.status, 200, "{}", String::from_utf8_lossy(&reg.bytes));
    let reg = reg.json();
    let agent = reg["agent_id"].as_str().unwrap().to_string();
    let session = reg["credential"].as_str().unwrap().to_string();
    let unauthorized = c.call("POST", "/v1/agents/register", "/v1/agents/register", a, Some(json!({}))).await;
    assert_eq!(unauthorized.status, 401, "the admin token is no join token");
    let ev = c
        .events(
            "/v1/agents/{agent}/session",
            &format!("/v1/agents/{agent}/session"),
            &session,
            1,
            &[("ping", "Empty"), ("cancel", "CancelNotice")],
        )
        .await;
    assert_eq!(ev[0].0, "ping");

    let r = c
        .call(
            "POST",
            "/v1/repos/{repo}/workflow-runs",
            "/v1/repos/spec/workflow-runs",
            a,
            Some(json!({ "commit_sha": "main", "workflow_path": ".kiln/remote.yaml" })),
        )
        .await;
    assert_eq!(r.status, 202);
    let claim_path = format!("/v1/agents/{agent}/claim");
    let mut assignment = Value::Null;
    for n in 0..20 {
        let claim = json!({ "session_id": "", "claim_request_id": format!("claim-{n}"), "wait_ms": 5000 });
        let got = c.call("POST", "/v1/agents/{agent}/claim", &claim_path, Some(session.as_str()), Some(claim)).await;
        assert_eq!(got.status, 200, "{}", String::from_utf8_lossy(&got.bytes));
        assignment = got.json()["assignment"].clone();
        if !assignment.is_null() {
            break;
        }
    }
    assert!(assignment.is_object(), "the job for this agent's labels was never assigned");
    let job = assignment["job_id"].as_str().unwrap().to_string();
    let epoch = assignment["epoch"].as_i64().unwrap();
    let att = assignment["attempt_token"].as_str().unwrap().to_string();
    let t = Some(att.as_str());
    let base = format!("/v1/jobs/{job}/attempts/{epoch}");
    let at = |rest: &str| format!("{base}{rest}");
    const A: &str = "/v1/jobs/{job}/attempts/{epoch}";

    let hb = c.call("POST", &format!("{A}/heartbeat"), &at("/heartbeat"), t, None).await;
    assert_eq!(hb.status, 200);
    let wrong = c.call("POST", &format!("{A}/heartbeat"), &at("/heartbeat"), Some(session.as_str()), None).await;
    assert!(wrong.status >= 400, "the session credential is no attempt token");
    let data = b"remote\n";
    let chunk = json!({
        "stream": "stdout", "seq": 0, "offset": 0,
        "data": base64::engine::general_purpose::STANDARD.encode(data),
        "sha256": hex::encode(sha2::Sha256::digest(data)),
    });
    let ack = c.call("POST", &format!("{A}/logs"), &at("/logs"), t, Some(chunk)).await;
    assert_eq!(ack.status, 200, "{}", String::from_utf8_lossy(&ack.bytes));
    let raw = http
        .post(format!("{}{}", up.url, at("/logs")))
        .bearer_auth(&att)
        .header("content-type", "application/octet-stream")
        .header("kiln-log-stream", "stdout")
        .header("kiln-log-seq", "1")
        .header("kiln-log-offset", data.len().to_string())
        .header("kiln-log-sha256", hex::encode(sha2::Sha256::digest(b"more\n")))
        .header("kiln-log-crc32c", kiln_api::log_crc32c(b"more\n"))
        .body("more\n");
    assert_eq!(c.send("POST", &format!("{A}/logs"), raw).await.status, 200);
    let batch = json!({"chunks": [
        {"stream": "stdout", "seq": 2, "offset": data.len() + 5,
         "data": base64::engine::general_purpose::STANDARD.encode(b"tail\n"),
         "crc32c": kiln_api::log_crc32c(b"tail\n"), "in_order": true},
        {"stream": "system", "seq": 0, "offset": 0,
         "data": base64::engine::general_purpose::STANDARD.encode(b"done\n"),
         "crc32c": kiln_api::log_crc32c(b"done\n")},
    ]});
    let ack = c.call("POST", &format!("{A}/logs/batch"), &at("/logs/batch"), t, Some(batch)).await;
    assert_eq!(ack.status, 200, "{}", String::from_utf8_lossy(&ack.bytes));
    assert_eq!(ack.json()["accepted"], 2);

    // An artifact of this attempt: an upload session, its part, the seal.
    let bytes = b"candidate bytes\n";
    let sha = hex::encode(sha2::Sha256::digest(bytes));
    let up_s = c
        .call(
            "POST",
            &format!("{A}/artifacts"),
            &at("/artifacts"),
            t,
            Some(json!({ "name": "out.txt", "size": bytes.len(), "sha256": sha })),
        )
        .await;
    assert_eq!(up_s.status, 200, "{}", String::from_utf8_lossy(&up_s.bytes));
    let up_s = up_s.json();
    let generation = up_s["generation_id"].as_str().unwrap().to_string();
    let part_url = c
        .call(
            "POST",
            &format!("{A}/artifacts/{{generation}}/parts/{{part}}"),
            &at(&format!("/artifacts/{generation}/parts/0")),
            t,
            Some(json!({ "size": bytes.len(), "content_md5": "" })),
        )
        .await;
    // A local object store hands out `part_url`, not presigned parts: an error body.
    assert!(part_url.status == 200 || part_url.status >= 400);
    let put = up_s["part_url"].as_str().unwrap().replace("{part}", "0");
    let receipt = c.send("PUT", "/blob/uploads/{generation}/parts/{part}", http.put(&put).body(bytes.to_vec())).await;
    assert_eq!(receipt.status, 200, "{}", String::from_utf8_lossy(&receipt.bytes));
    let sealed = c
        .call(
            "POST",
            &format!("{A}/artifacts/{{generation}}/seal"),
            &at(&format!("/artifacts/{generation}/seal")),
            t,
            Some(json!({ "sha256": sha })),
        )
        .await;
    assert_eq!(sealed.status, 200, "{}", String::from_utf8_lossy(&sealed.bytes));
    let restore = c
        .call(
            "POST",
            &format!("{A}/restore"),
            &at("/restore"),
            t,
            Some(json!({ "from_job": "build", "name": "app.txt" })),
        )
        .await;
    assert!(restore.status >= 400, "not a job this one needs");
    let lookup = c
        .call(
            "POST",
            &format!("{A}/cache/lookup"),
            &at("/cache/lookup"),
            t,
            Some(json!({ "candidates": [{ "namespace": "refs/heads/main", "key": "k1" }] })),
        )
        .await;
    assert!(lookup.status == 200 || lookup.status >= 400, "{}", lookup.status);
    let save = c
        .call(
            "POST",
            &format!("{A}/cache/save"),
            &at("/cache/save"),
            t,
            Some(json!({ "generation_id": generation, "namespace": "refs/heads/main", "key": "k1" })),
        )
        .await;
    assert!(save.status == 200 || save.status >= 400);
    let report = c
        .call(
            "POST",
            &format!("{A}/cache/report"),
            &at("/cache/report"),
            t,
            Some(json!({ "key": "k1", "result": "miss" })),
        )
        .await;
    assert!(report.status == 200 || report.status >= 400, "{}", report.status);
    let image = c
        .call(
            "POST",
            &format!("{A}/image"),
            &at("/image"),
            t,
            Some(json!({ "digest": format!("sha256:{}", "0".repeat(64)) })),
        )
        .await;
    assert!(image.status == 200 || image.status >= 400, "{}", image.status);
    // Issue 43: a parsed test report staged for the completion, and the
    // recorded timings a job's `kiln tests split` reads.
    let staged = c
        .call(
            "POST",
            &format!("{A}/reports"),
            &at("/reports"),
            t,
            Some(json!({ "path": "junit.xml", "format": "junit", "tests": [
                { "id": "s :: t", "suite": "s", "name": "t", "outcome": "failed", "message": "boom",
                  "retries": [{ "kind": "flaky_failure", "outcome": "failed" }] },
            ] })),
        )
        .await;
    assert_eq!(staged.status, 200, "{}", String::from_utf8_lossy(&staged.bytes));
    let bad_report = c
        .call(
            "POST",
            &format!("{A}/reports"),
            &at("/reports"),
            t,
            Some(json!({ "path": "x", "format": "xunit", "tests": [] })),
        )
        .await;
    assert_eq!(bad_report.status, 422, "{}", String::from_utf8_lossy(&bad_report.bytes));
    assert_eq!(c.call("GET", &format!("{A}/timings"), &at("/timings"), t, None).await.status, 200);
    let shard = c
        .call(
            "POST",
            &format!("{A}/shards/next"),
            &at("/shards/next"),
            t,
            Some(json!({ "group": "unit", "tests": ["a"] })),
        )
        .await;
    assert_eq!(
        shard.status,
        422,
        "a job without `reports:` has no shard queue: {}",
        String::from_utf8_lossy(&shard.bytes)
    );
    let done = c
        .call(
            "POST",
            &format!("{A}/complete"),
            &at("/complete"),
            t,
            Some(json!({ "outcome": "success", "exit_code": 0, "sandbox": { "evidence": "exited" } })),
        )
        .await;
    assert_eq!(done.status, 200, "{}", String::from_utf8_lossy(&done.bytes));
    assert_eq!(done.json()["job_status"], "success");
    let release =
        c.call("POST", &format!("{A}/release"), &at("/release"), t, Some(json!({ "evidence": "exited" }))).await;
    assert!(release.status == 200 || release.status >= 400);
    // The epoch is over: its calls are refused (409 `stale_epoch`, or 401
    // once the attempt token no longer authenticates).
    let stale = c.call("POST", &format!("{A}/heartbeat"), &at("/heartbeat"), t, None).await;
    assert!(matches!(stale.status, 401 | 409), "{}", stale.status);
    let drain = c
        .call("POST", "/v1/agents/{agent}/drain", &format!("/v1/agents/{agent}/drain"), Some(session.as_str()), None)
        .await;
    assert_eq!(drain.status, 200);

    // ---------- access (admin) ----------
    let tok = c.call("POST", "/v1/tokens", "/v1/tokens", a, Some(json!({ "name": "ci", "scope": "read" }))).await;
    assert_eq!(tok.status, 201, "{}", String::from_utf8_lossy(&tok.bytes));
    let tok = tok.json();
    let bad = c.call("POST", "/v1/tokens", "/v1/tokens", a, Some(json!({ "name": "ci", "scope": "root" }))).await;
    assert!(bad.status >= 400);
    let read = tok["token"].as_str().unwrap().to_string();
    assert_eq!(c.call("GET", "/v1/tokens", "/v1/tokens", a, None).await.status, 200);
    let forbidden = c.call("GET", "/v1/tokens", "/v1/tokens", Some(read.as_str()), None).await;
    assert_eq!(forbidden.status, 403, "a read token may not list tokens");
    let id = tok["id"].as_str().unwrap();
    assert_eq!(c.call("DELETE", "/v1/tokens/{id}", &format!("/v1/tokens/{id}"), a, None).await.status, 200);
    let jt =
        c.call("POST", "/v1/agent-tokens", "/v1/agent-tokens", a, Some(json!({ "name": "pool-x", "pool": "x" }))).await;
    assert_eq!(jt.status, 201);
    let jid = jt.json()["id"].as_str().unwrap().to_string();
    assert_eq!(c.call("GET", "/v1/agent-tokens", "/v1/agent-tokens", a, None).await.status, 200);
    let rv = c.call("DELETE", "/v1/agent-tokens/{id}", &format!("/v1/agent-tokens/{jid}"), a, None).await;
    assert_eq!(rv.status, 200);
    assert_eq!(c.call("GET", "/v1/agents", "/v1/agents", a, None).await.status, 200);
    assert_eq!(c.call("GET", "/v1/overview", "/v1/overview", a, None).await.status, 200);
    assert_eq!(c.call("GET", "/v1/audit", "/v1/audit?limit=50", a, None).await.status, 200);
    let rm = c.call("DELETE", "/v1/agents/{agent}", &format!("/v1/agents/{agent}"), a, None).await;
    assert_eq!(rm.status, 200);
    assert_eq!(c.call("DELETE", "/v1/repos/{repo}", "/v1/repos/scratch", a, None).await.status, 200);

    // Every documented operation was called.
    let mut documented = BTreeSet::new();
    for (path, item) in c.doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            documented.insert((method.to_uppercase(), path.clone()));
        }
    }
    let uncalled: Vec<_> = documented.difference(&c.seen).collect();
    assert!(uncalled.is_empty(), "documented operations this test never called (add a call): {uncalled:?}");
}
