//! Where a client command's server and token come from (issue 17): the
//! profile that `kiln login` writes, and a local `kiln up` found by itself.
//!
//! Precedence, for the server and the token each:
//! 1. flags (`--server`, `--token-file`),
//! 2. the environment (`KILN_SERVER`, `KILN_TOKEN`),
//! 3. the profile's context (`--context NAME` / `KILN_CONTEXT`, else its
//!    `current` one) in `$XDG_CONFIG_HOME/kiln/config.toml` (fallback
//!    `~/.config/kiln/config.toml`),
//! 4. a running `kiln up` on this machine: `./kiln-data` first, else the one
//!    registered under `$XDG_STATE_HOME/kiln/up/` (fallback
//!    `~/.local/state/kiln/up/`),
//! 5. the server `http://127.0.0.1:7070` (with no token: an error saying
//!    how to get one).
//!
//! A token is only ever sent to the server it was saved with: a context's
//! (or a local `kiln up`'s) token is used only when the server chosen above
//! is that context's (or that `kiln up`'s), so `KILN_SERVER=https://other`
//! never receives the profile's token.

use kiln_cmd::{Failure, usage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The server when nothing names one.
pub(super) const DEFAULT_SERVER: &str = "http://127.0.0.1:7070";

/// `config.toml`: named contexts and the current one.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub(super) struct Profile {
    /// The context used when neither `--context` nor `KILN_CONTEXT` names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
}

/// One server and the token to use with it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(super) struct Context {
    pub server: String,
    pub token: String,
}

fn env_path(var: &str) -> Option<PathBuf> {
    // The XDG base directory spec: a relative path is invalid and ignored.
    std::env::var_os(var).map(PathBuf::from).filter(|p| p.is_absolute())
}

fn home() -> Option<PathBuf> {
    env_path("HOME")
}

/// `$XDG_CONFIG_HOME/kiln/config.toml`, or `~/.config/kiln/config.toml`.
pub(super) fn config_path() -> Result<PathBuf, Failure> {
    env_path("XDG_CONFIG_HOME")
        .or_else(|| home().map(|h| h.join(".config")))
        .map(|d| d.join("kiln").join("config.toml"))
        .ok_or_else(|| usage("neither XDG_CONFIG_HOME nor HOME is set: there is no place for the CLI's profile"))
}

/// `$XDG_STATE_HOME/kiln/up`, or `~/.local/state/kiln/up`: one file per
/// running `kiln up` (see [`UpState`]).
pub(super) fn up_registry() -> Option<PathBuf> {
    env_path("XDG_STATE_HOME")
        .or_else(|| home().map(|h| h.join(".local").join("state")))
        .map(|d| d.join("kiln").join("up"))
}

impl Profile {
    /// The profile at `path`; none there is an empty one.
    pub(super) fn load(path: &Path) -> Result<Profile, Failure> {
        match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text).map_err(|e| {
                usage(format!("{}: {e}\nfix or remove the file (kiln login rewrites it)", path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Profile::default()),
            Err(e) => Err(usage(format!("{}: {e}", path.display()))),
        }
    }

    /// Write the profile to `path`, mode 0600 (it holds tokens), its
    /// directory 0700: written to a temporary file beside it and renamed
    /// over it, so a reader sees the old profile or the new one, never half.
    pub(super) fn save(&self, path: &Path) -> Result<(), Failure> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        let fail = |e: std::io::Error| usage(format!("{}: {e}", path.display()));
        let dir = path.parent().ok_or_else(|| usage(format!("{}: no parent directory", path.display())))?;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(fail)?;
        let text = toml::to_string_pretty(self).map_err(|e| usage(format!("{}: {e}", path.display())))?;
        let tmp = dir.join(format!(".config.toml.{}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            // The mode of `open` applies to a new file only; an old one keeps its own.
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            f.write_all(b"# Written by `kiln login`: contexts (server and API token) of the kiln CLI.\n")?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            fail(e)
        })
    }

    /// The context to use: `name` (which must exist), else the current one.
    fn pick(&self, name: Option<&str>, path: &Path) -> Result<Option<&Context>, Failure> {
        match name {
            Some(n) => self.contexts.get(n).map(Some).ok_or_else(|| {
                usage(format!(
                    "no context `{n}` in {} (contexts: {}); add it with `kiln login URL --context {n}`",
                    path.display(),
                    self.names()
                ))
            }),
            None => Ok(self.current.as_deref().and_then(|c| self.contexts.get(c))),
        }
    }

    pub(super) fn names(&self) -> String {
        if self.contexts.is_empty() {
            "none".into()
        } else {
            self.contexts.keys().cloned().collect::<Vec<_>>().join(", ")
        }
    }
}

/// What a running `kiln up` records, in `DATA_DIR/kiln-up.json` and in its
/// entry of the registry ([`up_registry`]), while it holds the data
/// directory's lock (`DATA_DIR/kiln-up.lock`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(super) struct UpState {
    pub pid: u32,
    pub url: String,
    /// Absolute.
    pub data_dir: PathBuf,
}

/// The state file in a data directory.
pub(super) const UP_STATE_FILE: &str = "kiln-up.json";
/// The lock a running `kiln up` holds (see `up.rs`).
pub(super) const UP_LOCK_FILE: &str = "kiln-up.lock";

/// A running local `kiln up` and its admin token.
#[derive(Debug, Clone)]
pub(super) struct LocalUp {
    pub state: UpState,
    pub token: String,
}

/// Whether a `kiln up` holds the lock of `data_dir` now. Taking the lock
/// (shared, without waiting) succeeds only when no process holds it: the
/// kernel drops a lock when its holder dies, however it dies.
fn is_locked(data_dir: &Path) -> bool {
    let Ok(file) = std::fs::File::open(data_dir.join(UP_LOCK_FILE)) else { return false };
    matches!(
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock),
        Err((_, nix::errno::Errno::EWOULDBLOCK))
    )
}

/// The `kiln up` recorded in `state_file`, if it is running and its admin
/// token is readable (it is 0600: only to the user running it).
fn running(state_file: &Path) -> Option<LocalUp> {
    let state: UpState = serde_json::from_slice(&std::fs::read(state_file).ok()?).ok()?;
    if !is_locked(&state.data_dir) {
        return None;
    }
    let token = std::fs::read_to_string(state.data_dir.join("admin.token")).ok()?.trim().to_string();
    (!token.is_empty()).then_some(LocalUp { state, token })
}

/// A running `kiln up` of this user: the one of `./kiln-data` (its default
/// data directory) if running, else the only one registered. Several
/// registered and none here is an error naming them. Registry entries of
/// `kiln up`s that are gone are removed.
pub(super) fn discover() -> Result<Option<LocalUp>, Failure> {
    if let Some(up) = running(&Path::new("kiln-data").join(UP_STATE_FILE)) {
        return Ok(Some(up));
    }
    let Some(dir) = up_registry() else { return Ok(None) };
    let Ok(entries) = std::fs::read_dir(&dir) else { return Ok(None) };
    let mut found: Vec<LocalUp> = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        match running(&path) {
            Some(up) => {
                if !found.iter().any(|f| f.state.data_dir == up.state.data_dir) {
                    found.push(up);
                }
            }
            None => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => {
            found.sort_by(|a, b| a.state.data_dir.cmp(&b.state.data_dir));
            let list: Vec<String> = found
                .iter()
                .map(|u| format!("{} ({}, pid {})", u.state.url, u.state.data_dir.display(), u.state.pid))
                .collect();
            Err(usage(format!(
                "several local kiln up are running: {}; pick one with KILN_SERVER, --server, or `kiln login URL --token-file DATA_DIR/admin.token`",
                list.join(", ")
            )))
        }
    }
}

/// The server and token a client command uses (see the module docs for
/// the order), and where each came from.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Resolved {
    pub server: String,
    pub token: Option<String>,
}

/// What the flags and the environment gave, before the profile and discovery.
#[derive(Debug, Default, Clone)]
pub(super) struct Given {
    /// `--server` or `KILN_SERVER`.
    pub server: Option<String>,
    /// `--token-file` (read) or `KILN_TOKEN`.
    pub token: Option<String>,
    /// `--context` or `KILN_CONTEXT`.
    pub context: Option<String>,
}

fn same_server(a: &str, b: &str) -> bool {
    a.trim().trim_end_matches('/') == b.trim().trim_end_matches('/')
}

/// Resolve what `given` leaves open from the profile at `config` and, if
/// still open, a local `kiln up` (`discover` is called only then).
pub(super) fn resolve(
    given: Given,
    config: &Path,
    discover: impl Fn() -> Result<Option<LocalUp>, Failure>,
) -> Result<Resolved, Failure> {
    if let (Some(server), Some(token)) = (&given.server, &given.token) {
        return Ok(Resolved { server: server.clone(), token: Some(token.clone()) });
    }
    let profile = Profile::load(config)?;
    let ctx = profile.pick(given.context.as_deref(), config)?.cloned();
    // Looked for once, and only when needed.
    let mut local: Option<Option<LocalUp>> = None;
    let server = match (&given.server, &ctx) {
        (Some(s), _) => s.clone(),
        (None, Some(c)) => c.server.clone(),
        (None, None) => {
            let found = discover()?;
            let url = found.as_ref().map_or_else(|| DEFAULT_SERVER.to_string(), |u| u.state.url.clone());
            local = Some(found);
            url
        }
    };
    let mut token = given.token.or_else(|| ctx.filter(|c| same_server(&c.server, &server)).map(|c| c.token));
    if token.is_none() {
        let found = match local {
            Some(found) => found,
            None => discover()?,
        };
        token = found.filter(|u| same_server(&u.state.url, &server)).map(|u| u.token);
    }
    Ok(Resolved { server, token })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(server: &str, token: &str) -> Context {
        Context { server: server.into(), token: token.into() }
    }

    fn local(url: &str, token: &str) -> LocalUp {
        LocalUp { state: UpState { pid: 1, url: url.into(), data_dir: "/d".into() }, token: token.into() }
    }

    #[test]
    fn flags_and_env_beat_the_profile_which_beats_a_local_kiln_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kiln").join("config.toml");
        let none = || Ok(None);
        let up = || Ok(Some(local("http://127.0.0.1:9999", "up-token")));
        let given = |s: Option<&str>, t: Option<&str>, c: Option<&str>| Given {
            server: s.map(Into::into),
            token: t.map(Into::into),
            context: c.map(Into::into),
        };
        let r = |s: &str, t: Option<&str>| Resolved { server: s.to_string(), token: t.map(String::from) };
        fn ok<T>(r: Result<T, Failure>) -> T {
            r.map_err(|e| e.message).unwrap()
        }

        // No profile: a local kiln up, else the default server without a token.
        assert_eq!(ok(resolve(given(None, None, None), &path, up)), r("http://127.0.0.1:9999", Some("up-token")));
        assert_eq!(ok(resolve(given(None, None, None), &path, none)), r(DEFAULT_SERVER, None));

        let mut p = Profile { current: Some("prod".into()), ..Default::default() };
        p.contexts.insert("prod".into(), ctx("https://ci.example.com", "prod-token"));
        p.contexts.insert("dev".into(), ctx("http://dev:7070", "dev-token"));
        ok(p.save(&path));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(ok(Profile::load(&path)), p);

        // The current context beats the local kiln up; --context picks another.
        assert_eq!(ok(resolve(given(None, None, None), &path, up)), r("https://ci.example.com", Some("prod-token")));
        assert_eq!(ok(resolve(given(None, None, Some("dev")), &path, up)), r("http://dev:7070", Some("dev-token")));
        assert!(resolve(given(None, None, Some("nope")), &path, up).is_err_and(|e| e.message.contains("dev, prod")));
        // The environment's token beats the context's; its server too, and
        // then the context's token is not sent to that other server.
        assert_eq!(ok(resolve(given(None, Some("env"), None), &path, up)), r("https://ci.example.com", Some("env")));
        assert_eq!(ok(resolve(given(Some("http://other:1"), None, None), &path, none)), r("http://other:1", None));
        assert_eq!(
            ok(resolve(given(Some("https://ci.example.com/"), None, None), &path, none)),
            r("https://ci.example.com/", Some("prod-token"))
        );
        // A server named by the environment that is the local kiln up's gets its token.
        assert_eq!(
            ok(resolve(given(Some("http://127.0.0.1:9999"), None, None), &path, up)),
            r("http://127.0.0.1:9999", Some("up-token"))
        );
        // Both given: the profile is not even read (a broken one does not matter).
        std::fs::write(&path, "current = [").unwrap();
        assert_eq!(ok(resolve(given(Some("http://a:1"), Some("t"), None), &path, none)), r("http://a:1", Some("t")));
        assert!(resolve(given(None, None, None), &path, none).is_err());
    }
}
