//! What a repository's clone URL may be, checked by the server when a
//! repository is registered and again by the server and the agent before
//! every git call (a URL stored by an older version is not trusted either).
//!
//! Why (issue 13, finding 1): a clone URL reaches `git fetch` as an argument.
//! An option-like URL (`--upload-pack=touch pwned;false`) ran a command on the
//! server host, and git's remote-helper syntax (`ext::sh -c …`) runs one by
//! design. Every git call also puts `--` before user-supplied arguments and
//! restricts transports with [`GIT_ALLOW_PROTOCOL`]; this check is the first
//! of those three walls and the one that gives the user a clear answer.

/// The transports git may use for user-supplied URLs (`GIT_ALLOW_PROTOCOL`):
/// no `ext` (runs commands), no `fd`, no other remote helpers.
pub const GIT_ALLOW_PROTOCOL: &str = "file:git:http:https:ssh";

/// Longest clone URL accepted.
pub const MAX_CLONE_URL: usize = 2048;

/// `Ok(())` if `url` is a local path, a `file://`, `http(s)://`, `ssh://` or
/// `git://` URL, or an scp-like `[user@]host:path`; otherwise why not, in
/// words a user can act on.
pub fn check_clone_url(url: &str) -> Result<(), String> {
    if url.is_empty() {
        return Err("clone_url is required".into());
    }
    if url.len() > MAX_CLONE_URL {
        return Err(format!("clone_url is longer than {MAX_CLONE_URL} bytes"));
    }
    if url.chars().any(char::is_control) {
        return Err("clone_url contains control characters".into());
    }
    if url.starts_with('-') {
        return Err(format!("clone_url `{url}` looks like a command-line option; give a URL or a path"));
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        let scheme = scheme.to_ascii_lowercase();
        if !matches!(scheme.as_str(), "file" | "http" | "https" | "ssh" | "git" | "git+ssh" | "ssh+git") {
            return Err(format!(
                "clone_url scheme `{scheme}://` is not allowed; use file://, http(s)://, ssh:// or git://, or a path"
            ));
        }
        if rest.starts_with('-') {
            return Err(format!("clone_url `{url}` names a host that looks like a command-line option"));
        }
        return Ok(());
    }
    // git's remote-helper syntax `<transport>::<address>` (ext::, fd::, …).
    if let Some((helper, _)) = url.split_once("::")
        && !helper.contains('/')
    {
        return Err(format!("clone_url uses git's remote helper `{helper}::`, which is not allowed"));
    }
    Ok(())
}

/// The credential of an `http(s)` clone URL (basic authentication), never
/// shown: it is stored sealed like a secret, handed only to git (through
/// its environment, see [`git_credential_env`]), and its `Debug` says
/// nothing.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CloneCredential {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for CloneCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CloneCredential(***)")
    }
}

/// The username a clone token is sent with when the URL names none
/// (GitHub's for tokens; GitLab and Gitea accept any).
pub const DEFAULT_TOKEN_USER: &str = "x-access-token";

fn http_scheme(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https").then_some((scheme, rest))
}

/// An `http(s)` URL without its credential, and the credential
/// (`user:password@`, or a bare `token@`, percent-decoded). Any other URL
/// (ssh's `git@host` names a login, not a secret) is returned unchanged.
pub fn split_credential(url: &str) -> (String, Option<CloneCredential>) {
    let Some((scheme, rest)) = http_scheme(url) else {
        return (url.to_string(), None);
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..end].rfind('@') else {
        return (url.to_string(), None);
    };
    let userinfo = &rest[..at];
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let credential = CloneCredential { username: percent_decode(user), password: percent_decode(password) };
    (format!("{scheme}://{}", &rest[at + 1..]), Some(credential))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() && b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit() {
            let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
            out.push(hex(b[i + 1]) * 16 + hex(b[i + 2]));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `text` with every URL credential replaced by `***` (`https://***@host/…`):
/// the one redaction applied wherever a clone URL, or text that may hold one
/// (git's messages), is shown — API answers, job logs, deliveries, server
/// and agent logs, the audit log.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        // The authority ends at the first of these; a credential is what
        // precedes its last `@`.
        let end = tail.find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace() || "'\"`<>".contains(c));
        let authority = &tail[..end.unwrap_or(tail.len())];
        let scheme: String =
            head[..i].chars().rev().take_while(|c| c.is_ascii_alphanumeric() || "+.-".contains(*c)).collect();
        // (Read backwards from `://`.)
        let http = scheme.eq_ignore_ascii_case("ptth") || scheme.eq_ignore_ascii_case("sptth");
        match authority.rfind('@') {
            // ssh's `git@host` is a login name, shown; a password is not.
            Some(at) if at > 0 && (http || authority[..at].contains(':')) => {
                out.push_str("***");
                rest = &tail[at..];
            }
            _ => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

/// The environment that gives git `credential` for `url`'s origin only,
/// never on a command line (`/proc/PID/cmdline` is readable by every local
/// user) nor in a file: a credential helper, configured through
/// `GIT_CONFIG_*`, that answers only for the URL's scheme and host and
/// reads the values from the environment it inherits. Earlier helpers (a
/// user's credential store) are cleared.
pub fn git_credential_env(url: &str, credential: &CloneCredential) -> Vec<(String, String)> {
    let origin = match http_scheme(url) {
        Some((scheme, rest)) => {
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            format!("{}://{}", scheme.to_ascii_lowercase(), &rest[..end])
        }
        None => return Vec::new(),
    };
    const HELPER: &str = "!f() { test \"$1\" = get || exit 0; p=; h=; while IFS= read -r l; do case \"$l\" in \
        protocol=*) p=${l#protocol=};; host=*) h=${l#host=};; esac; done; \
        test \"$p://$h\" = \"$KILN_GIT_CREDENTIAL_ORIGIN\" || exit 0; \
        printf 'username=%s\\npassword=%s\\n' \"$KILN_GIT_CREDENTIAL_USER\" \"$KILN_GIT_CREDENTIAL_PASSWORD\"; }; f";
    vec![
        ("GIT_CONFIG_COUNT".into(), "2".into()),
        ("GIT_CONFIG_KEY_0".into(), "credential.helper".into()),
        ("GIT_CONFIG_VALUE_0".into(), String::new()),
        ("GIT_CONFIG_KEY_1".into(), "credential.helper".into()),
        ("GIT_CONFIG_VALUE_1".into(), HELPER.into()),
        ("KILN_GIT_CREDENTIAL_ORIGIN".into(), origin),
        ("KILN_GIT_CREDENTIAL_USER".into(), credential.username.clone()),
        ("KILN_GIT_CREDENTIAL_PASSWORD".into(), credential.password.clone()),
    ]
}

/// Whether a credential can be given to git (no control characters, which
/// would break the credential protocol's lines).
pub fn check_credential(c: &CloneCredential) -> Result<(), String> {
    if c.username.is_empty() || c.username.len() > 256 || c.password.len() > 4096 {
        return Err("a clone credential is a username of 1 to 256 and a token of at most 4096 characters".into());
    }
    if c.username.chars().chain(c.password.chars()).any(char::is_control) {
        return Err(
            "a clone credential must not contain control characters (a newline at the end of a token file is removed)"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_clone_url;

    #[test]
    fn accepted_urls() {
        for ok in [
            "/srv/git/app",
            "relative/path",
            "file:///srv/git/app",
            "https://github.com/org/app.git",
            "HTTP://example.com/app",
            "ssh://git@example.com:2222/org/app.git",
            "git://example.com/app",
            "git@github.com:org/app.git",
            "/path/with a space/app",
        ] {
            assert_eq!(check_clone_url(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn refused_urls() {
        for bad in [
            "",
            "--upload-pack=touch pwned;false",
            "-u",
            "ext::sh -c touch% /tmp/pwned",
            "fd::17",
            "foo::bar",
            "ssh://-oProxyCommand=touch%20pwned/x",
            "gopher://example.com/app",
            "https://example.com/a\nb",
            "/tmp/\0x",
        ] {
            assert!(check_clone_url(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(check_clone_url(&"a".repeat(super::MAX_CLONE_URL + 1)).is_err());
    }

    #[test]
    fn credentials_are_split_and_redacted() {
        use super::{redact, split_credential};
        let (url, c) = split_credential("http://bob:s%40cret@git.example:8080/r.git");
        assert_eq!(url, "http://git.example:8080/r.git");
        let c = c.unwrap();
        assert_eq!((c.username.as_str(), c.password.as_str()), ("bob", "s@cret"));
        assert_eq!(format!("{c:?}"), "CloneCredential(***)");
        let (url, c) = split_credential("https://ghp_tok@github.com/o/r");
        assert_eq!((url.as_str(), c.unwrap().username.as_str()), ("https://github.com/o/r", "ghp_tok"));
        assert_eq!(split_credential("ssh://git@host/r").0, "ssh://git@host/r");
        assert!(split_credential("git@github.com:o/r.git").1.is_none());
        assert!(split_credential("https://host/a@b").1.is_none(), "an @ in the path is no credential");
        assert_eq!(
            redact("fatal: unable to access 'http://bob:tok@h/r.git/': 403; see https://a:b@x"),
            "fatal: unable to access 'http://***@h/r.git/': 403; see https://***@x"
        );
        assert_eq!(redact("https://host/a@b and ssh://git@h/r"), "https://host/a@b and ssh://git@h/r");
        assert_eq!(redact("ssh://git:pw@h/r HTTPS://t@h"), "ssh://***@h/r HTTPS://***@h");
    }
}
