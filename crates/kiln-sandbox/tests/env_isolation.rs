//! The agent's environment never reaches a step. A separate test binary
//! with one test, so that setting a variable races no other thread.
#![allow(unsafe_code)]

use kiln_sandbox::{Executor, HostConfig, HostExecutor, OutputStream, StepEvent, StepExit, StepRequest};

#[test]
fn steps_see_only_the_environment_built_for_them() {
    // SAFETY: the only test of this binary, run before any other thread
    // (the runtime is built below) reads the environment.
    unsafe { std::env::set_var("KILN_TEST_AGENT_SECRET", "hunter2") };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = HostConfig::new(dir.path().join("ws"), dir.path().join("attempt"), dir.path().join("pgids"));
        cfg.path = "/usr/bin:/bin".into();
        let exec = HostExecutor::new(cfg);
        exec.prepare().await.unwrap();
        let mut req = StepRequest { name: "env".into(), command: "env".into(), ..Default::default() };
        req.env.insert("KILN_JOB".into(), "build".into());
        let mut h = exec.exec(&req).await.unwrap();
        let mut stdout = Vec::new();
        loop {
            match h.next().await.unwrap() {
                StepEvent::Output { stream: OutputStream::Stdout, data } => stdout.extend(data),
                StepEvent::Output { .. } => {}
                StepEvent::Exited(e) => {
                    assert_eq!(e, StepExit::Code(0));
                    break;
                }
            }
        }
        let env = String::from_utf8(stdout).unwrap();
        assert!(!env.contains("hunter2"), "agent secret leaked: {env}");
        assert!(!env.contains("KILN_TEST_AGENT_SECRET"));
        let mut vars: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
        vars.retain(|v| *v != "PWD" && *v != "_" && *v != "SHLVL"); // set by sh itself
        vars.sort();
        assert_eq!(vars, ["CI", "HOME", "KILN_JOB", "LANG", "PATH", "TMPDIR"]);
        let home = dir.path().join("attempt").join("home");
        assert!(env.contains(&format!("HOME={}\n", home.display())));
        assert!(env.contains("PATH=/usr/bin:/bin\n") && env.contains("CI=true\n") && env.contains("LANG=C.UTF-8\n"));
        assert!(env.contains("KILN_JOB=build\n"));
        exec.cleanup().await.unwrap();
        assert!(!home.exists());
    });
}
