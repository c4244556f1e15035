//! Job outputs (issue 16): steps append `name=value` lines (or the heredoc
//! form `name<<DELIM`, the value's lines, `DELIM`) to the file named by
//! `$KILN_OUTPUT`; after the last step the agent reads the declared names
//! and sends them with the completion, which binds them only if it succeeds
//! the job of the live epoch (spec 000 §9). The file is one per attempt,
//! outside the workspace (so it is never checked in, cached or published),
//! in a directory of the attempt's sandbox handed to the step user; a
//! container job sees it at [`CONTAINER_DIR`].
//!
//! The step is untrusted: the file is opened without following links, must
//! be a regular file, and is read up to [`MAX_FILE_BYTES`]; a value holding
//! one of the job's secrets is dropped (with a warning) rather than bound
//! where every reader of the run would see it.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where a container job's output directory is mounted.
pub(crate) const CONTAINER_DIR: &str = "/kiln/outputs";
pub(crate) const FILE: &str = "output";
/// The most a job's output file may hold (the server binds at most
/// [`kiln_workflow::MAX_OUTPUT_BYTES`] of names and values).
pub(crate) const MAX_FILE_BYTES: u64 = kiln_workflow::MAX_OUTPUT_BYTES as u64 + 64 * 1024;

/// The attempt's output file: where the agent reads it and what
/// `$KILN_OUTPUT` says in the step.
pub(crate) struct OutputFile {
    pub host_path: PathBuf,
    pub env_value: String,
    pub dir: PathBuf,
}

/// Creates the (empty) output file in `sandbox/outputs`. `container`: the
/// directory is mounted into the job's container, whose user is unknown,
/// so it is writable by all (the sandbox above it is the agent's, 0700 or
/// 0711); otherwise it belongs to the step user when steps run as one.
pub(crate) fn prepare(
    sandbox: &Path,
    container: bool,
    step_user: Option<kiln_sandbox::StepUser>,
) -> std::io::Result<OutputFile> {
    let dir = sandbox.join("outputs");
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        // A job slot's kept sandbox, reset after its last attempt (see
        // `crate::slots`): the directory and its emptied file are reused.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && std::fs::symlink_metadata(&dir)?.is_dir() => {}
        Err(e) => return Err(e),
    }
    let path = dir.join(FILE);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || std::os::unix::fs::MetadataExt::nlink(&meta) != 1 {
        return Err(std::io::Error::other(format!("{} is not a file of its own", path.display())));
    }
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    if container {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    } else if let Some(u) = step_user {
        for p in [&dir, &path] {
            std::os::unix::fs::lchown(p, Some(u.uid), Some(u.gid))?;
        }
    }
    let env_value = if container { format!("{CONTAINER_DIR}/{FILE}") } else { path.display().to_string() };
    Ok(OutputFile { host_path: path, env_value, dir })
}

/// The output file [`prepare`] made for a container in `sandbox` (a warm
/// container's directory, made before the job was known).
pub(crate) fn prepared_for_container(sandbox: &Path) -> std::io::Result<OutputFile> {
    let dir = sandbox.join("outputs");
    let path = dir.join(FILE);
    if !std::fs::symlink_metadata(&path)?.is_file() {
        return Err(std::io::Error::other(format!("{} is not a regular file", path.display())));
    }
    Ok(OutputFile { host_path: path, env_value: format!("{CONTAINER_DIR}/{FILE}"), dir })
}

/// What the file held: the declared outputs, and warnings for the log.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Collected {
    pub outputs: BTreeMap<String, String>,
    pub warnings: Vec<String>,
}

/// Reads the output file after the steps: `Err` (the job's own fault, with
/// a message saying what to fix) when it is not a regular file, is too
/// large or malformed, or the declared outputs exceed the limit.
pub(crate) fn read(path: &Path, declared: &[String], secrets: &[&str]) -> Result<Collected, String> {
    let mut f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits())
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Collected::default()),
        Err(e) => return Err(format!("cannot read $KILN_OUTPUT: {e} (it must stay a regular file)")),
    };
    let meta = f.metadata().map_err(|e| format!("cannot read $KILN_OUTPUT: {e}"))?;
    if !meta.is_file() {
        return Err("$KILN_OUTPUT was replaced by something that is not a regular file".into());
    }
    let mut bytes = Vec::new();
    (&mut f).take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read $KILN_OUTPUT: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "$KILN_OUTPUT holds more than {MAX_FILE_BYTES} bytes; job outputs are for short values (at most {} bytes \
             in all): pass files between jobs as artifacts",
            kiln_workflow::MAX_OUTPUT_BYTES
        ));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        format!("$KILN_OUTPUT is not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to())
    })?;
    let mut out = Collected::default();
    let mut undeclared: Vec<String> = Vec::new();
    for (name, value) in parse(&text)? {
        if !declared.contains(&name) {
            if !undeclared.contains(&name) {
                undeclared.push(name);
            }
            continue;
        }
        if secrets.iter().any(|s| s.len() >= crate::mask::MIN_MASKED && value.contains(s)) {
            out.warnings.push(format!("output `{name}` is not kept: its value contains a secret"));
            out.outputs.remove(&name);
            continue;
        }
        // A later line for the same name wins.
        out.outputs.insert(name, value);
    }
    if !undeclared.is_empty() {
        out.warnings.push(format!(
            "ignored output{} not declared in the job's `outputs`: {}",
            if undeclared.len() == 1 { "" } else { "s" },
            undeclared.join(", ")
        ));
    }
    let total: usize = out.outputs.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > kiln_workflow::MAX_OUTPUT_BYTES {
        return Err(format!(
            "the job's outputs are {total} bytes; at most {} are allowed: pass larger data as an artifact",
            kiln_workflow::MAX_OUTPUT_BYTES
        ));
    }
    Ok(out)
}

/// `name=value` lines and `name<<DELIM` … `DELIM` blocks, in order. Empty
/// lines are skipped; a `\r` before a line's end is dropped.
pub(crate) fn parse(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).enumerate();
    while let Some((i, line)) = lines.next() {
        if line.is_empty() {
            continue;
        }
        let eq = line.find('=');
        // `name<<DELIM` unless a `=` comes first (`cmd=cat <<EOF` is a value).
        let heredoc = line.find("<<").filter(|h| eq.is_none_or(|e| *h < e));
        match (eq, heredoc) {
            (_, Some(h)) => {
                let (name, delim) = (&line[..h], &line[h + 2..]);
                check_name(name, i)?;
                if delim.is_empty() || delim.trim() != delim {
                    return Err(format!(
                        "line {} of $KILN_OUTPUT: `{name}<<` needs a delimiter right after it, e.g. `{name}<<EOF`",
                        i + 1
                    ));
                }
                let mut value: Vec<&str> = Vec::new();
                let mut closed = false;
                for (_, l) in lines.by_ref() {
                    if l == delim {
                        closed = true;
                        break;
                    }
                    value.push(l);
                }
                if !closed {
                    return Err(format!(
                        "line {} of $KILN_OUTPUT: the value of `{name}` is not closed with a line `{delim}`",
                        i + 1
                    ));
                }
                out.push((name.to_string(), value.join("\n")));
            }
            (Some(e), None) => {
                let name = &line[..e];
                check_name(name, i)?;
                out.push((name.to_string(), line[e + 1..].to_string()));
            }
            (None, None) => {
                return Err(format!(
                    "line {} of $KILN_OUTPUT is neither `name=value` nor `name<<DELIMITER`: `{}`",
                    i + 1,
                    line.chars().take(80).collect::<String>().escape_debug()
                ));
            }
        }
    }
    Ok(out)
}

fn check_name(name: &str, line: usize) -> Result<(), String> {
    if kiln_workflow::output_name_ok(name) {
        return Ok(());
    }
    Err(format!(
        "line {} of $KILN_OUTPUT: `{}` is not an output name (a letter or `_`, then letters, digits, `_` or `-`)",
        line + 1,
        name.chars().take(80).collect::<String>().escape_debug()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn lines_and_heredocs() {
        let text = "version=1.2.3\r\n\nnotes<<EOF\nline one\nx=y\n\nEOF\nempty=\neq=a=b\nv2<<END_X\nEND_X\n";
        assert_eq!(
            parse(text).unwrap(),
            pairs(&[("version", "1.2.3"), ("notes", "line one\nx=y\n"), ("empty", ""), ("eq", "a=b"), ("v2", ""),])
        );
        assert_eq!(parse("").unwrap(), vec![]);
        // `<<` inside a value is part of the value.
        assert_eq!(parse("cmd=cat <<EOF").unwrap(), pairs(&[("cmd", "cat <<EOF")]));
    }

    #[test]
    fn malformed_input_is_refused_with_the_line() {
        for (text, want) in [
            ("version", "line 1 of $KILN_OUTPUT is neither"),
            ("ok=1\n=x", "line 2 of $KILN_OUTPUT: `` is not an output name"),
            ("1x=2", "`1x` is not an output name"),
            ("a b=2", "`a b` is not an output name"),
            ("notes<<EOF\nnever closed", "not closed with a line `EOF`"),
            ("notes<<", "needs a delimiter"),
            ("notes<< EOF\nEOF", "needs a delimiter"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn only_declared_outputs_are_kept_and_secrets_never() {
        let dir = tempfile::tempdir().unwrap();
        let f = prepare(dir.path(), false, None).unwrap();
        std::fs::write(&f.host_path, "a=1\nb=2\nz=9\na=3\ntok=key-s3cret-x\nshort=ab\n").unwrap();
        let declared = ["a".to_string(), "b".into(), "tok".into(), "short".into()];
        let r = read(&f.host_path, &declared, &["s3cret", "ab"]).unwrap();
        // `ab` is too short to be masked (see `mask::MIN_MASKED`), so it is no reason to drop a value.
        assert_eq!(
            r.outputs,
            BTreeMap::from([("a".into(), "3".into()), ("b".into(), "2".into()), ("short".into(), "ab".into())])
        );
        assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
        assert!(r.warnings.iter().any(|w| w.contains("`tok`") && w.contains("secret")));
        assert!(r.warnings.iter().any(|w| w.contains("not declared") && w.contains('z')));
    }

    #[test]
    fn a_link_or_an_oversized_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let f = prepare(dir.path(), false, None).unwrap();
        let secret = dir.path().join("agent-key");
        std::fs::write(&secret, "k=agent secret").unwrap();
        std::fs::remove_file(&f.host_path).unwrap();
        std::os::unix::fs::symlink(&secret, &f.host_path).unwrap();
        let e = read(&f.host_path, &["k".into()], &[]).unwrap_err();
        assert!(e.contains("regular file"), "{e}");

        std::fs::remove_file(&f.host_path).unwrap();
        std::fs::create_dir(&f.host_path).unwrap();
        assert!(read(&f.host_path, &["k".into()], &[]).unwrap_err().contains("not a regular file"));

        std::fs::remove_dir(&f.host_path).unwrap();
        let big = format!("k={}\n", "x".repeat(MAX_FILE_BYTES as usize));
        std::fs::write(&f.host_path, big).unwrap();
        assert!(read(&f.host_path, &["k".into()], &[]).unwrap_err().contains("more than"));

        let at_limit = format!("k={}\n", "x".repeat(kiln_workflow::MAX_OUTPUT_BYTES));
        std::fs::write(&f.host_path, at_limit).unwrap();
        assert!(read(&f.host_path, &["k".into()], &[]).unwrap_err().contains("at most"));
        // A removed file is no outputs, not an error.
        std::fs::remove_file(&f.host_path).unwrap();
        assert_eq!(read(&f.host_path, &["k".into()], &[]).unwrap(), Collected::default());
    }

    #[test]
    fn container_jobs_see_the_mounted_path() {
        let dir = tempfile::tempdir().unwrap();
        let f = prepare(dir.path(), true, None).unwrap();
        assert_eq!(f.env_value, "/kiln/outputs/output");
        assert_eq!(std::fs::metadata(&f.dir).unwrap().permissions().mode() & 0o777, 0o777);
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(text in "(\\PC|\n|=|<<){0,200}") {
            let _ = parse(&text);
        }

        #[test]
        fn written_values_read_back(values in proptest::collection::btree_map("[a-z_][a-z0-9_-]{0,8}", "[^\n\r]{0,40}", 0..8)) {
            let text: String = values.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            let got: BTreeMap<String, String> = parse(&text).unwrap().into_iter().collect();
            proptest::prop_assert_eq!(got, values);
        }
    }
}
