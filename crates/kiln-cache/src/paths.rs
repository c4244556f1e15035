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

/// A symlink target is accepted when it is relative, made of leading `..`
/// components followed by normal components, and the `..` components do not
/// climb above the root from the link's directory. Because `..` never
/// follows a normal component, resolving it never walks back out of a
/// directory reached through another (checked) symlink, so the check holds
/// for chains of links too.
pub(crate) fn check_symlink_target(entry_path: &str, target: &str) -> Result<(), String> {
    if target.is_empty() {
        return Err(format!("symlink {entry_path:?} has an empty target"));
    }
    if target.starts_with('/') {
        return Err(format!("symlink {entry_path:?} has an absolute target {target:?}"));
    }
    if target.contains('\0') {
        return Err(format!("symlink {entry_path:?} target contains NUL"));
    }
    let depth = parent(entry_path).split('/').filter(|c| !c.is_empty()).count();
    let mut ups = 0usize;
    let mut seen_normal = false;
    for c in target.split('/') {
        match c {
            "" | "." => {
                return Err(format!("symlink {entry_path:?} target {target:?} is not normalised"));
            }
            ".." if seen_normal => {
                return Err(format!("symlink {entry_path:?} target {target:?} has '..' after a name"));
            }
            ".." => {
                ups += 1;
                if ups > depth {
                    return Err(format!("symlink {entry_path:?} target {target:?} leaves its root"));
                }
            }
            _ => seen_normal = true,
        }
    }
    Ok(())
}

/// Pack-time normalisation of a symlink target: drops `.` and empty
/// components; `None` if the result is not acceptable.
pub(crate) fn normalise_symlink_target(entry_path: &str, target: &str) -> Option<String> {
    if target.starts_with('/') {
        return None;
    }
    let parts: Vec<&str> = target.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    let t = parts.join("/");
    check_symlink_target(entry_path, &t).ok().map(|()| t)
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
        assert!(check_symlink_target("a/l", "b").is_ok());
        assert!(check_symlink_target("a/l", "..").is_ok());
        assert!(check_symlink_target("a/l", "../b/c").is_ok());
        assert!(check_symlink_target("l", "..").is_err());
        assert!(check_symlink_target("a/l", "../..").is_err());
        assert!(check_symlink_target("a/l", "b/../..").is_err());
        assert!(check_symlink_target("a/l", "b/..").is_err());
        assert!(check_symlink_target("a/l", "/etc").is_err());
        assert_eq!(normalise_symlink_target("a/l", "./b//c/").as_deref(), Some("b/c"));
        assert_eq!(normalise_symlink_target("l", "../x"), None);
    }
}
