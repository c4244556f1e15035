//! The readers every parser reads through: a byte cap that stops (and says
//! so) instead of reading on, and a streaming lossy UTF-8 repair.

use std::io::{self, Read};

/// Reads at most `cap` bytes of `inner`, then reports end of input; whether
/// more was there is known with one probe byte, never by reading on.
pub(crate) struct Capped<R> {
    inner: R,
    remaining: u64,
    pub read: u64,
    pub exceeded: bool,
}

impl<R: Read> Capped<R> {
    pub fn new(inner: R, cap: u64) -> Capped<R> {
        Capped { inner, remaining: cap, read: 0, exceeded: false }
    }
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.remaining == 0 {
            if !self.exceeded {
                let mut probe = [0u8; 1];
                loop {
                    match self.inner.read(&mut probe) {
                        Ok(n) => {
                            self.exceeded = n > 0;
                            break;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    }
                }
            }
            return Ok(0);
        }
        let want = buf.len().min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.remaining -= n as u64;
        self.read += n as u64;
        if n == 0 {
            // The real end: nothing was cut.
            self.remaining = 0;
            self.exceeded = false;
            return Ok(0);
        }
        Ok(n)
    }
}

/// Passes UTF-8 through and replaces every invalid sequence with U+FFFD,
/// counting them; a sequence split across reads is carried over, so the
/// result does not depend on how the input was chunked.
pub(crate) struct Utf8Lossy<R> {
    inner: R,
    /// Repaired bytes not yet handed out.
    out: Vec<u8>,
    out_pos: usize,
    /// Bytes read from `inner`; its first `carry` bytes are the start of
    /// a sequence cut by the end of the last read.
    raw: Vec<u8>,
    carry: usize,
    eof: bool,
    pub replaced: u64,
    /// Byte offset (in the input) of the first replaced sequence.
    pub first_at: Option<u64>,
    consumed: u64,
}

const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();

impl<R: Read> Utf8Lossy<R> {
    pub fn new(inner: R) -> Utf8Lossy<R> {
        Utf8Lossy {
            inner,
            out: Vec::with_capacity(64 * 1024),
            out_pos: 0,
            raw: Vec::new(),
            carry: 0,
            eof: false,
            replaced: 0,
            first_at: None,
            consumed: 0,
        }
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    fn note_bad(&mut self, at: u64) {
        self.replaced += 1;
        self.first_at.get_or_insert(at);
    }

    /// Refill `out` with the next repaired chunk; false at the end.
    fn fill(&mut self) -> io::Result<bool> {
        const CHUNK: usize = 64 * 1024;
        self.out.clear();
        self.out_pos = 0;
        if self.raw.len() < CHUNK + 4 {
            self.raw.resize(CHUNK + 4, 0);
        }
        while self.out.is_empty() {
            let start = self.carry;
            if self.eof {
                if start == 0 {
                    return Ok(false);
                }
                // An incomplete sequence at the very end.
                let at = self.consumed - start as u64;
                self.carry = 0;
                self.note_bad(at);
                self.out.extend_from_slice(REPLACEMENT);
                return Ok(true);
            }
            let n = loop {
                match self.inner.read(&mut self.raw[start..start + CHUNK]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            // Offset in the input of raw[0].
            let base = self.consumed - start as u64;
            self.consumed += n as u64;
            if n == 0 {
                self.eof = true;
                continue;
            }
            let end = start + n;
            self.carry = 0;
            let mut i = 0;
            while i < end {
                match std::str::from_utf8(&self.raw[i..end]) {
                    Ok(_) => {
                        self.out.extend_from_slice(&self.raw[i..end]);
                        i = end;
                    }
                    Err(e) => {
                        let valid = e.valid_up_to();
                        self.out.extend_from_slice(&self.raw[i..i + valid]);
                        match e.error_len() {
                            Some(bad) => {
                                self.note_bad(base + (i + valid) as u64);
                                self.out.extend_from_slice(REPLACEMENT);
                                i += valid + bad;
                            }
                            None => {
                                // At most 3 bytes, possibly completed by
                                // the next read: moved to the front.
                                let rest = end - (i + valid);
                                self.raw.copy_within(i + valid..end, 0);
                                self.carry = rest;
                                i = end;
                            }
                        }
                    }
                }
            }
        }
        Ok(true)
    }
}

impl<R: Read> Read for Utf8Lossy<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.out_pos >= self.out.len() && !self.fill()? {
            return Ok(0);
        }
        let n = buf.len().min(self.out.len() - self.out_pos);
        buf[..n].copy_from_slice(&self.out[self.out_pos..self.out_pos + n]);
        self.out_pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out one byte per read, to split every sequence.
    struct OneByte<'a>(&'a [u8]);
    impl Read for OneByte<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() || buf.is_empty() {
                return Ok(0);
            }
            buf[0] = self.0[0];
            self.0 = &self.0[1..];
            Ok(1)
        }
    }

    fn repair(input: &[u8]) -> (String, u64) {
        let mut r = Utf8Lossy::new(OneByte(input));
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        (String::from_utf8(out).expect("valid UTF-8 out"), r.replaced)
    }

    #[test]
    fn lossy_repair_is_chunking_independent() {
        assert_eq!(repair("aé€😀".as_bytes()), ("aé€😀".to_string(), 0));
        assert_eq!(repair(b"a\xffb"), ("a\u{FFFD}b".to_string(), 1));
        assert_eq!(repair(b"a\xe2\x82"), ("a\u{FFFD}".to_string(), 1));
        let lossy = String::from_utf8_lossy(b"x\xc3\x28\xf0\x9f\x98y");
        assert_eq!(repair(b"x\xc3\x28\xf0\x9f\x98y").0, lossy);
    }

    #[test]
    fn cap_stops_and_knows_whether_more_was_there() {
        let mut c = Capped::new(&b"0123456789"[..], 4);
        let mut out = Vec::new();
        c.read_to_end(&mut out).unwrap();
        assert_eq!((out.as_slice(), c.exceeded, c.read), (&b"0123"[..], true, 4));
        let mut c = Capped::new(&b"0123"[..], 4);
        let mut out = Vec::new();
        c.read_to_end(&mut out).unwrap();
        assert!(!c.exceeded);
    }
}
