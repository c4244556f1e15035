//! Each documented payload, parsed and normalized.

use kiln_forge::{Forge, ForgeEvent, PullRequestEvent, PushEvent, parse};

fn fixture(forge: Forge, name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{}/{name}.json", manifest_dir(), forge.as_str());
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn parsed(forge: Forge, event: &str, name: &str) -> ForgeEvent {
    parse(forge, event, &fixture(forge, name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn push(forge: Forge, event: &str, name: &str) -> PushEvent {
    match parsed(forge, event, name) {
        ForgeEvent::Push(p) => p,
        other => panic!("{name}: expected a push, got {other:?}"),
    }
}

fn pr(forge: Forge, event: &str, name: &str) -> PullRequestEvent {
    match parsed(forge, event, name) {
        ForgeEvent::PullRequest(p) => p,
        other => panic!("{name}: expected a pull request, got {other:?}"),
    }
}

fn ignored(forge: Forge, event: &str, name: &str) -> String {
    match parsed(forge, event, name) {
        ForgeEvent::Ignored { reason } => reason,
        other => panic!("{name}: expected Ignored, got {other:?}"),
    }
}

fn strings(v: &[&str]) -> Option<Vec<String>> {
    Some(v.iter().map(|s| s.to_string()).collect())
}

// ---- GitHub ----

#[test]
fn github_push_branch() {
    let p = push(Forge::Github, "push", "push_branch");
    assert_eq!(
        p,
        PushEvent {
            git_ref: "refs/heads/main".into(),
            before: Some("6113728f27ae82c7b1a177c8d03f9e96e0adf246".into()),
            // Upper-case in the fixture: normalized to lower case.
            after: "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c".into(),
            actor: "Codertocat".into(),
            changed: strings(&["README.md", "build.sh", "docs/new.md", "src/main.rs"]),
        }
    );
}

#[test]
fn github_push_tag() {
    let p = push(Forge::Github, "push", "push_tag");
    assert_eq!(p.git_ref, "refs/tags/v1.0.0");
    assert_eq!(p.before, None);
    assert_eq!(p.after, "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c");
    assert_eq!(p.actor, "Codertocat");
    assert_eq!(p.changed, None);
}

#[test]
fn github_push_delete_is_ignored() {
    assert_eq!(ignored(Forge::Github, "push", "push_delete"), "ref deleted");
}

#[test]
fn github_push_new_branch() {
    let p = push(Forge::Github, "push", "push_new_branch");
    assert_eq!(p.git_ref, "refs/heads/feature/login");
    assert_eq!(p.before, None);
    assert_eq!(p.after, "a10867b14bb761a232cd80139fbd4c0d33264240");
    // A new ref's commit list says nothing about what differs from the
    // branch it was made from.
    assert_eq!(p.changed, None);
}

#[test]
fn github_forced_push_has_unknown_changes() {
    let mut v: serde_json::Value = serde_json::from_slice(&fixture(Forge::Github, "push_branch")).unwrap();
    v["forced"] = true.into();
    let ForgeEvent::Push(p) = parse(Forge::Github, "push", v.to_string().as_bytes()).unwrap() else { panic!() };
    assert_eq!(p.changed, None);
}

#[test]
fn github_pull_request_opened_from_fork() {
    let p = pr(Forge::Github, "pull_request", "pull_request_opened_fork");
    assert_eq!(
        p,
        PullRequestEvent {
            number: 2,
            action: "opened".into(),
            head_sha: "ec26c3e57ca3a959ca5aad62de7213c562f8c821".into(),
            head_ref: "changes".into(),
            base_ref: "master".into(),
            base_sha: Some("f95f852bd8fca8fcc58a9a2d6c842781e32a215e".into()),
            fork: true,
            author_write_access: Some(false),
            actor: "Octocat".into(),
            fetch_ref: "refs/pull/2/head".into(),
            title: "Update the README with new information.".into(),
        }
    );
}

#[test]
fn github_pull_request_synchronize_same_repo() {
    let p = pr(Forge::Github, "pull_request", "pull_request_synchronize");
    assert_eq!(p.number, 3);
    assert_eq!(p.action, "synchronize");
    assert_eq!(p.head_sha, "34c5c7793cb3b279e22454cb6750c80560547b3a");
    assert_eq!(p.head_ref, "feature/login");
    assert_eq!(p.base_ref, "main");
    assert!(!p.fork);
    assert_eq!(p.author_write_access, Some(true));
    assert_eq!(p.actor, "Codertocat");
    assert_eq!(p.fetch_ref, "refs/pull/3/head");
    assert_eq!(p.title, "Add a login page");
}

#[test]
fn github_author_association_values() {
    let body = fixture(Forge::Github, "pull_request_synchronize");
    for (assoc, want) in [
        ("OWNER", Some(true)),
        ("MEMBER", Some(true)),
        ("COLLABORATOR", Some(true)),
        ("CONTRIBUTOR", Some(false)),
        ("FIRST_TIME_CONTRIBUTOR", Some(false)),
        ("FIRST_TIMER", Some(false)),
        ("MANNEQUIN", Some(false)),
        ("NONE", Some(false)),
    ] {
        let mut v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        v["pull_request"]["author_association"] = assoc.into();
        let ForgeEvent::PullRequest(p) = parse(Forge::Github, "pull_request", v.to_string().as_bytes()).unwrap() else {
            panic!()
        };
        assert_eq!(p.author_write_access, want, "{assoc}");
    }
    // A deleted fork: head.repo is null, which is not the base repository.
    let mut v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    v["pull_request"]["head"]["repo"] = serde_json::Value::Null;
    let ForgeEvent::PullRequest(p) = parse(Forge::Github, "pull_request", v.to_string().as_bytes()).unwrap() else {
        panic!()
    };
    assert!(p.fork);
}

#[test]
fn github_pull_request_closed_is_ignored() {
    let reason = ignored(Forge::Github, "pull_request", "pull_request_closed");
    assert!(reason.contains("closed"), "{reason}");
}

#[test]
fn github_ping() {
    assert_eq!(parsed(Forge::Github, "ping", "ping"), ForgeEvent::Ping);
}

#[test]
fn unknown_events_are_ignored() {
    for forge in Forge::ALL {
        let reason = match parse(forge, "issues", b"{}").unwrap() {
            ForgeEvent::Ignored { reason } => reason,
            other => panic!("{other:?}"),
        };
        assert_eq!(reason, "event issues is not supported");
    }
    // Event names are per forge: GitLab has no "push", GitHub no "Push Hook".
    assert!(matches!(parse(Forge::Gitlab, "push", b"{}").unwrap(), ForgeEvent::Ignored { .. }));
    assert!(matches!(parse(Forge::Github, "Push Hook", b"{}").unwrap(), ForgeEvent::Ignored { .. }));
}

// ---- GitLab ----

#[test]
fn gitlab_push_branch() {
    let p = push(Forge::Gitlab, "Push Hook", "push_branch");
    assert_eq!(
        p,
        PushEvent {
            git_ref: "refs/heads/master".into(),
            before: Some("95790bf891e76fee5e1747ab589903a6a1f80f22".into()),
            after: "da1560886d4f094c3e6c9ef40349f7d38b5d27d7".into(),
            actor: "jsmith".into(),
            changed: strings(&["CHANGELOG", "app/controller/application.rb"]),
        }
    );
}

#[test]
fn gitlab_truncated_commit_list_means_unknown_changes() {
    let p = push(Forge::Gitlab, "Push Hook", "push_branch_truncated");
    assert_eq!(p.after, "da1560886d4f094c3e6c9ef40349f7d38b5d27d7");
    assert_eq!(p.changed, None);
}

#[test]
fn gitlab_push_new_branch() {
    let p = push(Forge::Gitlab, "Push Hook", "push_new_branch");
    assert_eq!(p.git_ref, "refs/heads/feature");
    assert_eq!(p.before, None);
    assert_eq!(p.after, "da1560886d4f094c3e6c9ef40349f7d38b5d27d7");
    assert_eq!(p.changed, None);
}

#[test]
fn gitlab_push_delete_is_ignored() {
    assert_eq!(ignored(Forge::Gitlab, "Push Hook", "push_delete"), "ref deleted");
}

#[test]
fn gitlab_tag_push() {
    let p = push(Forge::Gitlab, "Tag Push Hook", "tag_push");
    assert_eq!(p.git_ref, "refs/tags/v1.0.0");
    assert_eq!(p.before, None);
    assert_eq!(p.after, "82b3d5ae55f7080f1e6022629cdb57bfae7cccc7");
    assert_eq!(p.actor, "jsmith");
    assert_eq!(p.changed, None);
}

#[test]
fn gitlab_merge_request_open_from_fork() {
    let p = pr(Forge::Gitlab, "Merge Request Hook", "merge_request_open");
    assert_eq!(
        p,
        PullRequestEvent {
            number: 1,
            action: "opened".into(),
            head_sha: "da1560886d4f094c3e6c9ef40349f7d38b5d27d7".into(),
            head_ref: "ms-viewport".into(),
            base_ref: "master".into(),
            base_sha: None,
            fork: true,
            author_write_access: None,
            actor: "root".into(),
            fetch_ref: "refs/merge-requests/1/head".into(),
            title: "MS-Viewport".into(),
        }
    );
}

#[test]
fn gitlab_merge_request_update_with_commits() {
    let p = pr(Forge::Gitlab, "Merge Request Hook", "merge_request_update");
    assert_eq!(p.number, 2);
    assert_eq!(p.action, "synchronize");
    assert_eq!(p.head_sha, "b6568db1bc1dcd7f8b4d5a946b0b91f9dacd7327");
    assert_eq!(p.head_ref, "feature/login");
    assert!(!p.fork);
    assert_eq!(p.actor, "jsmith");
    assert_eq!(p.fetch_ref, "refs/merge-requests/2/head");
}

#[test]
fn gitlab_merge_request_reopen() {
    let mut v: serde_json::Value = serde_json::from_slice(&fixture(Forge::Gitlab, "merge_request_open")).unwrap();
    v["object_attributes"]["action"] = "reopen".into();
    let ForgeEvent::PullRequest(p) = parse(Forge::Gitlab, "Merge Request Hook", v.to_string().as_bytes()).unwrap()
    else {
        panic!()
    };
    assert_eq!(p.action, "reopened");
}

#[test]
fn gitlab_merge_request_ignored_actions() {
    let reason = ignored(Forge::Gitlab, "Merge Request Hook", "merge_request_update_title");
    assert!(reason.contains("without new commits"), "{reason}");
    let reason = ignored(Forge::Gitlab, "Merge Request Hook", "merge_request_close");
    assert!(reason.contains("close"), "{reason}");
    for action in ["merge", "approved", "unapproved"] {
        let mut v: serde_json::Value = serde_json::from_slice(&fixture(Forge::Gitlab, "merge_request_open")).unwrap();
        v["object_attributes"]["action"] = action.into();
        assert!(matches!(
            parse(Forge::Gitlab, "Merge Request Hook", v.to_string().as_bytes()).unwrap(),
            ForgeEvent::Ignored { .. }
        ));
    }
}

// ---- Gitea / Forgejo ----

#[test]
fn gitea_push_branch() {
    let p = push(Forge::Gitea, "push", "push_branch");
    assert_eq!(
        p,
        PushEvent {
            git_ref: "refs/heads/develop".into(),
            before: Some("28e1879d029cb852e4844d9c718537df08844e03".into()),
            after: "bffeb74224043ba2feb48d137756c8a9331c449a".into(),
            actor: "gitea".into(),
            changed: strings(&["README.md", "hooks.md", "old.md"]),
        }
    );
}

#[test]
fn gitea_push_without_file_lists_has_unknown_changes() {
    let p = push(Forge::Gitea, "push", "push_branch_no_files");
    assert_eq!(p.after, "bffeb74224043ba2feb48d137756c8a9331c449a");
    assert_eq!(p.changed, None);
}

#[test]
fn gitea_push_new_branch_and_tag() {
    let p = push(Forge::Gitea, "push", "push_new_branch");
    assert_eq!(p.git_ref, "refs/heads/feature");
    assert_eq!(p.before, None);
    assert_eq!(p.changed, None);
    let t = push(Forge::Gitea, "push", "push_tag");
    assert_eq!(t.git_ref, "refs/tags/v1.0");
    assert_eq!(t.before, None);
    assert_eq!(t.after, "bffeb74224043ba2feb48d137756c8a9331c449a");
}

#[test]
fn gitea_deletions_are_ignored() {
    assert_eq!(ignored(Forge::Gitea, "push", "push_delete"), "ref deleted");
    assert_eq!(ignored(Forge::Gitea, "delete", "delete"), "ref deleted");
}

#[test]
fn gitea_pull_request_opened_from_fork() {
    let p = pr(Forge::Gitea, "pull_request", "pull_request_opened_fork");
    assert_eq!(
        p,
        PullRequestEvent {
            number: 1,
            action: "opened".into(),
            head_sha: "4ee2a2c4e08f1e6a4a4ff0b8a6a76c6d8d8a7a3c".into(),
            head_ref: "more-hooks".into(),
            base_ref: "master".into(),
            base_sha: Some("28e1879d029cb852e4844d9c718537df08844e03".into()),
            fork: true,
            author_write_access: None,
            actor: "forker".into(),
            fetch_ref: "refs/pull/1/head".into(),
            title: "Add more webhooks".into(),
        }
    );
}

#[test]
fn gitea_pull_request_synchronized_same_repo() {
    let p = pr(Forge::Gitea, "pull_request", "pull_request_synchronized");
    assert_eq!(p.number, 2);
    assert_eq!(p.action, "synchronize");
    assert_eq!(p.head_sha, "bffeb74224043ba2feb48d137756c8a9331c449a");
    assert_eq!(p.head_ref, "tidy");
    assert!(!p.fork);
    assert_eq!(p.actor, "gitea");
    assert_eq!(p.fetch_ref, "refs/pull/2/head");
    // The same delivery under its event type name.
    assert_eq!(pr(Forge::Gitea, "pull_request_sync", "pull_request_synchronized"), p);
}

#[test]
fn gitea_pull_request_closed_is_ignored() {
    let reason = ignored(Forge::Gitea, "pull_request", "pull_request_closed");
    assert!(reason.contains("closed"), "{reason}");
}

// ---- malformed payloads ----

#[test]
fn errors_name_the_missing_field() {
    let cases: &[(Forge, &str, &str, &str)] = &[
        (Forge::Github, "push", "after", "after"),
        (Forge::Github, "push", "ref", "ref"),
        (Forge::Gitlab, "Push Hook", "user_username", "user_username"),
        (Forge::Gitea, "push", "ref", "ref"),
    ];
    for &(forge, event, remove, named) in cases {
        let mut v: serde_json::Value = serde_json::from_slice(&fixture(forge, "push_branch")).unwrap();
        v.as_object_mut().unwrap().remove(remove);
        let err = parse(forge, event, v.to_string().as_bytes()).unwrap_err();
        assert!(err.message.contains(named), "{forge} {remove}: {err}");
    }
    let mut v: serde_json::Value = serde_json::from_slice(&fixture(Forge::Gitlab, "merge_request_open")).unwrap();
    v["object_attributes"].as_object_mut().unwrap().remove("last_commit");
    let err = parse(Forge::Gitlab, "Merge Request Hook", v.to_string().as_bytes()).unwrap_err();
    assert_eq!(err.message, "field object_attributes.last_commit.id is missing");

    let mut v: serde_json::Value = serde_json::from_slice(&fixture(Forge::Gitea, "pull_request_opened_fork")).unwrap();
    v["pull_request"]["head"]["sha"] = "not-a-sha".into();
    let err = parse(Forge::Gitea, "pull_request", v.to_string().as_bytes()).unwrap_err();
    assert!(err.message.contains("pull_request.head.sha"), "{err}");
}

#[test]
fn malformed_json_is_an_error() {
    for (forge, event) in [
        (Forge::Github, "push"),
        (Forge::Github, "ping"),
        (Forge::Gitlab, "Merge Request Hook"),
        (Forge::Gitea, "pull_request"),
    ] {
        assert!(parse(forge, event, b"{not json").is_err());
        assert!(parse(forge, event, b"[]").is_err());
    }
}

#[test]
fn bad_shas_and_refs_are_errors() {
    let base: serde_json::Value = serde_json::from_slice(&fixture(Forge::Github, "push_branch")).unwrap();
    for (field, value) in [
        ("after", "abc"),
        ("after", "zz1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c"),
        ("before", "123"),
        ("ref", "main"),
        ("ref", "refs/heads/a\nb"),
    ] {
        let mut v = base.clone();
        v[field] = value.into();
        let err = parse(Forge::Github, "push", v.to_string().as_bytes()).unwrap_err();
        assert!(err.message.contains(field), "{field}={value:?}: {err}");
    }
    // SHA-256 object ids are accepted.
    let mut v = base.clone();
    v["after"] = "ab".repeat(32).into();
    assert!(matches!(parse(Forge::Github, "push", v.to_string().as_bytes()).unwrap(), ForgeEvent::Push(_)));
}

/// The package's directory, read when the test runs: a test binary reused
/// from a build of another checkout (a shared target dir, as CI has) must
/// read this checkout's files.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo")
}
