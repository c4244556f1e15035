//! A step's script: which program runs it ([`shell_argv`]) and how `${{ }}`
//! in `run` reaches it ([`render_run`]).
//!
//! A value is never pasted into shell text. Each `${{ expr }}` of a `run`
//! becomes a reference to an environment variable (`KILN_EXPR_<n>`) that
//! holds the value, quoted to fit where it stands: `"${KILN_EXPR_1}"`
//! outside quotes, `${KILN_EXPR_1}` inside double quotes or an unquoted
//! here-document, `'"${KILN_EXPR_1}"'` inside single quotes. The shell
//! never parses an expanded parameter as code, so a branch name or input
//! like `"; rm -rf ~` stays text. Only `sh` and `bash` steps may use
//! `${{ }}` in `run` (checked at parse time): other interpreters read the
//! value from `env:`.

use crate::expr::{ConditionContext, ExprError, Segment, eval_part, segments};
use std::collections::BTreeMap;

/// The shells a step may name; anything else must be a template with `{0}`.
pub const SHELLS: &[&str] = &["sh", "bash", "python3"];

/// Runs a command template: the arguments are the template's words and, last,
/// the script. The script goes to a private temporary file that replaces every
/// `{0}` word; the file is removed afterwards and the command's status kept.
const TEMPLATE_TRAMPOLINE: &str = r#"n=$#; i=0; s=
for a; do i=$((i+1)); [ "$i" -eq "$n" ] && s=$a; done
f=$(mktemp "${TMPDIR:-/tmp}/kiln-step.XXXXXX") || exit 127
printf '%s\n' "$s" > "$f" || exit 127
i=0
for a; do i=$((i+1)); shift; if [ "$i" -lt "$n" ]; then [ "$a" = "{0}" ] && a=$f; set -- "$@" "$a"; fi; done
"$@"; rc=$?; rm -f "$f"; exit $rc"#;

/// The program and arguments a step's script is appended to, as the last
/// argument. Empty means the executor's default, `/bin/sh -e -c`.
///
/// `sh` → `sh -e -c`; `bash` → `bash --noprofile --norc -eo pipefail -c`;
/// `python3` → `python3 -c`; a template such as `perl {0}` runs with the
/// script in a temporary file named where `{0}` stands.
pub fn shell_argv(shell: Option<&str>) -> Vec<String> {
    let words: &[&str] = match shell {
        None | Some("sh") => return Vec::new(),
        Some("bash") => &["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"],
        Some("python3") => &["python3", "-c"],
        Some(template) => {
            let mut argv: Vec<String> =
                ["sh", "-c", TEMPLATE_TRAMPOLINE, "kiln-step"].iter().map(|s| s.to_string()).collect();
            argv.extend(template.split_whitespace().map(str::to_string));
            return argv;
        }
    };
    words.iter().map(|s| s.to_string()).collect()
}

/// Whether `${{ }}` in `run` can become an environment reference for this
/// shell (the POSIX shells).
pub(crate) fn shell_expands(shell: Option<&str>) -> bool {
    matches!(shell, None | Some("sh" | "bash"))
}

/// Why a `shell:` value is refused, if it is.
pub(crate) fn check_shell(shell: &str) -> Result<(), String> {
    if SHELLS.contains(&shell) {
        return Ok(());
    }
    if shell.chars().any(char::is_control) {
        return Err("contains a control character".into());
    }
    if !shell.split_whitespace().any(|w| w == "{0}") {
        return Err(format!(
            "`{}` is not a known shell; use `sh`, `bash`, `python3`, or a command template with `{{0}}` for the script file, like `perl {{0}}`",
            shell.escape_debug()
        ));
    }
    Ok(())
}

/// Where a `${{ }}` stands in shell text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quote {
    None,
    Single,
    Double,
    Comment,
    /// In the body of a here-document with an unquoted delimiter.
    HereDoc,
}

/// A small scanner of POSIX shell quoting: enough to know, at each `${{`,
/// whether it stands outside quotes, in single or double quotes, in a
/// comment or in a here-document. Safety never depends on it (an expanded
/// parameter is never code); it decides only word splitting.
#[derive(Debug, Default)]
struct Scanner {
    quote: Option<Quote>,
    /// Characters of the current line so far, for here-document ends.
    line: String,
    /// Delimiters of here-documents opened on this line: (word, quoted, strip tabs).
    pending: Vec<(String, bool, bool)>,
    /// The here-document being read: (delimiter, quoted, strip tabs).
    heredoc: Option<(String, bool, bool)>,
    /// The previous character was a backslash (outside single quotes).
    escaped: bool,
    /// The previous character (outside here-documents).
    prev: char,
}

impl Scanner {
    fn state(&self) -> Result<Quote, String> {
        match &self.heredoc {
            Some((_, true, _)) => Err(
                "`${{ }}` stands in a here-document with a quoted delimiter (`<<'EOF'`), where nothing is expanded; \
                 use an unquoted delimiter (`<<EOF`)"
                    .into(),
            ),
            Some(_) => Ok(Quote::HereDoc),
            None => Ok(self.quote.unwrap_or(Quote::None)),
        }
    }

    fn feed(&mut self, text: &str) {
        let chars: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            i += 1;
            if c == '\n' {
                self.newline();
                continue;
            }
            self.line.push(c);
            if self.heredoc.is_some() {
                continue;
            }
            if self.escaped {
                self.escaped = false;
                self.prev = c;
                continue;
            }
            match (self.quote, c) {
                (Some(Quote::Comment), _) => {}
                (Some(Quote::Single), '\'') => self.quote = None,
                (Some(Quote::Single), _) => {}
                (Some(Quote::Double), '"') => self.quote = None,
                (Some(Quote::Double), '\\') => self.escaped = true,
                (Some(Quote::Double), _) => {}
                (_, '\\') => self.escaped = true,
                (_, '\'') => self.quote = Some(Quote::Single),
                (_, '"') => self.quote = Some(Quote::Double),
                (_, '#') if self.prev.is_whitespace() || self.prev == '\0' || self.prev == ';' => {
                    self.quote = Some(Quote::Comment)
                }
                (_, '<') if chars.get(i) == Some(&'<') && chars.get(i + 1) != Some(&'<') => {
                    // `<<WORD`, `<<-WORD`, `<< 'WORD'`, `<<"WORD"`
                    let mut j = i + 1;
                    let strip = chars.get(j) == Some(&'-');
                    if strip {
                        j += 1;
                    }
                    while chars.get(j).is_some_and(|c| *c == ' ' || *c == '\t') {
                        j += 1;
                    }
                    let mut word = String::new();
                    let mut quoted = false;
                    while let Some(&w) = chars.get(j) {
                        if w.is_whitespace() || matches!(w, ';' | '|' | '&' | '>' | '<' | ')') {
                            break;
                        }
                        if matches!(w, '\'' | '"' | '\\') {
                            quoted = true;
                        } else {
                            word.push(w);
                        }
                        j += 1;
                    }
                    if !word.is_empty() {
                        self.pending.push((word, quoted, strip));
                    }
                    for &w in &chars[i..j] {
                        self.line.push(w);
                    }
                    i = j;
                    self.prev = 'x';
                    continue;
                }
                _ => {}
            }
            self.prev = c;
        }
    }

    fn newline(&mut self) {
        let line = std::mem::take(&mut self.line);
        if let Some((word, _, strip)) = &self.heredoc {
            let body = if *strip { line.trim_start_matches('\t') } else { line.as_str() };
            if body == word {
                self.heredoc = None;
            }
        } else {
            if self.quote == Some(Quote::Comment) {
                self.quote = None;
            }
            self.escaped = false;
        }
        if self.heredoc.is_none() && !self.pending.is_empty() && self.quote.is_none() {
            self.heredoc = Some(self.pending.remove(0));
        }
        self.prev = '\n';
    }
}

/// The variable that holds the `n`-th (1-based) expression value of a step.
fn var_name(n: usize) -> String {
    format!("KILN_EXPR_{n}")
}

/// `run` with every `${{ }}` replaced by a reference to an environment
/// variable, and those variables with their values (evaluated over `ctx`).
pub fn render_run(run: &str, ctx: &ConditionContext) -> Result<(String, BTreeMap<String, String>), String> {
    let mut vars = BTreeMap::new();
    let script = plan(run, &mut |inner, name| {
        vars.insert(name.to_string(), eval_part(inner, ctx).map_err(|e| e.to_string())?);
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    Ok((script, vars))
}

/// Parse-time check of `run`: every `${{ }}` stands where it can be
/// expanded (and its expression is checked by the caller).
pub(crate) fn check_run(run: &str) -> Result<(), ExprError> {
    plan(run, &mut |_, _| Ok(())).map(|_| ())
}

fn plan(run: &str, each: &mut dyn FnMut(&str, &str) -> Result<(), String>) -> Result<String, ExprError> {
    let mut out = String::with_capacity(run.len());
    let mut scanner = Scanner::default();
    let mut n = 0;
    for seg in segments(run)? {
        match seg {
            Segment::Text(t) => {
                scanner.feed(t);
                out.push_str(t);
            }
            Segment::Expr { inner, offset } => {
                n += 1;
                let name = var_name(n);
                each(inner, &name).map_err(|m| ExprError { offset, message: m })?;
                let state = scanner.state().map_err(|m| ExprError { offset, message: m })?;
                let reference = match state {
                    Quote::None | Quote::Comment => format!("\"${{{name}}}\""),
                    Quote::Double | Quote::HereDoc => format!("${{{name}}}"),
                    Quote::Single => format!("'\"${{{name}}}\"'"),
                };
                out.push_str(&reference);
                scanner.feed("x");
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> ConditionContext {
        ConditionContext {
            event: "push".into(),
            inputs: BTreeMap::from([("who".into(), "\"; rm -rf ~".into())]),
            ..Default::default()
        }
    }

    #[test]
    fn references_fit_their_quoting() {
        let cases = [
            ("echo ${{ inputs.who }}", "echo \"${KILN_EXPR_1}\""),
            ("echo \"hi ${{ inputs.who }}\"", "echo \"hi ${KILN_EXPR_1}\""),
            ("echo 'hi ${{ inputs.who }}'", "echo 'hi '\"${KILN_EXPR_1}\"''"),
            ("echo \"it's\" ${{ event }}", "echo \"it's\" \"${KILN_EXPR_1}\""),
            (
                "cat <<EOF\n${{ event }}\nEOF\necho ${{ event }}",
                "cat <<EOF\n${KILN_EXPR_1}\nEOF\necho \"${KILN_EXPR_2}\"",
            ),
            ("cat <<-X >f\n\t'${{ event }}'\n\tX\n", "cat <<-X >f\n\t'${KILN_EXPR_1}'\n\tX\n"),
            ("echo \\' ${{ event }}", "echo \\' \"${KILN_EXPR_1}\""),
            (
                "echo a # it's ${{ event }}\necho '${{ event }}'",
                "echo a # it's \"${KILN_EXPR_1}\"\necho ''\"${KILN_EXPR_2}\"''",
            ),
        ];
        for (src, want) in cases {
            let (script, vars) = render_run(src, &ctx()).unwrap();
            assert_eq!(script, want, "{src}");
            assert!(vars.values().all(|v| v == "push" || v == "\"; rm -rf ~"), "{vars:?}");
        }
        let (script, vars) = render_run("echo ${{ inputs.who }} ${{ inputs.none || 'x' }}", &ctx()).unwrap();
        assert_eq!(script, "echo \"${KILN_EXPR_1}\" \"${KILN_EXPR_2}\"");
        assert_eq!(vars["KILN_EXPR_1"], "\"; rm -rf ~");
        assert_eq!(vars["KILN_EXPR_2"], "x");
        assert_eq!(render_run("plain $HOME", &ctx()).unwrap().0, "plain $HOME");
        // A job output is data too: never pasted into the script.
        let with_output = ConditionContext {
            needs_outputs: BTreeMap::from([(
                "build".into(),
                BTreeMap::from([("v".into(), "$(touch /tmp/pwned)`id`".into())]),
            )]),
            ..ctx()
        };
        let (script, vars) = render_run("echo v=${{ needs.build.outputs.v }}", &with_output).unwrap();
        assert_eq!(script, "echo v=\"${KILN_EXPR_1}\"");
        assert_eq!(vars["KILN_EXPR_1"], "$(touch /tmp/pwned)`id`");
    }

    #[test]
    fn quoted_heredocs_are_refused() {
        let e = check_run("cat <<'EOF'\n${{ event }}\nEOF").unwrap_err();
        assert!(e.message.contains("quoted delimiter"), "{e}");
        assert!(check_run("cat <<'EOF'\nx\nEOF\necho ${{ event }}").is_ok());
    }

    #[test]
    fn shells() {
        assert!(shell_argv(None).is_empty() && shell_argv(Some("sh")).is_empty());
        assert_eq!(shell_argv(Some("bash"))[0], "bash");
        assert_eq!(shell_argv(Some("perl -w {0}"))[4..], ["perl", "-w", "{0}"]);
        assert!(check_shell("zsh").is_err());
        assert!(check_shell("zsh -e {0}").is_ok());
        assert!(check_shell("zsh -e x{0}").is_err());
    }
}
