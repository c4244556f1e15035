//! The spec's illustrative workflow (spec 000 §5) parses unchanged, and the
//! canonical hash ignores presentation but not content.

use kiln_workflow::{Image, parse};

const SPEC_EXAMPLE: &str = include_str!("fixtures/valid/spec-example.yaml");

#[test]
fn spec_example_parses() {
    let w = parse(SPEC_EXAMPLE).unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(w.version, 1);
    assert_eq!(w.jobs.len(), 2);

    let compile = &w.jobs[0];
    assert_eq!(compile.name, "compile");
    assert!(compile.needs.is_empty());
    assert_eq!(compile.image, Some(Image::Ref { reference: "registry.example.com/ci/jdk17-maven:approved".into() }));
    assert_eq!(compile.steps.len(), 1);
    assert_eq!(compile.steps[0].run, "./ci/build.sh");
    let cache = compile.cache.as_ref().unwrap();
    assert_eq!(cache.kind, "dependencies");
    assert_eq!(cache.version, "deps-v1");
    assert_eq!(cache.inputs, ["ci/dependencies.lock"]);
    assert_eq!(cache.paths, ["/work/cache/maven"]);
    assert_eq!(compile.artifacts.publish.len(), 1);
    assert_eq!(compile.artifacts.publish[0].name, "app");
    assert_eq!(compile.artifacts.publish[0].path, "target/app.jar");
    assert_eq!(compile.retry, 0);
    assert_eq!(compile.timeout_secs, None);

    let it = w.job("integration-test").unwrap();
    assert_eq!(it.needs, ["compile"]);
    assert_eq!(it.artifacts.restore.len(), 1);
    let restore = &it.artifacts.restore[0];
    assert_eq!(restore.from_job, "compile");
    assert_eq!(restore.name, "app");
    assert_eq!(restore.path, "inputs/app.jar");
    assert_eq!(it.steps[0].run, "./ci/integration-test.sh inputs/app.jar");
}

#[test]
fn hash_ignores_formatting_comments_and_key_order() {
    let base = parse(SPEC_EXAMPLE).unwrap().canonical_hash();
    assert_eq!(base.len(), 64);

    // Same content: comments, flow style, different key order, quoting,
    // blank lines and a document marker.
    let reformatted = r#"---
# The spec's example, rewritten.
jobs:
  - steps: ["./ci/build.sh"]   # one step
    name: compile
    artifacts: {publish: [{path: target/app.jar, name: app}]}
    cache: {paths: [/work/cache/maven], inputs: [ci/dependencies.lock], version: 'deps-v1', kind: dependencies}
    image: {ref: "registry.example.com/ci/jdk17-maven:approved"}

  - name: "integration-test"
    steps:
      - run: ./ci/integration-test.sh inputs/app.jar
    artifacts:
      restore: [{name: app, path: inputs/app.jar, from_job: compile}]
    image:
      ref: registry.example.com/ci/jdk21-gradle:approved
    cache:
      version: deps-v1
      kind: dependencies
      inputs:
        - ci/dependencies.lock
      paths:
        - /work/cache/gradle
version: 1
"#;
    let w = parse(reformatted).unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(w.canonical_hash(), base);

    // Making the implicit sequential dependency explicit is the same graph.
    let explicit =
        SPEC_EXAMPLE.replace("  - name: integration-test\n", "  - name: integration-test\n    needs: [compile]\n");
    assert_ne!(explicit, SPEC_EXAMPLE);
    assert_eq!(parse(&explicit).unwrap().canonical_hash(), base);
}

#[test]
fn hash_changes_with_content() {
    let base = parse(SPEC_EXAMPLE).unwrap().canonical_hash();
    let changed = [
        SPEC_EXAMPLE.replace("./ci/build.sh", "./ci/build.sh --release"),
        SPEC_EXAMPLE.replace("      - ./ci/build.sh\n", "      - ./ci/build.sh\n      - ./ci/lint.sh\n"),
        SPEC_EXAMPLE.replace("deps-v1", "deps-v2"),
        SPEC_EXAMPLE.replace("jdk17-maven", "jdk17-maven2"),
        SPEC_EXAMPLE.replace("  - name: integration-test\n", "  - name: integration-test\n    retry: 1\n"),
    ];
    for src in &changed {
        assert_ne!(src, SPEC_EXAMPLE);
        let hash = parse(src).unwrap_or_else(|d| panic!("{d}")).canonical_hash();
        assert_ne!(hash, base, "content change kept the hash:\n{src}");
    }
}

#[test]
fn sequential_default_and_explicit_graph() {
    let seq =
        parse("version: 1\njobs:\n  - {name: a, steps: [x]}\n  - {name: b, steps: [x]}\n  - {name: c, steps: [x]}\n")
            .unwrap();
    let needs: Vec<_> = seq.jobs.iter().map(|j| j.needs.clone()).collect();
    assert_eq!(needs, [vec![], vec!["a".to_string()], vec!["b".to_string()]]);

    // Once any job declares `needs`, the graph is exactly as written.
    let explicit = parse(
        "version: 1\njobs:\n  - {name: a, steps: [x]}\n  - {name: b, steps: [x]}\n  - {name: c, steps: [x], needs: a}\n",
    )
    .unwrap();
    let needs: Vec<_> = explicit.jobs.iter().map(|j| j.needs.clone()).collect();
    assert_eq!(needs, [vec![], vec![], vec!["a".to_string()]]);
}

#[test]
fn diagnostics_display_as_line_col_message() {
    let d = parse("version: 1\njobs:\n  - name: a\n    steps: [x]\n    retry: 11\n").unwrap_err();
    assert_eq!(d.to_string(), "5:12: `retry` of job `a` is `11`; it must be from 0 to 10");
    let d = parse("version: 2\njobs: []\n").unwrap_err();
    assert_eq!(d.0.len(), 2);
    assert_eq!(
        d.to_string(),
        "1:10: unsupported workflow `version: 2`; this version of Kiln understands `version: 1`\n\
         2:7: `jobs` is empty; add at least one job with a `name` and `steps`"
    );
}

#[test]
fn crlf_line_endings_and_bom_are_accepted() {
    let base = parse(SPEC_EXAMPLE).unwrap().canonical_hash();
    let crlf = SPEC_EXAMPLE.replace('\n', "\r\n");
    assert_eq!(parse(&crlf).unwrap_or_else(|d| panic!("{d}")).canonical_hash(), base);
    let bom = format!("\u{feff}{SPEC_EXAMPLE}");
    assert_eq!(parse(&bom).unwrap_or_else(|d| panic!("{d}")).canonical_hash(), base);
}

/// The new optional fields (matrix, quorum, condition, concurrency) are left
/// out of the canonical encoding when unused, so definitions stored before
/// they existed keep their hash. Pinned values computed before the change.
#[test]
fn hashes_of_existing_workflows_are_unchanged() {
    assert_eq!(
        parse(SPEC_EXAMPLE).unwrap().canonical_hash(),
        "68f2f5d2edf567830848ff490b87bd648893150dafb62893952f9194e83d7134"
    );
    let pinned = [
        ("all-fields", "b13f887d1fefa28b10315b3cf2b7d913a2bbbd9219f13a6f8b7e6fdbf27c518f"),
        ("explicit-graph", "7c79422a540a915f8326037755ad335064768ad823ce1ef019854c03506d9e6d"),
        ("flow-style", "ccc6af249bce9964d2b4a1b89b4f7f348fd22e96b630f588548fcd8f6638206c"),
        ("sequential", "3478f5eafa9d1ee479bd84fff8367281b0e5e4837349d1ab55897c385352c400"),
    ];
    for (name, hash) in pinned {
        let path =
            format!("{}/tests/fixtures/valid/{name}.yaml", std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo"));
        let src = std::fs::read_to_string(path).unwrap();
        assert_eq!(parse(&src).unwrap().canonical_hash(), hash, "{name}");
    }
    // A definition stored before the new fields existed still deserialises.
    let old = r#"{"version":1,"jobs":[{"name":"a","steps":[{"run":"x"}],"needs":[],"artifacts":{"publish":[],"restore":[]},"env":{},"retry":0,"runs_on":{}}]}"#;
    let w: kiln_workflow::Workflow = serde_json::from_str(old).unwrap();
    assert_eq!(w.concurrency, None);
    assert_eq!((w.jobs[0].matrix.as_ref(), w.jobs[0].quorum, w.jobs[0].condition.as_ref()), (None, None, None));
}

#[test]
fn new_fields_change_the_hash() {
    let base = parse(SPEC_EXAMPLE).unwrap().canonical_hash();
    let changed = [
        SPEC_EXAMPLE.replace("  - name: integration-test\n", "  - name: integration-test\n    if: branch == 'main'\n"),
        SPEC_EXAMPLE.replace("  - name: integration-test\n", "  - name: integration-test\n    concurrency: it\n"),
        SPEC_EXAMPLE
            .replace("  - name: integration-test\n", "  - name: integration-test\n    needs-policy: {quorum: 1}\n"),
        format!("concurrency: ci\n{SPEC_EXAMPLE}"),
    ];
    for src in &changed {
        let hash = parse(src).unwrap_or_else(|d| panic!("{d}\n{src}")).canonical_hash();
        assert_ne!(hash, base, "{src}");
    }
}
