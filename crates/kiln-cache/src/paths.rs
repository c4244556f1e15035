//! Lexical path checks shared by pack, unpack and input hashing.

/// A relative, '/'-separated path made only of normal components: not
/// empty, no leading or trailing '/', no empty, `.` or `..` component, no NUL.
pub(crate) fn check_rel_path(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Err("empty path".into());
    }
    if p.starts_with('/') {
        return Err(format!("absolute path {p:?}"));
    }
    if p.contains('\0') {
        return Err(format!("path {p:?} contains NUL"));
    }
    for c in p.split('/') {
        match c {
            "" => return Err(format!("path {p:?} has an empty component")),
            "." => return Err(format!("path {p:?} has a '.' component")),
            ".." => return Err(format!("path {p:?} has a '..' component")),
            _ => {}
        }
    }
    Ok(())
}

/// Parent of a relative path ("" for a top-level entry).
pub(crate) fn parent(p: &str) -> &str {
    match p.rfind('/') {
        Some(i) => &p[..i],
        None => "",
    }
}

/// A symlink target is accepted as any non-empty text without NUL (issue
/// 41, item 4: a venv's `bin/python -> /usr/bin/python3` must come back as
/// that link). Restoring a link never follows it, and nothing is ever
/// written below one: an entry's parent must be a directory listed before
/// it (`unpack`'s manifest check), so a link leaving the root is only a
/// link, as the step could have made itself.
pub(crate) fn check_symlink_target(entry_path: &str, target: &str) -> Result<(), String> {
    if target.is_empty() {
        return Err(format!("symlink {entry_path:?} has an empty target"));
    }
    if target.contains('\0') {
        return Err(format!("symlink {entry_path:?} target contains NUL"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rel_paths() {
        assert!(check_rel_path("a/b").is_ok());
        assert!(check_rel_path("a/../b").is_err());
        assert!(check_rel_path("/a").is_err());
        assert!(check_rel_path("a//b").is_err());
        assert!(check_rel_path("a/").is_err());
        assert!(check_rel_path("./a").is_err());
        assert!(check_rel_path("").is_err());
    }

    #[test]
    fn symlink_targets() {
        for ok in ["b", "..", "../b/c", "../../x", "/usr/bin/python3", "./b//c/"] {
            assert!(check_symlink_target("a/l", ok).is_ok(), "{ok}");
        }
        assert!(check_symlink_target("a/l", "").is_err());
        assert!(check_symlink_target("a/l", "a\0b").is_err());
    }
}
