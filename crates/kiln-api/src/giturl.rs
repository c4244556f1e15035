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
}
