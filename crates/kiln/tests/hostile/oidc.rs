//! OIDC identity tokens: a trusted run's job that asks for `id-token:` gets
//! a JWT that verifies with an independent JWT library against the JWKS
//! the server publishes; an untrusted run's job gets neither it nor secrets.

use crate::BIN;
use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnServer, TestRepo, wait_run};

/// The job writes its token (or `none`) and its secret (or `none`) to a
/// published artifact: logs would mask them.
const WF: &str = "version: 1\njobs:\n  - name: deploy\n    id-token:\n      audience: sts.example.com\n    \
                  secrets: [CLOUD_KEY]\n    steps:\n      - printf %s \"${KILN_ID_TOKEN:-none}\" | rev > token.txt\n      \
                  - printf %s \"${CLOUD_KEY:-none}\" | rev > key.txt\n    artifacts:\n      publish:\n        \
                  - {name: token, path: token.txt}\n        - {name: key, path: key.txt}\n";

/// What the step wrote, reversed back: the step reverses its values, since
/// an artifact holding a secret (the token included) is refused (issue 39).
async fn artifact(c: &Client, run: &str, name: &str) -> String {
    let d = c.artifact(run, "deploy", name).await.unwrap();
    c.download(&d.url).await.unwrap().text().await.unwrap().trim_end().chars().rev().collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trusted_job_gets_a_verifiable_id_token_and_an_untrusted_one_gets_nothing() {
    // The pull request's run goes to an agent of pool `forks` (a host one
    // here, with the unsafe opt-in; placement is proven in `placement`).
    let server = KilnServer::start(BIN.as_ref(), &["--untrusted-on-host-agents"]).unwrap();
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", WF)]).unwrap();
    server.add_repo("app", &repo);
    let c = Client::new(&server.url, &server.token);
    c.put_secret("app", "CLOUD_KEY", "ck-93b1").await.unwrap();
    let _agent = server.agent("real", &[]).unwrap();

    let run = c.submit_run("app", &SubmitRun { commit_sha: "HEAD".into(), ..Default::default() }, None).await.unwrap();
    let r = wait_run(&c, &run.run_id, 60).await;
    assert_eq!(r.status, "success", "{r:#?}");
    let token = artifact(&c, &run.run_id, "token").await;
    assert_eq!(artifact(&c, &run.run_id, "key").await, "ck-93b1");

    let claims = verified(&server.url, &token, "sts.example.com").await;
    // A run started at HEAD carries the branch HEAD names (issue 41, item 8).
    assert_eq!(claims["sub"], "repo:app:ref:refs/heads/main");
    assert_eq!((claims["run_id"].as_str(), claims["job"].as_str()), (Some(run.run_id.as_str()), Some("deploy")));
    assert_eq!(claims["trust"], "trusted");
    assert!(claims.get("environment").is_none(), "no environment: {claims}");
    let ttl = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert!(ttl > 0 && ttl <= 3600, "short-lived: {ttl} s");

    // A pull request's run: no token, no secret.
    let _forks = server.pool_agent("forks", "pr-box", &[]).unwrap();
    let pr = SubmitRun { commit_sha: "HEAD".into(), event: Some("pull_request".into()), ..Default::default() };
    let run = c.submit_run("app", &pr, None).await.unwrap();
    let r = wait_run(&c, &run.run_id, 60).await;
    assert_eq!((r.status.as_str(), r.trust.as_str()), ("success", "untrusted"));
    assert_eq!(artifact(&c, &run.run_id, "token").await, "none");
    assert_eq!(artifact(&c, &run.run_id, "key").await, "none");
}

/// A deploy job's token (issue 46) names its environment, so a cloud role
/// can trust "production deploys of app" only: `environment` and
/// `sub = repo:app:environment:production`, verified against the JWKS.
#[tokio::test(flavor = "multi_thread")]
async fn a_deploy_jobs_id_token_carries_its_environment() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let wf = WF.replace("  - name: deploy\n", "  - name: deploy\n    environment: production\n");
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", wf.as_str())]).unwrap();
    server.add_repo("app", &repo);
    let c = Client::new(&server.url, &server.token);
    c.put_secret("app", "CLOUD_KEY", "ck-93b1").await.unwrap();
    let env = kiln_api::CreateEnvironment { name: "production".into(), ..Default::default() };
    c.create_environment(&env).await.unwrap();
    let _agent = server.agent("real", &[]).unwrap();
    let run = c.submit_run("app", &SubmitRun { commit_sha: "HEAD".into(), ..Default::default() }, None).await.unwrap();
    let r = wait_run(&c, &run.run_id, 60).await;
    assert_eq!(r.status, "success", "{r:#?}");
    let claims = verified(&server.url, &artifact(&c, &run.run_id, "token").await, "sts.example.com").await;
    assert_eq!(claims["sub"], "repo:app:environment:production", "{claims}");
    assert_eq!(claims["environment"], "production", "{claims}");
    assert_eq!((claims["job"].as_str(), claims["trust"].as_str()), (Some("deploy"), Some("trusted")));
}

/// The token's claims once it verified as a cloud provider verifies it:
/// discovery, the key set it names, ES256, audience and issuer; another
/// audience or a tampered payload does not verify.
async fn verified(url: &str, token: &str, audience: &str) -> serde_json::Value {
    let server_url = url;
    // Discovery, then the key set, as a cloud provider would fetch them.
    let http = reqwest::Client::new();
    let discovery: serde_json::Value =
        http.get(format!("{server_url}/.well-known/openid-configuration")).send().await.unwrap().json().await.unwrap();
    let issuer = discovery["issuer"].as_str().unwrap().to_string();
    let jwks_uri = discovery["jwks_uri"].as_str().unwrap();
    assert!(jwks_uri.ends_with("/.well-known/jwks.json"), "{jwks_uri}");
    let jwks: jsonwebtoken::jwk::JwkSet =
        http.get(format!("{server_url}/.well-known/jwks.json")).send().await.unwrap().json().await.unwrap();
    let header = jsonwebtoken::decode_header(token).unwrap();
    assert_eq!(header.alg, jsonwebtoken::Algorithm::ES256);
    let jwk = jwks.find(header.kid.as_deref().expect("kid")).expect("the signing key is published");
    let key = jsonwebtoken::DecodingKey::from_jwk(jwk).unwrap();
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    v.set_audience(&[audience]);
    v.set_issuer(&[issuer.as_str()]);
    v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    let claims = jsonwebtoken::decode::<serde_json::Value>(token, &key, &v).expect("verifies").claims;
    // Another audience, or a tampered payload, does not verify.
    let mut other = v.clone();
    other.set_audience(&["someone-else"]);
    assert!(jsonwebtoken::decode::<serde_json::Value>(token, &key, &other).is_err());
    let parts: Vec<&str> = token.split('.').collect();
    let forged = format!("{}.{}x.{}", parts[0], parts[1], parts[2]);
    assert!(jsonwebtoken::decode::<serde_json::Value>(&forged, &key, &v).is_err());
    claims
}
