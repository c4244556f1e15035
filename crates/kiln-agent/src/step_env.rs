//! What host steps get from the agent's machine (issue 41, item 1).
//!
//! A host step's environment is built from scratch (`kiln_sandbox::host`):
//! none of the agent's variables reach it, and its `HOME` is a private
//! directory of the attempt. That keeps the agent's credentials and one
//! job's leftovers away from the next, but it also hides the toolchains a
//! user installed in a home directory (rustup, pyenv, nvm, sdkman), which
//! find themselves through `HOME` or a variable of their own.
//!
//! So the agent's owner says what passes through, and the defaults find the
//! step user's own toolchains:
//! - `--env NAME=VALUE` sets a variable for every host step; `--env NAME`
//!   passes the agent's own value; `--env-file FILE` holds such lines.
//! - `--path DIR` puts a directory in front of the steps' `PATH`.
//! - Unless `--no-user-toolchains`: for each toolchain found in the step
//!   user's home directory, its home variable (`RUSTUP_HOME`, `CARGO_HOME`,
//!   `PYENV_ROOT`, `NVM_DIR`, `SDKMAN_DIR`) and its `bin` directories.
//!
//! Precedence, lowest first: the executor's base (`PATH`, `HOME`,
//! `TMPDIR`, `LANG`, `CI`), the user's toolchains, `--env`/`--env-file`,
//! then the workflow's `env:` and the `KILN_*` variables. `HOME` and
//! `TMPDIR` stay the job's own and `KILN_*` stays Kiln's: asking to pass
//! those through is refused, so that no flag can hand a step the agent's
//! token (`KILN_AGENT_TOKEN`) or another job's home.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The environment and `PATH` entries the agent adds to every host step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepEnv {
    /// Variables set in every host step (below the workflow's `env:`).
    pub vars: BTreeMap<String, String>,
    /// Directories put in front of the steps' `PATH`, in this order.
    pub path: Vec<PathBuf>,
}

/// Toolchains found in a home directory: (directory in the home, the
/// variable naming it, `bin` directories inside it for `PATH`).
const TOOLCHAINS: &[(&str, &str, &[&str])] = &[
    (".rustup", "RUSTUP_HOME", &[]),
    (".cargo", "CARGO_HOME", &["bin"]),
    (".pyenv", "PYENV_ROOT", &["shims", "bin"]),
    (".nvm", "NVM_DIR", &[]),
    (".sdkman", "SDKMAN_DIR", &[]),
    (".local", "", &["bin"]),
];

impl StepEnv {
    /// Adds one `--env` argument: `NAME=VALUE`, or `NAME` for the agent's
    /// own value (`lookup`, normally `std::env::var`).
    pub fn add_arg(&mut self, arg: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
        let (name, value) = match arg.split_once('=') {
            Some((n, v)) => (n.trim(), v.to_string()),
            None => {
                let n = arg.trim();
                check_name(n)?;
                let v = lookup(n).ok_or_else(|| {
                    format!("--env {n}: the agent's environment has no {n} (give a value: --env {n}=VALUE)")
                })?;
                (n, v)
            }
        };
        check_name(name)?;
        if value.contains('\0') {
            return Err(format!("--env {name}: the value holds a NUL byte"));
        }
        self.vars.insert(name.to_string(), value);
        Ok(())
    }

    /// Adds the lines of an env file: `NAME=VALUE` or `NAME` (the agent's
    /// own value); blank lines and `#` comments are skipped, an `export `
    /// prefix is allowed, and one pair of quotes around a value is removed.
    pub fn add_file(&mut self, file: &Path, lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
        let text = std::fs::read_to_string(file).map_err(|e| format!("--env-file {}: {e}", file.display()))?;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let line = line.strip_prefix("export ").unwrap_or(line).trim_start();
            let unquoted = match line.split_once('=') {
                Some((n, v)) => {
                    let v = v.trim();
                    let v = ['"', '\'']
                        .iter()
                        .find_map(|q| v.strip_prefix(*q).and_then(|r| r.strip_suffix(*q)))
                        .unwrap_or(v);
                    format!("{}={v}", n.trim())
                }
                None => line.to_string(),
            };
            self.add_arg(&unquoted, lookup).map_err(|e| format!("{}:{}: {e}", file.display(), i + 1))?;
        }
        Ok(())
    }

    /// Adds one `--path` directory (absolute, existing).
    pub fn add_path(&mut self, dir: &Path) -> Result<(), String> {
        if !dir.is_absolute() {
            return Err(format!("--path {}: give an absolute directory", dir.display()));
        }
        if !dir.is_dir() {
            return Err(format!("--path {}: no such directory", dir.display()));
        }
        if !self.path.iter().any(|p| p == dir) {
            self.path.push(dir.to_path_buf());
        }
        Ok(())
    }

    /// The toolchains of the user whose home is `home` (see the module
    /// docs), below what is already set: a variable given with `--env` is
    /// kept. `own`: the steps run as the agent's own user, whose values of
    /// the toolchains' variables (`lookup`) win over the defaults in
    /// `home`. Returns the variables added, for the agent's start line.
    pub fn add_user_toolchains(
        &mut self,
        home: &Path,
        own: bool,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Vec<String> {
        let mut added = vec![];
        let mut bins = vec![];
        for (dir, var, bin) in TOOLCHAINS {
            let from_env = if own && !var.is_empty() { lookup(var).filter(|v| !v.is_empty()) } else { None };
            let root = match from_env {
                Some(v) => PathBuf::from(v),
                None => home.join(dir),
            };
            if !root.is_dir() {
                continue;
            }
            if !var.is_empty() && !self.vars.contains_key(*var) {
                self.vars.insert(var.to_string(), root.display().to_string());
                added.push(format!("{var}={}", root.display()));
            }
            bins.extend(bin.iter().map(|b| root.join(b)).filter(|b| b.is_dir()));
        }
        // sdkman's installed candidates (java, gradle, maven, …).
        let sdk = self.vars.get("SDKMAN_DIR").map(PathBuf::from);
        if let Some(entries) = sdk.and_then(|sdk| std::fs::read_dir(sdk.join("candidates")).ok()) {
            let mut found: Vec<PathBuf> =
                entries.flatten().map(|e| e.path().join("current")).filter(|c| c.is_dir()).collect();
            found.sort();
            for c in found {
                if c.parent().and_then(Path::file_name).is_some_and(|n| n == "java")
                    && !self.vars.contains_key("JAVA_HOME")
                {
                    self.vars.insert("JAVA_HOME".into(), c.display().to_string());
                    added.push(format!("JAVA_HOME={}", c.display()));
                }
                if c.join("bin").is_dir() {
                    bins.push(c.join("bin"));
                }
            }
        }
        for b in bins {
            if !self.path.contains(&b) {
                added.push(format!("PATH+={}", b.display()));
                self.path.push(b);
            }
        }
        added
    }

    /// The steps' `PATH`: the `--path` directories (and the toolchains'),
    /// then `base` (the agent's `PATH`, or `--env PATH=…`), without
    /// repeating an entry.
    pub fn steps_path(&self, base: &str) -> String {
        let base = self.vars.get("PATH").map(String::as_str).unwrap_or(base);
        let mut out: Vec<String> = vec![];
        for p in self.path.iter().map(|p| p.display().to_string()).chain(base.split(':').map(str::to_string)) {
            if !p.is_empty() && !out.contains(&p) {
                out.push(p);
            }
        }
        out.join(":")
    }
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if !ok {
        return Err(format!("--env `{name}`: not a variable name ([A-Za-z_][A-Za-z0-9_]*)"));
    }
    if name.starts_with("KILN_") {
        return Err(format!(
            "--env {name}: KILN_* variables are Kiln's own (the agent's token among them) and never pass to steps"
        ));
    }
    if name == "HOME" || name == "TMPDIR" {
        return Err(format!(
            "--env {name}: each job has its own {name}; pass the tool's own variable instead (e.g. RUSTUP_HOME, \
             PYENV_ROOT) — see docs/deploy.md"
        ));
    }
    Ok(())
}

/// The `PATH` entries the step user cannot reach (a directory it may not
/// search on the way, e.g. `/root/.cargo/bin` for `nobody`), for the
/// agent's start line and the exit-127 hint.
pub fn unreachable_path_entries(path: &str, uid: u32, gid: u32) -> Vec<String> {
    path.split(':').filter(|p| !p.is_empty() && !searchable(Path::new(p), uid, gid)).map(str::to_string).collect()
}

/// Whether `uid`/`gid` may search every directory from `/` down to `dir`
/// (by mode bits; root may search anything). Missing directories are
/// "reachable": they hide nothing.
fn searchable(dir: &Path, uid: u32, gid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    if uid == 0 {
        return true;
    }
    let mut cur = PathBuf::new();
    for c in dir.components() {
        cur.push(c);
        let Ok(m) = std::fs::metadata(&cur) else { return true };
        let bit = if m.uid() == uid {
            0o100
        } else if m.gid() == gid {
            0o010
        } else {
            0o001
        };
        if m.is_dir() && m.mode() & bit == 0 {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn env_args_set_or_pass_through_and_refuse_what_is_kilns() {
        let lookup = env(&[("JAVA_OPTS", "-Xmx1g")]);
        let mut s = StepEnv::default();
        s.add_arg("FOO=bar=baz", &lookup).unwrap();
        s.add_arg("JAVA_OPTS", &lookup).unwrap();
        assert_eq!(s.vars["FOO"], "bar=baz");
        assert_eq!(s.vars["JAVA_OPTS"], "-Xmx1g");
        let e = s.add_arg("MISSING", &lookup).unwrap_err();
        assert!(e.contains("has no MISSING") && e.contains("--env MISSING=VALUE"), "{e}");
        let e = s.add_arg("KILN_AGENT_TOKEN", &lookup).unwrap_err();
        assert!(e.contains("never pass to steps"), "{e}");
        let e = s.add_arg("KILN_X=1", &lookup).unwrap_err();
        assert!(e.contains("Kiln's own"), "{e}");
        assert!(s.add_arg("HOME=/root", &lookup).unwrap_err().contains("its own HOME"));
        assert!(s.add_arg("TMPDIR=/tmp", &lookup).unwrap_err().contains("its own TMPDIR"));
        assert!(s.add_arg("1X=2", &lookup).unwrap_err().contains("not a variable name"));
        assert!(s.add_arg("A-B=2", &lookup).unwrap_err().contains("not a variable name"));
        assert_eq!(s.vars.len(), 2, "nothing refused was kept");
    }

    #[test]
    fn env_files_take_comments_export_and_quotes_and_name_the_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("agent.env");
        std::fs::write(&f, "# toolchains\n\nexport A=1\nB = \"two words\"\nC='x'\nD\n").unwrap();
        let mut s = StepEnv::default();
        s.add_file(&f, &env(&[("D", "from agent")])).unwrap();
        assert_eq!(
            s.vars,
            [("A", "1"), ("B", "two words"), ("C", "x"), ("D", "from agent")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        );
        std::fs::write(&f, "A=1\nKILN_TOKEN=x\n").unwrap();
        let e = StepEnv::default().add_file(&f, &env(&[])).unwrap_err();
        assert!(e.contains("agent.env:2: --env KILN_TOKEN"), "{e}");
    }

    #[test]
    fn path_dirs_go_first_once_and_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = StepEnv::default();
        s.add_path(dir.path()).unwrap();
        s.add_path(dir.path()).unwrap();
        let d = dir.path().display().to_string();
        assert_eq!(s.steps_path(&format!("/usr/bin:{d}:/bin")), format!("{d}:/usr/bin:/bin"));
        assert!(s.add_path(Path::new("rel/bin")).unwrap_err().contains("absolute"));
        assert!(s.add_path(&dir.path().join("nope")).unwrap_err().contains("no such directory"));
        s.vars.insert("PATH".into(), "/opt/bin".into());
        assert_eq!(s.steps_path("/usr/bin"), format!("{d}:/opt/bin"), "--env PATH replaces the base");
    }

    #[test]
    fn user_toolchains_are_found_in_the_home_and_never_override_env_flags() {
        let home = tempfile::tempdir().unwrap();
        for d in [".rustup", ".cargo/bin", ".pyenv/shims", ".pyenv/bin", ".sdkman/candidates/java/current/bin"] {
            std::fs::create_dir_all(home.path().join(d)).unwrap();
        }
        let mut s = StepEnv::default();
        s.add_arg("CARGO_HOME=/opt/cargo", &env(&[])).unwrap();
        let added = s.add_user_toolchains(home.path(), false, &env(&[("RUSTUP_HOME", "/elsewhere")]));
        let h = home.path();
        assert_eq!(s.vars["RUSTUP_HOME"], h.join(".rustup").display().to_string(), "another user's env is not read");
        assert_eq!(s.vars["CARGO_HOME"], "/opt/cargo", "--env wins");
        assert_eq!(s.vars["PYENV_ROOT"], h.join(".pyenv").display().to_string());
        assert_eq!(s.vars["JAVA_HOME"], h.join(".sdkman/candidates/java/current").display().to_string());
        assert!(!s.vars.contains_key("NVM_DIR"), "no .nvm, no NVM_DIR");
        assert_eq!(
            s.path,
            vec![
                h.join(".cargo/bin"),
                h.join(".pyenv/shims"),
                h.join(".pyenv/bin"),
                h.join(".sdkman/candidates/java/current/bin")
            ]
        );
        assert!(added.iter().any(|a| a.starts_with("RUSTUP_HOME=")), "{added:?}");
        // The agent's own user: its RUSTUP_HOME wins over the default dir.
        let other = tempfile::tempdir().unwrap();
        let mut own = StepEnv::default();
        let o = other.path().display().to_string();
        own.add_user_toolchains(home.path(), true, &env(&[("RUSTUP_HOME", &o)]));
        assert_eq!(own.vars["RUSTUP_HOME"], o);
        // A home without toolchains (nobody's /nonexistent) adds nothing.
        let mut none = StepEnv::default();
        assert!(none.add_user_toolchains(Path::new("/nonexistent"), false, &env(&[])).is_empty());
        assert_eq!(none, StepEnv::default());
    }

    #[test]
    fn path_entries_behind_a_closed_directory_are_unreachable() {
        use std::os::unix::fs::PermissionsExt;
        let top = tempfile::tempdir().unwrap();
        let closed = top.path().join("home");
        std::fs::create_dir_all(closed.join(".cargo/bin")).unwrap();
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let bin = closed.join(".cargo/bin").display().to_string();
        let path = format!("{bin}:/usr/bin:/no/such/dir");
        let (me, my_gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        assert_eq!(unreachable_path_entries(&path, 65534, 65534), vec![bin], "nobody may not search the home");
        if me != 0 {
            assert!(unreachable_path_entries(&path, me, my_gid).is_empty(), "the owner reaches its own home");
        }
        assert!(unreachable_path_entries(&path, 0, 0).is_empty(), "root reaches everything");
    }
}
