//! GitHub Actions filter patterns (branches, tags, paths), as the "filter
//! pattern cheat sheet" of GitHub's workflow syntax describes them:
//!
//! * `*` matches zero or more characters, but not `/`;
//! * `**` matches zero or more of any character; `**/` matches zero or more
//!   whole directories (so `**/README.md` matches `README.md` too);
//! * `?` matches zero or one of the preceding character (`*.jsx?` matches
//!   `page.js` and `page.jsx`);
//! * `+` matches one or more of the preceding character (`[0-9]+`);
//! * `[abc]`, `[a-z0-9]` match one character listed or in a range;
//! * `\` makes the next character literal.
//!
//! A leading `!` (negation) is handled by the lists ([`list_matches`]), not
//! here. Matching is linear in pattern × text (no backtracking blow-up).

/// What one pattern element matches, once.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Atom {
    Char(char),
    /// `[...]`: single characters and inclusive ranges.
    Class(Vec<(char, char)>),
}

impl Atom {
    fn matches(&self, c: char) -> bool {
        match self {
            Atom::Char(a) => *a == c,
            Atom::Class(ranges) => ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    One(Atom),
    /// `x?`
    Optional(Atom),
    /// `x+`
    OneOrMore(Atom),
    /// `*`
    Star,
    /// `**` not followed by `/`
    AnyChars,
    /// `**/`: empty, or anything ending with `/`
    AnyDirs,
}

/// Compile a pattern (without its leading `!`), or say why it is invalid.
fn compile(pattern: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut toks: Vec<Tok> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '*' => {
                if chars.get(i + 1) == Some(&'*') {
                    if chars.get(i + 2) == Some(&'/') {
                        toks.push(Tok::AnyDirs);
                        i += 3;
                    } else {
                        toks.push(Tok::AnyChars);
                        i += 2;
                    }
                } else {
                    toks.push(Tok::Star);
                    i += 1;
                }
            }
            '?' | '+' => {
                let atom = match toks.pop() {
                    Some(Tok::One(atom)) => atom,
                    _ => {
                        return Err(format!(
                            "`{c}` at position {} must follow a character or a `[...]` class (it repeats the one before it); write `\\{c}` for a literal `{c}`",
                            i + 1
                        ));
                    }
                };
                toks.push(if c == '?' { Tok::Optional(atom) } else { Tok::OneOrMore(atom) });
                i += 1;
            }
            '[' => {
                let start = i;
                i += 1;
                let mut ranges: Vec<(char, char)> = Vec::new();
                loop {
                    let Some(&c) = chars.get(i) else {
                        return Err(format!("`[` at position {} has no closing `]`", start + 1));
                    };
                    if c == ']' {
                        i += 1;
                        break;
                    }
                    let c = if c == '\\' {
                        i += 1;
                        *chars.get(i).ok_or_else(|| "the pattern ends with `\\`".to_string())?
                    } else {
                        c
                    };
                    if chars.get(i + 1) == Some(&'-') && chars.get(i + 2).is_some_and(|&e| e != ']') {
                        let end = chars[i + 2];
                        if end < c {
                            return Err(format!("the range `{c}-{end}` in `[...]` goes backwards"));
                        }
                        ranges.push((c, end));
                        i += 3;
                    } else {
                        ranges.push((c, c));
                        i += 1;
                    }
                }
                if ranges.is_empty() {
                    return Err(format!("`[]` at position {} is empty; list at least one character", start + 1));
                }
                toks.push(Tok::One(Atom::Class(ranges)));
            }
            '\\' => {
                let next = *chars.get(i + 1).ok_or_else(|| "the pattern ends with `\\`".to_string())?;
                toks.push(Tok::One(Atom::Char(next)));
                i += 2;
            }
            _ => {
                toks.push(Tok::One(Atom::Char(c)));
                i += 1;
            }
        }
    }
    Ok(toks)
}

/// Why `pattern` (without a leading `!`) is not a valid filter pattern, if
/// it is not.
pub(crate) fn check_pattern(pattern: &str) -> Result<(), String> {
    compile(pattern).map(|_| ())
}

/// Whether `text` matches the filter `pattern` as a whole (GitHub Actions
/// semantics, see the module docs). A leading `!` is a literal here; an
/// invalid pattern matches nothing.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    match compile(pattern) {
        Ok(toks) => run(&toks, text),
        Err(_) => false,
    }
}

/// dp over (token, text position), from the end, two rows at a time.
fn run(toks: &[Tok], text: &str) -> bool {
    let t: Vec<char> = text.chars().collect();
    let m = t.len();
    // next[j]: toks[i+1..] matches t[j..]
    let mut next: Vec<bool> = (0..=m).map(|j| j == m).collect();
    let mut cur = vec![false; m + 1];
    for tok in toks.iter().rev() {
        // For AnyDirs: whether some k > j has t[k-1] == '/' and next[k].
        let mut dir_tail = false;
        for j in (0..=m).rev() {
            let here = t.get(j).copied();
            cur[j] = match tok {
                Tok::One(a) => here.is_some_and(|c| a.matches(c)) && next[j + 1],
                Tok::Optional(a) => next[j] || (here.is_some_and(|c| a.matches(c)) && next[j + 1]),
                Tok::OneOrMore(a) => here.is_some_and(|c| a.matches(c)) && (next[j + 1] || cur[j + 1]),
                Tok::Star => next[j] || (here.is_some_and(|c| c != '/') && cur[j + 1]),
                Tok::AnyChars => next[j] || (here.is_some() && cur[j + 1]),
                Tok::AnyDirs => {
                    if here == Some('/') && next[j + 1] {
                        dir_tail = true;
                    }
                    next[j] || dir_tail
                }
            };
        }
        std::mem::swap(&mut cur, &mut next);
    }
    next[0]
}

/// A pattern list as GitHub reads it: patterns apply in order, a `!pattern`
/// takes back what earlier ones matched, so the last matching pattern
/// decides. True when that one is positive.
pub(crate) fn list_matches(patterns: &[String], text: &str) -> bool {
    let mut matched = false;
    for p in patterns {
        match p.strip_prefix('!') {
            Some(negated) => {
                if matched && glob_match(negated, text) {
                    matched = false;
                }
            }
            None => {
                if !matched && glob_match(p, text) {
                    matched = true;
                }
            }
        }
    }
    matched
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yes(pattern: &str, texts: &[&str]) {
        for t in texts {
            assert!(glob_match(pattern, t), "`{pattern}` should match `{t}`");
        }
    }

    fn no(pattern: &str, texts: &[&str]) {
        for t in texts {
            assert!(!glob_match(pattern, t), "`{pattern}` should not match `{t}`");
        }
    }

    fn list(patterns: &[&str]) -> Vec<String> {
        patterns.iter().map(|s| s.to_string()).collect()
    }

    // The cheat sheet's "Patterns to match branches and tags", row by row.
    #[test]
    fn cheat_sheet_branches_and_tags() {
        yes("feature/*", &["feature/my-branch", "feature/your-branch"]);
        no("feature/*", &["feature/beta-a/my-branch", "feature", "features/x"]);
        yes("feature/**", &["feature/beta-a/my-branch", "feature/your-branch", "feature/mona/the/octocat"]);
        no("feature/**", &["feature", "other/feature/x"]);
        let exact = list(&["main", "releases/mona-the-octocat"]);
        assert!(list_matches(&exact, "main"));
        assert!(list_matches(&exact, "releases/mona-the-octocat"));
        assert!(!list_matches(&exact, "main2"));
        assert!(!list_matches(&exact, "releases/mona"));
        yes("*", &["main", "releases"]);
        no("*", &["all/the/branches", "every/tag"]);
        yes("**", &["all/the/branches", "every/tag", "main"]);
        yes("*feature", &["mona-feature", "feature", "ver-10-feature"]);
        no("*feature", &["feature-x", "a/feature"]);
        yes("v2*", &["v2", "v2.0", "v2.9"]);
        no("v2*", &["v1", "v2/x", "xv2"]);
        yes("v[12].[0-9]+.[0-9]+", &["v1.10.1", "v2.0.0"]);
        no("v[12].[0-9]+.[0-9]+", &["v3.0.0", "v1.x.1", "v1..1", "v1.0"]);
    }

    // The cheat sheet's "Patterns to match file paths", row by row.
    #[test]
    fn cheat_sheet_paths() {
        yes("*", &["README.md", "server.rb"]);
        no("*", &["docs/README.md"]);
        yes("*.jsx?", &["page.js", "page.jsx"]);
        no("*.jsx?", &["page.jsxx", "src/page.js"]);
        yes("**", &["all/the/files.md", "x"]);
        yes("*.js", &["app.js", "index.js"]);
        no("*.js", &["js/index.js"]);
        yes("**.js", &["index.js", "js/index.js", "src/js/app.js"]);
        no("**.js", &["index.jsx"]);
        yes("docs/*", &["docs/README.md", "docs/file.txt"]);
        no("docs/*", &["docs/mona/octocat.txt"]);
        yes("docs/**", &["docs/README.md", "docs/mona/octocat.txt"]);
        no("docs/**", &["README.md", "src/docs/x"]);
        yes("docs/**/*.md", &["docs/README.md", "docs/mona/hello-world.md", "docs/a/markdown/file.md"]);
        no("docs/**/*.md", &["docs/a/file.txt", "README.md"]);
        yes("**/docs/**", &["docs/hello.md", "dir/docs/my-file.txt", "space/docs/plan/space.doc"]);
        no("**/docs/**", &["mydocs/x", "docs"]);
        yes("**/README.md", &["README.md", "js/README.md"]);
        no("**/README.md", &["README.mdx", "js/XREADME.md"]);
        yes("**/*src/**", &["a/src/app.js", "my-src/code/js/app.js"]);
        no("**/*src/**", &["src-a/app.js"]);
        yes("**/*-post.md", &["my-post.md", "path/their-post.md"]);
        no("**/*-post.md", &["post.md"]);
        yes("**/migrate-*.sql", &["migrate-10909.sql", "db/migrate-v1.0.sql", "db/sept/migrate-v1.sql"]);
        no("**/migrate-*.sql", &["db/migrate-v1/x.sql"]);

        let md = list(&["*.md", "!README.md"]);
        assert!(list_matches(&md, "hello.md"));
        assert!(!list_matches(&md, "README.md"));
        assert!(!list_matches(&md, "docs/hello.md"));
        let md = list(&["*.md", "!README.md", "README*"]);
        assert!(list_matches(&md, "hello.md"));
        assert!(list_matches(&md, "README.md"));
        assert!(list_matches(&md, "README.doc"));
    }

    #[test]
    fn classes_escapes_and_quantifiers() {
        yes("[CB]at", &["Cat", "Bat"]);
        no("[CB]at", &["cat", "at"]);
        yes("[1-2]00", &["100", "200"]);
        no("[1-2]00", &["300"]);
        yes("[0-9a-z]", &["0", "q"]);
        no("[0-9a-z]", &["Q", "-"]);
        yes("ab+c", &["abc", "abbbc"]);
        no("ab+c", &["ac"]);
        yes("colou?r", &["color", "colour"]);
        yes("release\\+x", &["release+x"]);
        no("release\\+x", &["releasex"]);
        yes("a\\*b", &["a*b"]);
        no("a\\*b", &["axb"]);
        yes("!x", &["!x"]);
        yes("", &[""]);
        no("", &["a"]);
        no("a", &[""]);
        yes("a*", &["a"]);
        yes("**/", &["", "a/", "a/b/"]);
        yes("日本*", &["日本語"]);
    }

    #[test]
    fn invalid_patterns() {
        for p in ["?x", "+", "*?", "**+", "[", "[abc", "[]", "[z-a]", "x\\", "[a\\"] {
            assert!(check_pattern(p).is_err(), "{p} should be invalid");
            assert!(!glob_match(p, "x"));
        }
        for p in ["a?", "[a-]", "[-a]", "[\\]]", "\\?"] {
            assert!(check_pattern(p).is_ok(), "{p} should be valid");
        }
        assert!(glob_match("[a-]", "-"));
        assert!(glob_match("[\\]]", "]"));
    }

    #[test]
    fn last_match_wins() {
        let l = list(&["releases/**", "!releases/**-alpha"]);
        assert!(list_matches(&l, "releases/10"));
        assert!(!list_matches(&l, "releases/10-alpha"));
        assert!(!list_matches(&l, "main"));
        let l = list(&["**", "!docs/**", "docs/keep.md"]);
        assert!(list_matches(&l, "src/a.rs"));
        assert!(!list_matches(&l, "docs/x.md"));
        assert!(list_matches(&l, "docs/keep.md"));
        assert!(!list_matches(&[], "x"));
    }

    #[test]
    fn long_inputs_are_linear() {
        let text = "a".repeat(5000);
        let pattern = "*a*a*a*a*a*a*a*a*a*a*b".to_string();
        let start = std::time::Instant::now();
        assert!(!glob_match(&pattern, &text));
        assert!(glob_match(&"**".repeat(200), &text));
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
    }
}
