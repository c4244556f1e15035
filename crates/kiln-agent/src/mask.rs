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

impl Masker {
    /// A masker for these values, or `None` when there is nothing to mask.
    pub(crate) fn new<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<Masker> {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        for v in values {
            if v.len() < MIN_MASKED {
                continue;
            }
            let forms = [
                v.as_bytes().to_vec(),
                base64::engine::general_purpose::STANDARD.encode(v).into_bytes(),
                base64::engine::general_purpose::STANDARD_NO_PAD.encode(v).into_bytes(),
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v).into_bytes(),
            ];
            for f in forms {
                if !patterns.contains(&f) {
                    patterns.push(f);
                }
            }
            // A multi-line value also leaks line by line (e.g. a PEM key).
            for line in v.lines().map(str::trim).filter(|l| l.len() >= 8) {
                if !patterns.iter().any(|p| p == line.as_bytes()) {
                    patterns.push(line.as_bytes().to_vec());
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
