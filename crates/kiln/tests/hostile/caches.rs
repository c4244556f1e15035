//! Issue 39, items 1 and 13: what a job packs for others (caches, build
//! contexts, artifacts) with real `kiln up` / `kiln server` / `kiln agent`
//! processes. The test runner is root, so the agents are root and the host
//! executor's steps run as `nobody`: the attacker is the step (or the
//! repository it checks out), the agent is the one that would follow its
//! links.

use crate::{BIN, containers_available, engine_url, registry};
use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnAgent, KilnServer, KilnUp, TestRepo};
use std::path::PathBuf;
use std::process::Command;

/// The `kiln` under test: this build, or `KILN_HOSTILE_BIN` (how these
/// tests were checked against the build before the fix, where they fail).
fn bin() -> PathBuf {
    std::env::var_os("KILN_HOSTILE_BIN").map_or_else(|| PathBuf::from(BIN), PathBuf::from)
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{name}{}x{nanos}", std::process::id())
}

/// Registers `repo` under a fresh name.
async fn register(c: &Client, repo: &TestRepo) -> String {
    let name = unique("r");
    c.create_repo(&kiln_api::CreateRepo {
        team: None,
        forge: Default::default(),
        name: name.clone(),
        clone_url: repo.path().display().to_string(),
        webhook_secret: None,
        secret_pools: None,
    })
    .await
    .unwrap();
    name
}

/// Runs `main` of `repo_name` to its end; the run and its whole log.
async fn run(c: &Client, cli: Command, repo_name: &str) -> (kiln_api::Run, String) {
    run_workflow(c, cli, repo_name, None).await
}

/// [`run`] of the workflow at `path` (None: the default one).
async fn run_workflow(c: &Client, cli: Command, repo_name: &str, path: Option<&str>) -> (kiln_api::Run, String) {
    let body = SubmitRun { commit_sha: "main".into(), workflow_path: path.map(str::to_string), ..Default::default() };
    let r = c.submit_run(repo_name, &body, None).await.unwrap();
    let run = kiln_testkit::wait_run(c, &r.run_id, 180).await;
    let mut cli = cli;
    let out = cli.args(["logs", &r.run_id]).output().unwrap();
    (run, String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

fn job<'a>(run: &'a kiln_api::Run, name: &str) -> &'a kiln_api::Job {
    run.jobs.iter().find(|j| j.name == name).unwrap_or_else(|| panic!("no job {name}"))
}

fn message(run: &kiln_api::Run, name: &str) -> String {
    job(run, name).attempts.last().and_then(|a| a.message.clone()).unwrap_or_default()
}

/// What a step printed between `begin-list` and `end-list` (spelt apart in
/// the script, so the step's own text never matches).
fn listing(log: &str) -> String {
    let Some((_, rest)) = log.split_once("begin-list\n") else { panic!("no listing in the log:\n{log}") };
    rest.split("end-list").next().unwrap_or_default().to_string()
}

/// A job whose step lists what its cache restored, then makes the cache
/// path (or a directory on its way) a link: `make_link` is the attack.
fn link_pipeline(image: Option<&str>, path: &str, make_link: &str) -> String {
    let image = image.map(|i| format!("    image: {i}\n")).unwrap_or_default();
    format!(
        "version: 1\njobs:\n  - name: probe\n{image}    cache: {{kind: deps, version: \"1\", inputs: [lock.txt], paths: [{path}]}}\n    \
         steps:\n      - |\n        echo \"be\"\"gin-list\"\n        find deps up -maxdepth 3 2>/dev/null | sort || true\n        \
         echo \"en\"\"d-list\"\n        rm -rf deps up\n        {make_link}\n        ls -la\n"
    )
}

/// The attack of item 1, twice: run 1 makes the cache path a link out of
/// the workspace and succeeds (so its cache would be saved); run 2 lists
/// what it restored. `marker` is a file name of the linked place that must
/// never show up in run 2's listing.
async fn link_attack(
    c: &Client,
    cli: impl Fn() -> Command,
    image: Option<&str>,
    what: &str,
    path: &str,
    make_link: &str,
    marker: &str,
) {
    let yaml = link_pipeline(image, path, make_link);
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &yaml), ("lock.txt", "v1\n")]).unwrap();
    let name = register(c, &repo).await;
    let (r1, log1) = run(c, cli(), &name).await;
    assert_eq!(r1.status.as_str(), "success", "{what}: the job's outcome does not change:\n{log1}");
    let info = job(&r1, "probe").cache.clone().expect("a cache report");
    let saved = info.saved.clone().unwrap_or_default();
    assert!(saved.starts_with("not saved"), "{what}: the link's target was saved ({saved}):\n{log1}");
    assert!(
        log1.contains("cache: not saved") && log1.contains("symbolic link"),
        "{what}: a clear line in the job's log:\n{log1}"
    );
    let (r2, log2) = run(c, cli(), &name).await;
    assert_eq!(r2.status.as_str(), "success", "{what}:\n{log2}");
    let listing = listing(&log2);
    assert!(!listing.contains(marker), "{what}: run 2 restored the link's target:\n{log2}");
    assert_eq!(job(&r2, "probe").cache.as_ref().map(|c| c.result.as_str()), Some("miss"), "{what}:\n{log2}");
}

/// Item 1, host executor: a step running as `nobody` made its cache path a
/// link to `/etc`, to the server's data directory, and a directory on the
/// way to it a link to `/`; the (root) agent packed what the links pointed
/// to and the next run restored `/etc/shadow` or `admin.token` into its
/// workspace. Now the save is refused with a line in the log, the job
/// still succeeds, and the next run restores nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_cache_path_linked_out_of_the_workspace_is_never_packed_on_the_host() {
    let up = KilnUp::start(&bin(), 1).unwrap();
    let data = up.data_dir();
    assert!(data.join("admin.token").is_file(), "the data dir holds the admin token");
    let c = Client::new(&up.url, &up.token);
    let to_data = format!("ln -s {} deps", data.display());
    for (what, path, make_link, marker) in [
        ("a link to /etc", "deps", "ln -s /etc deps", "deps/passwd"),
        ("a link to the data directory", "deps", to_data.as_str(), "deps/admin.token"),
        ("a link on the way", "up/etc", "ln -s / up", "up/etc/passwd"),
    ] {
        link_attack(&c, || up.cli(), None, what, path, make_link, marker).await;
    }
}

/// A container agent with a name of this test process (its containers are
/// labelled, and reaped, by it).
fn container_agent(s: &KilnServer, name: &str) -> (KilnAgent, Reap) {
    let engine = engine_url();
    let name = format!("{name}-{}", std::process::id());
    let agent = s.agent(&name, &["--executor", "container", "--engine", engine.as_str()]).unwrap();
    (agent, Reap(name))
}

/// Removes the containers an agent left when the test ends.
struct Reap(String);

impl Drop for Reap {
    fn drop(&mut self) {
        let label = format!("label=kiln.agent={}", self.0);
        let Ok(out) = Command::new("podman").args(["ps", "-a", "-q", "--filter", &label]).output() else { return };
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("podman").args(["rm", "-f", "-t", "0", id]).output();
        }
    }
}

/// Item 1, container executor: the same links made inside the job's
/// container (the workspace is a host directory the agent packs).
#[tokio::test(flavor = "multi_thread")]
async fn a_cache_path_linked_out_of_the_workspace_is_never_packed_from_a_container() {
    if !containers_available() {
        return;
    }
    let s = KilnServer::start(&bin(), &["--insecure-registry", &registry(), "--retry-base", "100ms"]).unwrap();
    let (_agent, _reap) = container_agent(&s, "caches-ctr");
    let data = s.data_dir();
    assert!(data.join("admin.token").is_file(), "the data dir holds the admin token");
    let c = Client::new(&s.url, &s.token);
    let image = format!("{}/kiln-test/base:latest", registry());
    let to_data = format!("ln -s {} deps", data.display());
    for (what, path, make_link, marker) in [
        ("a link to /etc", "deps", "ln -s /etc deps", "deps/passwd"),
        ("a link to the data directory", "deps", to_data.as_str(), "deps/admin.token"),
    ] {
        link_attack(&c, || s.cli(), Some(&image), what, path, make_link, marker).await;
    }
}

/// Item 1, build contexts: a repository whose `context:` is a committed
/// link to `/etc` (or below a link to `/`) had the agent tar the host's
/// `/etc` for the engine, and the image held `/etc/passwd`. Now the build
/// is refused, naming the link, and nothing of the host reaches a step.
#[tokio::test(flavor = "multi_thread")]
async fn a_build_context_linked_out_of_the_checkout_is_refused() {
    if !containers_available() {
        return;
    }
    let s = KilnServer::start(&bin(), &["--insecure-registry", &registry(), "--retry-base", "100ms"]).unwrap();
    let (_agent, _reap) = container_agent(&s, "caches-ctx");
    let c = Client::new(&s.url, &s.token);
    let reg = registry();
    for (what, context) in [("a linked context", "ctx"), ("a context below a link", "up/etc")] {
        let yaml = format!(
            "version: 1\njobs:\n  - name: build\n    image: {{dockerfile: ci/Dockerfile, context: {context}}}\n    \
             steps:\n      - cat /leaked\n"
        );
        let dockerfile = format!("FROM {reg}/kiln-test/base:latest\nCOPY passwd /leaked\n");
        let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &yaml), ("ci/Dockerfile", &dockerfile)]).unwrap();
        std::os::unix::fs::symlink("/etc", repo.path().join("ctx")).unwrap();
        std::os::unix::fs::symlink("/", repo.path().join("up")).unwrap();
        repo.commit(&[], "links out of the checkout").unwrap();
        let name = register(&c, &repo).await;
        let (r, log) = run(&c, s.cli(), &name).await;
        assert_eq!(r.status.as_str(), "failed", "{what}: built from the host's /etc:\n{log}");
        let m = message(&r, "build");
        assert!(m.contains("symbolic link") || log.contains("symbolic link"), "{what}: {m}\n{log}");
        assert!(!log.contains("root:x:0:0"), "{what}: the host's /etc/passwd reached the step:\n{log}");
    }
}

/// Item 1, restore side: a repository that commits a link where a cache
/// path's parent should be (`c -> <outside>`, cache path `c/deps`) had the
/// root agent make its staging directory and restore (replacing what was
/// there) outside the workspace. Now the restore is refused with a line in
/// the log, the job runs cold, and nothing is made outside.
#[tokio::test(flavor = "multi_thread")]
async fn a_restore_through_a_committed_link_makes_nothing_outside_the_workspace() {
    let up = KilnUp::start(&bin(), 1).unwrap();
    let c = Client::new(&up.url, &up.token);
    let outside = tempfile::tempdir().unwrap();
    let yaml = "version: 1\njobs:\n  - name: probe\n    cache: {kind: deps, version: \"1\", inputs: [lock.txt], paths: [c/deps]}\n    \
                steps:\n      - mkdir -p c/deps && echo built > c/deps/file || true\n";
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", yaml), ("lock.txt", "v1\n")]).unwrap();
    let name = register(&c, &repo).await;
    let (r1, log1) = run(&c, up.cli(), &name).await;
    assert_eq!(r1.status.as_str(), "success", "{log1}");
    assert_eq!(job(&r1, "probe").cache.as_ref().and_then(|c| c.saved.clone()).as_deref(), Some("saved"), "{log1}");
    std::os::unix::fs::symlink(outside.path(), repo.path().join("c")).unwrap();
    repo.commit(&[], "c is a link out of the checkout").unwrap();
    let (r2, log2) = run(&c, up.cli(), &name).await;
    assert_eq!(r2.status.as_str(), "success", "{log2}");
    assert!(log2.contains("symbolic link"), "a clear line in the log:\n{log2}");
    let made: Vec<_> = std::fs::read_dir(outside.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(made.is_empty(), "restored outside the workspace: {made:?}\n{log2}");
}

const SECRET: &str = "tok-9c1e-PUBLISHED-42";

fn secret_set(cli: Command, repo: &str, name: &str, value: &str) {
    let mut cli = cli;
    let mut set = cli.args(["secret", "set", repo, name]).stdin(std::process::Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(set.stdin.as_mut().unwrap(), format!("{value}\n").as_bytes()).unwrap();
    assert!(set.wait().unwrap().success());
}

/// Item 13: a trusted run's steps write the job's secret into a published
/// file, into a file of a published directory (base64), and into a cache
/// path. Each artifact is refused (the job fails naming the file and the
/// secret's name, never its value) and nothing is bound; the cache is not
/// saved (with a log line naming the file) and the next run restores
/// nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_secret_is_never_published_in_an_artifact_or_a_cache() {
    let up = KilnUp::start(&bin(), 1).unwrap();
    let c = Client::new(&up.url, &up.token);
    let file = "version: 1\njobs:\n  - name: file\n    secrets: [DEPLOY_TOKEN]\n    steps:\n      - mkdir -p out && echo \"token=$DEPLOY_TOKEN\" > out/app.conf\n    \
                artifacts:\n      publish:\n        - name: conf\n          path: out/app.conf\n";
    let tree = "version: 1\njobs:\n  - name: tree\n    secrets: [DEPLOY_TOKEN]\n    steps:\n      - mkdir -p site/sub && echo fine > site/index.html && printf %s \"$DEPLOY_TOKEN\" | base64 > site/sub/b64.txt\n    \
                artifacts:\n      publish:\n        - name: site\n          path: site\n";
    let cached = "version: 1\njobs:\n  - name: cached\n    secrets: [DEPLOY_TOKEN]\n    cache: {kind: deps, version: \"1\", inputs: [lock.txt], paths: [deps]}\n    \
                steps:\n      - echo \"be\"\"gin-list\"; find deps 2>/dev/null || true; echo \"en\"\"d-list\"\n      - mkdir -p deps && echo fine > deps/a && echo \"$DEPLOY_TOKEN\" > deps/creds\n";
    let repo = TestRepo::new(&[
        (".kiln/file.yaml", file),
        (".kiln/tree.yaml", tree),
        (".kiln/pipeline.yaml", cached),
        ("lock.txt", "v1\n"),
    ])
    .unwrap();
    let name = register(&c, &repo).await;
    secret_set(up.cli(), &name, "DEPLOY_TOKEN", SECRET);

    for (j, file) in [("file", "out/app.conf"), ("tree", "site/sub/b64.txt")] {
        let (r, log) = run_workflow(&c, up.cli(), &name, Some(&format!(".kiln/{j}.yaml"))).await;
        assert!(!log.contains(SECRET), "{log}");
        assert_eq!(job(&r, j).status.as_str(), "failed", "{j}: published a secret:\n{log}");
        let m = message(&r, j);
        assert!(m.contains(file) && m.contains("DEPLOY_TOKEN") && !m.contains(SECRET), "{j}: {m}");
        assert!(job(&r, j).artifacts.is_empty(), "{j}: nothing bound");
    }
    let (r1, log1) = run(&c, up.cli(), &name).await;
    assert!(!log1.contains(SECRET), "{log1}");
    let cached = job(&r1, "cached");
    assert_eq!(cached.status.as_str(), "success", "a refused cache save does not fail the job:\n{log1}");
    let saved = cached.cache.as_ref().and_then(|c| c.saved.clone()).unwrap_or_default();
    assert!(saved.starts_with("not saved") && saved.contains("deps/creds"), "{saved}");
    assert!(log1.contains("cache: not saved: `deps/creds` holds the value of secret `DEPLOY_TOKEN`"), "{log1}");
    // The run's artifacts, as the API lists them: none.
    let raw = reqwest::Client::new()
        .get(format!("{}/v1/workflow-runs/{}", up.url, r1.id))
        .bearer_auth(&up.token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!raw.contains(SECRET), "{raw}");

    let (r2, log2) = run(&c, up.cli(), &name).await;
    let cached = job(&r2, "cached");
    assert_eq!(cached.cache.as_ref().map(|c| c.result.as_str()), Some("miss"), "{log2}");
    let listing = listing(&log2);
    assert!(!listing.contains("creds"), "the next run restored the secret:\n{log2}");
}

/// Issue 41, item 4 kept issue 13's rule: a file whose every hard link is
/// in the workspace is published (cargo's `target/release/<bin>`), one
/// linked to a file outside it is still refused. The step (running as
/// `nobody`) links a file it made in /var/tmp (the same filesystem as the
/// workspace here) into the workspace, as a single artifact and inside a
/// published directory: the job fails naming the file, nothing is bound,
/// and the outside file keeps its mode (the freeze never touched it).
#[tokio::test(flavor = "multi_thread")]
async fn a_hard_link_to_a_file_outside_the_workspace_is_still_refused() {
    use std::os::unix::fs::PermissionsExt;
    let up = KilnUp::start(&bin(), 1).unwrap();
    let c = Client::new(&up.url, &up.token);
    // /var/tmp: on the workspace's filesystem here (the step's /tmp is its own).
    let outside = format!("/var/tmp/kiln-outside-{}", unique("h"));
    let wf = format!(
        "version: 1\njobs:\n  - name: single\n    needs: []\n    steps:\n      - |\n        set -e\n        \
         echo outside > {outside}-1 && chmod 600 {outside}-1\n        mkdir -p out && ln {outside}-1 out/app\n    \
         artifacts:\n      publish:\n        - {{name: app, path: out/app}}\n  - name: tree\n    needs: []\n    \
         steps:\n      - |\n        set -e\n        echo outside > {outside}-2 && chmod 600 {outside}-2\n        \
         mkdir -p site && echo fine > site/index.html && ln {outside}-2 site/stolen\n    \
         artifacts:\n      publish:\n        - {{name: site, path: site}}\n"
    );
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", &wf)]).unwrap();
    let name = register(&c, &repo).await;
    let (r, log) = run(&c, up.cli(), &name).await;
    for (j, file, n) in [("single", "`out/app`", 1), ("tree", "`stolen`", 2)] {
        assert_eq!(job(&r, j).status.as_str(), "failed", "{j}: published a file linked from outside:\n{log}");
        let m = message(&r, j);
        assert!(
            m.contains(file) && m.contains("2 hard links and only 1 of them is in the workspace"),
            "{j}: {m}\n{log}"
        );
        assert!(job(&r, j).artifacts.is_empty(), "{j}: nothing bound");
        let path = format!("{outside}-{n}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{j}: the outside file was not made read-only");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "outside\n");
        let _ = std::fs::remove_file(&path);
    }
}
