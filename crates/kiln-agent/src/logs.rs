//! The log streamer of one attempt (spec 000 §13, invariant 7).
//!
//! Step output is appended to per-stream buffers without ever waiting on
//! the network, so pipe draining never blocks on the server. A shipper task
//! cuts chunks — at [`CHUNK_SIZE`] bytes, [`FLUSH_AFTER`] (100 ms) after the first
//! unflushed byte, or on an explicit flush — and sends them in order, up to
//! [`IN_FLIGHT`] of one stream at a time. Each chunk is identified by
//! (stream, seq, offset, length, digest: the server's SHA-256 of the
//! bytes; the agent sends a CRC-32C to check them in transit); a failed
//! chunk is retried with identical bytes while the error is retryable.
//! 409 stale_epoch fences the attempt and drops everything. A chunk
//! refused for another reason is skipped: the server sees a gap, never a
//! rewritten history.
//!
//! Chunks are sent `in_order`: the server commits one only right after the
//! stream's bytes before it and answers 503 (retried here) until then, so a
//! chunk refused for a while (a full server disk) and retried later still
//! commits before the chunks sent after it. The chunk after a skipped one
//! is sent without the flag: the hole is explicit, and nothing waits on it.
//!
//! Seq and offset both start at 0 per stream; offset counts bytes of that
//! stream. Streams: `stdout`, `stderr`, `system` (agent messages).
//!
//! A `system` line (step header, "checking out …") cuts everything buffered
//! before it into the queue and waits in the `system` buffer, like output,
//! for the flush timer, a flush or the next output — which cuts it into the
//! queue first. Chunks are sent in queue order, so in arrival order the line
//! precedes the output written after it (e.g. the step it announces), and
//! lines written together (a short step's result and the job's last line)
//! leave in one chunk.

use crate::control::{Control, Stop, backoff};
use crate::mask::{Held, Masker};
use kiln_api::client::Client;
use kiln_api::types::RawLogChunk as LogChunk;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub(crate) const CHUNK_SIZE: usize = 64 * 1024;
/// Largest chunk shipped (the server's limit is 1 MiB of bytes).
pub(crate) const MAX_CHUNK: usize = 1024 * 1024;
/// Longest a written byte waits before it is shipped. Spec 000 §13 gives
/// 2 s as an example; 100 ms keeps live logs live (write-to-browser p95
/// under 250 ms) while heavy output still leaves in 64 KiB–1 MiB chunks, so
/// a quiet stream costs at most ten requests a second.
pub(crate) const FLUSH_AFTER: Duration = Duration::from_millis(100);
/// How long the first bytes after a quiet [`FLUSH_AFTER`] wait (so lines
/// written together leave together). A stream still ships at most one
/// timer-flushed chunk per [`FLUSH_AFTER`]: bytes written sooner after the
/// last one wait until [`FLUSH_AFTER`] after it — never longer than
/// [`FLUSH_AFTER`] after they were written. A line printed now and then so
/// leaves within milliseconds rather than 100 ms later (issue 20:
/// write-to-browser latency), for no more requests than before.
pub(crate) const FIRST_FLUSH_AFTER: Duration = Duration::from_millis(5);
/// Chunks of one stream in flight at once (issue 20): the server syncs
/// chunks that arrive together with one `fdatasync`, so a heavy stream's
/// sync groups grow with the window (8 × 1 MiB: on the reference disk a
/// write + `fdatasync` loop does ~190 MB/s at 1 MiB per sync, ~550 MB/s at
/// 4 MiB). Only a backlog fills it: while chunks are in flight only full
/// 1 MiB chunks are cut, so slow output still leaves in small chunks at
/// the flush timer. Safe because every chunk is sent `in_order` (see the
/// module doc): a chunk refused and retried later still commits before the
/// ones sent after it. The base of the window: it grows up to four times
/// that while the server acknowledges full chunks quickly ([`next_window`]).
pub(crate) const IN_FLIGHT: usize = 8;
/// [`IN_FLIGHT`], or `KILN_AGENT_LOG_IN_FLIGHT` (measurements: `1` is the
/// one-at-a-time path) when it is a positive integer; anything else is
/// refused (the agent does not start: a knob that is accepted must do what
/// it says).
pub(crate) fn in_flight_setting() -> Result<usize, String> {
    match std::env::var("KILN_AGENT_LOG_IN_FLIGHT") {
        Err(_) => Ok(IN_FLIGHT),
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("KILN_AGENT_LOG_IN_FLIGHT must be a positive integer, not {v:?}")),
    }
}

/// How long a few small chunks wait, with nothing in flight, for more to
/// leave with them in one request (`…/logs/batch`): a short job's
/// `system` lines and output (three chunks, three requests and three
/// transactions before) usually leave with its last line, in one.
pub(crate) const LINGER: Duration = Duration::from_millis(5);

/// Whether small chunks leave together ([`LINGER`]): `KILN_AGENT_LOG_BATCH`
/// `on` (the default) or `off` (one request per chunk, as before:
/// measurements); anything else is refused when the agent starts.
pub(crate) fn batch_setting() -> Result<bool, String> {
    match std::env::var("KILN_AGENT_LOG_BATCH") {
        Err(_) => Ok(true),
        Ok(v) => match v.trim() {
            "on" => Ok(true),
            "off" => Ok(false),
            other => Err(format!("KILN_AGENT_LOG_BATCH must be `on` or `off`, not {other:?}")),
        },
    }
}

/// [`batch_setting`], checked when the agent starts.
fn batch() -> bool {
    static B: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *B.get_or_init(|| batch_setting().unwrap_or(true))
}

/// Cleared when a server answers that it has no `…/logs/batch` (an older
/// one): chunks then leave one per request.
static SERVER_BATCHES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// [`in_flight_setting`], checked when the agent starts.
fn in_flight() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| in_flight_setting().unwrap_or(IN_FLIGHT))
}
/// Unshipped bytes held in memory per attempt. While the server keeps
/// taking chunks, a step writing faster than they are shipped waits for
/// room (its pipe fills, as it would into a file on a slow disk); when the
/// server takes nothing for [`SPOOL_AFTER`], output goes to the on-disk
/// spool instead, and beyond that it is dropped (and the drop recorded in
/// the `system` stream) rather than blocking the step.
pub const MAX_BUFFERED: usize = 16 * 1024 * 1024;
/// How long step output waits for room in memory while nothing is shipped
/// before it goes to the spool (see [`MAX_BUFFERED`]). Issue 20: writing a
/// backlog to the spool and reading it back cost a loud step's agent about
/// a fifth of its CPU, for bytes the server was about to take anyway.
pub const SPOOL_AFTER: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout = 0,
    Stderr = 1,
    System = 2,
    /// Service containers' output (`[name] ` lines).
    Services = 3,
}

/// Indexed by `Stream as usize`.
const NAMES: [&str; 4] = kiln_api::logs::stream::AGENT_STREAMS;

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
    /// When the flush timer last cut a chunk of this stream.
    flushed_at: Option<Instant>,
    dropped: u64,
    /// Bytes that arrived while memory was full, in order after `pending`.
    spool: Option<Spool>,
}

/// An on-disk overflow of one stream (spec 000 §13 "bounded buffer /
/// spool"): appended at the back, read back into memory at the front as
/// chunks leave, emptied (truncated) once drained.
struct Spool {
    file: std::fs::File,
    read: u64,
    written: u64,
}

impl Spool {
    fn unread(&self) -> u64 {
        self.written - self.read
    }
}

impl StreamBuf {
    fn spooled(&self) -> u64 {
        self.spool.as_ref().map_or(0, Spool::unread)
    }

    fn spool_write(&mut self, dir: &std::path::Path, name: &str, data: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        if self.spool.is_none() {
            std::fs::create_dir_all(dir)?;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.join(format!("{name}.spool")))?;
            self.spool = Some(Spool { file, read: 0, written: 0 });
        }
        let sp = self.spool.as_mut().expect("spool");
        sp.file.write_all_at(data, sp.written)?;
        sp.written += data.len() as u64;
        Ok(())
    }

    /// Moves spooled bytes into memory until `want` bytes are pending.
    fn refill(&mut self, want: usize) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let Some(sp) = self.spool.as_mut() else { return Ok(()) };
        if sp.unread() == 0 || self.pending.len() >= want {
            return Ok(());
        }
        let n = (want - self.pending.len()).min(sp.unread() as usize);
        let mut buf = vec![0u8; n];
        sp.file.read_exact_at(&mut buf, sp.read)?;
        sp.read += n as u64;
        self.pending.extend(&buf);
        self.first_pending_at.get_or_insert_with(Instant::now);
        if sp.unread() == 0 {
            sp.file.set_len(0)?;
            sp.read = 0;
            sp.written = 0;
        }
        Ok(())
    }
}

/// Chunk buffers handed back once their chunk was acknowledged, for the
/// next large chunk of the same attempt (issue 20: a fresh 1 MiB buffer per
/// chunk cost page faults and unmapping on every chunk). Issue 47: the
/// pool belongs to one attempt and goes with it — an agent-wide pool held
/// up to [`SPARE_MAX`] buffers, grown to 2–3 MiB each, for the agent's
/// life after one loud job (`kiln bench memory`: 7.7 MB of a 200 MB log's
/// buffers kept by an idle agent) — and keeps only buffers of at most
/// [`MAX_CHUNK`] bytes.
#[derive(Default)]
pub(crate) struct Spare(Vec<Vec<u8>>);

/// Most buffers a [`Spare`] keeps: the deepest window of chunks in flight
/// is [`IN_FLIGHT`] × 4, but a few suffice to cover the acknowledgements
/// racing the next cut.
const SPARE_MAX: usize = 16;

impl Spare {
    /// An empty buffer for a chunk of `len` bytes (a spare one for a large
    /// chunk, sized to exactly what it holds).
    fn take(&mut self, len: usize) -> Vec<u8> {
        if len >= CHUNK_SIZE
            && let Some(mut v) = self.0.pop()
        {
            v.clear();
            v.reserve_exact(len);
            return v;
        }
        Vec::with_capacity(len)
    }

    /// Keeps an acknowledged chunk's buffer for a later chunk, if nothing
    /// else holds it and it is no larger than a chunk may be.
    fn give_back(&mut self, data: bytes::Bytes) {
        if data.len() < CHUNK_SIZE || self.0.len() >= SPARE_MAX {
            return;
        }
        if let Ok(m) = data.try_into_mut() {
            let v = Vec::from(m);
            if v.capacity() <= MAX_CHUNK {
                self.0.push(v);
            }
        }
    }

    /// Bytes held by the kept buffers.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.0.iter().map(Vec::capacity).sum()
    }
}

impl StreamBuf {
    fn cut(&mut self, name: &str, len: usize, spare: &mut Spare) -> LogChunk {
        // Copy the deque's (at most two) slices, then drop the range: a
        // byte-wise `drain().collect()` cost more than hashing the chunk.
        let mut data = spare.take(len);
        let (a, b) = self.pending.as_slices();
        let from_a = a.len().min(len);
        data.extend_from_slice(&a[..from_a]);
        data.extend_from_slice(&b[..len - from_a]);
        self.pending.drain(..len);
        let chunk = LogChunk {
            stream: name.to_string(),
            seq: self.seq,
            offset: self.offset,
            // A CRC for the transport, not a SHA-256: the server digests
            // the bytes it stores (issue 20: that digest on both sides was
            // a fifth of the machine at 350 MB/s).
            sha256: None,
            crc32c: Some(kiln_api::types::log_crc32c(&data)),
            data: data.into(),
            in_order: true,
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
    fn cut_all(&mut self, name: &str, chunk_size: usize, out: &mut VecDeque<LogChunk>, spare: &mut Spare) {
        while !self.pending.is_empty() {
            let len = self.pending.len().min(chunk_size);
            out.push_back(self.cut(name, len, spare));
        }
    }
}

#[derive(Default)]
struct Buffers {
    streams: [StreamBuf; 4],
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
    /// Byte-rate limit: tokens available and when they were counted.
    tokens: f64,
    tokens_at: Option<Instant>,
    /// Bytes dropped over the rate limit since the last gap note.
    rate_dropped: u64,
    /// Bytes dropped over the rate limit in all (the attempt's telemetry).
    rate_dropped_total: u64,
    /// Bytes dropped because the buffer and spool were full, as noted in
    /// the log (telemetry).
    buffer_dropped_total: u64,
    /// `system` lines written while output waited in the spool, with the
    /// stdout and stderr positions they follow: each is released once the
    /// output before it has left the spool, exactly after that output.
    deferred: VecDeque<(String, [i64; 2])>,
    /// When the attempt last wrote anything (steps' output, the agent's own
    /// progress lines; not hang warnings): what the hang detector measures.
    last_activity: Option<Instant>,
    /// This attempt's reusable chunk buffers (dropped with it).
    spare: Spare,
}

impl Buffers {
    /// Cuts the pending output of every stream but `system` into the queue,
    /// in chunks of at most `chunk_size`.
    fn cut_output(&mut self, chunk_size: usize) {
        let Buffers { streams, ready, spare, .. } = self;
        for (i, s) in streams.iter_mut().enumerate() {
            if i != Stream::System as usize {
                s.cut_all(NAMES[i], chunk_size, ready, spare);
            }
        }
    }

    /// Unshipped bytes, including chunks already cut.
    fn buffered(&self) -> usize {
        let pending: usize = self.streams.iter().map(|s| s.pending.len()).sum();
        pending + self.ready.iter().map(|c| c.data.len()).sum::<usize>()
    }

    fn spooled(&self) -> u64 {
        self.streams.iter().map(StreamBuf::spooled).sum()
    }

    /// Admits up to `len` bytes under the rate limit; returns how many.
    fn admit(&mut self, rate: u64, len: usize) -> usize {
        let now = Instant::now();
        let burst = rate.max(64 * 1024) as f64;
        let elapsed = self.tokens_at.map_or(burst / rate as f64, |t| (now - t).as_secs_f64());
        self.tokens = (self.tokens + elapsed * rate as f64).min(burst);
        self.tokens_at = Some(now);
        let n = (self.tokens.floor() as usize).min(len);
        self.tokens -= n as f64;
        n
    }
}

pub(crate) struct LogStreamer {
    cfg: LogConfig,
    masker: Option<Masker>,
    bufs: Arc<Mutex<Buffers>>,
    notify: Arc<Notify>,
    /// Notified whenever the shipper takes bytes out of memory.
    drained: Arc<Notify>,
    task: JoinHandle<bool>,
}

#[derive(Clone)]
pub(crate) struct LogConfig {
    pub chunk_size: usize,
    pub flush_after: Duration,
    /// [`FIRST_FLUSH_AFTER`].
    pub first_flush_after: Duration,
    /// Unshipped bytes held in memory; more wait for room, or go to the
    /// spool once nothing was shipped for `spool_after`.
    pub max_buffered: usize,
    /// [`SPOOL_AFTER`] (zero: spool at once, never wait).
    pub spool_after: Duration,
    /// Directory of the attempt's on-disk spool (`None`: no spool; output
    /// over `max_buffered` is dropped and the drop recorded).
    pub spool_dir: Option<std::path::PathBuf>,
    /// Largest spool; output beyond it is dropped and the drop recorded.
    pub max_spool: u64,
    /// Per-attempt stdout + stderr byte rate (bytes/s, with a one-second
    /// burst); output over it is drained, dropped, and marked as a gap.
    pub rate_limit: Option<u64>,
    /// Largest chunk cut from a backlog (the server accepts up to 1 MiB).
    pub max_chunk: usize,
    /// Per-attempt cap on stdout + stderr bytes shipped (spec 000 §13). The
    /// step keeps running and its pipes keep draining; the excess is dropped
    /// and the log says so.
    pub max_bytes: u64,
    /// The agent's metrics (bytes acknowledged, chunks retried).
    pub metrics: Option<Arc<crate::metrics::AgentMetrics>>,
    /// Chunks of one stream sent before the first is acknowledged.
    pub in_flight: usize,
    /// Small chunks leave together (see [`LINGER`]).
    pub batch: bool,
    /// [`LINGER`].
    pub linger: Duration,
}

/// Default per-attempt output limit: 100 MiB.
pub const DEFAULT_LOG_LIMIT: u64 = 100 * 1024 * 1024;

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            chunk_size: CHUNK_SIZE,
            max_chunk: MAX_CHUNK,
            flush_after: FLUSH_AFTER,
            first_flush_after: FIRST_FLUSH_AFTER,
            max_buffered: MAX_BUFFERED,
            spool_after: SPOOL_AFTER,
            spool_dir: None,
            max_spool: DEFAULT_SPOOL_LIMIT,
            rate_limit: None,
            max_bytes: DEFAULT_LOG_LIMIT,
            metrics: None,
            in_flight: in_flight(),
            batch: batch(),
            linger: LINGER,
        }
    }
}

/// Default largest on-disk log spool per attempt: 1 GiB.
pub const DEFAULT_SPOOL_LIMIT: u64 = 1024 * 1024 * 1024;

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
        let drained = Arc::new(Notify::new());
        let shipper = Shipper {
            client,
            job_id,
            epoch,
            ctl,
            cfg: cfg.clone(),
            bufs: bufs.clone(),
            notify: notify.clone(),
            drained: drained.clone(),
            holes: Mutex::default(),
        };
        let task = tokio::spawn(shipper.run());
        LogStreamer { cfg, masker, bufs, notify, drained, task }
    }

    /// Waits until memory has room for `len` more bytes of output, for as
    /// long as the shipper keeps taking bytes out of it: a step writing
    /// faster than its output is shipped is held back by its own pipe
    /// instead of the agent writing the excess to disk and reading it back.
    /// Returns at once when there is room, when output already waits in
    /// the spool (order), or when the output limit drops it anyway; and
    /// after [`LogConfig::spool_after`] without progress (a stalled or
    /// unreachable server), so [`Self::write`] spools and the step never
    /// hangs on its log.
    pub(crate) async fn room(&self, len: usize) {
        let deadline = Instant::now() + self.cfg.spool_after;
        loop {
            let drained = self.drained.notified();
            {
                let b = self.bufs.lock().expect("log buffers");
                if b.closed
                    || b.buffered() + len <= self.cfg.max_buffered
                    || b.spooled() > 0
                    || b.accepted >= self.cfg.max_bytes
                {
                    return;
                }
            }
            if tokio::time::timeout_at(deadline, drained).await.is_err() {
                return;
            }
        }
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
        b.last_activity = Some(Instant::now());
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
        // System lines waiting for the flush timer precede this output: cut
        // them first (the queue keeps the order between streams). Output
        // still pending beside them was written before them (a note such as
        // the truncation notice, which follows the bytes kept): cut first.
        // Notes this call adds below stay pending, as they always did.
        if stream != Stream::System && !b.streams[Stream::System as usize].pending.is_empty() {
            b.cut_output(self.cfg.chunk_size);
            let Buffers { streams, ready, spare, .. } = &mut *b;
            streams[Stream::System as usize].cut_all(NAMES[Stream::System as usize], self.cfg.chunk_size, ready, spare);
        }
        let mut data = data;
        if stream != Stream::System
            && let Some(rate) = self.cfg.rate_limit
        {
            let n = b.admit(rate, data.len());
            if n < data.len() {
                b.rate_dropped += (data.len() - n) as u64;
                b.rate_dropped_total += (data.len() - n) as u64;
                data = &data[..n];
            } else if b.rate_dropped > 0 {
                let note = rate_gap_note(std::mem::take(&mut b.rate_dropped), rate);
                let sys = &mut b.streams[Stream::System as usize];
                sys.pending.extend(note.as_bytes());
                sys.first_pending_at.get_or_insert_with(Instant::now);
            }
            if data.is_empty() {
                return;
            }
        }
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
        if stream == Stream::Services && over {
            // Services' output never waits on disk (the spool keeps the
            // job's own stdout/stderr in order); over the memory bound it is
            // dropped, and the log says so.
            let note = format!("[kiln] {} bytes of services output dropped: the log buffer was full\n", data.len());
            let sys = &mut b.streams[Stream::System as usize];
            sys.pending.extend(note.as_bytes());
            sys.first_pending_at.get_or_insert_with(Instant::now);
            drop(b);
            self.notify.notify_one();
            return;
        }
        let spooled = b.spooled();
        let s = &mut b.streams[stream as usize];
        if matches!(stream, Stream::Stdout | Stream::Stderr) && (over || s.spooled() > 0) {
            // Memory is full (or older bytes wait on disk): spool, in order.
            let room = self.cfg.max_spool.saturating_sub(spooled);
            let written = match &self.cfg.spool_dir {
                Some(dir) if data.len() as u64 <= room => match s.spool_write(dir, NAMES[stream as usize], data) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot write the log spool; dropping output");
                        false
                    }
                },
                _ => false,
            };
            if !written {
                s.dropped += data.len() as u64;
            }
            drop(b);
            self.notify.notify_one();
            return;
        }
        s.pending.extend(data);
        // The first unflushed byte starts the flush clock: wake the
        // shipper so it arms its timer (it may be sleeping with none).
        let started = s.first_pending_at.is_none();
        s.first_pending_at.get_or_insert_with(Instant::now);
        let full = s.pending.len() >= self.cfg.chunk_size;
        drop(b);
        if full || started {
            self.notify.notify_one();
        }
    }

    /// A line in the `system` stream (a newline is added), after everything
    /// written before it and before everything written after it; shipped
    /// within [`FLUSH_AFTER`] (see the module doc).
    pub(crate) fn system(&self, line: &str) {
        self.system_line(line, true);
    }

    /// [`Self::system`]; `activity`: whether the line counts as output for
    /// the hang detector (its own warnings do not).
    fn system_line(&self, line: &str, activity: bool) {
        let line = &self.mask_line(line);
        let mut b = self.bufs.lock().expect("log buffers");
        if b.closed {
            return;
        }
        if activity {
            b.last_activity = Some(Instant::now());
        }
        if b.spooled() > 0 {
            // Output written before this line still waits on disk.
            let end = |s: &StreamBuf| s.offset + (s.pending.len() as u64 + s.spooled()) as i64;
            let marks = [end(&b.streams[0]), end(&b.streams[1])];
            b.deferred.push_back((line.to_string(), marks));
            drop(b);
            self.notify.notify_one();
            return;
        }
        b.cut_output(self.cfg.chunk_size);
        let sys = &mut b.streams[Stream::System as usize];
        sys.pending.extend(format!("{line}\n").as_bytes());
        // Shipped with the next output (cut before it), a flush or the
        // timer: a short step's header, result and the job's last line
        // leave in one chunk, not one request each.
        sys.first_pending_at.get_or_insert_with(Instant::now);
        drop(b);
        // Wake the shipper so it arms its timer (a note before this line
        // may have started the clock without waking it).
        self.notify.notify_one();
    }

    /// Spec 004's hang detector, run beside the attempt's work: after
    /// `warn_after` without output the log gets one warning per silence;
    /// after `kill_after` the attempt is stopped ([`Stop::Hung`]: killed
    /// like a timeout, failed with class `hang`). Returns once it stopped
    /// the attempt; pends forever otherwise.
    pub(crate) async fn watch_silence(
        &self,
        warn_after: Option<Duration>,
        kill_after: Option<Duration>,
        ctl: &Control,
    ) {
        if warn_after.is_none() && kill_after.is_none() {
            return std::future::pending().await;
        }
        let begun = Instant::now();
        // The silence (by its start) the warning was given for.
        let mut warned: Option<Instant> = None;
        loop {
            let last = self.bufs.lock().expect("log buffers").last_activity.unwrap_or(begun).max(begun);
            let silent = last.elapsed();
            if let Some(k) = kill_after
                && silent >= k
            {
                self.system_line(
                    &format!(
                        "✗ hang: no output for {}; the job is killed (hang-kill-after)",
                        kiln_workflow::format_duration(k)
                    ),
                    false,
                );
                ctl.stop(Stop::Hung);
                return;
            }
            if let Some(w) = warn_after
                && silent >= w
                && warned != Some(last)
            {
                warned = Some(last);
                let then = kill_after
                    .map(|k| {
                        format!(
                            "; it is killed after {} without output (hang-kill-after)",
                            kiln_workflow::format_duration(k)
                        )
                    })
                    .unwrap_or_default();
                self.system_line(&format!("⚠ hang: no output for {}{then}", kiln_workflow::format_duration(w)), false);
            }
            let mut next = kill_after.map(|k| last + k);
            if let Some(w) = warn_after
                && warned != Some(last)
            {
                next = Some(next.map_or(last + w, |n| n.min(last + w)));
            }
            // Output may start a new silence meanwhile: look again at least
            // every second (one lock).
            let soon = Instant::now() + Duration::from_secs(1);
            let at = next.map_or(soon, |n| n.min(soon));
            tokio::select! {
                _ = tokio::time::sleep_until(at) => {}
                _ = ctl.stopped() => return std::future::pending().await,
            }
        }
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
    /// Bytes this attempt's output lost so far: over the limit, over the
    /// rate limit, to a full buffer and spool.
    pub(crate) fn losses(&self) -> (u64, u64, u64) {
        let b = self.bufs.lock().expect("log buffers");
        (b.truncated, b.rate_dropped_total, b.buffer_dropped_total)
    }

    pub(crate) fn report_truncation(&self) {
        let (truncated, rate_dropped) = {
            let mut b = self.bufs.lock().expect("log buffers");
            (b.truncated, std::mem::take(&mut b.rate_dropped))
        };
        if let (Some(rate), true) = (self.cfg.rate_limit, rate_dropped > 0) {
            self.system(rate_gap_note(rate_dropped, rate).trim_end());
        }
        if truncated > 0 {
            self.system(&format!("[kiln] ⚠ truncated: {truncated} bytes of output were dropped over the limit"));
        }
    }

    /// Ship the output buffered now (step end); does not wait. System
    /// lines keep their timer: the step's result line leaves with the next
    /// line or output (a no-op job's last two lines in one chunk).
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

fn rate_gap_note(dropped: u64, rate: u64) -> String {
    format!(
        "[kiln] ⚠ gap: {dropped} bytes of output dropped here: faster than this agent's log rate limit of {rate} bytes/s (the step kept running)\n"
    )
}

/// A full-size chunk acknowledged within this long says the server keeps
/// up with the stream (see [`next_window`]). On the reference machine a
/// lone loud stream's 1 MiB chunks are acknowledged in 16–56 ms; with 20
/// loud streams at once, in 130 ms and up.
const FAST_ACK: Duration = Duration::from_millis(100);

/// The window of a stream (chunks in flight at once) after a full-size
/// chunk was acknowledged in `took`: one more after a fast acknowledgement,
/// up to four times `base` ([`LogConfig::in_flight`]), and back to `base`
/// after a slow one. A lone heavy stream so reaches larger sync groups on
/// the server (its syncs, not its CPU, left it idle a fifth of the time
/// with 8 in flight; issue 20), while a busy server is not sent more than
/// before: more bytes in flight there only lengthen the queue that every
/// other stream's chunks wait in.
fn next_window(window: usize, base: usize, took: Duration) -> usize {
    if took <= FAST_ACK { (window + 1).min(base * 4) } else { base }
}

struct Shipper {
    client: Client,
    job_id: String,
    epoch: i64,
    ctl: Control,
    cfg: LogConfig,
    bufs: Arc<Mutex<Buffers>>,
    notify: Arc<Notify>,
    /// See [`LogStreamer::room`].
    drained: Arc<Notify>,
    /// Per stream, the end offsets of chunks given up (refused for good):
    /// the chunk starting there follows an explicit hole.
    holes: Mutex<Vec<(String, i64)>>,
}

impl Shipper {
    /// Whether `chunk` starts right after a chunk that was given up.
    fn after_hole(&self, chunk: &LogChunk) -> bool {
        self.holes.lock().expect("holes").iter().any(|(s, end)| *s == chunk.stream && *end == chunk.offset)
    }

    /// Sends chunks as they are cut, up to [`LogConfig::in_flight`] of one
    /// stream at a time (the server commits them in offset order); a chunk
    /// of another stream waits until those were acknowledged, so the order
    /// between streams (a step header before the step's output) holds.
    ///
    /// With nothing in flight, small chunks (of any streams) wait up to
    /// [`LogConfig::linger`] after the first of them was cut for more, and
    /// leave together in one request; the streamer's end, a large chunk or
    /// a full batch sends them at once.
    async fn run(self) -> bool {
        use futures::StreamExt;
        use futures::future::Either;
        let mut queue: VecDeque<LogChunk> = VecDeque::new();
        let mut inflight = futures::stream::FuturesOrdered::new();
        let mut inflight_stream: Option<String> = None;
        let base = self.cfg.in_flight.max(1);
        let mut window = base;
        let me = &self;
        // When the oldest chunk in the queue was cut.
        let mut queued_at: Option<Instant> = None;
        loop {
            let (mut deadline, mut done) = (None, false);
            let batching = self.batching();
            let small = |c: &LogChunk| c.data.len() <= kiln_api::LOG_BATCH_CHUNK_MAX;
            let gathering = batching && inflight.is_empty() && queue.iter().all(small);
            if queue.is_empty() || gathering {
                // While chunks are in flight only full-size chunks (or
                // output due by the flush timer) are cut: a backlog leaves
                // in large chunks rather than many small ones.
                let (chunks, d, dn) = self.cut(!inflight.is_empty());
                queue.extend(chunks);
                (deadline, done) = (d, dn);
            }
            if queue.is_empty() {
                queued_at = None;
            } else if queued_at.is_none() {
                queued_at = Some(Instant::now());
            }
            let mut linger_until = None;
            if batching && inflight.is_empty() {
                let n = queue.iter().take(kiln_api::LOG_BATCH_MAX_CHUNKS).take_while(|c| small(c)).count();
                let more_may_come = !done && n == queue.len() && n < kiln_api::LOG_BATCH_MAX_CHUNKS;
                let until = queued_at.map(|t| t + self.cfg.linger);
                if n > 0 && more_may_come && until.is_some_and(|u| Instant::now() < u) {
                    linger_until = until;
                } else if n >= 2 {
                    let batch: Vec<LogChunk> = queue.drain(..n).collect();
                    queued_at = (!queue.is_empty()).then(Instant::now);
                    // Nothing else leaves until the batch is answered.
                    inflight_stream = Some(String::new());
                    inflight.push_back(Either::Left(async move { (me.send_batch(batch).await, None) }));
                }
            }
            while let Some(c) = queue.front()
                && linger_until.is_none()
            {
                let other_stream = inflight_stream.as_ref().is_some_and(|s| *s != c.stream);
                if inflight.len() >= window || (!inflight.is_empty() && other_stream) {
                    break;
                }
                let c = queue.pop_front().expect("front");
                inflight_stream = Some(c.stream.clone());
                let large = c.data.len() >= self.cfg.max_chunk.max(self.cfg.chunk_size);
                inflight.push_back(Either::Right(async move {
                    let sent = Instant::now();
                    (me.send(c).await, large.then(|| sent.elapsed()))
                }));
                queued_at = (!queue.is_empty()).then(Instant::now);
            }
            if inflight.is_empty() && queue.is_empty() && done {
                return true;
            }
            let idle = queue.is_empty() || linger_until.is_some();
            let wake = [deadline.filter(|_| idle), linger_until].into_iter().flatten().min();
            let sleep = async {
                match wake {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some((ok, took)) = inflight.next(), if !inflight.is_empty() => {
                    if !ok {
                        return false;
                    }
                    if let Some(took) = took {
                        window = next_window(window, base, took);
                    }
                    if inflight.is_empty() {
                        inflight_stream = None;
                    }
                }
                _ = self.notify.notified(), if idle => {}
                _ = sleep => {}
                _ = self.ctl.fenced() => return false,
            }
        }
    }

    /// Chunks ready to ship, the next time-based flush, and whether the
    /// streamer is closed and empty.
    /// `busy`: chunks are in flight; only full chunks of `max_chunk` bytes
    /// (and output due by the timer or a flush) are cut.
    fn cut(&self, busy: bool) -> (Vec<LogChunk>, Option<Instant>, bool) {
        let mut b = self.bufs.lock().expect("log buffers");
        // A flush (a step's end) ships its output now; system lines keep
        // their timer (the job's next line usually takes them along).
        let flush = std::mem::take(&mut b.flush_requested);
        let closed = b.closed;
        for (i, name) in NAMES.iter().enumerate().take(2) {
            let dropped = std::mem::take(&mut b.streams[i].dropped);
            // Counted when noted in the log (every drop is noted).
            b.buffer_dropped_total += dropped;
            if dropped > 0 {
                let note = format!("[kiln] {dropped} bytes of {name} dropped: the log buffer was full\n");
                let sys = &mut b.streams[Stream::System as usize];
                sys.pending.extend(note.as_bytes());
                sys.first_pending_at.get_or_insert_with(Instant::now);
            }
        }
        let refill_to = self.cfg.max_chunk.max(self.cfg.chunk_size) * 2;
        let marks = b.deferred.front().map(|(_, m)| *m);
        for (i, s) in b.streams.iter_mut().take(2).enumerate() {
            // Never read past the next deferred line's position.
            let want = match marks {
                Some(m) => refill_to.min((m[i] - s.offset).max(0) as usize),
                None => refill_to,
            };
            if let Err(e) = s.refill(want) {
                // Unreadable spool: what it held is lost; say so.
                let lost = s.spooled();
                s.spool = None;
                s.dropped += lost;
                tracing::error!(error = %e, lost, "cannot read the log spool");
            }
        }
        while let Some((_, m)) = b.deferred.front() {
            let m = *m;
            let in_memory = |s: &StreamBuf, mark: i64| s.offset + s.pending.len() as i64 >= mark;
            if !(in_memory(&b.streams[0], m[0]) && in_memory(&b.streams[1], m[1])) {
                break;
            }
            let (line, _) = b.deferred.pop_front().expect("front");
            let Buffers { streams, ready, spare, .. } = &mut *b;
            for (i, s) in streams.iter_mut().take(2).enumerate() {
                let mut n = (m[i] - s.offset).max(0) as usize;
                while n > 0 {
                    let len = n.min(self.cfg.chunk_size);
                    ready.push_back(s.cut(NAMES[i], len, spare));
                    n -= len;
                }
            }
            let sys = &mut streams[Stream::System as usize];
            sys.pending.extend(line.as_bytes());
            sys.pending.push_back(b'\n');
            sys.cut_all(NAMES[Stream::System as usize], self.cfg.chunk_size, ready, spare);
        }
        let now = Instant::now();
        let mut chunks: Vec<LogChunk> = b.ready.drain(..).collect();
        let mut deadline: Option<Instant> = None;
        let Buffers { streams, spare, .. } = &mut *b;
        for (i, s) in streams.iter_mut().enumerate() {
            // 64 KiB triggers a chunk; a backlog that built up while the
            // previous chunk was in flight leaves in chunks of up to
            // `max_chunk`, so heavy output is not shipped 64 KiB at a time.
            let max = self.cfg.max_chunk.max(self.cfg.chunk_size);
            let full = if busy { max } else { self.cfg.chunk_size };
            while s.pending.len() >= full {
                let n = s.pending.len().min(max);
                chunks.push(s.cut(NAMES[i], n, spare));
            }
            if let Some(first) = s.first_pending_at {
                // Due FLUSH_AFTER after the last timer flush, at most
                // FLUSH_AFTER after the first pending byte, at least
                // FIRST_FLUSH_AFTER after it. System lines wait the whole
                // FLUSH_AFTER: the step's output (or its end) usually takes
                // them along, and a short job's lines leave in one chunk
                // rather than one request at its start.
                let fa = self.cfg.flush_after;
                let first_after = if i == Stream::System as usize { fa } else { self.cfg.first_flush_after.min(fa) };
                let quick = first + first_after;
                let due = s.flushed_at.map_or(quick, |last| (last + fa).min(first + fa).max(quick));
                let force = closed || (flush && i != Stream::System as usize);
                if force || now >= due {
                    let len = s.pending.len();
                    chunks.push(s.cut(NAMES[i], len, spare));
                    s.flushed_at = Some(now);
                } else {
                    deadline = Some(deadline.map_or(due, |x| x.min(due)));
                }
            }
        }
        let done = b.closed && b.buffered() == 0 && b.ready.is_empty() && b.spooled() == 0 && b.deferred.is_empty();
        drop(b);
        if !chunks.is_empty() {
            self.drained.notify_waiters();
        }
        (chunks, deadline, done)
    }

    /// Whether small chunks leave together (the setting, and the server
    /// has the batch call).
    fn batching(&self) -> bool {
        self.cfg.batch && SERVER_BATCHES.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends a few small chunks in one request; those the server did not
    /// take (refused, or after a refused one) and all of them on a failed
    /// request then go one by one, each getting its own answer. False if
    /// fenced.
    async fn send_batch(&self, chunks: Vec<LogChunk>) -> bool {
        use base64::Engine;
        let wire = kiln_api::LogChunkBatch {
            chunks: chunks
                .iter()
                .map(|c| kiln_api::LogChunk {
                    stream: c.stream.clone(),
                    seq: c.seq,
                    offset: c.offset,
                    data: base64::engine::general_purpose::STANDARD.encode(&c.data),
                    sha256: None,
                    crc32c: c.crc32c.clone(),
                    in_order: !self.after_hole(c),
                })
                .collect(),
        };
        let res = tokio::select! {
            r = self.client.append_log_batch(&self.job_id, self.epoch, &wire) => r,
            _ = self.ctl.fenced() => return false,
        };
        let accepted = match res {
            Ok(ack) => ack.accepted.min(chunks.len()),
            Err(e) if e.is_stale_epoch() => {
                tracing::warn!(error = %e, "log chunks refused: this attempt was fenced");
                self.ctl.stop(Stop::Fenced);
                return false;
            }
            Err(e) => {
                if matches!(e.status(), Some(404 | 405)) {
                    tracing::info!("the server takes no batches of log chunks; sending them one by one");
                    SERVER_BATCHES.store(false, std::sync::atomic::Ordering::Relaxed);
                }
                0
            }
        };
        let mut rest = chunks.into_iter();
        for chunk in rest.by_ref().take(accepted) {
            self.acknowledged(chunk);
        }
        for chunk in rest {
            if !self.send(chunk).await {
                return false;
            }
        }
        true
    }

    /// A chunk the server took: counted, its buffer kept for the next one.
    fn acknowledged(&self, chunk: LogChunk) {
        if let Some(m) = &self.cfg.metrics {
            m.log_bytes_sent.inc_by(chunk.data.len() as u64);
        }
        self.bufs.lock().expect("log buffers").spare.give_back(chunk.data);
    }

    /// Sends one chunk until acknowledged. False if fenced.
    async fn send(&self, mut chunk: LogChunk) -> bool {
        let mut failures = 0;
        loop {
            // Decided on every try: the chunk before may be given up while
            // this one waits for it.
            chunk.in_order = !self.after_hole(&chunk);
            let res = tokio::select! {
                r = self.client.append_log_raw(&self.job_id, self.epoch, &chunk) => r,
                _ = self.ctl.fenced() => return false,
            };
            match res {
                Ok(_) => {
                    self.acknowledged(chunk);
                    return true;
                }
                Err(e) if e.is_stale_epoch() => {
                    tracing::warn!(error = %e, "log chunk refused: this attempt was fenced");
                    self.ctl.stop(Stop::Fenced);
                    return false;
                }
                Err(e) if e.is_retryable() => {
                    failures += 1;
                    if let Some(m) = &self.cfg.metrics {
                        m.log_chunk_retries.inc();
                    }
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
                    let end = chunk.offset + chunk.data.len() as i64;
                    self.holes.lock().expect("holes").push((chunk.stream.clone(), end));
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
                first_flush_after: Duration::from_secs(3600),
                max_buffered: MAX_BUFFERED,
                max_bytes: DEFAULT_LOG_LIMIT,
                ..LogConfig::default()
            },
            bufs: Arc::default(),
            notify: Arc::default(),
            drained: Arc::default(),
            holes: Mutex::default(),
        }
    }

    #[test]
    fn the_window_grows_while_the_server_keeps_up_and_falls_back_when_it_does_not() {
        let fast = FAST_ACK / 2;
        let mut w = 8;
        for _ in 0..100 {
            w = next_window(w, 8, fast);
        }
        assert_eq!(w, 32, "at most four times the base");
        assert_eq!(next_window(9, 8, fast), 10, "one at a time");
        assert_eq!(next_window(32, 8, FAST_ACK * 2), 8, "back to the base after a slow acknowledgement");
        assert_eq!(next_window(8, 8, FAST_ACK * 2), 8, "never below it");
        assert_eq!(next_window(1, 1, fast), 2);
    }

    fn decode(c: &LogChunk) -> Vec<u8> {
        c.data.to_vec()
    }

    /// A buffer handed back after an acknowledgement is reused without
    /// its old bytes leaking into the next chunk.
    #[test]
    fn reused_chunk_buffers_carry_only_the_new_bytes() {
        let mut spare = Spare::default();
        spare.give_back(bytes::Bytes::from(vec![b'Z'; MAX_CHUNK]));
        assert_eq!(spare.0.len(), 1);
        let mut s = StreamBuf::default();
        let data: Vec<u8> = (0..CHUNK_SIZE + 7).map(|i| b'a' + (i % 26) as u8).collect();
        s.pending.extend(&data);
        let c = s.cut("stdout", data.len(), &mut spare);
        assert_eq!(spare.0.len(), 0, "the spare buffer was taken");
        assert_eq!(c.data.to_vec(), data);
        assert_eq!(c.crc32c.as_deref(), Some(kiln_api::types::log_crc32c(&data).as_str()));
        assert_eq!(c.sha256, None);
        assert_eq!((c.offset, s.offset, s.pending.len()), (0, data.len() as i64, 0));
        // A buffer someone else still holds is not taken back.
        let held = c.data.clone();
        spare.give_back(c.data);
        assert_eq!(held.to_vec(), data);
        assert_eq!(spare.0.len(), 0);
    }

    /// Issue 47: the spare buffers are bounded in number and size — a
    /// buffer grown past the largest chunk is freed, not kept — and a
    /// reused buffer is not grown past what its chunk needs.
    #[test]
    fn spare_buffers_are_bounded_in_number_and_size() {
        let mut spare = Spare::default();
        for _ in 0..SPARE_MAX + 8 {
            spare.give_back(bytes::Bytes::from(vec![0u8; MAX_CHUNK]));
        }
        assert_eq!(spare.0.len(), SPARE_MAX);
        assert_eq!(spare.held(), SPARE_MAX * MAX_CHUNK);
        let mut spare = Spare::default();
        spare.give_back(bytes::Bytes::from(vec![0u8; MAX_CHUNK + 1]));
        spare.give_back(bytes::Bytes::from(Vec::with_capacity(3 * MAX_CHUNK)));
        assert_eq!(spare.held(), 0, "buffers larger than a chunk are freed");
        spare.give_back(bytes::Bytes::from(vec![0u8; CHUNK_SIZE]));
        let v = spare.take(CHUNK_SIZE + 1);
        assert!(v.capacity() > CHUNK_SIZE && v.capacity() < 2 * CHUNK_SIZE, "{}", v.capacity());
    }

    /// Issue 47: the chunk buffers belong to the attempt: once its
    /// streamer finished, nothing of its buffers is left in the agent.
    #[tokio::test]
    async fn an_attempts_log_buffers_go_with_it() {
        let streamer = LogStreamer::start(
            Client::new("http://127.0.0.1:9", "t"),
            "j".into(),
            1,
            Control::new(),
            LogConfig::default(),
            None,
        );
        streamer.bufs.lock().unwrap().spare.give_back(bytes::Bytes::from(vec![0u8; MAX_CHUNK]));
        let bufs = Arc::downgrade(&streamer.bufs);
        assert!(streamer.finish().await, "nothing to ship");
        assert!(bufs.upgrade().is_none(), "the attempt's buffers were dropped with it");
    }

    /// Issue 20: the first bytes after a quiet spell leave after
    /// FIRST_FLUSH_AFTER, not FLUSH_AFTER; a stream still gets at most one
    /// timer-flushed chunk per FLUSH_AFTER, and no byte waits longer.
    #[tokio::test(start_paused = true)]
    async fn quiet_output_leaves_at_once_and_timer_chunks_stay_one_per_flush_interval() {
        let mut s = shipper(1 << 20);
        s.cfg.flush_after = FLUSH_AFTER;
        s.cfg.first_flush_after = FIRST_FLUSH_AFTER;
        let write = |s: &Shipper, data: &[u8]| {
            let mut b = s.bufs.lock().unwrap();
            b.streams[0].pending.extend(data);
            b.streams[0].first_pending_at.get_or_insert_with(Instant::now);
        };
        let t0 = Instant::now();
        write(&s, b"one\n");
        let (chunks, deadline, _) = s.cut(false);
        assert!(chunks.is_empty(), "lines written together leave together");
        assert_eq!(deadline, Some(t0 + FIRST_FLUSH_AFTER));
        tokio::time::advance(FIRST_FLUSH_AFTER).await;
        let (chunks, _, _) = s.cut(false);
        assert_eq!(chunks.iter().map(decode).collect::<Vec<_>>(), [b"one\n".to_vec()], "not 100 ms later");
        // 50 ms later: the next line waits until FLUSH_AFTER after the last flush.
        tokio::time::advance(Duration::from_millis(50)).await;
        write(&s, b"two\n");
        let (chunks, deadline, _) = s.cut(false);
        assert!(chunks.is_empty());
        assert_eq!(deadline, Some(t0 + FIRST_FLUSH_AFTER + FLUSH_AFTER));
        tokio::time::advance(FLUSH_AFTER - Duration::from_millis(50)).await;
        let (chunks, _, _) = s.cut(false);
        assert_eq!(chunks.iter().map(decode).collect::<Vec<_>>(), [b"two\n".to_vec()]);
        // After a quiet FLUSH_AFTER, quick again.
        tokio::time::advance(FLUSH_AFTER * 2).await;
        write(&s, b"three\n");
        let (_, deadline, _) = s.cut(false);
        assert_eq!(deadline, Some(Instant::now() + FIRST_FLUSH_AFTER));
        // Never later than FLUSH_AFTER after the first pending byte.
        let mut b = s.bufs.lock().unwrap();
        b.streams[0].flushed_at = Some(Instant::now());
        drop(b);
        let (_, deadline, _) = s.cut(false);
        assert_eq!(deadline, Some(Instant::now() + FLUSH_AFTER));
    }

    #[tokio::test]
    async fn chunks_are_cut_at_the_size_and_on_flush_with_running_offsets() {
        let s = shipper(4);
        {
            let mut b = s.bufs.lock().unwrap();
            b.streams[0].pending.extend(b"abcdefghij");
            b.streams[0].first_pending_at = Some(Instant::now());
        }
        let (chunks, deadline, done) = s.cut(false);
        assert_eq!(
            chunks.iter().map(|c| (c.seq, c.offset, decode(c))).collect::<Vec<_>>(),
            [(0, 0, b"abcd".to_vec()), (1, 4, b"efgh".to_vec())]
        );
        assert!(deadline.is_some() && !done, "the tail waits for the timer");
        assert_eq!(chunks[0].crc32c.as_deref(), Some("92c80a31"), "CRC-32C of abcd");
        s.bufs.lock().unwrap().flush_requested = true;
        let (chunks, deadline, _) = s.cut(false);
        assert_eq!((chunks[0].seq, chunks[0].offset, decode(&chunks[0])), (2, 8, b"ij".to_vec()));
        assert_eq!(chunks[0].stream, "stdout");
        assert!(deadline.is_none());
        s.bufs.lock().unwrap().closed = true;
        assert!(s.cut(false).2, "closed and empty");
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
        let (chunks, _, _) = s.cut(false);
        assert_eq!(
            chunks.iter().map(|c| (c.seq, c.offset, decode(c))).collect::<Vec<_>>(),
            [(0, 0, b"abcdefgh".to_vec()), (1, 8, b"ijklmnop".to_vec())],
            "two full chunks; the 3-byte tail waits for more bytes or the timer"
        );
    }

    #[tokio::test]
    async fn a_system_line_is_its_own_chunk_after_what_was_written_before() {
        let s = shipper(4);
        let streamer = streamer_for(&s);
        streamer.write(Stream::Stdout, b"abcdef");
        streamer.write(Stream::Stderr, b"err");
        streamer.system("▶ s");
        streamer.write(Stream::Stdout, b"gh");
        s.bufs.lock().unwrap().flush_requested = true;
        let (chunks, _, _) = s.cut(false);
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
    async fn system_lines_wait_for_the_timer_and_lines_written_together_leave_in_one_chunk() {
        let mut s = shipper(64);
        s.cfg.flush_after = FLUSH_AFTER;
        s.cfg.first_flush_after = FIRST_FLUSH_AFTER;
        let streamer = streamer_for(&s);
        let t0 = Instant::now();
        streamer.system("✓ step 1/1: true (0.0s)");
        streamer.system("✓ job success");
        let (chunks, deadline, _) = s.cut(false);
        assert!(chunks.is_empty(), "not shipped at once: {chunks:?}");
        // Not the quick first flush of output: the whole interval.
        assert!(deadline.is_some_and(|d| d >= t0 + FLUSH_AFTER), "the flush timer is armed for FLUSH_AFTER");
        // A step's end flushes its output, not the system lines: the
        // step's result leaves with the job's last line.
        s.bufs.lock().unwrap().flush_requested = true;
        let (chunks, deadline, _) = s.cut(false);
        assert!(chunks.is_empty() && deadline.is_some(), "a flush leaves system lines to the timer: {chunks:?}");
        s.bufs.lock().unwrap().closed = true;
        let (chunks, _, _) = s.cut(false);
        let got: Vec<(String, i64, Vec<u8>)> = chunks.iter().map(|c| (c.stream.clone(), c.offset, decode(c))).collect();
        assert_eq!(got, [("system".to_string(), 0, "✓ step 1/1: true (0.0s)\n✓ job success\n".as_bytes().to_vec())]);
    }

    /// A no-op job's log in three requests: the checkout note with the
    /// step's header (cut by its output), the output (the step's end
    /// flushes it), and the step's result with the job's last line.
    #[tokio::test]
    async fn a_short_jobs_log_leaves_in_three_chunks() {
        let mut s = shipper(64);
        s.cfg.flush_after = FLUSH_AFTER;
        s.cfg.first_flush_after = FLUSH_AFTER;
        let streamer = streamer_for(&s);
        streamer.system_note("checking out r at abc");
        streamer.system("▶ step 1/1: date");
        streamer.write(Stream::Stdout, b"12:00\n");
        streamer.flush();
        streamer.system("✓ step 1/1: date (0.0s)");
        let mut all = s.cut(false).0;
        streamer.system("✓ job success");
        s.bufs.lock().unwrap().closed = true;
        all.extend(s.cut(false).0);
        let got: Vec<(String, String)> =
            all.iter().map(|c| (c.stream.clone(), String::from_utf8(decode(c)).unwrap())).collect();
        let c = |st: &str, t: &str| (st.to_string(), t.to_string());
        assert_eq!(
            got,
            [
                c("system", "checking out r at abc\n▶ step 1/1: date\n"),
                c("stdout", "12:00\n"),
                c("system", "✓ step 1/1: date (0.0s)\n✓ job success\n"),
            ]
        );
    }

    #[tokio::test]
    async fn a_system_line_wakes_the_shipper_to_arm_its_timer_even_after_a_note() {
        let s = shipper(64);
        let streamer = streamer_for(&s);
        streamer.system_note("checking out");
        streamer.system("▶ step 1/1");
        // Else a shipper asleep without a deadline would keep the line until
        // the step's next output or its end.
        tokio::time::timeout(Duration::from_secs(5), s.notify.notified())
            .await
            .expect("the shipper was not woken by the system line");
    }

    #[tokio::test]
    async fn the_truncation_notice_follows_every_byte_kept() {
        let mut s = shipper(256);
        s.cfg.max_bytes = 5;
        let streamer = streamer_for(&s);
        streamer.write(Stream::Stdout, b"abc");
        // Over the limit: "de" is kept, the rest dropped, with a notice.
        streamer.write(Stream::Stdout, b"defgh");
        // More output after the limit: dropped, and it moves nothing.
        streamer.write(Stream::Stdout, b"ijk");
        streamer.system("✓ job success");
        let chunks = drain_all(&s);
        let got: Vec<(String, String)> =
            chunks.iter().map(|c| (c.stream.clone(), String::from_utf8_lossy(&c.data).into_owned())).collect();
        // The bytes kept stay one run, and the notice follows them.
        assert_eq!(got[0], ("stdout".to_string(), "abcde".to_string()), "{got:?}");
        assert!(got[1..].iter().all(|(stream, _)| stream == "system"), "{got:?}");
        let system: String = got[1..].iter().map(|(_, t)| t.as_str()).collect();
        assert!(system.contains("truncated") && system.ends_with("✓ job success\n"), "{got:?}");
    }

    #[tokio::test]
    async fn dropped_output_is_reported_in_the_system_stream() {
        let s = shipper(1 << 20);
        s.bufs.lock().unwrap().streams[1].dropped = 42;
        s.bufs.lock().unwrap().closed = true;
        let (chunks, _, _) = s.cut(false);
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].stream, "system");
        assert!(String::from_utf8(decode(&chunks[0])).unwrap().contains("42 bytes of stderr dropped"));
    }

    fn streamer_for(s: &Shipper) -> LogStreamer {
        LogStreamer {
            cfg: s.cfg.clone(),
            masker: None,
            bufs: s.bufs.clone(),
            notify: s.notify.clone(),
            drained: s.drained.clone(),
            task: tokio::spawn(async { true }),
        }
    }

    /// A shipper whose memory holds 32 bytes, spooling into `dir` after
    /// `spool_after` without progress.
    fn spooling_shipper(dir: &std::path::Path, spool_after: Duration) -> Shipper {
        let mut s = shipper(8);
        s.cfg.max_buffered = 32;
        s.cfg.spool_after = spool_after;
        s.cfg.spool_dir = Some(dir.to_path_buf());
        s
    }

    /// Output over the memory bound waits for the shipper instead of going
    /// to the spool while the shipper keeps taking bytes, and goes on the
    /// moment it takes some.
    #[tokio::test]
    async fn output_over_the_memory_bound_waits_for_the_shipper() {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(spooling_shipper(dir.path(), Duration::from_secs(3600)));
        let streamer = Arc::new(streamer_for(&s));
        streamer.write(Stream::Stdout, &[b'a'; 30]);
        // Room for 2 bytes: returns at once.
        tokio::time::timeout(Duration::from_secs(5), streamer.room(2)).await.expect("room for 2 bytes");
        let waiter = tokio::spawn({
            let streamer = streamer.clone();
            async move { streamer.room(10).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "30 + 10 bytes do not fit in 32: the write waits");
        let (chunks, _, _) = s.cut(false);
        assert!(!chunks.is_empty(), "the shipper took the pending bytes");
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woken by the shipper").unwrap();
        streamer.write(Stream::Stdout, &[b'b'; 10]);
        assert_eq!(s.bufs.lock().unwrap().spooled(), 0, "nothing went to disk");
        assert!(!dir.path().join("stdout.spool").exists());
    }

    /// When the shipper takes nothing for `spool_after` (a stalled server),
    /// the write goes on into the spool: the step never hangs on its log.
    #[tokio::test]
    async fn output_goes_to_the_spool_when_nothing_is_shipped() {
        let dir = tempfile::tempdir().unwrap();
        let s = spooling_shipper(dir.path(), Duration::from_millis(20));
        let streamer = streamer_for(&s);
        streamer.write(Stream::Stdout, &[b'a'; 30]);
        tokio::time::timeout(Duration::from_secs(5), streamer.room(10)).await.expect("gives up waiting");
        streamer.write(Stream::Stdout, &[b'b'; 10]);
        assert_eq!(s.bufs.lock().unwrap().spooled(), 10, "the write went to the spool");
        // Once output waits in the spool, later writes follow it at once (order).
        tokio::time::timeout(Duration::from_secs(5), streamer.room(10)).await.expect("no wait behind the spool");
        let chunks = drain_all(&s);
        let out: Vec<u8> = chunks.iter().filter(|c| c.stream == "stdout").flat_map(|c| c.data.to_vec()).collect();
        assert_eq!(out, [[b'a'; 30].as_slice(), &[b'b'; 10]].concat());
    }

    /// Drains the shipper as the network would: every chunk, in order.
    fn drain_all(s: &Shipper) -> Vec<LogChunk> {
        let mut all = vec![];
        s.bufs.lock().unwrap().closed = true;
        loop {
            let (chunks, _, done) = s.cut(false);
            all.extend(chunks);
            if done {
                return all;
            }
        }
    }

    #[tokio::test]
    async fn output_over_the_memory_bound_goes_to_the_spool_and_comes_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = shipper(8);
        s.cfg.max_buffered = 32;
        s.cfg.spool_dir = Some(dir.path().to_path_buf());
        let streamer = streamer_for(&s);
        let input: Vec<u8> = (0..2000u32).map(|i| (i % 251) as u8).collect();
        let (first, second) = input.split_at(1500);
        for piece in first.chunks(7) {
            streamer.write(Stream::Stdout, piece);
        }
        streamer.system("▶ step 2");
        for piece in second.chunks(7) {
            streamer.write(Stream::Stdout, piece);
        }
        let spooled = s.bufs.lock().unwrap().spooled();
        assert!(spooled > 1900, "most bytes wait on disk: {spooled}");
        assert!(dir.path().join("stdout.spool").exists());
        let chunks = drain_all(&s);
        let mut out = vec![];
        for c in chunks.iter().filter(|c| c.stream == "stdout") {
            assert_eq!(c.offset as usize, out.len(), "contiguous offsets");
            out.extend_from_slice(&c.data);
        }
        assert_eq!(out, input, "every byte, in order");
        // The step header follows exactly the output written before it.
        let header = chunks.iter().position(|c| c.stream == "system").expect("the header");
        let before: usize = chunks[..header].iter().map(|c| c.data.len()).sum();
        assert_eq!(before, 1500);
        let system: Vec<u8> = chunks.iter().filter(|c| c.stream == "system").flat_map(|c| c.data.to_vec()).collect();
        assert_eq!(system, "▶ step 2\n".as_bytes(), "one line, nothing dropped to report");
        assert_eq!(std::fs::metadata(dir.path().join("stdout.spool")).unwrap().len(), 0, "a drained spool is emptied");
    }

    #[tokio::test]
    async fn output_over_the_spool_limit_is_dropped_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = shipper(8);
        s.cfg.max_buffered = 16;
        s.cfg.spool_dir = Some(dir.path().to_path_buf());
        s.cfg.max_spool = 100;
        let streamer = streamer_for(&s);
        for _ in 0..50 {
            streamer.write(Stream::Stdout, b"0123456789");
        }
        let chunks = drain_all(&s);
        let kept: usize = chunks.iter().filter(|c| c.stream == "stdout").map(|c| c.data.len()).sum();
        assert_eq!(kept, 110, "16 bytes of memory (one 10-byte write fits) + 100 of spool");
        let system: Vec<u8> = chunks.iter().filter(|c| c.stream == "system").flat_map(|c| c.data.to_vec()).collect();
        assert!(
            String::from_utf8_lossy(&system).contains("390 bytes of stdout dropped"),
            "{}",
            String::from_utf8_lossy(&system)
        );
    }

    #[tokio::test]
    async fn output_over_the_rate_limit_is_dropped_with_a_gap_marker_where_it_was() {
        let mut s = shipper(1 << 20);
        s.cfg.rate_limit = Some(1000);
        let streamer = streamer_for(&s);
        // The burst (64 KiB, the minimum) passes; the rest of a fast write is dropped.
        streamer.write(Stream::Stdout, &vec![b'x'; 100 * 1024]);
        tokio::time::sleep(Duration::from_millis(50)).await;
        streamer.write(Stream::Stdout, b"after\n"); // 50 tokens refilled: admitted, and the gap is marked
        streamer.report_truncation();
        let chunks = drain_all(&s);
        let stdout: usize = chunks.iter().filter(|c| c.stream == "stdout").map(|c| c.data.len()).sum();
        assert_eq!(stdout, 64 * 1024 + 6);
        let system: String = chunks
            .iter()
            .filter(|c| c.stream == "system")
            .map(|c| String::from_utf8_lossy(&c.data).into_owned())
            .collect();
        assert!(system.contains(&format!("gap: {} bytes of output dropped here", 36 * 1024)), "{system}");
        assert!(system.contains("rate limit of 1000 bytes/s"), "{system}");
    }
}
