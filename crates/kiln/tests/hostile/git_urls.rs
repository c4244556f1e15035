//! Finding 1: repository URLs reach `git` on the server and the agent.

use crate::{BIN, names_under};
use kiln_api::{Client, CreateRepo};
use kiln_testkit::KilnServer;

/// Finding 1: a clone URL is an argument of the server's `git fetch`. An
/// option-like URL ran a command on the server host at the next run; git's
/// `ext::` helper runs one by design. Both are refused at registration (422,
/// no repository stored), and no command ran.
#[tokio::test(flavor = "multi_thread")]
async fn option_like_and_helper_clone_urls_are_refused() {
    let server = KilnServer::start(BIN.as_ref(), &[]).unwrap();
    let c = Client::new(&server.url, &server.token);
    let marker = server.data.path().join("pwned");
    let hostile = [
        format!("--upload-pack=touch {};false", marker.display()),
        format!("ext::sh -c touch% {}", marker.display()),
        "-c core.sshCommand=touch".to_string(),
        "fd::3".to_string(),
    ];
    let before = names_under(&server.data_dir());
    for url in &hostile {
        let e = c
            .create_repo(&CreateRepo {
                team: None,
                forge: Default::default(),
                name: "evil".into(),
                clone_url: url.clone(),
                webhook_secret: None,
                secret_pools: None,
            })
            .await
            .expect_err(url);
        assert_eq!(e.status(), Some(422), "{url}: {e:?}");
    }
    assert!(c.list_repos().await.unwrap().is_empty(), "no repository was stored");
    assert!(!marker.exists(), "no command ran");
    assert_eq!(names_under(&server.data_dir()), before, "nothing changed on disk");
}
