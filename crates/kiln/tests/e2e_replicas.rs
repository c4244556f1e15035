//! Several servers: clients and agents given several replica URLs move past
//! one that stops answering.

use kiln_api::{Client, SubmitRun};
use kiln_testkit::{KilnServer, TestRepo, wait_run};

const BIN: &str = env!("CARGO_BIN_EXE_kiln");

fn add_repo(s: &KilnServer, name: &str, repo: &TestRepo) {
    let out = s.cli().args(["repo", "add", name, "--url"]).arg(repo.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// An agent given several server URLs moves past one that does not answer.
#[tokio::test(flavor = "multi_thread")]
async fn agent_with_several_server_urls_skips_a_dead_one() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    // Nothing listens there once the listener is dropped.
    let urls = format!("http://{dead},{}", server.url);
    let agent = std::process::Command::new(BIN)
        .args(["agent", "--server", &urls, "--token", &server.agent_token, "--name", "multi", "--work-dir"])
        .arg(server.data_dir().join("agent-work"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _agent = Kill(agent);
    let repo = TestRepo::new(&[(".kiln/pipeline.yaml", "version: 1\njobs:\n  - name: hi\n    steps: [\"echo hi\"]\n")])
        .unwrap();
    add_repo(&server, "hi", &repo);
    let c = Client::new(&urls, &server.token);
    let r = c.submit_run("hi", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await;
    let r = match r {
        Ok(r) => r,
        // The first call may hit the dead URL; the client has moved on.
        Err(e) => {
            assert!(e.is_retryable(), "{e}");
            c.submit_run("hi", &SubmitRun { commit_sha: "main".into(), ..Default::default() }, None).await.unwrap()
        }
    };
    assert_eq!(c.base_url(), server.url, "the client moved to the live server");
    let run = wait_run(&c, &r.run_id, 60).await;
    assert_eq!(run.status, "success");
}
