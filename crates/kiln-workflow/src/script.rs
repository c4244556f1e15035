//! A step's script: which program runs it ([`shell_argv`]) and how `${{ }}`
//! in `run` reaches it ([`render_run`]).
//!
//! A value is never pasted into shell text. Each `${{ expr }}` of a `run`
//! becomes a reference to an exported environment variable (`KILN_EXPR_<n>`)
//! that holds the value, quoted to fit where it stands: `"${KILN_EXPR_1}"`
//! outside quotes, `${KILN_EXPR_1}` inside double quotes or an unquoted
//! here-document. The shell expands a reference once and never parses the
//! result as code, so a branch name or input like `"; rm -rf ~` stays text.
//!
//! A nested parser would parse it, though (issue 39 item 11). So a `${{ }}`
//! is refused where the expanded value would reach one: inside single
//! quotes (text handed on unexpanded, usually a program: `sh -c '…'`), in
//! the program text of an interpreter (`sh -c "…"`, `python3 -c`, `awk`,
//! `eval`, …), in a here-document, here-string or pipe read by something
//! that runs it (`sh <<EOF`, `| python3`), in bash arithmetic (`$(( ))`,
//! `(( ))`, `[[ -eq ]]`, array subscripts, where `a[$(id)]` runs `id`), in a
//! variable name (`read`, `printf -v`), or as the command name. The refusal
//! says where and to pass the value through `env:`. Only `sh` and `bash`
//! steps may use `${{ }}` in `run` (checked at parse time): other
//! interpreters read the value from `env:`.

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

/// The common advice of every refusal below.
const HINT: &str = "pass the value through `env:` (e.g. `env: {NAME: \"${{ inputs.x }}\"}`) and use \"$NAME\" \
                    where it is data; a nested program reads it from its environment (`sh -c 'echo \"$NAME\"'`, \
                    `os.environ[\"NAME\"]`)";

/// How a reference is written where it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Outside quotes (or in a comment): `"${V}"`, one word.
    Bare,
    /// Inside double quotes or an unquoted here-document: `${V}`.
    Quoted,
}

/// Where a simple command's words end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closer {
    /// The script itself.
    Top,
    /// `$( … )`.
    Paren,
    /// `<( … )`: its output is a file another command reads.
    ProcIn,
    /// `>( … )`: it reads the output of the command it stands in.
    ProcOut,
    /// `` ` … ` ``.
    Backtick,
}

/// A here-document waiting for its body (opened on the current line).
#[derive(Debug, Clone)]
struct HereDoc {
    delimiter: String,
    quoted: bool,
    strip_tabs: bool,
    /// The command that reads it (its name), if known when `<<` was read.
    consumer: Option<String>,
    /// The command it was opened in (see [`Cmd::serial`]).
    serial: u64,
    /// That command's output is piped to another command.
    piped: bool,
}

/// `[[ … ]]` being read: whether it compares numbers (then every operand
/// is evaluated as arithmetic, where `a[$(id)]` runs `id`), and the
/// expressions inside it.
#[derive(Debug, Default)]
struct Test {
    arithmetic: bool,
    exprs: Vec<usize>,
}

/// The simple command being read in a code frame.
#[derive(Debug, Default)]
struct Cmd {
    /// Completed words, quotes removed (an expansion keeps its `$`).
    words: Vec<String>,
    /// The word being read, if one has started.
    cur: Option<String>,
    /// The next word is a redirection target (not an argument).
    redirect_next: bool,
    /// The current word is a redirection target.
    cur_redirect: bool,
    /// The next word is a here-string (`<<< word`), read by the command.
    herestring_next: bool,
    cur_herestring: bool,
    /// Depth of `[` … `]` in the current word (an array subscript, which
    /// bash evaluates as arithmetic, or a glob).
    brackets: u32,
    serial: u64,
    test: Option<Test>,
    /// The expressions in this command (also inside its `$( )` and quotes).
    exprs: Vec<usize>,
    /// The expressions of the commands piped into this one.
    upstream: Vec<usize>,
    /// Its output goes to a `>( … )` that runs what it reads.
    output_runner: Option<String>,
}

#[derive(Debug)]
enum Frame {
    Code {
        cmd: Cmd,
        closer: Closer,
        parens: u32,
    },
    Double,
    Single,
    /// `$' … '`.
    AnsiC,
    /// `${ … }` (brace depth).
    Param(u32),
    /// `$(( … ))` or `(( … ))` (parenthesis depth inside).
    Arith(u32),
    /// `$[ … ]` (bracket depth inside).
    ArithBracket(u32),
    Comment,
    /// The body of a here-document.
    Body(HereDoc),
}

/// What the scanner found at one `${{ }}`.
#[derive(Debug)]
struct Found {
    offset: usize,
    place: Result<Place, String>,
}

/// A scanner of shell text: quoting, nesting (`$( )`, backticks, `${ }`,
/// arithmetic, here-documents) and the words of each simple command, enough
/// to decide at each `${{ }}` whether the shell will expand the reference
/// exactly once as data, or whether the value could reach a parser as
/// code (a nested interpreter, arithmetic, a variable name). Where it cannot
/// tell, it refuses: a false refusal costs an `env:` line, a false
/// acceptance would run a branch name.
#[derive(Debug)]
struct Scanner {
    frames: Vec<Frame>,
    /// Here-documents opened on the current line, in order.
    pending: Vec<HereDoc>,
    /// The text of the current line (for here-document ends).
    line: String,
    /// The previous character was a backslash (where it escapes).
    escaped: bool,
    serial: u64,
    found: Vec<Found>,
    /// A command that runs its input ended inside the innermost `>( … )`.
    proc_runner: Option<String>,
}

/// Data-only readers of a here-document or here-string: what they read is
/// never run. Anything else (`sh`, `python3`, `psql`, `ssh`…) may run it.
const STDIN_DATA: &[&str] = &[
    "cat",
    "tee",
    "grep",
    "egrep",
    "fgrep",
    "wc",
    "head",
    "tail",
    "sort",
    "uniq",
    "tr",
    "cut",
    "base64",
    "sha256sum",
    "sha1sum",
    "sha512sum",
    "md5sum",
    "read",
];

/// Commands whose later arguments are another command (skipped to find the
/// program a value is handed to).
const WRAPPERS: &[&str] = &[
    "command", "builtin", "exec", "nohup", "time", "env", "sudo", "doas", "nice", "timeout", "setsid", "stdbuf",
    "xargs",
];

/// Interpreters and the options whose argument is program text; `attached`
/// when the text may follow the option in the same word (`-c'print(1)'`).
struct Interp {
    names: &'static [&'static str],
    /// The option letters (combined single-dash flags like `-ec` count).
    letters: &'static str,
    long: &'static [&'static str],
    attached: bool,
}

const INTERPRETERS: &[Interp] = &[
    Interp {
        names: &[
            "sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "busybox", "fish", "su", "runuser", "flock", "script",
        ],
        letters: "c",
        long: &["--command"],
        attached: false,
    },
    Interp { names: &["python", "python2", "python3", "pypy", "pypy3"], letters: "c", long: &[], attached: true },
    Interp {
        names: &["perl", "ruby", "lua", "luajit", "Rscript", "osascript"],
        letters: "eE",
        long: &[],
        attached: true,
    },
    Interp { names: &["node", "nodejs", "bun"], letters: "ep", long: &["--eval", "--print"], attached: true },
    Interp { names: &["php"], letters: "r", long: &[], attached: true },
    Interp { names: &["pwsh", "powershell"], letters: "c", long: &["-Command", "-command"], attached: false },
];

/// Programs whose first operand (unless `-f`) is program text: awk's, and
/// sed's (GNU sed runs commands: `e`, `s///e`).
const SCRIPT_OPERAND: &[&str] = &["awk", "gawk", "mawk", "nawk", "sed", "gsed"];

/// Builtins that read every argument as code or arithmetic, or that run
/// their arguments through a shell.
const CODE_BUILTINS: &[&str] = &["eval", "let", "watch", "alias", "ssh"];

/// Builtins whose arguments are variable names (bash evaluates a subscript
/// in a name: `read 'a[$(id)]'` runs `id`).
const NAME_BUILTINS: &[&str] = &["read", "unset", "mapfile", "readarray"];

/// Reserved words that may precede a command.
const RESERVED: &[&str] = &["if", "then", "else", "elif", "do", "while", "until", "!", "{", "time"];

/// The index of the program a command runs, from `k` (after assignments
/// and reserved words): wrappers (`sudo -u x`, `env A=b`, `timeout 5`) are
/// skipped. At most `end`.
fn program_index(words: &[String], k: usize, end: usize) -> usize {
    let mut name_at = k;
    while name_at < end && WRAPPERS.contains(&basename(&words[name_at])) {
        let wrapper = basename(&words[name_at]);
        name_at += 1;
        while name_at < end {
            let w = &words[name_at];
            if w.starts_with('-') || (wrapper == "env" && is_assignment(w)) {
                let takes_arg = matches!(
                    (wrapper, w.as_str()),
                    ("sudo" | "doas", "-u" | "-g" | "-C" | "-D" | "-h" | "-p" | "-r" | "-t" | "-U")
                        | ("nice", "-n")
                        | ("timeout", "-s" | "-k")
                        | ("env", "-u" | "-C")
                        | ("xargs", "-I" | "-n" | "-P" | "-d" | "-E" | "-L" | "-s" | "-a")
                );
                name_at += if takes_arg { 2 } else { 1 };
            } else if wrapper == "timeout" && w.chars().next().is_some_and(|c| c.is_ascii_digit()) {
                name_at += 1;
                break;
            } else {
                break;
            }
        }
    }
    name_at.min(end)
}

/// Whether a command runs what it reads on its input as code (its name):
/// a shell or interpreter without program text or a script (also inside
/// `docker`/`podman`/`kubectl` commands), `ssh`, `xargs`, a SQL client…
fn runs_stdin(words: &[String]) -> Option<String> {
    const RUNNERS: &[&str] = &[
        "eval", "source", ".", "ssh", "xargs", "psql", "mysql", "sqlite3", "dc", "at", "batch", "crontab", "parallel",
    ];
    let mut k = 0;
    while k < words.len() && (is_assignment(&words[k]) || RESERVED.contains(&words[k].as_str())) {
        k += 1;
    }
    let start = program_index(words, k, words.len());
    // `xargs` makes command lines of what it reads.
    if words[k..start].iter().any(|w| basename(w) == "xargs") {
        return Some("xargs".into());
    }
    let program = words.get(start)?;
    // Container tools run a command given in their arguments.
    let scan_all =
        matches!(basename(program), "docker" | "podman" | "nerdctl" | "kubectl" | "oc" | "chroot" | "nsenter");
    let mut i = start;
    while i < words.len() {
        if i > start && !scan_all {
            break;
        }
        let b = basename(&words[i]);
        if RUNNERS.contains(&b) {
            return Some(b.to_string());
        }
        if let Some(interp) = INTERPRETERS.iter().find(|x| x.names.contains(&b)) {
            // It runs its input unless it has program text or a script.
            let rest = &words[i + 1..];
            let mut runs = true;
            let mut skip = false;
            for w in rest {
                if skip {
                    skip = false;
                    continue;
                }
                if is_code_flag(interp, w) || w == "-m" {
                    runs = false;
                    break;
                }
                if w == "-s" || w == "-" {
                    break;
                }
                if w == "-o" || w == "-O" || w == "-W" || w == "-X" {
                    skip = true;
                    continue;
                }
                if !w.starts_with(['-', '+']) {
                    runs = false;
                    break;
                }
            }
            if runs {
                return Some(b.to_string());
            }
        }
        i += 1;
    }
    None
}

fn basename(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// `NAME=…` or `NAME+=…`.
fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| is_name(name.strip_suffix('+').unwrap_or(name)))
}

fn refusal(what: &str) -> String {
    format!("`${{{{ }}}}` {what}, so its value could run as code; {HINT}")
}

impl Cmd {
    fn new(serial: u64) -> Self {
        Cmd { serial, ..Cmd::default() }
    }

    /// The current word has started (a quote, an expansion or a character).
    fn start_word(&mut self) {
        if self.cur.is_none() {
            self.cur = Some(String::new());
            self.cur_redirect = std::mem::take(&mut self.redirect_next);
            self.cur_herestring = std::mem::take(&mut self.herestring_next);
        }
    }

    fn push_char(&mut self, c: char) {
        self.start_word();
        if let Some(w) = &mut self.cur {
            w.push(c);
        }
    }

    /// The current word ends: arguments are kept, redirection targets not.
    /// Returns the word.
    fn end_word(&mut self) -> Option<String> {
        let word = self.cur.take()?;
        self.brackets = 0;
        let redirect = std::mem::take(&mut self.cur_redirect);
        self.cur_herestring = false;
        if redirect {
            return None;
        }
        if let Some(t) = &mut self.test
            && matches!(word.as_str(), "-eq" | "-ne" | "-lt" | "-le" | "-gt" | "-ge" | "-v" | "-R")
        {
            t.arithmetic = true;
        }
        self.words.push(word.clone());
        Some(word)
    }

    /// Why a value in the current word could be code, if it could.
    fn code_position(&self) -> Option<String> {
        let cur = self.cur.as_deref().unwrap_or("");
        if self.brackets > 0 {
            return Some(refusal("stands in an array subscript `[…]`, which bash evaluates as arithmetic"));
        }
        if self.cur_redirect || self.cur_herestring {
            return None;
        }
        let words = &self.words;
        let idx = words.len();
        // Leading assignments: their values are data.
        let mut k = 0;
        while k < idx && (is_assignment(&words[k]) || RESERVED.contains(&words[k].as_str())) {
            k += 1;
        }
        if k == idx {
            return if is_assignment(cur) || self.test.is_some() {
                None
            } else {
                Some(refusal(
                    "stands where the shell reads a command name; the value would choose the program to run (compare it instead: `[ \"${{ … }}\" = true ]`)",
                ))
            };
        }
        let name_at = program_index(words, k, idx);
        if name_at == idx && !cur.starts_with('-') {
            return Some(refusal(
                "stands where the shell reads a command name; the value would choose the program to run",
            ));
        }
        let name = words.get(name_at).map_or("", |w| basename(w));
        if CODE_BUILTINS.contains(&name) {
            return Some(refusal(&format!("is an argument of `{name}`, which runs its arguments as code")));
        }
        if matches!(name, "source" | "." | "trap") && words[name_at + 1..].iter().all(|w| w.starts_with('-')) {
            return Some(refusal(&format!("is the first argument of `{name}`, which runs it as code")));
        }
        if NAME_BUILTINS.contains(&name) {
            return Some(refusal(&format!(
                "is an argument of `{name}`, which reads it as a variable name (bash evaluates a subscript in a name)"
            )));
        }
        if matches!(name, "printf" | "test" | "[") && words.last().is_some_and(|w| w == "-v") {
            return Some(refusal(&format!("follows `{name} -v`, which reads it as a variable name")));
        }
        if matches!(name, "declare" | "typeset" | "local" | "readonly" | "export") {
            let typed = words[name_at + 1..]
                .iter()
                .any(|w| w.starts_with(['-', '+']) && w.chars().any(|c| matches!(c, 'i' | 'a' | 'A' | 'n')));
            if typed {
                return Some(refusal(&format!(
                    "is an argument of `{name}` with an integer, array or reference attribute, whose value bash evaluates"
                )));
            }
            if !cur.contains('=') {
                return Some(refusal(&format!("stands in a variable name given to `{name}`")));
            }
        }
        // A program-text argument of an interpreter, anywhere in the
        // command (`docker run img sh -c …`, `find -exec sh -c …`).
        let mut interp: Option<&Interp> = None;
        let mut interp_name = "";
        let mut code_next = false;
        let mut script_operand: Option<&str> = None;
        let mut skip_arg = false;
        for w in &words[name_at..] {
            if skip_arg {
                skip_arg = false;
                continue;
            }
            let b = basename(w);
            if let Some(i) = INTERPRETERS.iter().find(|i| i.names.contains(&b)) {
                interp = Some(i);
                interp_name = b;
                code_next = false;
                script_operand = None;
                continue;
            }
            if SCRIPT_OPERAND.contains(&b) {
                script_operand = Some(b);
                interp = None;
                continue;
            }
            if let Some(awk) = script_operand {
                match w.as_str() {
                    "-f" | "--file" => script_operand = None,
                    "-e" | "--expression" => {
                        // The next word is program text.
                        code_next = true;
                        interp_name = awk;
                    }
                    "-v" | "-F" | "-l" => skip_arg = true,
                    o if o.starts_with('-') => {}
                    _ => {
                        if code_next {
                            code_next = false;
                        }
                        script_operand = None;
                    }
                }
                continue;
            }
            if let Some(i) = interp {
                if code_next {
                    // The program text was this word; what follows is data.
                    interp = None;
                    code_next = false;
                } else if is_code_flag(i, w) {
                    code_next = true;
                }
            }
        }
        if code_next {
            return Some(refusal(&format!("is the program text of `{interp_name}`")));
        }
        if let Some(awk) = script_operand
            && !cur.starts_with('-')
        {
            return Some(refusal(&format!("is the program text of `{awk}`")));
        }
        if let Some(i) = interp {
            if i.attached && i.letters.chars().any(|l| cur.starts_with(&format!("-{l}"))) {
                return Some(refusal(&format!("is the program text of `{interp_name}`")));
            }
            if i.long.iter().any(|l| cur.starts_with(&format!("{l}="))) {
                return Some(refusal(&format!("is the program text of `{interp_name}`")));
            }
        }
        None
    }
}

/// `-c`, `-ec`, `--command`: the option whose argument is program text.
fn is_code_flag(i: &Interp, w: &str) -> bool {
    if i.long.contains(&w) {
        return true;
    }
    match w.strip_prefix('-') {
        Some(flags)
            if !flags.starts_with('-') && !flags.is_empty() && flags.chars().all(|c| c.is_ascii_alphabetic()) =>
        {
            // Perl's `-ne`/`-pe`/`-lane`: the code letter is last.
            let last = flags.chars().last().unwrap_or(' ');
            if i.attached && i.letters.contains(last) {
                return true;
            }
            !i.attached && flags.chars().any(|c| i.letters.contains(c))
        }
        _ => false,
    }
}

impl Scanner {
    fn new() -> Self {
        Scanner {
            frames: vec![Frame::Code { cmd: Cmd::new(0), closer: Closer::Top, parens: 0 }],
            pending: Vec::new(),
            line: String::new(),
            escaped: false,
            serial: 0,
            found: Vec::new(),
            proc_runner: None,
        }
    }

    fn next_serial(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }

    fn code(&mut self) -> Option<&mut Cmd> {
        match self.frames.last_mut() {
            Some(Frame::Code { cmd, .. }) => Some(cmd),
            _ => None,
        }
    }

    /// In a code frame, a quote or expansion starts (or continues) a word.
    fn start_word(&mut self) {
        if let Some(cmd) = self.code() {
            cmd.start_word();
        }
    }

    /// The simple command in the innermost code frame ends.
    fn end_command(&mut self) {
        self.end_command_by(false);
    }

    /// The simple command in the innermost code frame ends, by a pipe or
    /// otherwise. A command that runs its input as code refuses every value
    /// piped into it.
    fn end_command_by(&mut self, pipe: bool) {
        self.end_word();
        let serial = self.next_serial();
        let Some(Frame::Code { cmd, closer, .. }) = self.frames.last_mut() else { return };
        if cmd.test.is_some() {
            return;
        }
        let in_proc_out = *closer == Closer::ProcOut;
        if cmd.words.is_empty() && !pipe {
            // `a |` then a newline: the pipeline goes on.
            return;
        }
        let runner = runs_stdin(&cmd.words);
        let upstream = std::mem::take(&mut cmd.upstream);
        let exprs = std::mem::take(&mut cmd.exprs);
        let output_runner = cmd.output_runner.take();
        *cmd = Cmd::new(serial);
        if pipe {
            cmd.upstream = upstream.iter().chain(&exprs).copied().collect();
        }
        let exprs_here = exprs;
        if in_proc_out && runner.is_some() {
            self.proc_runner.clone_from(&runner);
        }
        if let Some(name) = output_runner {
            for offset in exprs_here.iter().chain(&upstream) {
                if let Some(f) = self.found.iter_mut().find(|f| f.offset == *offset)
                    && f.place.is_ok()
                {
                    f.place = Err(refusal(&format!(
                        "is in a command whose output goes to `>( {name} … )`, which runs what it reads"
                    )));
                }
            }
        }
        if let Some(name) = runner {
            for offset in upstream {
                if let Some(f) = self.found.iter_mut().find(|f| f.offset == offset)
                    && f.place.is_ok()
                {
                    f.place = Err(refusal(&format!(
                        "is in a command whose output is piped to `{name}`, which runs what it reads"
                    )));
                }
            }
        }
    }

    fn end_word(&mut self) {
        let Some(Frame::Code { cmd, .. }) = self.frames.last_mut() else { return };
        let Some(word) = cmd.end_word() else { return };
        let at_start =
            cmd.words.len() == 1 || cmd.words[..cmd.words.len() - 1].iter().all(|w| RESERVED.contains(&w.as_str()));
        if word == "[[" && at_start && cmd.test.is_none() {
            cmd.test = Some(Test::default());
        } else if word == "]]"
            && let Some(t) = cmd.test.take()
            && t.arithmetic
        {
            for offset in t.exprs {
                if let Some(f) = self.found.iter_mut().find(|f| f.offset == offset)
                    && f.place.is_ok()
                {
                    f.place = Err(refusal(
                        "stands in a `[[ … ]]` that compares numbers (`-eq`, `-lt`, …), where bash evaluates operands as arithmetic",
                    ));
                }
            }
        }
    }

    fn feed(&mut self, text: &str) {
        let chars: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied();
            let next2 = chars.get(i + 2).copied();
            i += 1;
            if c == '\n' {
                self.line_end();
                continue;
            }
            self.line.push(c);
            if std::mem::take(&mut self.escaped) {
                if let Some(cmd) = self.code() {
                    cmd.push_char(c);
                }
                continue;
            }
            let Some(frame) = self.frames.last_mut() else { return };
            match frame {
                Frame::Comment => {}
                Frame::Single => {
                    if c == '\'' {
                        self.frames.pop();
                    }
                }
                Frame::AnsiC => match c {
                    '\\' => self.escaped = true,
                    '\'' => {
                        self.frames.pop();
                    }
                    _ => {}
                },
                Frame::Body(h) => {
                    if h.quoted {
                        continue;
                    }
                    match c {
                        '\\' => self.escaped = true,
                        '$' | '`' => i += self.dollar(c, next, next2, false),
                        _ => {}
                    }
                }
                Frame::Double => match c {
                    '\\' => self.escaped = true,
                    '"' => {
                        self.frames.pop();
                    }
                    '$' | '`' => i += self.dollar(c, next, next2, false),
                    _ => {}
                },
                Frame::Param(depth) => match c {
                    '\\' => self.escaped = true,
                    '{' => *depth += 1,
                    '}' if *depth == 0 => {
                        self.frames.pop();
                    }
                    '}' => *depth -= 1,
                    '\'' => self.frames.push(Frame::Single),
                    '"' => self.frames.push(Frame::Double),
                    '$' | '`' => i += self.dollar(c, next, next2, false),
                    _ => {}
                },
                Frame::Arith(depth) => match c {
                    '(' => *depth += 1,
                    ')' if *depth > 0 => *depth -= 1,
                    ')' => {
                        if next == Some(')') {
                            i += 1;
                            self.line.push(')');
                        }
                        self.frames.pop();
                    }
                    '"' => self.frames.push(Frame::Double),
                    '\'' => self.frames.push(Frame::Single),
                    '\\' => self.escaped = true,
                    '$' | '`' => i += self.dollar(c, next, next2, false),
                    _ => {}
                },
                Frame::ArithBracket(depth) => match c {
                    '[' => *depth += 1,
                    ']' if *depth > 0 => *depth -= 1,
                    ']' => {
                        self.frames.pop();
                    }
                    '$' | '`' => i += self.dollar(c, next, next2, false),
                    _ => {}
                },
                Frame::Code { .. } => i += self.code_char(c, &chars, i),
            }
        }
    }

    /// A `$` or backquote outside single quotes: push what it opens.
    /// Returns how many more characters it consumed.
    fn dollar(&mut self, c: char, next: Option<char>, next2: Option<char>, in_code: bool) -> usize {
        if c == '`' {
            if let Some(Frame::Code { closer: Closer::Backtick, .. }) = self.frames.last() {
                self.frames.pop();
                return 0;
            }
            self.start_word();
            let serial = self.next_serial();
            self.frames.push(Frame::Code { cmd: Cmd::new(serial), closer: Closer::Backtick, parens: 0 });
            return 0;
        }
        self.start_word();
        let (frame, used) = match (next, next2) {
            (Some('('), Some('(')) => (Frame::Arith(0), 2),
            (Some('('), _) => {
                let serial = self.next_serial();
                (Frame::Code { cmd: Cmd::new(serial), closer: Closer::Paren, parens: 0 }, 1)
            }
            (Some('{'), _) => (Frame::Param(0), 1),
            (Some('['), _) => (Frame::ArithBracket(0), 1),
            (Some('\''), _) if in_code => (Frame::AnsiC, 1),
            _ => {
                if let Some(cmd) = self.code() {
                    cmd.push_char('$');
                }
                return 0;
            }
        };
        for c in [next, next2].into_iter().flatten().take(used) {
            self.line.push(c);
        }
        self.frames.push(frame);
        used
    }

    /// One character in a code frame; `i` is the index after it. Returns
    /// how many more characters it consumed.
    fn code_char(&mut self, c: char, chars: &[char], i: usize) -> usize {
        let next = chars.get(i).copied();
        let next2 = chars.get(i + 1).copied();
        let mut in_test = matches!(self.frames.last(), Some(Frame::Code { cmd, .. }) if cmd.test.is_some());
        if in_test && matches!(c, ';' | '&' | '|') {
            if c != ';' && next == Some(c) {
                // `&&` and `||` join tests inside `[[ ]]`; `]]` may close it.
                self.end_word();
                let still = matches!(self.frames.last(), Some(Frame::Code { cmd, .. }) if cmd.test.is_some());
                if !still {
                    self.end_command();
                }
                self.line.push(c);
                return 1;
            }
            // A lone `;`, `&` or `|` cannot stand inside `[[ ]]`: bash
            // refuses the script, and to sh (dash) `[[` was an ordinary
            // command all along — read the rest as sh does (a pipe is a pipe).
            self.end_word();
            if let Some(Frame::Code { cmd, .. }) = self.frames.last_mut() {
                cmd.test = None;
            }
            in_test = false;
        }
        match c {
            // bash reads `a[x y]=1` as one word: a subscript may hold blanks.
            ' ' | '\t' if self.code().is_some_and(|cmd| cmd.brackets > 0) => {
                if let Some(cmd) = self.code() {
                    cmd.push_char(c);
                }
            }
            ' ' | '\t' => self.end_word(),
            '\\' => {
                self.escaped = true;
                self.start_word();
            }
            '\'' => {
                self.start_word();
                self.frames.push(Frame::Single);
            }
            '"' => {
                self.start_word();
                self.frames.push(Frame::Double);
            }
            '$' | '`' => return self.dollar(c, next, next2, true),
            '#' if self.code().is_some_and(|cmd| cmd.cur.is_none()) => self.frames.push(Frame::Comment),
            ';' | '&' => self.end_command(),
            '|' => {
                let serial = self.code().map_or(0, |cmd| cmd.serial);
                for h in &mut self.pending {
                    if h.serial == serial && next != Some('|') {
                        h.piped = true;
                    }
                }
                if next == Some('|') {
                    self.end_command();
                    self.line.push('|');
                    return 1;
                }
                self.end_command_by(true);
                if next == Some('&') {
                    // `|&`
                    self.line.push('&');
                    return 1;
                }
            }
            '<' | '>' if in_test => self.end_word(),
            '<' | '>' if next == Some('(') => {
                // Process substitution: a command whose output is a file name.
                self.start_word();
                let serial = self.next_serial();
                let closer = if c == '<' { Closer::ProcIn } else { Closer::ProcOut };
                self.proc_runner = None;
                self.frames.push(Frame::Code { cmd: Cmd::new(serial), closer, parens: 0 });
                self.line.push('(');
                return 1;
            }
            '<' | '>' => {
                // A file descriptor number before the operator is not a word.
                if let Some(cmd) = self.code()
                    && cmd.cur.as_deref().is_some_and(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_digit()))
                {
                    cmd.cur = None;
                    cmd.cur_redirect = false;
                }
                self.end_word();
                if c == '<' && next == Some('<') && next2 == Some('<') {
                    if let Some(cmd) = self.code() {
                        cmd.herestring_next = true;
                    }
                    self.line.push_str("<<");
                    return 2;
                }
                if c == '<' && next == Some('<') {
                    return self.heredoc_start(chars, i);
                }
                let mut used = 0;
                while matches!(chars.get(i + used), Some('>' | '&' | '|')) {
                    self.line.push(chars[i + used]);
                    used += 1;
                }
                if let Some(cmd) = self.code() {
                    cmd.redirect_next = true;
                }
                return used;
            }
            '(' => {
                let at_start = self.code().is_some_and(|cmd| cmd.cur.is_none());
                if at_start && next == Some('(') {
                    self.frames.push(Frame::Arith(0));
                    self.line.push('(');
                    return 1;
                }
                self.end_command();
                if let Some(Frame::Code { parens, .. }) = self.frames.last_mut() {
                    *parens += 1;
                }
            }
            ')' => {
                self.end_command();
                match self.frames.last_mut() {
                    Some(Frame::Code { parens, .. }) if *parens > 0 => *parens -= 1,
                    Some(Frame::Code { closer: Closer::Paren | Closer::ProcIn, .. }) => {
                        self.frames.pop();
                    }
                    Some(Frame::Code { closer: Closer::ProcOut, .. }) => {
                        self.frames.pop();
                        if let Some(runner) = self.proc_runner.take()
                            && let Some(cmd) = self.code()
                        {
                            cmd.output_runner = Some(runner);
                        }
                    }
                    _ => {}
                }
            }
            '[' => {
                let Some(cmd) = self.code() else { return 0 };
                let word_start = cmd.cur.is_none();
                let spaced = next.is_none_or(|n| n == ' ' || n == '\t' || n == '\n');
                let double = next == Some('[') && next2.is_none_or(|n| n == ' ' || n == '\t' || n == '\n');
                if word_start && double {
                    cmd.push_char('[');
                    cmd.push_char('[');
                    self.line.push('[');
                    return 1;
                }
                cmd.push_char('[');
                // A subscript is arithmetic only in a name: an assignment
                // (`a[x]=1`, before the command) or a name argument (refused
                // on its own); in an argument word `x[…]` is a glob.
                if !(word_start && spaced) && cmd.words.iter().all(|w| is_assignment(w)) {
                    cmd.brackets += 1;
                }
            }
            ']' => {
                let Some(cmd) = self.code() else { return 0 };
                cmd.push_char(']');
                cmd.brackets = cmd.brackets.saturating_sub(1);
            }
            _ => {
                if let Some(cmd) = self.code() {
                    cmd.push_char(c);
                }
            }
        }
        0
    }

    /// `<<WORD`, `<<-WORD`, `<< 'WORD'`, `<<"WORD"`: `i` is the index of
    /// the second `<`. Returns how many more characters it consumed.
    fn heredoc_start(&mut self, chars: &[char], i: usize) -> usize {
        let mut j = i + 1;
        let strip_tabs = chars.get(j) == Some(&'-');
        if strip_tabs {
            j += 1;
        }
        while chars.get(j).is_some_and(|c| *c == ' ' || *c == '\t') {
            j += 1;
        }
        let mut delimiter = String::new();
        let mut quoted = false;
        while let Some(&w) = chars.get(j) {
            if w.is_whitespace() || matches!(w, ';' | '|' | '&' | '>' | '<' | ')' | '(') {
                break;
            }
            if matches!(w, '\'' | '"' | '\\') {
                quoted = true;
            } else {
                delimiter.push(w);
            }
            j += 1;
        }
        let (consumer, serial) = match self.code() {
            Some(cmd) => {
                let mut k = 0;
                while k < cmd.words.len() && is_assignment(&cmd.words[k]) {
                    k += 1;
                }
                (cmd.words.get(k).map(|w| basename(w).to_string()), cmd.serial)
            }
            None => (None, 0),
        };
        if !delimiter.is_empty() {
            self.pending.push(HereDoc { delimiter, quoted, strip_tabs, consumer, serial, piped: false });
        }
        for &w in &chars[i..j] {
            self.line.push(w);
        }
        j - i
    }

    fn line_end(&mut self) {
        let line = std::mem::take(&mut self.line);
        if std::mem::take(&mut self.escaped) {
            // A continued line (or an escaped newline in quotes).
            if let Some(Frame::Body(h)) = self.frames.last() {
                if !h.quoted {
                    return;
                }
            } else {
                return;
            }
        }
        match self.frames.last_mut() {
            Some(Frame::Body(h)) => {
                let body = if h.strip_tabs { line.trim_start_matches('\t') } else { line.as_str() };
                if body == h.delimiter {
                    self.frames.pop();
                    self.next_body();
                }
                return;
            }
            Some(Frame::Comment) => {
                self.frames.pop();
            }
            _ => {}
        }
        if matches!(self.frames.last(), Some(Frame::Code { .. })) {
            self.end_command();
            self.next_body();
        }
    }

    /// Start reading the next pending here-document's body, if any.
    fn next_body(&mut self) {
        if !self.pending.is_empty() && matches!(self.frames.last(), Some(Frame::Code { .. })) {
            let h = self.pending.remove(0);
            self.frames.push(Frame::Body(h));
        }
    }

    /// Where a `${{ }}` at `offset` stands, or why it may not stand there.
    fn place(&mut self, offset: usize) -> Result<Place, String> {
        if self.escaped {
            return Err(refusal("follows a backslash, which would escape the quote of its reference"));
        }
        let mut place = None;
        // A here-document's body stands for the word of the command that
        // reads it (whose words are done by then).
        let mut after_body = false;
        for f in self.frames.iter().rev() {
            if std::mem::take(&mut after_body) && matches!(f, Frame::Code { .. }) {
                continue;
            }
            after_body = matches!(f, Frame::Body(_));
            let here = match f {
                Frame::Single => Err(refusal(
                    "stands inside single quotes, whose text the shell passes on unexpanded, often as a program \
                     (`sh -c '…'`, `python3 -c '…'`, `awk '…'`)",
                )),
                Frame::AnsiC => Err(refusal("stands inside `$'…'` quotes")),
                Frame::Arith(_) | Frame::ArithBracket(_) => Err(refusal(
                    "stands in arithmetic (`$(( ))`, `(( ))`, `$[ ]`), which bash evaluates (`a[$(id)]` runs `id`)",
                )),
                Frame::Param(_) => Err(refusal(
                    "stands inside a parameter expansion `${…}` (an index, offset or name there is evaluated)",
                )),
                Frame::Body(h) if h.quoted => Err(
                    "`${{ }}` stands in a here-document with a quoted delimiter (`<<'EOF'`), where nothing is expanded; \
                     use an unquoted delimiter (`<<EOF`) with `cat`"
                        .to_string(),
                ),
                Frame::Body(h) => match &h.consumer {
                    Some(c) if STDIN_DATA.contains(&c.as_str()) && !h.piped => Ok(Place::Quoted),
                    Some(c) if STDIN_DATA.contains(&c.as_str()) => Err(refusal(&format!(
                        "stands in a here-document read by `{c}` whose output is piped on (the next command may run it)"
                    ))),
                    Some(c) => Err(refusal(&format!(
                        "stands in a here-document read by `{c}`, which may run it (only `cat`, `tee`, `grep`, … read a here-document as data)"
                    ))),
                    None => Err(refusal("stands in a here-document whose reader is unknown")),
                },
                Frame::Double => Ok(Place::Quoted),
                // The shell skips a comment.
                Frame::Comment => return Ok(Place::Bare),
                Frame::Code { closer: Closer::ProcIn, .. } => Err(refusal(
                    "stands in a process substitution `<( … )`, whose output a command reads as a file (`source <(…)` runs it)",
                )),
                Frame::Code { cmd, .. } => {
                    if let Some(why) = cmd.code_position() {
                        Err(why)
                    } else if cmd.cur_herestring {
                        let mut k = 0;
                        while k < cmd.words.len() && is_assignment(&cmd.words[k]) {
                            k += 1;
                        }
                        match cmd.words.get(k).map(|w| basename(w)) {
                            Some(c) if STDIN_DATA.contains(&c) => Ok(Place::Bare),
                            Some(c) => Err(refusal(&format!("is a here-string read by `{c}`, which may run it"))),
                            None => Err(refusal("is a here-string whose reader is unknown")),
                        }
                    } else {
                        Ok(Place::Bare)
                    }
                }
            };
            place.get_or_insert(here?);
        }
        // The value is part of each enclosing command's words (and output).
        let mut after_body = false;
        for f in self.frames.iter_mut().rev() {
            if let Frame::Code { cmd, .. } = f {
                if std::mem::take(&mut after_body) {
                    continue;
                }
                cmd.exprs.push(offset);
                if let Some(t) = &mut cmd.test {
                    t.exprs.push(offset);
                }
            }
            after_body = matches!(f, Frame::Body(_));
        }
        Ok(place.unwrap_or(Place::Bare))
    }

    /// A `${{ }}` at `offset`: record where it stands; it reads as one
    /// character of the current word.
    fn expr(&mut self, offset: usize) {
        let place = self.place(offset);
        self.found.push(Found { offset, place });
        self.feed("x");
    }

    /// After the whole script: close what is still open.
    fn finish(&mut self) {
        self.line_end();
        while self.frames.len() > 1 {
            self.end_word();
            self.frames.pop();
        }
        self.end_word();
        // A `[[` left open that compares numbers.
        let open =
            matches!(self.frames.last(), Some(Frame::Code { cmd: Cmd { test: Some(t), .. }, .. }) if t.arithmetic);
        if open {
            if let Some(Frame::Code { cmd, .. }) = self.frames.last_mut() {
                cmd.cur = Some("]]".into());
            }
            self.end_word();
        }
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
    let segs = segments(run)?;
    // `${{ matrix.<key> }}` is substituted as text when the matrix is
    // expanded (the checks run again then): here it is a word character.
    let is_matrix = |inner: &str| inner.trim_start().starts_with("matrix");
    let mut scanner = Scanner::new();
    for seg in &segs {
        match seg {
            Segment::Text(t) => scanner.feed(t),
            Segment::Expr { inner, .. } if is_matrix(inner) => scanner.feed("x"),
            Segment::Expr { offset, .. } => scanner.expr(*offset),
        }
    }
    scanner.finish();
    let mut found = scanner.found.into_iter();
    let mut out = String::with_capacity(run.len());
    let mut n = 0;
    for seg in segs {
        match seg {
            Segment::Text(t) => out.push_str(t),
            Segment::Expr { inner, offset } if is_matrix(inner) => {
                out.push_str(&run[offset - 3..offset + inner.len() + 2]);
            }
            Segment::Expr { inner, offset } => {
                n += 1;
                let name = var_name(n);
                each(inner, &name).map_err(|m| ExprError { offset, message: m })?;
                let place = found.next().map_or(Ok(Place::Bare), |f| f.place);
                // The hint names the expression itself.
                let place = place.map_err(|m| ExprError {
                    offset,
                    message: m.replace("${{ inputs.x }}", &format!("${{{{{inner}}}}}")),
                });
                let reference = match place? {
                    Place::Bare => format!("\"${{{name}}}\""),
                    Place::Quoted => format!("${{{name}}}"),
                };
                out.push_str(&reference);
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
            ("echo \"it's\" ${{ event }}", "echo \"it's\" \"${KILN_EXPR_1}\""),
            (
                "cat <<EOF\n${{ event }}\nEOF\necho ${{ event }}",
                "cat <<EOF\n${KILN_EXPR_1}\nEOF\necho \"${KILN_EXPR_2}\"",
            ),
            ("cat <<-X >f\n\t'${{ event }}'\n\tX\n", "cat <<-X >f\n\t'${KILN_EXPR_1}'\n\tX\n"),
            ("echo \\' ${{ event }}", "echo \\' \"${KILN_EXPR_1}\""),
            (
                "echo a # it's ${{ event }}\necho \"${{ event }}\"",
                "echo a # it's \"${KILN_EXPR_1}\"\necho \"${KILN_EXPR_2}\"",
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

    /// Issue 39 item 11: a value never reaches a parser as code. Each of
    /// these was rendered (and ran the value) before the rule.
    #[test]
    fn nested_interpreters_arithmetic_and_names_are_refused() {
        let cases = [
            // Single quotes hand text on unexpanded, often as a program.
            ("sh -c 'echo ${{ inputs.who }}'", "single quotes"),
            ("python3 -c 'print(\"${{ inputs.who }}\")'", "single quotes"),
            ("perl -ne 'print if /${{ inputs.who }}/' f", "single quotes"),
            ("echo $'${{ inputs.who }}'", "`$'…'`"),
            // The program text of a nested interpreter, in any quoting.
            ("sh -c \"echo ${{ inputs.who }}\"", "program text of `sh`"),
            ("bash --noprofile -ec \"echo ${{ inputs.who }}\"", "program text of `bash`"),
            ("python3 -c \"print('${{ inputs.who }}')\"", "program text of `python3`"),
            ("python3 -c\"print('${{ inputs.who }}')\"", "program text of `python3`"),
            ("node -e \"console.log('${{ inputs.who }}')\"", "program text of `node`"),
            ("perl -ne \"print if /${{ inputs.who }}/\" f", "program text of `perl`"),
            ("docker run --rm img sh -c \"echo ${{ inputs.who }}\"", "program text of `sh`"),
            ("find . -exec /bin/sh -c \"echo ${{ inputs.who }}\" \\;", "program text of `sh`"),
            ("sudo -u nobody bash -c ${{ inputs.who }}", "program text of `bash`"),
            ("sh -c \"$(echo ${{ inputs.who }})\"", "program text of `sh`"),
            ("sh -c \"`echo ${{ inputs.who }}`\"", "program text of `sh`"),
            ("awk \"BEGIN { print \\\"${{ inputs.who }}\\\" }\"", "program text of `awk`"),
            ("sed -i \"s/x/${{ inputs.who }}/\" f", "program text of `sed`"),
            ("sed -e \"s/x/${{ inputs.who }}/\" f", "program text of `sed`"),
            ("eval \"echo ${{ inputs.who }}\"", "`eval`"),
            ("if eval \"${{ inputs.who }}\"; then :; fi", "`eval`"),
            ("trap \"echo ${{ inputs.who }}\" EXIT", "`trap`"),
            ("source ${{ inputs.who }}", "`source`"),
            ("ssh host \"echo ${{ inputs.who }}\"", "`ssh`"),
            ("${{ inputs.who }} --version", "command name"),
            ("if ${{ inputs.who }}; then :; fi", "command name"),
            ("echo \\${{ inputs.who }}", "backslash"),
            // A here-document or here-string read by something that may run it.
            ("sh <<EOF\necho ${{ inputs.who }}\nEOF", "here-document read by `sh`"),
            ("python3 - <<EOF\nprint(\"${{ inputs.who }}\")\nEOF", "here-document read by `python3`"),
            ("cat <<EOF | sh\necho ${{ inputs.who }}\nEOF", "piped on"),
            ("bash <<< \"echo ${{ inputs.who }}\"", "here-string read by `bash`"),
            ("cat <<EOF\n$(sh -c \"echo ${{ inputs.who }}\")\nEOF", "program text of `sh`"),
            ("cat <<'EOF'\n${{ inputs.who }}\nEOF", "quoted delimiter"),
            // Arithmetic: bash evaluates `a[$(id)]` there, running `id`.
            ("echo $(( ${{ inputs.who }} + 1 ))", "arithmetic"),
            ("x=$((1 + ${{ inputs.who }}))", "arithmetic"),
            ("(( n = ${{ inputs.who }} ))", "arithmetic"),
            ("for ((i = 0; i < ${{ inputs.who }}; i++)); do :; done", "arithmetic"),
            ("echo $[ ${{ inputs.who }} ]", "arithmetic"),
            ("cat <<EOF\n$(( ${{ inputs.who }} ))\nEOF", "arithmetic"),
            ("[[ ${{ inputs.who }} -eq 1 ]]", "compares numbers"),
            ("[[ \"${{ inputs.who }}\" -gt 0 ]] && echo big", "compares numbers"),
            ("[[ 1 -lt \"${{ inputs.who }}\" ]]", "compares numbers"),
            ("if [[ \"${{ inputs.who }}\" -gt 1 ]]; then :; fi", "compares numbers"),
            ("while ! [[ ${{ inputs.who }} -le 1 ]]; do :; done", "compares numbers"),
            ("arr[${{ inputs.who }}]=1", "subscript"),
            ("a[bash -c ${{ inputs.who }}]=1", "subscript"),
            ("echo \"${arr[${{ inputs.who }}]}\"", "parameter expansion"),
            ("echo \"${x:${{ inputs.who }}}\"", "parameter expansion"),
            ("let n=${{ inputs.who }}", "`let`"),
            ("declare -i n=${{ inputs.who }}", "integer"),
            ("local -n ref=${{ inputs.who }}", "reference"),
            // Variable names: bash evaluates a subscript in a name.
            ("read ${{ inputs.who }} < f", "variable name"),
            ("printf -v \"${{ inputs.who }}\" x", "variable name"),
            ("[ -v \"${{ inputs.who }}\" ]", "variable name"),
            ("[[ -v ${{ inputs.who }} ]]", "compares numbers"),
            ("export ${{ inputs.who }}", "variable name"),
            // Piped into something that runs what it reads.
            ("echo \"${{ inputs.who }}\" | sh", "piped to `sh`"),
            // To sh (dash) an unclosed `[[` is an ordinary command: the
            // pipe after it is a pipe (a property-test find).
            ("[[ echo $((1<<2)); echo ${{ inputs.who }} | tr a a | sh -s", "piped to `sh`"),
            ("[[ x | echo ${{ inputs.who }} | sh", "piped to `sh`"),
            ("printf '%s' \"${{ inputs.who }}\" | tr a b | bash -s", "piped to `bash`"),
            ("echo \"${{ inputs.who }}\" |\n  python3", "piped to `python3`"),
            ("echo \"$(echo ${{ inputs.who }})\" | sudo sh", "piped to `sh`"),
            ("echo ${{ inputs.who }} | docker run -i img sh", "piped to `sh`"),
            ("echo ${{ inputs.who }} | xargs -I{} touch {}", "piped to `xargs`"),
            ("echo ${{ inputs.who }} |& ssh host", "piped to `ssh`"),
            ("sh <(echo ${{ inputs.who }})", "process substitution"),
            ("source <(echo \"${{ inputs.who }}\")", "process substitution"),
            ("echo \"${{ inputs.who }}\" > >(sh)", "`>( sh … )`"),
            ("echo \"${{ inputs.who }}\" | tee >(bash) >/dev/null", "`>( bash … )`"),
            ("unset \"${{ inputs.who }}\"", "variable name"),
        ];
        for (src, want) in cases {
            let e = check_run(src).expect_err(src);
            assert!(e.message.contains(want), "{src}: {e}");
            assert!(e.message.contains("env:") || e.message.contains("quoted delimiter"), "{src}: no hint: {e}");
            assert!(render_run(src, &ctx()).is_err(), "{src}");
            // The error points at the expression.
            assert_eq!(&src[e.offset..e.offset + 8], " inputs.", "{src}");
        }
    }

    /// Positions where the value is data: GitHub Actions habits keep working.
    #[test]
    fn data_positions_are_rendered() {
        let cases = [
            ("echo $((1<<2)) ${{ event }}", "echo $((1<<2)) \"${KILN_EXPR_1}\""),
            ("x=$((1<<2))\necho ${{ event }}", "x=$((1<<2))\necho \"${KILN_EXPR_1}\""),
            ("(( x = 1 << 2 ))\necho ${{ event }}", "(( x = 1 << 2 ))\necho \"${KILN_EXPR_1}\""),
            ("sh -c 'echo \"$1\"' sh ${{ event }}", "sh -c 'echo \"$1\"' sh \"${KILN_EXPR_1}\""),
            ("python3 build.py --name \"${{ event }}\"", "python3 build.py --name \"${KILN_EXPR_1}\""),
            ("docker build -t img:${{ event }} .", "docker build -t img:\"${KILN_EXPR_1}\" ."),
            ("[ \"${{ event }}\" -eq 1 ] || true", "[ \"${KILN_EXPR_1}\" -eq 1 ] || true"),
            ("if [ \"${{ event }}\" = push ]; then echo y; fi", "if [ \"${KILN_EXPR_1}\" = push ]; then echo y; fi"),
            ("[[ \"${{ event }}\" == p* ]] && echo y", "[[ \"${KILN_EXPR_1}\" == p* ]] && echo y"),
            ("[[ -n ${{ event }} ]] && sh -c 'echo hi'", "[[ -n \"${KILN_EXPR_1}\" ]] && sh -c 'echo hi'"),
            ("FOO=${{ event }} make", "FOO=\"${KILN_EXPR_1}\" make"),
            // In an argument, `x[…]` is a glob, not a subscript.
            ("echo bare[${{ event }}]", "echo bare[\"${KILN_EXPR_1}\"]"),
            ("export FOO=\"${{ event }}\"", "export FOO=\"${KILN_EXPR_1}\""),
            ("grep -q p <<< \"${{ event }}\"", "grep -q p <<< \"${KILN_EXPR_1}\""),
            ("echo \"$(basename \"${{ event }}\")\"", "echo \"$(basename \"${KILN_EXPR_1}\")\""),
            ("for f in ${{ event }}; do echo \"$f\"; done", "for f in \"${KILN_EXPR_1}\"; do echo \"$f\"; done"),
            ("case \"${{ event }}\" in p*) echo p;; esac", "case \"${KILN_EXPR_1}\" in p*) echo p;; esac"),
            ("cat <<EOF >> out\nv=${{ event }}\nEOF\n", "cat <<EOF >> out\nv=${KILN_EXPR_1}\nEOF\n"),
            ("x=$(cat <<EOF\n${{ event }}\nEOF\n)", "x=$(cat <<EOF\n${KILN_EXPR_1}\nEOF\n)"),
            ("echo ok 2>/dev/null ${{ event }}", "echo ok 2>/dev/null \"${KILN_EXPR_1}\""),
            ("echo ${{ matrix.os }} ${{ event }}", "echo ${{ matrix.os }} \"${KILN_EXPR_1}\""),
            ("echo \"${{ event }}\" | grep sh", "echo \"${KILN_EXPR_1}\" | grep sh"),
            ("echo ${{ event }} | python3 check.py", "echo \"${KILN_EXPR_1}\" | python3 check.py"),
            ("echo ${{ event }} | sh -c 'cat'", "echo \"${KILN_EXPR_1}\" | sh -c 'cat'"),
            ("echo ${{ event }} || sh\nsh", "echo \"${KILN_EXPR_1}\" || sh\nsh"),
            ("echo ${{ event }} | tee out; cat out | sh", "echo \"${KILN_EXPR_1}\" | tee out; cat out | sh"),
            ("echo ${{ event }} | tee >(wc -c)", "echo \"${KILN_EXPR_1}\" | tee >(wc -c)"),
        ];
        for (src, want) in cases {
            let (script, vars) = render_run(src, &ctx()).unwrap_or_else(|e| panic!("{src}: {e}"));
            assert_eq!(script, want, "{src}");
            assert_eq!(vars["KILN_EXPR_1"], "push");
        }
    }

    /// The accepted forms, run by the real shells with hostile values: the
    /// value is printed or compared, never run.
    #[test]
    fn accepted_forms_run_values_as_data() {
        let dir = std::env::temp_dir().join(format!("kiln-expr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mark = dir.join("pwned");
        let m = mark.display();
        let hostile = [
            format!("'; touch {m}; '"),
            format!("\"; touch {m}; \""),
            format!("$(touch {m})"),
            format!("`touch {m}`"),
            format!("a[$(touch {m})]"),
            format!("x\nEOF\ntouch {m}\n"),
            format!("-c touch {m}"),
        ];
        let scripts = [
            "echo ${{ inputs.v }}",
            "echo \"${{ inputs.v }}\" $((1<<2))",
            "[ \"${{ inputs.v }}\" -eq 1 ] 2>/dev/null || echo no",
            "[[ \"${{ inputs.v }}\" == a* ]] && echo yes || true",
            "sh -c 'echo \"$1\"' sh ${{ inputs.v }}",
            "cat <<EOF\nv=${{ inputs.v }}\nEOF",
            "x=$(cat <<EOF\n${{ inputs.v }}\nEOF\n)\necho \"$x\"",
            "FOO=${{ inputs.v }} sh -c 'echo \"$FOO\"'",
            "grep -c . <<< \"${{ inputs.v }}\" || true",
            "for f in ${{ inputs.v }}; do echo \"$f\"; done",
            "case \"${{ inputs.v }}\" in a*) echo a;; esac",
        ];
        for value in &hostile {
            let ctx =
                ConditionContext { inputs: BTreeMap::from([("v".to_string(), value.clone())]), ..Default::default() };
            for src in scripts {
                let (script, vars) = render_run(src, &ctx).unwrap_or_else(|e| panic!("{src}: {e}"));
                for shell in ["sh", "bash"] {
                    let out = std::process::Command::new(shell)
                        .arg("-c")
                        .arg(&script)
                        .envs(&vars)
                        .current_dir(&dir)
                        .stdin(std::process::Stdio::null())
                        .output()
                        .unwrap();
                    assert!(!mark.exists(), "{shell} ran {value:?} in {script:?}: {out:?}");
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The forms refused above do run the value when rendered as before
    /// (a reference spliced where the shell hands text on as code), which
    /// is why they are refused: proven with the real shells.
    #[test]
    fn refused_forms_would_run_the_value() {
        let dir = std::env::temp_dir().join(format!("kiln-expr-naive-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mark = dir.join("pwned");
        let m = mark.display();
        let cases = [
            ("sh -c 'echo '\"${V}\"''", format!("x; touch {m}")),
            ("sh -c \"echo ${V}\"", format!("x; touch {m}")),
            ("python3 -c 'print(\"'\"${V}\"'\")'", format!("\"); import os; os.system(\"touch {m}\"); print(\"")),
            ("sh <<EOF\necho ${V}\nEOF", format!("x; touch {m}")),
            ("echo $(( \"${V}\" + 1 ))", format!("a[$(touch {m})]")),
            ("[[ \"${V}\" -eq 1 ]]", format!("a[$(touch {m})]")),
        ];
        for (script, value) in cases {
            let _ = std::fs::remove_file(&mark);
            let out = std::process::Command::new("bash")
                .arg("-c")
                .arg(script)
                .env("V", &value)
                .current_dir(&dir)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            if script.starts_with("python3") && !out.status.success() && !mark.exists() {
                continue; // no python3 here
            }
            assert!(mark.exists(), "{script} did not run {value:?}: {out:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
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
