//! Secret masking in job output (spec 000 §14, spec 003 "Secrets"): the
//! values of the secrets a job received, and their base64 forms, are
//! replaced by `***` before the bytes leave the agent — also when a value is
//! split across reads of the pipe. Best effort, not an exfiltration barrier:
//! a job can always transform a secret (reverse it, hex it) before printing.

use aho_corasick::{AhoCorasick, MatchKind};
use base64::Engine;

/// What a masked value is replaced with.
pub(crate) const MASK: &[u8] = b"***";
/// Shorter values are not masked: hiding every `ab` would wreck the log
/// while protecting nothing.
pub(crate) const MIN_MASKED: usize = 3;

#[derive(Clone)]
pub(crate) struct Masker {
    ac: AhoCorasick,
    patterns: Vec<Vec<u8>>,
    longest: usize,
}

/// Per-stream state: the tail held back because it may be the start of a
/// secret that continues in the next read.
#[derive(Default)]
pub(crate) struct Held(Vec<u8>);

impl From<&[u8]> for Held {
    fn from(b: &[u8]) -> Self {
        Held(b.to_vec())
    }
}

/// The forms of a secret value that are masked (and scanned for): the
/// value, its base64 forms, and each long line of a multi-line value (e.g.
/// a PEM key leaks line by line); pushed onto `patterns` unless present.
fn push_forms(v: &str, patterns: &mut Vec<Vec<u8>>, mut added: impl FnMut()) {
    let forms = [
        v.as_bytes().to_vec(),
        base64::engine::general_purpose::STANDARD.encode(v).into_bytes(),
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(v).into_bytes(),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v).into_bytes(),
    ];
    for f in forms {
        if !patterns.contains(&f) {
            patterns.push(f);
            added();
        }
    }
    for line in v.lines().map(str::trim).filter(|l| l.len() >= 8) {
        if !patterns.iter().any(|p| p == line.as_bytes()) {
            patterns.push(line.as_bytes().to_vec());
            added();
        }
    }
}

impl Masker {
    /// A masker for these values, or `None` when there is nothing to mask.
    pub(crate) fn new<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<Masker> {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        for v in values {
            if v.len() < MIN_MASKED {
                continue;
            }
            push_forms(v, &mut patterns, || {});
        }
        if patterns.is_empty() {
            return None;
        }
        let ac = AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(&patterns).expect("patterns");
        let longest = patterns.iter().map(Vec::len).max().unwrap_or(0);
        Some(Masker { ac, patterns, longest })
    }

    /// Mask `data` (the next bytes of a stream) into `out`, holding back a
    /// tail that could be the beginning of a secret.
    pub(crate) fn push(&self, held: &mut Held, data: &[u8], out: &mut Vec<u8>) {
        let mut buf = std::mem::take(&mut held.0);
        buf.extend_from_slice(data);
        let hold_from = self.hold_point(&buf);
        let mut pos = 0;
        for m in self.ac.find_iter(&buf) {
            if m.start() >= hold_from {
                break;
            }
            out.extend_from_slice(&buf[pos..m.start()]);
            out.extend_from_slice(MASK);
            pos = m.end();
        }
        let end = hold_from.max(pos);
        out.extend_from_slice(&buf[pos..end]);
        buf.drain(..end);
        held.0 = buf;
    }

    /// A whole text masked at once (a step's name or a failure message sent
    /// with the completion: it ends up in the run API).
    pub(crate) fn mask_text(&self, text: &str) -> String {
        let mut out = Vec::with_capacity(text.len());
        self.finish(&mut Held::from(text.as_bytes()), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The stream ended (or the step did): mask and release the held tail.
    pub(crate) fn finish(&self, held: &mut Held, out: &mut Vec<u8>) {
        let buf = std::mem::take(&mut held.0);
        let mut pos = 0;
        for m in self.ac.find_iter(&buf) {
            out.extend_from_slice(&buf[pos..m.start()]);
            out.extend_from_slice(MASK);
            pos = m.end();
        }
        out.extend_from_slice(&buf[pos..]);
    }

    /// The earliest position from which the rest of `buf` is a proper prefix
    /// of some pattern (only the last `longest - 1` bytes can be).
    fn hold_point(&self, buf: &[u8]) -> usize {
        let from = buf.len().saturating_sub(self.longest.saturating_sub(1));
        (from..buf.len())
            .find(|&p| {
                let rest = &buf[p..];
                self.patterns.iter().any(|pat| pat.len() > rest.len() && pat.starts_with(rest))
            })
            .unwrap_or(buf.len())
    }
}

/// Shorter values are not looked for in published files: a value this
/// short turns up by chance in binary files, refusing caches and artifacts
/// that hold no secret.
pub(crate) const MIN_SCANNED: usize = 8;

/// The job's secrets looked for in the files it publishes (artifacts) and
/// saves (cache archives) (issue 39, item 13): the same forms as the log
/// masking, each known by the secret's name, never its value. Streamed:
/// each file is fed in pieces, and a value split across pieces is found.
pub(crate) struct SecretScan {
    ac: AhoCorasick,
    /// Per pattern, the name of the secret it comes from.
    owner: Vec<String>,
    longest: usize,
}

impl SecretScan {
    /// A scan for these (name, value) pairs, or `None` when no value is
    /// long enough to look for.
    pub(crate) fn new<'a>(secrets: impl IntoIterator<Item = (&'a String, &'a String)>) -> Option<SecretScan> {
        let (mut patterns, mut owner) = (Vec::new(), Vec::new());
        for (name, value) in secrets {
            if value.len() < MIN_SCANNED {
                continue;
            }
            push_forms(value, &mut patterns, || owner.push(name.clone()));
        }
        if patterns.is_empty() {
            return None;
        }
        let ac = AhoCorasick::builder().match_kind(MatchKind::LeftmostFirst).build(&patterns).expect("patterns");
        let longest = patterns.iter().map(Vec::len).max().unwrap_or(0);
        Some(SecretScan { ac, owner, longest })
    }

    fn found(&self, m: aho_corasick::Match) -> String {
        format!("the value of secret `{}`", self.owner[m.pattern().as_usize()])
    }

    /// The whole of `data` at once (tests).
    #[cfg(test)]
    pub(crate) fn find_in(&self, data: &[u8]) -> Option<String> {
        self.ac.find(data).map(|m| self.found(m))
    }
}

impl kiln_cache::Scan for SecretScan {
    /// A match ending in `chunk` either lies in it or starts in the last
    /// `longest - 1` bytes before it, which `carry` keeps: the seam (carry
    /// and the head of `chunk`) is searched, then `chunk` alone, so each
    /// piece is searched about once, without copying it.
    fn feed(&self, carry: &mut Vec<u8>, chunk: &[u8]) -> Option<String> {
        let keep = self.longest.saturating_sub(1);
        if !carry.is_empty() {
            let head = &chunk[..chunk.len().min(keep)];
            let at = carry.len();
            carry.extend_from_slice(head);
            let hit = self.ac.find(&carry[..]).map(|m| self.found(m));
            carry.truncate(at);
            if hit.is_some() {
                return hit;
            }
        }
        if let Some(m) = self.ac.find(chunk) {
            return Some(self.found(m));
        }
        carry.extend_from_slice(chunk);
        let drop = carry.len().saturating_sub(keep);
        carry.drain(..drop);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn whole_texts_are_masked() {
        let m = Masker::new(["s3cret-value"]).unwrap();
        assert_eq!(m.mask_text("test \"$T\" = s3cret-value && echo ok"), "test \"$T\" = *** && echo ok");
        assert_eq!(m.mask_text("no secret here"), "no secret here");
    }

    fn mask_all(m: &Masker, parts: &[&[u8]]) -> Vec<u8> {
        let mut held = Held::default();
        let mut out = Vec::new();
        for p in parts {
            m.push(&mut held, p, &mut out);
        }
        m.finish(&mut held, &mut out);
        out
    }

    #[test]
    fn values_and_base64_forms_are_masked() {
        let m = Masker::new(["hunter2-secret"]).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode("hunter2-secret");
        let input = format!("pw=hunter2-secret\nb64={b64}\nok\n");
        assert_eq!(mask_all(&m, &[input.as_bytes()]), b"pw=***\nb64=***\nok\n");
    }

    #[test]
    fn a_value_split_across_reads_is_masked() {
        let m = Masker::new(["s3cr3t-value"]).unwrap();
        assert_eq!(mask_all(&m, &[b"token: s3c", b"r3t-va", b"lue done"]), b"token: *** done");
        // One byte at a time.
        let input = b"a s3cr3t-value b s3cr3t-valu";
        let parts: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(mask_all(&m, &parts), b"a *** b s3cr3t-valu");
    }

    #[test]
    fn output_without_secrets_is_released_at_once() {
        let m = Masker::new(["s3cr3t-value"]).unwrap();
        let mut held = Held::default();
        let mut out = Vec::new();
        m.push(&mut held, b"hello world\n", &mut out);
        assert_eq!(out, b"hello world\n", "nothing held back: no suffix starts a secret");
        out.clear();
        m.push(&mut held, b"prefix s3cr", &mut out);
        assert_eq!(out, b"prefix ", "a possible start of the secret waits for more bytes");
    }

    #[test]
    fn short_values_are_not_masked() {
        assert!(Masker::new(["ab", ""]).is_none());
    }

    fn scan_in_pieces(s: &SecretScan, parts: &[&[u8]]) -> Option<String> {
        let mut carry = Vec::new();
        parts.iter().find_map(|p| kiln_cache::Scan::feed(s, &mut carry, p))
    }

    fn secrets(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_scan_names_the_secret_never_its_value() {
        let s = secrets(&[("DEPLOY_KEY", "s3cr3t-deploy-key"), ("SHORT", "abc")]);
        let scan = SecretScan::new(&s).unwrap();
        let found = scan.find_in(b"config: s3cr3t-deploy-key\n").unwrap();
        assert_eq!(found, "the value of secret `DEPLOY_KEY`");
        let b64 = base64::engine::general_purpose::STANDARD.encode("s3cr3t-deploy-key");
        assert_eq!(scan.find_in(b64.as_bytes()).as_deref(), Some("the value of secret `DEPLOY_KEY`"));
        // Too short to look for: `abc` is in many files by chance.
        assert_eq!(scan.find_in(b"abc abc"), None);
        assert!(SecretScan::new(&secrets(&[("SHORT", "abc")])).is_none());
    }

    #[test]
    fn the_scan_finds_a_value_split_across_pieces() {
        let s = secrets(&[("TOKEN", "tok-0123456789")]);
        let scan = SecretScan::new(&s).unwrap();
        assert!(scan_in_pieces(&scan, &[b"aaaa tok-01", b"23456789 bbbb"]).is_some());
        // One byte at a time.
        let input = b"xx tok-0123456789 yy";
        let parts: Vec<&[u8]> = input.chunks(1).collect();
        assert!(scan_in_pieces(&scan, &parts).is_some());
        // Across three pieces, the middle one shorter than the value.
        assert!(scan_in_pieces(&scan, &[b"..tok-0", b"1234", b"56789.."]).is_some());
        // A near miss in pieces is no match.
        assert!(scan_in_pieces(&scan, &[b"tok-01234", b"5678 9"]).is_none());
    }

    proptest! {
        /// However a file is cut into pieces, the scan answers as it does
        /// on the whole file.
        #[test]
        fn scanning_does_not_depend_on_how_a_file_is_read(
            noise in proptest::collection::vec(proptest::sample::select(b"k3y-vale\n".to_vec()), 0..300),
            at in proptest::option::of(0usize..300),
            cuts in proptest::collection::vec(1usize..40, 1..20),
        ) {
            let s = secrets(&[("K", "k3y-value")]);
            let scan = SecretScan::new(&s).unwrap();
            let mut input = noise.clone();
            if let Some(p) = at {
                let p = p.min(input.len());
                input.splice(p..p, b"k3y-value".iter().copied());
            }
            let mut parts = Vec::new();
            let mut rest: &[u8] = &input;
            for c in cuts.iter().cycle() {
                if rest.is_empty() { break; }
                let (a, b) = rest.split_at((*c).min(rest.len()));
                parts.push(a);
                rest = b;
            }
            prop_assert_eq!(scan_in_pieces(&scan, &parts).is_some(), scan.find_in(&input).is_some());
            if at.is_some() {
                prop_assert!(scan.find_in(&input).is_some());
            }
        }
    }

    proptest! {
        /// Wherever the stream is cut, the secret never appears in the output,
        /// and without secrets in the input the output equals the input.
        #[test]
        fn masking_does_not_depend_on_how_output_is_split(
            noise in proptest::collection::vec(proptest::sample::select(b"abcs3t- \n".to_vec()), 0..200),
            at in proptest::collection::vec(0usize..200, 0..4),
            cuts in proptest::collection::vec(1usize..40, 1..20),
        ) {
            let secret = "s3cr3t";
            let m = Masker::new([secret]).unwrap();
            let mut input = noise.clone();
            for &p in at.iter().rev() {
                let p = p.min(input.len());
                input.splice(p..p, secret.bytes());
            }
            let mut parts = Vec::new();
            let mut rest: &[u8] = &input;
            for c in cuts.iter().cycle() {
                if rest.is_empty() { break; }
                let (a, b) = rest.split_at((*c).min(rest.len()));
                parts.push(a);
                rest = b;
            }
            let out = mask_all(&m, &parts);
            let whole = mask_all(&m, &[&input]);
            prop_assert_eq!(&out, &whole, "same result however the bytes were split");
            prop_assert!(!out.windows(secret.len()).any(|w| w == secret.as_bytes()));
            if !input.windows(secret.len()).any(|w| w == secret.as_bytes()) {
                prop_assert_eq!(out, input);
            }
        }
    }
}
