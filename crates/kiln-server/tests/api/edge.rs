//! Issue 39, item 12 (the lows at the API's edge): each test is the
//! attacker's call and the refusal, through the whole server in process.

use axum::http::StatusCode;
use kiln_api as api;
use kiln_testkit::{Caller, TestApp, next_frame};

/// A token made by `by` (a caller with an admin token).
async fn mint(by: Caller<'_>, scope: &str, repo: Option<&str>, trusted: Option<bool>) -> api::CreatedToken {
    let body =
        api::CreateToken { name: format!("{scope}-t"), scope: scope.into(), repo: repo.map(Into::into), trusted };
    by.post("/v1/tokens").json(&body).send().await.assert_status(StatusCode::CREATED).json()
}

/// An admin token made `--trusted false` cannot mint a trusted one: asked
/// for `trusted`, it is refused; by default what it makes is untrusted.
/// (Before: its admin token came out trusted.)
#[tokio::test]
async fn an_untrusted_admin_token_never_mints_a_trusted_token() {
    let app = TestApp::new().await;
    let _repo = super::repo(&app, "r", &super::pipeline(&["a"])).await;
    let untrusted = mint(app.admin(), "admin", None, Some(false)).await;
    assert!(!untrusted.info.trusted);
    let made = mint(app.with_token(&untrusted.token), "admin", None, None).await;
    assert!(!made.info.trusted, "an untrusted admin token's admin token is untrusted: {:?}", made.info);
    let trigger = mint(app.with_token(&untrusted.token), "trigger", Some("r"), None).await;
    assert!(!trigger.info.trusted);
    for (scope, repo) in [("admin", None), ("trigger", Some("r"))] {
        let body =
            api::CreateToken { name: "x".into(), scope: scope.into(), repo: repo.map(Into::into), trusted: Some(true) };
        let res = app.with_token(&untrusted.token).post("/v1/tokens").json(&body).send().await;
        assert_eq!(res.error_code(), "forbidden", "{scope}: {}", res.text());
        res.assert_status(StatusCode::FORBIDDEN);
    }
    // A run its token starts is untrusted.
    let res = app
        .with_token(&made.token)
        .post("/v1/repos/r/workflow-runs")
        .json(&api::SubmitRun { commit_sha: "HEAD".into(), ..Default::default() })
        .send()
        .await
        .assert_status(StatusCode::ACCEPTED);
    let run = super::get_run(&app, &res.json::<api::SubmitRunResponse>().run_id).await;
    assert_eq!(run.trust, "untrusted", "{run:?}");
    // The trusted admin token still mints trusted tokens.
    assert!(mint(app.admin(), "admin", None, None).await.info.trusted);
}

/// A trigger token of repository `a` pages `a`'s runs with `before=` a run
/// of repository `b` (its full id, or a prefix): the answer is exactly the
/// one for a run that does not exist — nothing says `b`'s run exists, where
/// it falls in time, or what ids a prefix matches. (Before: the list of
/// `a`'s runs older than `b`'s came back, and a prefix resolved.)
#[tokio::test]
async fn a_trigger_token_learns_nothing_of_another_repositorys_runs_through_before() {
    let app = TestApp::new().await;
    let _a = super::repo(&app, "a", &super::pipeline(&["x"])).await;
    let _b = super::repo(&app, "b", &super::pipeline(&["x"])).await;
    let older = super::submit(&app, "a").await;
    let theirs = super::submit(&app, "b").await;
    let _newer = super::submit(&app, "a").await;
    let t = mint(app.admin(), "trigger", Some("a"), None).await;
    let list = |before: String| {
        let c = app.with_token(&t.token);
        async move { c.get(&format!("/v1/repos/a/workflow-runs?before={before}")).send().await }
    };
    let nowhere = list("0badc0de-0000-4000-8000-000000000000".into()).await;
    // Prefixes long enough to be `b`'s alone (ids are time-ordered: a short one
    // may match `a`'s own runs too, which the caller may see).
    for probe in [theirs.clone(), theirs[..30].to_string(), theirs[..34].to_string()] {
        let got = list(probe.clone()).await;
        let norm = |r: &kiln_testkit::TestResponse, p: &str| r.text().replace(p, "P");
        assert_eq!(
            (got.status, norm(&got, &probe)),
            (nowhere.status, norm(&nowhere, "0badc0de-0000-4000-8000-000000000000")),
            "before={probe}"
        );
        // Nothing beyond what the caller sent: no run of `a`, no full id of `b`'s.
        assert!(!got.text().contains(&older), "{}", got.text());
        assert!(probe.len() == 36 || !got.text().contains(&theirs), "{}", got.text());
    }
    // Its own cursors page as before.
    let page: api::RunList = list(_newer.clone()).await.assert_status(StatusCode::OK).json();
    assert_eq!(page.runs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), vec![older.as_str()]);
}

/// The same `Idempotency-Key` sent by another token is another request: a
/// trigger token reusing a key the admin used gets its own run, never the
/// admin's (before: it got the admin's run back, trusted).
#[tokio::test]
async fn an_idempotency_key_is_the_callers_own() {
    let app = TestApp::new().await;
    let _repo = super::repo(&app, "r", &super::pipeline(&["a"])).await;
    let admin = mint(app.admin(), "admin", None, None).await.token;
    let t1 = mint(app.admin(), "trigger", Some("r"), None).await;
    let t2 = mint(app.admin(), "trigger", Some("r"), None).await;
    let submit = |token: String| {
        let c = app.with_token(&token);
        async move {
            let res = c
                .post("/v1/repos/r/workflow-runs")
                .header("Idempotency-Key", "deploy-42")
                .json(&api::SubmitRun { commit_sha: "HEAD".into(), ..Default::default() })
                .send()
                .await;
            res.assert_status(StatusCode::ACCEPTED).json::<api::SubmitRunResponse>().run_id
        }
    };
    let by_admin = submit(admin.clone()).await;
    let by_t1 = submit(t1.token.clone()).await;
    let by_t2 = submit(t2.token.clone()).await;
    assert!(by_t1 != by_admin && by_t2 != by_admin && by_t1 != by_t2, "{by_admin} {by_t1} {by_t2}");
    // Each caller's own retry is still absorbed.
    assert_eq!(submit(t1.token.clone()).await, by_t1);
    assert_eq!(submit(admin).await, by_admin);
    assert_eq!(super::get_run(&app, &by_t1).await.trust, "untrusted");
}

/// `/metrics` names agents, pools and routes: anonymous scrapes get 401, a
/// trigger token 403; an admin or read token scrapes (before: anyone).
#[tokio::test]
async fn metrics_need_an_admin_or_read_token() {
    let app = TestApp::new().await;
    let _repo = super::repo(&app, "r", &super::pipeline(&["a"])).await;
    super::register(&app, "secret-host-name", 1).await;
    let res = app.anonymous().get("/metrics").send().await;
    assert!(!res.text().contains("kiln_"), "{}", res.text());
    res.assert_status(StatusCode::UNAUTHORIZED);
    let trigger = mint(app.admin(), "trigger", Some("r"), None).await;
    app.with_token(&trigger.token).get("/metrics").send().await.assert_status(StatusCode::FORBIDDEN);
    let read = mint(app.admin(), "read", None, None).await;
    let text = app.with_token(&read.token).get("/metrics").send().await.assert_status(StatusCode::OK).text();
    assert!(text.contains("kiln_dispatch_queue_depth"), "{text}");
}

/// Login CSRF: a cross-site form posting the attacker's token as
/// `text/plain` (or any body from another origin) does not sign the
/// browser in — no cookie is set. The UI's own JSON sign-in still works.
#[tokio::test]
async fn a_cross_site_sign_in_sets_no_session() {
    let app = TestApp::new().await;
    let admin = mint(app.admin(), "admin", None, None).await.token;
    let body = serde_json::json!({"token": admin}).to_string();
    let post = || app.anonymous().post("/v1/ui/session").header("host", "kiln.test");
    // The form a hostile page submits: text/plain, from its own origin.
    let res = post()
        .header("content-type", "text/plain")
        .header("origin", "https://evil.example")
        .header("sec-fetch-site", "cross-site")
        .body(body.clone())
        .send()
        .await;
    assert!(res.header("set-cookie").is_none(), "{:?}", res.headers);
    assert!(res.status.is_client_error(), "{}", res.status);
    // JSON, but from another origin or site.
    for (name, value) in
        [("origin", "https://evil.example"), ("origin", "http://kiln.test:8080"), ("sec-fetch-site", "same-site")]
    {
        let res = post().header("content-type", "application/json").header(name, value).body(body.clone()).send().await;
        assert!(res.header("set-cookie").is_none(), "{name}: {value}");
        res.assert_status(StatusCode::FORBIDDEN);
    }
    // The UI's own page: JSON, same origin.
    let res = post()
        .header("content-type", "application/json")
        .header("origin", "http://kiln.test")
        .header("sec-fetch-site", "same-origin")
        .body(body)
        .send()
        .await
        .assert_status(StatusCode::NO_CONTENT);
    assert!(res.header("set-cookie").is_some());
}

/// A second agent registering a name held by a connected agent is refused
/// (409, naming it); once that agent is gone, the same pool's registration
/// takes the name over (the old record removed); another pool's never
/// does. (Before: any number of agents shared a name.)
#[tokio::test]
async fn agent_names_are_unique_among_live_agents() {
    let app = TestApp::new().await;
    let first = super::register(&app, "builder-1", 1).await;
    let path = format!("/v1/agents/{}/session?session_id={}", first.agent_id, first.session_id);
    let stream = app.with_token(&first.credential).get(&path).send_streaming().await;
    let mut frames = stream.into_body().into_data_stream();
    let ping = next_frame(&mut frames).await.unwrap();
    assert!(ping.starts_with("event: ping"), "{ping}");
    let body = api::RegisterAgent {
        name: "builder-1".into(),
        labels: Default::default(),
        max_jobs: 1,
        version: None,
        executor: None,
        fresh_start: false,
    };
    let res = app.agent().post("/v1/agents/register").json(&body).send().await;
    assert!(res.text().contains("already connected") && res.text().contains(&first.agent_id), "{}", res.text());
    res.assert_status(StatusCode::CONFLICT);

    // Another pool's join token never takes the name, live or not.
    let j = api::CreateJoinToken { name: "forks".into(), pool: Some("forks".into()) };
    let j: api::CreatedJoinToken =
        app.admin().post("/v1/agent-tokens").json(&j).send().await.assert_status(StatusCode::CREATED).json();
    app.with_token(&j.token).post("/v1/agents/register").json(&body).send().await.assert_status(StatusCode::CONFLICT);

    // The machine restarts: its stream ends, the same pool takes the name.
    drop(frames);
    let mut taken = None;
    for _ in 0..100 {
        let res = app.agent().post("/v1/agents/register").json(&body).send().await;
        if res.status == StatusCode::OK {
            taken = Some(res.json::<api::AgentRegistration>());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let taken = taken.expect("the same pool takes over the name of an agent with no live session");
    let res = app.with_token(&j.token).post("/v1/agents/register").json(&body).send().await;
    res.assert_status(StatusCode::CONFLICT);
    let agents: serde_json::Value = app.admin().get("/v1/agents").send().await.assert_status(StatusCode::OK).json();
    let named: Vec<&serde_json::Value> =
        agents["agents"].as_array().unwrap().iter().filter(|a| a["name"] == "builder-1").collect();
    assert_eq!(named.len(), 1, "{agents}");
    assert_eq!(named[0]["id"], taken.agent_id.as_str());
}

/// The UI session cookie holds a random id, not the token; signing out
/// deletes the session on the server, so a copy of the cookie (say, one
/// another port of this host received) authenticates nothing after it.
/// Revoking the token ends its sessions too. On loopback the cookie is a
/// `__Host-` one (Secure, host-only). (Before: the cookie was the token
/// itself, and signing out only asked the browser to forget it.)
#[tokio::test]
async fn a_signed_out_session_cookie_authenticates_nothing() {
    let app = TestApp::new().await;
    let made = mint(app.admin(), "admin", None, None).await;
    let sign_in = |host: &'static str| {
        let body = serde_json::json!({"token": made.token});
        let c = app.anonymous();
        async move { c.post("/v1/ui/session").header("host", host).json(&body).send().await }
    };
    let res = sign_in("127.0.0.1:7070").await.assert_status(StatusCode::NO_CONTENT);
    let cookie = res.header("set-cookie").unwrap().to_string();
    assert!(cookie.starts_with("__Host-kiln_session=") && cookie.contains("; Secure"), "{cookie}");
    assert!(cookie.contains("Path=/") && !cookie.contains("Domain"), "{cookie}");
    assert!(!cookie.contains(&made.token) && !cookie.contains(made.token.rsplit('.').next().unwrap()), "{cookie}");
    let jar = cookie.split(';').next().unwrap().to_string();
    let repos = |jar: String| {
        let c = app.anonymous();
        async move { c.get("/v1/repos").header("cookie", &jar).send().await.status }
    };
    assert_eq!(repos(jar.clone()).await, StatusCode::OK);
    // The cookie is not a bearer token either.
    let id = jar.split_once('=').unwrap().1.to_string();
    app.with_token(&id).get("/v1/repos").send().await.assert_status(StatusCode::UNAUTHORIZED);
    // Sign out; the stolen copy is dead.
    let out = app.anonymous().delete("/v1/ui/session").header("cookie", &jar).send().await;
    out.assert_status(StatusCode::NO_CONTENT);
    assert_eq!(repos(jar.clone()).await, StatusCode::UNAUTHORIZED);
    // A session of a token revoked since is dead too.
    let res = sign_in("kiln.example").await.assert_status(StatusCode::NO_CONTENT);
    let jar = res.header("set-cookie").unwrap().split(';').next().unwrap().to_string();
    assert!(jar.starts_with("kiln_session="), "plain http off loopback: {jar}");
    assert_eq!(repos(jar.clone()).await, StatusCode::OK);
    app.admin().delete(&format!("/v1/tokens/{}", made.info.id)).send().await.assert_status(StatusCode::OK);
    assert_eq!(repos(jar).await, StatusCode::UNAUTHORIZED);
}
