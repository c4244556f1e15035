//! Text Kiln does not control (job logs, messages from the server) on a
//! terminal (issue 13, finding 9). A job's output may carry escape
//! sequences that act on the *user's* terminal: OSC 52 writes the
//! clipboard, OSC 8 hides a link behind other text, OSC 0/2 set the window
//! title, DCS/APC reach terminal extensions, `\r` and cursor movement
//! overwrite what was shown. When the output is a terminal, colours and
//! emphasis (SGR: `ESC [ … m`) are kept and everything else is removed — the
//! rules of the web UI's log viewer (`assets/index.html`, `ESC_RE` and
//! `CTRL_RE`):
//!
//! - CSI `ESC [ params intermediates final`: kept only as SGR (final `m`,
//!   params of digits, `;` and `:`), dropped otherwise;
//! - OSC `ESC ] … (BEL | ESC \)` and the strings DCS/SOS/PM/APC
//!   (`ESC P|X|^|_ … ESC \`): dropped, however long, across chunks;
//! - any other `ESC intermediates final`: dropped;
//! - C0 controls other than tab and newline (so `\r`, backspace, bell),
//!   DEL, and C1 controls (U+0080–U+009F, which some terminals obey as
//!   8-bit CSI/OSC): dropped; bytes that are not UTF-8 become U+FFFD.
//!
//! Output to a file or pipe is passed through unchanged (`kiln logs > f`
//! keeps the log's bytes).

use std::io::IsTerminal;

/// Largest SGR parameter string kept; a longer CSI is dropped whole.
const MAX_PARAMS: usize = 64;

const REPLACEMENT: &[u8] = "\u{fffd}".as_bytes();

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Text,
    /// After ESC.
    Esc,
    /// After `ESC [`, collecting parameters (kept in `params`).
    Csi,
    /// A CSI that will be dropped: skip to its final byte.
    CsiSkip,
    /// `ESC` followed by intermediates: skip to the final byte.
    EscIntermediate,
    /// Inside OSC (ends with BEL or ST) or DCS/SOS/PM/APC (ends with ST).
    Str {
        osc: bool,
    },
    /// ESC inside a string: `\` ends it, anything else ends it too and is
    /// read again as the start of a new sequence.
    StrEsc,
}

/// A streaming sanitizer: feed it chunks as they come; a sequence split
/// across chunks is recognised as a whole.
#[derive(Debug)]
pub struct Sanitizer {
    state: State,
    params: Vec<u8>,
    /// An incomplete UTF-8 character.
    utf8: Vec<u8>,
    utf8_need: usize,
}

impl Default for Sanitizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Sanitizer {
    pub fn new() -> Self {
        Sanitizer { state: State::Text, params: Vec::new(), utf8: Vec::new(), utf8_need: 0 }
    }

    /// Append the sanitized form of `input` to `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        for &b in input {
            self.byte(b, out);
        }
    }

    /// End of the stream: an unfinished character becomes U+FFFD, an
    /// unfinished sequence is dropped.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.utf8.is_empty() {
            out.extend_from_slice(REPLACEMENT);
        }
        *self = Sanitizer::new();
    }

    fn byte(&mut self, b: u8, out: &mut Vec<u8>) {
        // A multi-byte character in progress (only in text).
        if self.utf8_need > 0 {
            let second = self.utf8.len() == 1;
            let ok = match (second, self.utf8[0]) {
                (true, 0xE0) => (0xA0..=0xBF).contains(&b),
                (true, 0xED) => (0x80..=0x9F).contains(&b),
                (true, 0xF0) => (0x90..=0xBF).contains(&b),
                (true, 0xF4) => (0x80..=0x8F).contains(&b),
                _ => (0x80..=0xBF).contains(&b),
            };
            if !ok {
                self.utf8.clear();
                self.utf8_need = 0;
                out.extend_from_slice(REPLACEMENT);
                return self.byte(b, out);
            }
            self.utf8.push(b);
            self.utf8_need -= 1;
            if self.utf8_need == 0 {
                // U+0080..U+009F (C1 controls) are dropped.
                if !(self.utf8[0] == 0xC2 && (0x80..=0x9F).contains(&self.utf8[1])) {
                    out.extend_from_slice(&self.utf8);
                }
                self.utf8.clear();
            }
            return;
        }
        match self.state {
            State::Text => match b {
                0x1B => self.state = State::Esc,
                b'\t' | b'\n' => out.push(b),
                0x00..=0x1F | 0x7F => {}
                0x20..=0x7E => out.push(b),
                0xC2..=0xDF => self.start_utf8(b, 1),
                0xE0..=0xEF => self.start_utf8(b, 2),
                0xF0..=0xF4 => self.start_utf8(b, 3),
                _ => out.extend_from_slice(REPLACEMENT),
            },
            State::Esc => match b {
                b'[' => {
                    self.params.clear();
                    self.state = State::Csi;
                }
                b']' => self.state = State::Str { osc: true },
                b'P' | b'X' | b'^' | b'_' => self.state = State::Str { osc: false },
                0x1B => {} // ESC ESC: the second one starts over
                0x20..=0x2F => self.state = State::EscIntermediate,
                0x30..=0x7E => self.state = State::Text,
                // Not a sequence after all: drop the ESC, read `b` as text.
                _ => {
                    self.state = State::Text;
                    self.byte(b, out);
                }
            },
            State::Csi => match b {
                b'0'..=b'9' | b';' | b':' if self.params.len() < MAX_PARAMS => self.params.push(b),
                b'm' => {
                    out.extend_from_slice(b"\x1b[");
                    out.extend_from_slice(&self.params);
                    out.push(b'm');
                    self.state = State::Text;
                }
                0x40..=0x7E => self.state = State::Text,
                0x20..=0x3F => self.state = State::CsiSkip,
                _ => self.abort(b, out),
            },
            State::CsiSkip => match b {
                0x40..=0x7E => self.state = State::Text,
                0x20..=0x3F => {}
                _ => self.abort(b, out),
            },
            State::EscIntermediate => match b {
                0x20..=0x2F => {}
                0x30..=0x7E => self.state = State::Text,
                _ => self.abort(b, out),
            },
            State::Str { osc } => match b {
                0x07 if osc => self.state = State::Text,
                0x1B => self.state = State::StrEsc,
                _ => {}
            },
            State::StrEsc => {
                self.state = State::Text;
                if b != b'\\' {
                    // ESC that was not ST: the string ended; this ESC
                    // starts a new sequence.
                    self.state = State::Esc;
                    self.byte(b, out);
                }
            }
        }
    }

    fn start_utf8(&mut self, b: u8, need: usize) {
        self.utf8.clear();
        self.utf8.push(b);
        self.utf8_need = need;
    }

    /// A sequence broken by a byte that cannot continue it: drop what was
    /// read, then read `b` as text (ESC starts a new sequence).
    fn abort(&mut self, b: u8, out: &mut Vec<u8>) {
        self.state = State::Text;
        self.byte(b, out);
    }
}

/// `text` sanitized whole.
pub fn clean(text: &str) -> String {
    let mut s = Sanitizer::new();
    let mut out = Vec::with_capacity(text.len());
    s.feed(text.as_bytes(), &mut out);
    s.finish(&mut out);
    String::from_utf8(out).expect("the sanitizer emits UTF-8")
}

/// `text` for standard output: sanitized when it is a terminal.
pub fn for_stdout(text: &str) -> String {
    if std::io::stdout().is_terminal() { clean(text) } else { text.to_string() }
}

/// `text` for standard error: sanitized when it is a terminal.
pub fn for_stderr(text: &str) -> String {
    if std::io::stderr().is_terminal() { clean(text) } else { text.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sequences_that_act_on_the_terminal_are_removed_and_colours_kept() {
        let cases: &[(&str, &[u8], &[u8])] = &[
            ("plain text", b"hello\tworld\n", b"hello\tworld\n"),
            ("SGR red and reset", b"\x1b[31mred\x1b[0m", b"\x1b[31mred\x1b[0m"),
            ("SGR 256 and truecolour", b"\x1b[38;5;208mo\x1b[38:2::1:2:3mx", b"\x1b[38;5;208mo\x1b[38:2::1:2:3mx"),
            ("SGR without parameters", b"\x1b[m", b"\x1b[m"),
            ("OSC 52 clipboard write (BEL)", b"a\x1b]52;c;ZWNobyBwd25lZA==\x07b", b"ab"),
            ("OSC 52 clipboard write (ST)", b"a\x1b]52;c;ZWNobyBwd25lZA==\x1b\\b", b"ab"),
            ("OSC 8 hyperlink", b"\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\", b"click"),
            ("OSC 0 window title", b"\x1b]0;pwned\x07x", b"x"),
            ("OSC 2 window title", b"\x1b]2;pwned\x1b\\x", b"x"),
            ("DCS (e.g. sixel, tmux passthrough)", b"\x1bPtmux;\x1b\x1b]52;c;x\x07\x1b\\y", b"y"),
            ("APC", b"\x1b_Gf=100;AAAA\x1b\\z", b"z"),
            ("cursor up and erase line", b"shown\x1b[1A\x1b[2Khidden", b"shownhidden"),
            ("private mode (alternate screen)", b"\x1b[?1049hx", b"x"),
            ("SGR with an intermediate is not SGR", b"\x1b[1 mx", b"x"),
            ("device status report (answerback)", b"\x1b[6nx", b"x"),
            ("full reset", b"\x1bcx", b"x"),
            ("charset designation", b"\x1b(0x", b"x"),
            ("carriage return overwrite", b"rm -rf /\rls", b"rm -rf /ls"),
            ("backspace, bell, DEL", b"a\x08b\x07c\x7fd", b"abcd"),
            ("C1 CSI (U+009B)", "a\u{9b}31mb".as_bytes(), b"a31mb"),
            ("C1 OSC (U+009D)", "a\u{9d}0;t\u{9c}b".as_bytes(), b"a0;tb"),
            ("lone 8-bit CSI byte", b"a\x9b2Jb", "a\u{fffd}2Jb".as_bytes()),
            ("UTF-8 kept", "größe ✓ 🔥".as_bytes(), "größe ✓ 🔥".as_bytes()),
            ("overlong ESC", b"\xe0\x80\x9bx", "\u{fffd}\u{fffd}\u{fffd}x".as_bytes()),
            ("ESC breaks an OSC", b"\x1b]0;t\x1b[31mred", b"\x1b[31mred"),
            ("unterminated OSC swallows to the end", b"a\x1b]52;c;AAAA", b"a"),
            ("too long a CSI is dropped", &[b"\x1b[".as_slice(), &[b'1'; 100], b"mz"].concat(), b"z"),
        ];
        for (name, input, want) in cases {
            let mut s = Sanitizer::new();
            let mut out = vec![];
            s.feed(input, &mut out);
            s.finish(&mut out);
            assert_eq!(out, *want, "{name}: got {:?}", String::from_utf8_lossy(&out));
            // The same, one byte at a time.
            let mut s = Sanitizer::new();
            let mut bytewise = vec![];
            for b in *input {
                s.feed(&[*b], &mut bytewise);
            }
            s.finish(&mut bytewise);
            assert_eq!(bytewise, *want, "{name} (byte by byte)");
        }
    }

    /// Every ESC of the output starts an SGR sequence; no other control
    /// (C0 but tab and newline, DEL, C1) is left; the output is UTF-8.
    fn only_sgr(out: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(out).map_err(|e| e.to_string())?;
        for c in text.chars() {
            let bad = (c.is_control() && c != '\t' && c != '\n' && c != '\x1b') || ('\u{80}'..='\u{9f}').contains(&c);
            if bad {
                return Err(format!("control {c:?} in {text:?}"));
            }
        }
        let mut rest = out;
        while let Some(i) = rest.iter().position(|&b| b == 0x1b) {
            let seq = &rest[i + 1..];
            let params = seq.get(1..).unwrap_or(&[]);
            let n = params.iter().take_while(|b| b.is_ascii_digit() || **b == b';' || **b == b':').count();
            if seq.first() != Some(&b'[') || params.get(n) != Some(&b'm') {
                return Err(format!("ESC not starting SGR in {:?}", String::from_utf8_lossy(out)));
            }
            rest = &params[n + 1..];
        }
        Ok(())
    }

    fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            Just(b"\x1b".to_vec()),
            Just(b"\x1b[".to_vec()),
            Just(b"\x1b]".to_vec()),
            Just(b"\x1bP".to_vec()),
            Just(b"\x1b\\".to_vec()),
            Just(b"\x07".to_vec()),
            Just(b"31;1m".to_vec()),
            Just(b"52;c;QUJD".to_vec()),
            Just("\u{9b}".as_bytes().to_vec()),
            Just(b"\xc2".to_vec()),
            Just(b"\r\n".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..8),
        ];
        proptest::collection::vec(piece, 0..40).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn output_never_holds_an_escape_but_sgr(input in hostile_bytes(), cuts in proptest::collection::vec(any::<usize>(), 0..6)) {
            let mut whole = vec![];
            let mut s = Sanitizer::new();
            s.feed(&input, &mut whole);
            s.finish(&mut whole);
            prop_assert!(only_sgr(&whole).is_ok(), "{:?}", only_sgr(&whole));
            // Chunk boundaries do not matter.
            let mut points: Vec<usize> = cuts.iter().map(|c| if input.is_empty() { 0 } else { c % input.len() }).collect();
            points.sort_unstable();
            let mut chunked = vec![];
            let mut s = Sanitizer::new();
            let mut at = 0;
            for p in points {
                s.feed(&input[at..p], &mut chunked);
                at = p;
            }
            s.feed(&input[at..], &mut chunked);
            s.finish(&mut chunked);
            prop_assert_eq!(chunked, whole);
        }
    }
}
