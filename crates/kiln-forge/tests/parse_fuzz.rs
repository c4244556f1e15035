//! `parse` never panics, whatever the bytes.

use kiln_forge::{Forge, parse};
use proptest::prelude::*;

const EVENTS: &[(Forge, &str)] = &[
    (Forge::Github, "push"),
    (Forge::Github, "pull_request"),
    (Forge::Github, "ping"),
    (Forge::Github, "issues"),
    (Forge::Gitlab, "Push Hook"),
    (Forge::Gitlab, "Tag Push Hook"),
    (Forge::Gitlab, "Merge Request Hook"),
    (Forge::Gitea, "push"),
    (Forge::Gitea, "pull_request"),
    (Forge::Gitea, "delete"),
];

fn fixtures() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for forge in Forge::ALL {
        let dir = format!("{}/tests/fixtures/{}", manifest_dir(), forge.as_str());
        for entry in std::fs::read_dir(dir).unwrap() {
            out.push(std::fs::read(entry.unwrap().path()).unwrap());
        }
    }
    out
}

/// JSON values shaped roughly like payloads: objects with the keys the
/// parsers look for, holding values of every type.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let keys = prop::sample::select(vec![
        "ref",
        "before",
        "after",
        "deleted",
        "forced",
        "commits",
        "added",
        "modified",
        "removed",
        "pusher",
        "name",
        "login",
        "sender",
        "action",
        "number",
        "pull_request",
        "head",
        "base",
        "sha",
        "repo",
        "id",
        "full_name",
        "title",
        "author_association",
        "user_username",
        "total_commits_count",
        "total_commits",
        "object_attributes",
        "iid",
        "oldrev",
        "last_commit",
        "source_branch",
        "target_branch",
        "source_project_id",
        "target_project_id",
        "user",
        "username",
        "diff_refs",
        "base_sha",
    ]);
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(serde_json::Value::Null, serde_json::Value::Number)),
        "[0-9a-f]{40}".prop_map(serde_json::Value::from),
        Just(serde_json::Value::from("0000000000000000000000000000000000000000")),
        "refs/(heads|tags)/[a-z]{0,5}".prop_map(serde_json::Value::from),
        prop::sample::select(vec![
            "opened",
            "synchronize",
            "synchronized",
            "reopened",
            "open",
            "reopen",
            "update",
            "close"
        ])
        .prop_map(serde_json::Value::from),
        ".{0,8}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(keys.clone().prop_map(String::from), inner, 0..8)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn arbitrary_bytes(body in prop::collection::vec(any::<u8>(), 0..512)) {
        for &(forge, event) in EVENTS {
            let _ = parse(forge, event, &body);
        }
    }

    #[test]
    fn arbitrary_json(v in json_value()) {
        let body = v.to_string();
        for &(forge, event) in EVENTS {
            let _ = parse(forge, event, body.as_bytes());
        }
    }

    #[test]
    fn mutated_fixtures(index in any::<prop::sample::Index>(), flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let all = fixtures();
        let mut body = index.get(&all).clone();
        for (at, byte) in flips {
            let i = at.index(body.len());
            body[i] = byte;
        }
        for &(forge, event) in EVENTS {
            let _ = parse(forge, event, &body);
        }
    }

    #[test]
    fn fixtures_with_a_field_replaced(index in any::<prop::sample::Index>(), v in json_value()) {
        let all = fixtures();
        let mut doc: serde_json::Value = serde_json::from_slice(index.get(&all).as_slice()).unwrap();
        // Replace every top-level and nested-once field in turn.
        let keys: Vec<String> = doc.as_object().unwrap().keys().cloned().collect();
        for k in keys {
            let saved = doc[&k].clone();
            doc[&k] = v.clone();
            let body = doc.to_string();
            for &(forge, event) in EVENTS {
                let _ = parse(forge, event, body.as_bytes());
            }
            doc[&k] = saved;
        }
    }
}

/// The package's directory, read when the test runs: a test binary reused
/// from a build of another checkout (a shared target dir, as CI has) must
/// read this checkout's files.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo")
}
