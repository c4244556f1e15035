//! The log streamer of one attempt (spec 000 §13, invariant 7).
//!
//! Step output is appended to per-stream buffers without ever waiting on
//! the network, so pipe draining never blocks on the server. A shipper task
//! cuts chunks — at [`CHUNK_SIZE`] bytes, [`FLUSH_AFTER`] after the first
//! unflushed byte, or on an explicit flush — and sends them one at a time,
//! in order. Each chunk is identified by (stream, seq, offset, length,
//! sha256); a failed chunk is retried with identical bytes while the error
//! is retryable. 409 stale_epoch fences the attempt and drops everything.
//! A chunk refused for another reason is skipped: the server sees a gap,
//! never a rewritten history.
//!
//! Seq and offset both start at 0 per stream; offset counts bytes of that
//! stream. Streams: `stdout`, `stderr`, `system` (agent messages).
//!
//! A `system` line (step header, "checking out …") is cut at once into its
//! own chunk, after everything buffered before it, and queued: chunks are
//! sent in queue order, so in arrival order the line precedes the output
//! written after it (e.g. the step it announces).

use crate::control::{Control, Stop, backoff};
use crate::mask::{Held, Masker};
use kiln_api::client::Client;
use kiln_api::types::RawLogChunk as LogChunk;
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub(crate) const CHUNK_SIZE: usize = 64 * 1024;
/// Largest chunk shipped (the server's limit is 1 MiB of bytes).
pub(crate) const MAX_CHUNK: usize = 1024 * 1024;
pub(crate) const FLUSH_AFTER: Duration = Duration::from_secs(2);
/// Unshipped bytes held per attempt before output is dropped (and the drop
/// recorded in the `system` stream) rather than blocking the step.
pub(crate) const MAX_BUFFERED: usize = 256 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout = 0,
    Stderr = 1,
    System = 2,
}

const NAMES: [&str; 3] = ["stdout", "stderr", "system"];

impl From<kiln_sandbox::OutputStream> for Stream {
    fn from(s: kiln_sandbox::OutputStream) -> Self {
        match s {
            kiln_sandbox::OutputStream::Stdout => Stream::Stdout,
            kiln_sandbox::OutputStream::Stderr => Stream::Stderr,
        }
    }
}

#[derive(Default)]
struct StreamBuf {
    seq: i64,
    /// Offset of the first pending byte.
    offset: i64,
    /// A deque: chunks are cut from the front while output is appended at
    /// the back, so a large backlog is never shifted (a Vec made that
    /// quadratic under heavy output).
    pending: VecDeque<u8>,
    first_pending_at: Option<Instant>,
    dropped: u64,
}

impl StreamBuf {
    fn cut(&mut self, name: &str, len: usize) -> LogChunk {
        // Copy the deque's (at most two) slices, then drop the range: a
        // byte-wise `drain().collect()` cost more than hashing the chunk.
        let mut data = Vec::with_capacity(len);
        let (a, b) = self.pending.as_slices();
        let from_a = a.len().min(len);
        data.extend_from_slice(&a[..from_a]);
        data.extend_from_slice(&b[..len - from_a]);
        self.pending.drain(..len);
        let chunk = LogChunk {
            stream: name.to_string(),
            seq: self.seq,
            offset: self.offset,
            sha256: hex::encode(Sha256::digest(&data)),
            data: data.into(),
        };
        self.seq += 1;
        self.offset += len as i64;
        // A remainder keeps the arrival time of its first byte.
        if self.pending.is_empty() {
            self.first_pending_at = None;
        }
        chunk
    }

    /// Cuts everything pending, in chunks of at most `chunk_size`.
    fn cut_all(&mut self, name: &str, chunk_size: usize, out: &mut VecDeque<LogChunk>) {
        while !self.pending.is_empty() {
            let len = self.pending.len().min(chunk_size);
            out.push_back(self.cut(name, len));
        }
    }
}

#[derive(Default)]
struct Buffers {
    streams: [StreamBuf; 3],
    /// Chunks cut ahead of the shipper (by [`LogStreamer::system`]), in order.
    ready: VecDeque<LogChunk>,
    flush_requested: bool,
    closed: bool,
    /// stdout + stderr bytes accepted so far for this attempt.
    accepted: u64,
    /// Bytes dropped because the attempt's output limit was reached.
    truncated: u64,
    /// Tails of stdout and stderr held back by the secret masker.
    held: [Held; 2],
}

impl Buffers {
    /// Unshipped bytes, including chunks already cut.
    fn buffered(&self) -> usize {
        let pending: usize = self.streams.iter().map(|s| s.pending.len()).sum();
        pending + self.ready.iter().map(|c| c.data.len()).sum::<usize>()
    }
}

pub(crate) struct LogStreamer {
    cfg: LogConfig,
    masker: Option<Masker>,
    bufs: Arc<Mutex<Buffers>>,
    notify: Arc<Notify>,
    task: JoinHandle<bool>,
}

#[derive(Clone, Copy)]
pub(crate) struct LogConfig {
    pub chunk_size: usize,
    pub flush_after: Duration,
    pub max_buffered: usize,
    /// Largest chunk cut from a backlog (the server accepts up to 1 MiB).
    pub max_chunk: usize,
    /// Per-attempt cap on stdout + stderr bytes shipped (spec 000 §13). The
    /// step keeps running and its pipes keep draining; the excess is dropped
    /// and the log says so.
    pub max_bytes: u64,
}

/// Default per-attempt output limit: 100 MiB.
pub const DEFAULT_LOG_LIMIT: u64 = 100 * 1024 * 1024;

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            chunk_size: CHUNK_SIZE,
            max_chunk: MAX_CHUNK,
            flush_after: FLUSH_AFTER,
            max_buffered: MAX_BUFFERED,
            max_bytes: DEFAULT_LOG_LIMIT,
        }
    }
}

impl LogStreamer {
    pub(crate) fn start(
        client: Client,
        job_id: String,
        epoch: i64,
        ctl: Control,
        cfg: LogConfig,
        masker: Option<Masker>,
    ) -> Self {
        let bufs = Arc::new(Mutex::new(Buffers::default()));
        let notify = Arc::new(Notify::new());
        let shipper = Shipper { client, job_id, epoch, ctl, cfg, bufs: bufs.clone(), notify: notify.clone() };
        let task = tokio::spawn(shipper.run());
        LogStreamer { cfg, masker, bufs, notify, task }
    }

    /// Appends bytes; never waits. Over the buffer cap, bytes are dropped
    /// and the drop is reported in the `system` stream. Secret values are
    /// masked first (see [`crate::mask`]).
    pub(crate) fn write(&self, stream: Stream, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let mut b = self.bufs.lock().expect("log buffers");
        if b.closed {
            return;
        }
        let masked;
        let data = match (&self.masker, stream) {
            (Some(m), Stream::Stdout | Stream::Stderr) => {
                let mut out = Vec::with_capacity(data.len());
                m.push(&mut b.held[stream as usize], data, &mut out);
                masked = out;
                &masked[..]
            }
            _ => data,
        };
        self.append(b, stream, data);
    }

    /// A whole line with secrets masked (step headers quote commands).
    fn mask_line(&self, line: &str) -> String {
        match &self.masker {
            None => line.to_string(),
            Some(m) => {
                let mut out = Vec::with_capacity(line.len());
                m.finish(&mut Held::from(line.as_bytes()), &mut out);
                String::from_utf8_lossy(&out).into_owned()
            }
        }
    }

    /// Releases the masker's held-back tails (end of a step: no secret can
    /// continue across it).
    fn release_held(&self) {
        let Some(m) = &self.masker else { return };
        for stream in [Stream::Stdout, Stream::Stderr] {
            let mut b = self.bufs.lock().expect("log buffers");
            let mut out = Vec::new();
            m.finish(&mut b.held[stream as usize], &mut out);
            if !out.is_empty() && !b.closed {
                self.append(b, stream, &out);
            }
        }
    }

    fn append(&self, mut b: std::sync::MutexGuard<'_, Buffers>, stream: Stream, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let mut data = data;
        if stream != Stream::System {
            let room = self.cfg.max_bytes.saturating_sub(b.accepted);
            if (data.len() as u64) > room {
                let first = b.truncated == 0;
                b.truncated += data.len() as u64 - room;
                data = &data[..room as usize];
                if first {
                    let note = format!(
                        "[kiln] ⚠ truncated: this attempt's output reached its limit of {} bytes; further output is dropped (the step keeps running)\n",
                        self.cfg.max_bytes
                    );
                    let sys = &mut b.streams[Stream::System as usize];
                    sys.pending.extend(note.as_bytes());
                    sys.first_pending_at.get_or_insert_with(Instant::now);
                }
                if data.is_empty() {
                    drop(b);
                    self.notify.notify_one();
                    return;
                }
            }
            b.accepted += data.len() as u64;
        }
        let over = b.buffered() + data.len() > self.cfg.max_buffered;
        let s = &mut b.streams[stream as usize];
        if over && stream != Stream::System {
            s.dropped += data.len() as u64;
            return;
        }
        s.pending.extend(data);
        // The first unflushed byte starts the 2 s flush clock: wake the
        // shipper so it arms its timer (it may be sleeping with none).
        let started = s.first_pending_at.is_none();
        s.first_pending_at.get_or_insert_with(Instant::now);
        let full = s.pending.len() >= self.cfg.chunk_size;
        drop(b);
        if full || started {
            self.notify.notify_one();
        }
    }

    /// A line in the `system` stream (a newline is added), shipped at once
    /// as its own chunk, after everything written before it.
    pub(crate) fn system(&self, line: &str) {
        let line = &self.mask_line(line);
        let mut b = self.bufs.lock().expect("log buffers");
        if b.closed {
            return;
        }
        let Buffers { streams, ready, .. } = &mut *b;
        for (i, s) in streams.iter_mut().enumerate() {
            s.cut_all(NAMES[i], self.cfg.chunk_size, ready);
        }
        let sys = &mut streams[Stream::System as usize];
        sys.pending.extend(format!("{line}\n").as_bytes());
        sys.cut_all(NAMES[Stream::System as usize], self.cfg.chunk_size, ready);
        drop(b);
        self.notify.notify_one();
    }

    /// A line in the `system` stream shipped with the next [`Self::system`]
    /// line or flush (saves a request for lines that precede a header anyway).
    pub(crate) fn system_note(&self, line: &str) {
        let line = &self.mask_line(line);
        let mut b = self.bufs.lock().expect("log buffers");
        if b.closed {
            return;
        }
        let sys = &mut b.streams[Stream::System as usize];
        sys.pending.extend(format!("{line}\n").as_bytes());
        sys.first_pending_at.get_or_insert_with(Instant::now);
    }

    /// If output was dropped over the limit, say how much (before the final
    /// status line).
    pub(crate) fn report_truncation(&self) {
        let truncated = self.bufs.lock().expect("log buffers").truncated;
        if truncated > 0 {
            self.system(&format!("[kiln] ⚠ truncated: {truncated} bytes of output were dropped over the limit"));
        }
    }

    /// Ship everything buffered now (step end); does not wait.
    pub(crate) fn flush(&self) {
        self.release_held();
        self.bufs.lock().expect("log buffers").flush_requested = true;
        self.notify.notify_one();
    }

    /// Ships everything still buffered and waits until every chunk was
    /// acknowledged (or skipped). False if the attempt was fenced first.
    pub(crate) async fn finish(self) -> bool {
        self.release_held();
        self.bufs.lock().expect("log buffers").closed = true;
        self.notify.notify_one();
        self.task.await.unwrap_or(false)
    }
}

struct Shipper {
    client: Client,
    job_id: String,
    epoch: i64,
    ctl: Control,
    cfg: LogConfig,
    bufs: Arc<Mutex<Buffers>>,
    notify: Arc<Notify>,
}

impl Shipper {
    async fn run(self) -> bool {
        loop {
            let (chunks, deadline, done) = self.cut();
            if chunks.is_empty() {
                if done {
                    return true;
                }
                let sleep = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = self.notify.notified() => {}
                    _ = sleep => {}
                    _ = self.ctl.fenced() => return false,
                }
                continue;
            }
            for c in chunks {
                if !self.send(c).await {
                    return false;
                }
            }
        }
    }

    /// Chunks ready to ship, the next time-based flush, and whether the
    /// streamer is closed and empty.
    fn cut(&self) -> (Vec<LogChunk>, Option<Instant>, bool) {
        let mut b = self.bufs.lock().expect("log buffers");
        let force = std::mem::take(&mut b.flush_requested) || b.closed;
        for (i, name) in NAMES.iter().enumerate().take(2) {
            let dropped = std::mem::take(&mut b.streams[i].dropped);
            if dropped > 0 {
                let note = format!("[kiln] {dropped} bytes of {name} dropped: the log buffer was full\n");
                let sys = &mut b.streams[Stream::System as usize];
                sys.pending.extend(note.as_bytes());
                sys.first_pending_at.get_or_insert_with(Instant::now);
            }
        }
        let now = Instant::now();
        let mut chunks: Vec<LogChunk> = b.ready.drain(..).collect();
        let mut deadline: Option<Instant> = None;
        for (i, s) in b.streams.iter_mut().enumerate() {
            // 64 KiB triggers a chunk; a backlog that built up while the
            // previous chunk was in flight leaves in chunks of up to
            // `max_chunk`, so heavy output is not shipped 64 KiB at a time.
            while s.pending.len() >= self.cfg.chunk_size {
                let n = s.pending.len().min(self.cfg.max_chunk.max(self.cfg.chunk_size));
                chunks.push(s.cut(NAMES[i], n));
            }
            if let Some(first) = s.first_pending_at {
                if force || now >= first + self.cfg.flush_after {
                    let len = s.pending.len();
                    chunks.push(s.cut(NAMES[i], len));
                } else {
                    let d = first + self.cfg.flush_after;
                    deadline = Some(deadline.map_or(d, |x| x.min(d)));
                }
            }
        }
        let done = b.closed && b.buffered() == 0 && b.ready.is_empty();
        (chunks, deadline, done)
    }

    /// Sends one chunk until acknowledged. False if fenced.
    async fn send(&self, chunk: LogChunk) -> bool {
        let mut failures = 0;
        loop {
            let res = tokio::select! {
                r = self.client.append_log_raw(&self.job_id, self.epoch, &chunk) => r,
                _ = self.ctl.fenced() => return false,
            };
            match res {
                Ok(_) => return true,
                Err(e) if e.is_stale_epoch() => {
                    tracing::warn!(error = %e, "log chunk refused: this attempt was fenced");
                    self.ctl.stop(Stop::Fenced);
                    return false;
                }
                Err(e) if e.is_retryable() => {
                    failures += 1;
                    let delay = backoff(failures, 200, 5_000);
                    tracing::warn!(error = %e, stream = %chunk.stream, seq = chunk.seq, retry_in_ms = delay.as_millis() as u64,
                        "log chunk not accepted; retrying with the same bytes");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = self.ctl.fenced() => return false,
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, stream = %chunk.stream, seq = chunk.seq, offset = chunk.offset,
                        "log chunk refused; the log will show a gap here");
                    return true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipper(chunk_size: usize) -> Shipper {
        Shipper {
            client: Client::new("http://127.0.0.1:9", "t"),
            job_id: "j".into(),
            epoch: 1,
            ctl: Control::new(),
            cfg: LogConfig {
                chunk_size,
                max_chunk: chunk_size,
                flush_after: Duration::from_secs(3600),
                max_buffered: MAX_BUFFERED,
                max_bytes: DEFAULT_LOG_LIMIT,
            },
            bufs: Arc::default(),
            notify: Arc::default(),
        }
    }

    fn decode(c: &LogChunk) -> Vec<u8> {
        c.data.to_vec()
    }

    #[tokio::test]
    async fn chunks_are_cut_at_the_size_and_on_flush_with_running_offsets() {
        let s = shipper(4);
        {
            let mut b = s.bufs.lock().unwrap();
            b.streams[0].pending.extend(b"abcdefghij");
            b.streams[0].first_pending_at = Some(Instant::now());
        }
        let (chunks, deadline, done) = s.cut();
        assert_eq!(
            chunks.iter().map(|c| (c.seq, c.offset, decode(c))).collect::<Vec<_>>(),
            [(0, 0, b"abcd".to_vec()), (1, 4, b"efgh".to_vec())]
        );
        assert!(deadline.is_some() && !done, "the tail waits for the timer");
        assert_eq!(chunks[0].sha256, hex::encode(Sha256::digest(b"abcd")));
        s.bufs.lock().unwrap().flush_requested = true;
        let (chunks, deadline, _) = s.cut();
        assert_eq!((chunks[0].seq, chunks[0].offset, decode(&chunks[0])), (2, 8, b"ij".to_vec()));
        assert_eq!(chunks[0].stream, "stdout");
        assert!(deadline.is_none());
        s.bufs.lock().unwrap().closed = true;
        assert!(s.cut().2, "closed and empty");
    }

    #[tokio::test]
    async fn a_backlog_leaves_in_larger_chunks_up_to_the_maximum() {
        let mut s = shipper(4);
        s.cfg.max_chunk = 8;
        {
            let mut b = s.bufs.lock().unwrap();
            b.streams[0].pending.extend(b"abcdefghijklmnopqrs");
            b.streams[0].first_pending_at = Some(Instant::now());
        }
        let (chunks, _, _) = s.cut();
        assert_eq!(
            chunks.iter().map(|c| (c.seq, c.offset, decode(c))).collect::<Vec<_>>(),
            [(0, 0, b"abcdefgh".to_vec()), (1, 8, b"ijklmnop".to_vec())],
            "two full chunks; the 3-byte tail waits for more bytes or the timer"
        );
    }

    #[tokio::test]
    async fn a_system_line_is_its_own_chunk_after_what_was_written_before() {
        let s = shipper(4);
        let streamer = LogStreamer {
            cfg: s.cfg,
            masker: None,
            bufs: s.bufs.clone(),
            notify: s.notify.clone(),
            task: tokio::spawn(async { true }),
        };
        streamer.write(Stream::Stdout, b"abcdef");
        streamer.write(Stream::Stderr, b"err");
        streamer.system("▶ s");
        streamer.write(Stream::Stdout, b"gh");
        s.bufs.lock().unwrap().flush_requested = true;
        let (chunks, _, _) = s.cut();
        let got: Vec<(String, i64, i64, Vec<u8>)> =
            chunks.iter().map(|c| (c.stream.clone(), c.seq, c.offset, decode(c))).collect();
        let sys = "▶ s\n".as_bytes();
        let c = |st: &str, seq, off, d: &[u8]| (st.to_string(), seq, off, d.to_vec());
        assert_eq!(
            got,
            [
                c("stdout", 0, 0, b"abcd"),
                c("stdout", 1, 4, b"ef"),
                c("stderr", 0, 0, b"err"),
                c("system", 0, 0, &sys[..4]),
                c("system", 1, 4, &sys[4..]),
                c("stdout", 2, 6, b"gh"),
            ]
        );
    }

    #[tokio::test]
    async fn dropped_output_is_reported_in_the_system_stream() {
        let s = shipper(1 << 20);
        s.bufs.lock().unwrap().streams[1].dropped = 42;
        s.bufs.lock().unwrap().flush_requested = true;
        let (chunks, _, _) = s.cut();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].stream, "system");
        assert!(String::from_utf8(decode(&chunks[0])).unwrap().contains("42 bytes of stderr dropped"));
    }
}
