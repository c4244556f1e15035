//! Commit statuses against FakeForge, for all three forges.

use kiln_forge::fake::{FakeForge, RecordedStatus};
use kiln_forge::{CommitState, Forge, StatusTarget, post_status};

const TOKEN: &str = "ghp_s3cr3t-T0KEN-value";
const SHA: &str = "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c";

fn target(fake: &FakeForge, forge: Forge, token: &str) -> StatusTarget {
    let repo = match forge {
        Forge::Gitlab => "group/sub/project",
        _ => "octo/hello",
    };
    StatusTarget { forge, api_url: fake.url(), repo: repo.into(), token: token.into() }
}

async fn post_all_states(fake: &FakeForge, forge: Forge) -> Vec<String> {
    let client = reqwest::Client::new();
    let t = target(fake, forge, TOKEN);
    let states = [
        CommitState::Pending,
        CommitState::Running,
        CommitState::Success,
        CommitState::Failure,
        CommitState::Cancelled,
        CommitState::Error,
    ];
    let before = fake.statuses().len();
    for (i, state) in states.into_iter().enumerate() {
        // A context per state, so GitLab's same-state rule does not apply.
        let context = format!("kiln/ci-{i}");
        post_status(&client, &t, SHA, &context, state, "the build", Some("https://kiln.example.com/runs/1"))
            .await
            .unwrap_or_else(|e| panic!("{forge} {state:?}: {e}"));
    }
    fake.statuses()[before..].iter().map(|s| s.state.clone()).collect()
}

#[tokio::test]
async fn github_states_and_shape() {
    let fake = FakeForge::start(TOKEN).await;
    let words = post_all_states(&fake, Forge::Github).await;
    assert_eq!(words, ["pending", "pending", "success", "failure", "error", "error"]);
    let all = fake.statuses();
    assert_eq!(
        all[0],
        RecordedStatus {
            forge: Forge::Github,
            repo: "octo/hello".into(),
            sha: SHA.into(),
            context: "kiln/ci-0".into(),
            state: "pending".into(),
            description: Some("the build".into()),
            target_url: Some("https://kiln.example.com/runs/1".into()),
        }
    );
    assert_eq!(all[4].description.as_deref(), Some("Cancelled: the build"));
}

#[tokio::test]
async fn gitlab_states_and_shape() {
    let fake = FakeForge::start(TOKEN).await;
    let words = post_all_states(&fake, Forge::Gitlab).await;
    assert_eq!(words, ["pending", "running", "success", "failed", "canceled", "failed"]);
    let all = fake.statuses();
    // The path arrived as one encoded segment and was decoded by the fake.
    assert_eq!(all[0].repo, "group/sub/project");
    assert_eq!(all[0].context, "kiln/ci-0");
    assert_eq!(all[4].description.as_deref(), Some("the build"));
    assert_eq!(all[0].target_url.as_deref(), Some("https://kiln.example.com/runs/1"));
}

#[tokio::test]
async fn gitlab_numeric_project_and_repeated_state() {
    let fake = FakeForge::start(TOKEN).await;
    let client = reqwest::Client::new();
    let mut t = target(&fake, Forge::Gitlab, TOKEN);
    t.repo = "42".into();
    post_status(&client, &t, SHA, "kiln", CommitState::Running, "", None).await.unwrap();
    // GitLab answers 400 "Cannot transition status" to the same state again:
    // that is success (a retried post is harmless).
    post_status(&client, &t, SHA, "kiln", CommitState::Running, "", None).await.unwrap();
    post_status(&client, &t, SHA, "kiln", CommitState::Success, "", None).await.unwrap();
    let words: Vec<_> = fake.statuses().into_iter().map(|s| (s.repo, s.state, s.target_url)).collect();
    assert_eq!(words, [("42".into(), "running".into(), None), ("42".into(), "success".into(), None)]);
    assert_eq!(fake.request_count(), 3);
}

#[tokio::test]
async fn gitea_states_and_shape() {
    let fake = FakeForge::start(TOKEN).await;
    let words = post_all_states(&fake, Forge::Gitea).await;
    assert_eq!(words, ["pending", "pending", "success", "failure", "error", "error"]);
    let all = fake.statuses();
    assert!(all.iter().all(|s| s.forge == Forge::Gitea && s.repo == "octo/hello"));
    assert_eq!(all[4].description.as_deref(), Some("Cancelled: the build"));
}

#[tokio::test]
async fn long_descriptions_are_cut() {
    let fake = FakeForge::start(TOKEN).await;
    let client = reqwest::Client::new();
    let long = "ü".repeat(300);
    for forge in Forge::ALL {
        let t = target(&fake, forge, TOKEN);
        post_status(&client, &t, SHA, "kiln", CommitState::Failure, &long, None).await.unwrap();
    }
    for s in fake.statuses() {
        let d = s.description.unwrap();
        assert_eq!(d.chars().count(), 140, "{}", s.forge);
    }
}

#[tokio::test]
async fn unavailable_is_retryable() {
    let fake = FakeForge::start(TOKEN).await;
    let client = reqwest::Client::new();
    for forge in Forge::ALL {
        let t = target(&fake, forge, TOKEN);
        fake.set_failing(1);
        let err = post_status(&client, &t, SHA, "kiln", CommitState::Success, "ok", None).await.unwrap_err();
        assert!(err.retryable, "{forge}: {err}");
        assert!(err.message.contains("503"), "{err}");
        assert!(!err.message.contains(TOKEN));
        // The next one goes through.
        post_status(&client, &t, SHA, "kiln", CommitState::Success, "ok", None).await.unwrap();
    }
    assert_eq!(fake.statuses().len(), 3);
    assert_eq!(fake.request_count(), 6);
}

#[tokio::test]
async fn wrong_token_is_not_retryable_and_not_leaked() {
    let fake = FakeForge::start(TOKEN).await;
    let client = reqwest::Client::new();
    let wrong = "glpat-WRONG-token-xyz";
    for forge in Forge::ALL {
        let t = target(&fake, forge, wrong);
        let err = post_status(&client, &t, SHA, "kiln", CommitState::Success, "ok", None).await.unwrap_err();
        assert!(!err.retryable, "{forge}: {err}");
        assert!(err.message.contains("401"), "{err}");
        assert!(!err.message.contains(wrong), "{err}");
        assert!(!format!("{t:?}").contains(wrong));
    }
    assert!(fake.statuses().is_empty());
}

#[tokio::test]
async fn connection_errors_are_retryable() {
    // A port nothing listens on: bind, note, drop.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let client = reqwest::Client::new();
    for forge in Forge::ALL {
        let t = StatusTarget {
            forge,
            api_url: format!("http://127.0.0.1:{port}"),
            repo: if forge == Forge::Gitlab { "1".into() } else { "o/r".into() },
            token: TOKEN.into(),
        };
        let err = post_status(&client, &t, SHA, "kiln", CommitState::Pending, "", None).await.unwrap_err();
        assert!(err.retryable, "{forge}: {err}");
        assert!(!err.message.contains(TOKEN));
    }
}

#[tokio::test]
async fn bad_arguments_are_refused_before_sending() {
    let fake = FakeForge::start(TOKEN).await;
    let client = reqwest::Client::new();
    let t = target(&fake, Forge::Github, TOKEN);
    for sha in ["abc", "", "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c/../x"] {
        let err = post_status(&client, &t, sha, "kiln", CommitState::Pending, "", None).await.unwrap_err();
        assert!(!err.retryable);
    }
    let mut bad = t.clone();
    bad.repo = "../../admin".into();
    assert!(post_status(&client, &bad, SHA, "kiln", CommitState::Pending, "", None).await.is_err());
    let mut bad = t.clone();
    bad.token = "line\nbreak".into();
    let err = post_status(&client, &bad, SHA, "kiln", CommitState::Pending, "", None).await.unwrap_err();
    assert!(!err.message.contains("line\nbreak"));
    assert_eq!(fake.request_count(), 0);
}

/// The fake itself refuses what the real forges refuse.
#[tokio::test]
async fn fake_checks_shapes() {
    let fake = FakeForge::start(TOKEN).await;
    let client = reqwest::Client::new();
    let url = fake.url();
    let gh = |body: serde_json::Value| {
        client
            .post(format!("{url}/repos/o/r/statuses/{SHA}"))
            .bearer_auth(TOKEN)
            .header("accept", "application/vnd.github+json")
            .header("x-github-api-version", "2022-11-28")
            .header("user-agent", "test")
            .json(&body)
            .send()
    };
    let ok = gh(serde_json::json!({"state": "success", "context": "c"})).await.unwrap();
    assert_eq!(ok.status(), 201);
    let created: serde_json::Value = ok.json().await.unwrap();
    assert_eq!(created["state"], "success");
    assert_eq!(gh(serde_json::json!({"state": "running"})).await.unwrap().status(), 422);
    assert_eq!(gh(serde_json::json!({"state": "failed"})).await.unwrap().status(), 422);
    assert_eq!(
        gh(serde_json::json!({"state": "success", "description": "x".repeat(141)})).await.unwrap().status(),
        422
    );
    // Gitea's "token" scheme, not Bearer.
    let r = client
        .post(format!("{url}/api/v1/repos/o/r/statuses/{SHA}"))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"state": "success"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = client
        .post(format!("{url}/api/v1/repos/o/r/statuses/{SHA}"))
        .header("authorization", format!("token {TOKEN}"))
        .json(&serde_json::json!({"state": "warning", "context": "c"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // GitLab: query parameters work too; its own words only; an unencoded
    // path does not route.
    let r = client
        .post(format!("{url}/api/v4/projects/7/statuses/{SHA}?state=canceled&name=q"))
        .header("private-token", TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = client
        .post(format!("{url}/api/v4/projects/7/statuses/{SHA}"))
        .header("private-token", TOKEN)
        .json(&serde_json::json!({"state": "failure"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = client
        .post(format!("{url}/api/v4/projects/g/p/statuses/{SHA}"))
        .header("private-token", TOKEN)
        .json(&serde_json::json!({"state": "success"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let recorded: Vec<_> = fake.statuses().into_iter().map(|s| (s.forge, s.state, s.context)).collect();
    assert_eq!(
        recorded,
        [
            (Forge::Github, "success".into(), "c".into()),
            (Forge::Gitea, "warning".into(), "c".into()),
            (Forge::Gitlab, "canceled".into(), "q".into()),
        ]
    );
}
