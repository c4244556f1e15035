//! Bounded text: UTF-8-safe cuts and an accumulator that never holds more
//! than its cap.

/// The largest index `<= i` that is a char boundary of `s`.
pub(crate) fn floor_char_boundary(s: &str, i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    let mut i = i;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Text gathered up to `cap` bytes; what did not fit is counted, not kept.
#[derive(Debug, Default)]
pub(crate) struct Bounded {
    pub text: String,
    pub cap: usize,
    pub dropped: u64,
}

impl Bounded {
    pub fn new(cap: usize) -> Bounded {
        Bounded { text: String::new(), cap, dropped: 0 }
    }

    pub fn push(&mut self, s: &str) {
        let room = self.cap.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
        } else {
            let cut = floor_char_boundary(s, room);
            self.text.push_str(&s[..cut]);
            self.dropped += (s.len() - cut) as u64;
        }
    }

    /// Drop trailing whitespace (indentation between elements).
    pub fn trim_end(&mut self) {
        let len = self.text.trim_end().len();
        self.text.truncate(len);
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty() && self.dropped == 0
    }

    /// The text, with a marker saying how much was cut (the marker may
    /// take the text a little past `cap`: it is bounded too).
    pub fn finish(self) -> (String, bool) {
        if self.dropped == 0 {
            (self.text, false)
        } else {
            (format!("{}… [{} more bytes cut]", self.text, self.dropped), true)
        }
    }
}

/// `s` cut to `cap` bytes at a char boundary, with a cut marker; and
/// whether it was cut.
pub(crate) fn bounded(s: &str, cap: usize) -> (String, bool) {
    let mut b = Bounded::new(cap);
    b.push(s);
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_at_char_boundaries() {
        let (s, cut) = bounded("aé€😀", 4);
        assert!(cut);
        assert!(s.starts_with("aé"));
        assert!(s.contains("[7 more bytes cut]"));
        let (s, cut) = bounded("short", 10);
        assert_eq!((s.as_str(), cut), ("short", false));
        assert_eq!(floor_char_boundary("😀", 3), 0);
    }
}
