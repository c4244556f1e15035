//! End to end on PostgreSQL: the real `kiln up` with `--database-url` on a
//! throwaway PostgreSQL server runs a real two-job pipeline, survives a
//! restart, and keeps no SQLite database beside. Skipped when PostgreSQL is
//! not installed, unless KILN_REQUIRE_POSTGRES=1.

use kiln_testkit::{KilnUp, TempPostgres, TestRepo, postgres_available};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[tokio::test(flavor = "multi_thread")]
async fn pipeline_runs_with_the_server_on_postgres() {
    if !postgres_available() {
        return;
    }
    let pg = TempPostgres::start().unwrap();
    let url = pg.create_database().await.unwrap();
    let repo = TestRepo::new(&[
        (
            ".kiln/pipeline.yaml",
            "version: 1\njobs:\n  - name: compile\n    steps:\n      - echo compiling at $KILN_COMMIT\n  \
             - name: test\n    steps:\n      - echo testing run $KILN_RUN_ID\n      - yes kiln-log-line | head -n 20000\n",
        ),
        ("README", "postgres\n"),
    ])
    .unwrap();
    let up = KilnUp::start_with(BIN.as_ref(), 2, &["--database-url", &url]).unwrap();
    let out = up.cli().args(["repo", "add", "demo", "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "repo add: {}", text(&out));
    let out = up.cli().args(["run", "--repo", "demo", "--commit", "main", "--follow"]).output().unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}\n{}\n{}", up.log(), pg.log());
    let head = repo.head().unwrap();
    assert!(all.contains(&format!("compiling at {head}")), "{all}");
    assert!(all.contains("testing run"), "{all}");
    let run_id =
        all.lines().find_map(|l| l.strip_prefix("run ").and_then(|r| r.strip_suffix(" accepted"))).unwrap().to_string();
    // The metadata lives in PostgreSQL, not in a SQLite file in the data dir.
    assert!(!up.data_dir().join("kiln.db").exists());
    // The log bytes do not (issue 47): the journal holds their index, the
    // object store the bytes, and `kiln logs` reads them back from there.
    let out = up.cli().args(["logs", &run_id]).output().unwrap();
    assert!(out.status.success() && text(&out).contains(&format!("compiling at {head}")), "{}", text(&out));
    let db = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&url).await.unwrap();
    // A chunk over 16 KiB keeps no byte in the database; a small one (the
    // echo lines) keeps its few in its row.
    let (bulk_bytes, in_objects, small_bytes): (i64, i64, i64) = sqlx::query_as(
        "SELECT COALESCE(SUM(length(data)) FILTER (WHERE length > 16384), 0)::BIGINT, \
         COALESCE(SUM(length) FILTER (WHERE seg IS NOT NULL), 0)::BIGINT, \
         COALESCE(SUM(length(data)) FILTER (WHERE length <= 16384), 0)::BIGINT \
         FROM log_chunks WHERE stream IN ('stdout', 'stderr')",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(bulk_bytes, 0, "no bulk step output in the database");
    assert!(in_objects >= 100_000, "the 280 KB of `yes` are in log objects: {in_objects} bytes");
    assert!(small_bytes < 20_000, "only small chunks' bytes in rows: {small_bytes}");
    let lines = text(&out).lines().filter(|l| l.ends_with("kiln-log-line")).count();
    assert_eq!(lines, 20_000, "`kiln logs` reads every line back");
    let segments = up.data_dir().join("objects/objects/logs/segments");
    assert!(std::fs::read_dir(&segments).map(|d| d.count()).unwrap_or(0) >= 1, "{}", segments.display());
    db.close().await;

    // A new server process (with a new data dir) on the same database sees
    // the finished run.
    drop(up);
    let up = KilnUp::start_with(BIN.as_ref(), 0, &["--database-url", &url]).unwrap();
    let st = up.cli().args(["status", &run_id, "--json"]).output().unwrap();
    assert!(st.status.success(), "{}\n{}", text(&st), up.log());
    let run: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(run["status"], "success", "{run}");
    assert_eq!(run["commit_sha"], head);
    let jobs = run["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    for j in jobs {
        assert_eq!(j["status"], "success", "{j}");
        assert_eq!(j["attempts"][0]["outcome"], "success", "{j}");
    }
}
