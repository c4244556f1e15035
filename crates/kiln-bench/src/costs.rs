//! What an operation costs: CPU time of the server and of PostgreSQL,
//! PostgreSQL's transactions and write-ahead log, sampled at the edges of
//! a window (`control_window_*` lines), and a least-squares fit of those
//! windows to a cost per operation (`kiln bench control-plane --fit`).

use crate::util::{clock_ticks_per_s, cpu_ticks};
use std::collections::BTreeMap;
use std::path::Path;

/// PostgreSQL's cumulative counters for the bench's cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct PgCounters {
    /// Committed transactions of the bench's database (`pg_stat_database`;
    /// a backend reports them at most once a second, so a window's edges
    /// are blurred by up to a second).
    pub commits: i64,
    pub rollbacks: i64,
    /// The next transaction id: transactions that wrote (read-only ones
    /// take no id), exact at the instant it is read.
    pub xids: i64,
    /// The write-ahead log's insert position, in bytes: exact.
    pub wal_bytes: i64,
    /// `pg_stat_wal.wal_sync`: the WAL's flushes to disk (fsyncs), as
    /// reported (like commits, up to a second late).
    pub wal_syncs: i64,
}

/// Reads [`PgCounters`]; `None` if the database cannot be read.
pub(crate) async fn pg_counters(url: &str) -> Option<PgCounters> {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.ok()?;
    // The statistics are read from a snapshot: start from a fresh one.
    let _ = sqlx::query("SELECT pg_stat_clear_snapshot()").execute(&mut c).await;
    let (commits, rollbacks): (i64, i64) =
        sqlx::query_as("SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()")
            .fetch_one(&mut c)
            .await
            .ok()?;
    let (xids, wal_bytes, wal_syncs): (i64, i64, i64) = sqlx::query_as(
        "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, \
                (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint, \
                (SELECT wal_sync FROM pg_stat_wal)",
    )
    .fetch_one(&mut c)
    .await
    .ok()?;
    let _ = c.close().await;
    Some(PgCounters { commits, rollbacks, xids, wal_bytes, wal_syncs })
}

/// The throwaway PostgreSQL server's processes: the postmaster listening on
/// `port` and its children (backends, writers), found in /proc. Read again
/// at each sample: a backend started since the last one counts from its
/// start, and one that exited is in the postmaster's reaped children.
pub(crate) fn postgres_pids(port: u16) -> Vec<u32> {
    let procs: Vec<(u32, u32, String)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).ok()?.replace('\0', " ");
            Some((pid, ppid, cmdline))
        })
        .collect();
    let port = format!("-p {port} ");
    let Some(master) = procs.iter().find(|(_, _, c)| c.contains("postgres") && c.contains(&port)).map(|p| p.0) else {
        return vec![];
    };
    procs.iter().filter(|(pid, ppid, _)| *pid == master || *ppid == master).map(|p| p.0).collect()
}

/// Where the costs are read: the server's processes (or this process for
/// an in-process server) and, on PostgreSQL, its URL and port.
#[derive(Debug, Clone, Default)]
pub(crate) struct Meter {
    pub server_pids: Vec<u32>,
    pub pg_port: Option<u16>,
    pub pg_url: Option<String>,
}

/// The meter's counters at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Reading {
    pub at: Option<std::time::Instant>,
    pub server_ticks: u64,
    pub pg_ticks: u64,
    /// The bench client's own (this process), when the caller reads it.
    pub client_ticks: u64,
    pub pg: Option<PgCounters>,
}

impl Meter {
    pub(crate) async fn read(&self) -> Reading {
        let pg_ticks = self.pg_port.map(|p| cpu_ticks(&postgres_pids(p))).unwrap_or(0);
        let server_ticks = cpu_ticks(&self.server_pids);
        let pg = match &self.pg_url {
            Some(u) => pg_counters(u).await,
            None => None,
        };
        Reading { at: Some(std::time::Instant::now()), server_ticks, pg_ticks, client_ticks: 0, pg }
    }
}

/// What a window between two readings cost, as a `key=value …` line's
/// fields: `seconds`, the operation counts given, `server_cpu_ms`,
/// `pg_cpu_ms`, `commits`, `rollbacks`, `xids`, `wal_bytes`, `wal_syncs`.
pub(crate) fn window_fields(r0: &Reading, r1: &Reading, ops: &[(&str, u64)]) -> String {
    let secs = match (r0.at, r1.at) {
        (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    let ms = |t0: u64, t1: u64| t1.saturating_sub(t0) as f64 * 1000.0 / clock_ticks_per_s();
    let mut s = format!("seconds={secs:.3}");
    for (k, v) in ops {
        s += &format!(" {k}={v}");
    }
    s += &format!(" server_cpu_ms={:.0}", ms(r0.server_ticks, r1.server_ticks));
    if let (Some(a), Some(b)) = (r0.pg, r1.pg) {
        s += &format!(
            " pg_cpu_ms={:.0} commits={} rollbacks={} xids={} wal_bytes={} wal_syncs={}",
            ms(r0.pg_ticks, r1.pg_ticks),
            b.commits - a.commits,
            b.rollbacks - a.rollbacks,
            b.xids - a.xids,
            b.wal_bytes - a.wal_bytes,
            b.wal_syncs - a.wal_syncs,
        );
    }
    s
}

/// One `control_window_*: key=value …` line's fields.
pub(crate) fn parse_window(line: &str) -> Option<BTreeMap<String, f64>> {
    let (name, rest) = line.split_once(':')?;
    if !name.trim().starts_with("control_window") {
        return None;
    }
    let fields: BTreeMap<String, f64> = rest
        .split_whitespace()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect();
    fields.contains_key("seconds").then_some(fields)
}

/// The regressors of the fit: seconds (what the replicas and PostgreSQL
/// cost idle, per second) and each operation's count.
pub(crate) const REGRESSORS: [&str; 5] = ["seconds", "accepts", "claims", "completions", "heartbeats"];
/// A window's fields, by name.
type Window = BTreeMap<String, f64>;

/// What is fitted.
pub(crate) const TARGETS: [&str; 6] = ["server_cpu_ms", "pg_cpu_ms", "commits", "xids", "wal_bytes", "wal_syncs"];

/// Ordinary least squares of `y` on the columns of `x` (rows of equal
/// length): the coefficients and their standard errors; `None` if the
/// columns are not independent or there are no more rows than columns.
pub(crate) fn least_squares(x: &[Vec<f64>], y: &[f64]) -> Option<(Vec<f64>, Vec<f64>)> {
    let p = x.first()?.len();
    let n = x.len();
    if n <= p || y.len() != n {
        return None;
    }
    // Columns scaled to unit largest magnitude: counts of thousands beside
    // seconds of ten keep the normal equations well conditioned.
    let scale: Vec<f64> = (0..p)
        .map(|j| x.iter().map(|r| r[j].abs()).fold(0.0, f64::max))
        .map(|m| if m > 0.0 { m } else { 1.0 })
        .collect();
    let xs: Vec<Vec<f64>> = x.iter().map(|r| r.iter().zip(&scale).map(|(v, s)| v / s).collect()).collect();
    let mut xtx = vec![vec![0.0; p]; p];
    let mut xty = vec![0.0; p];
    for (r, yi) in xs.iter().zip(y) {
        for i in 0..p {
            xty[i] += r[i] * yi;
            for j in 0..p {
                xtx[i][j] += r[i] * r[j];
            }
        }
    }
    let inv = invert(xtx)?;
    let beta: Vec<f64> = (0..p).map(|i| (0..p).map(|j| inv[i][j] * xty[j]).sum()).collect();
    let rss: f64 =
        xs.iter().zip(y).map(|(r, yi)| (yi - r.iter().zip(&beta).map(|(a, b)| a * b).sum::<f64>()).powi(2)).sum();
    let sigma2 = rss / (n - p) as f64;
    let se: Vec<f64> = (0..p).map(|i| (sigma2 * inv[i][i]).max(0.0).sqrt() / scale[i]).collect();
    let beta = beta.iter().zip(&scale).map(|(b, s)| b / s).collect();
    Some((beta, se))
}

/// Gauss-Jordan inverse with partial pivoting; `None` if singular.
fn invert(mut a: Vec<Vec<f64>>) -> Option<Vec<Vec<f64>>> {
    let n = a.len();
    let mut inv: Vec<Vec<f64>> = (0..n).map(|i| (0..n).map(|j| if i == j { 1.0 } else { 0.0 }).collect()).collect();
    for col in 0..n {
        let piv = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, piv);
        inv.swap(col, piv);
        let d = a[col][col];
        for j in 0..n {
            a[col][j] /= d;
            inv[col][j] /= d;
        }
        for i in 0..n {
            if i != col {
                let f = a[i][col];
                if f != 0.0 {
                    for j in 0..n {
                        a[i][j] -= f * a[col][j];
                        inv[i][j] -= f * inv[col][j];
                    }
                }
            }
        }
    }
    Some(inv)
}

/// The fit of every target over `windows`. The windows without accepts
/// are fitted to seconds, claims, completions and heartbeats by least
/// squares; then each window of accepts (the submission, nothing else
/// running) is charged the idle cost per second — that of the windows in
/// which nothing happened (`--claims-per-s 0`), else the fit's cost per
/// second — and the rest is divided by its accepts (the submissions last minutes: fitted together
/// with the rest they would weigh more than every other window). For each
/// target, (costs, standard errors) in [`REGRESSORS`]' order; an accept's
/// error is the spread of its windows' figures. A regressor that is zero
/// in every window is left out (its cost: NaN).
pub(crate) fn fit(windows: &[BTreeMap<String, f64>]) -> BTreeMap<&'static str, (Vec<f64>, Vec<f64>)> {
    let get = |w: &BTreeMap<String, f64>, k: &str| w.get(k).copied().unwrap_or(0.0);
    let (accepts, ops): (Vec<&Window>, Vec<&Window>) = windows.iter().partition(|w| get(w, "accepts") > 0.0);
    let used: Vec<usize> = (0..REGRESSORS.len())
        .filter(|&j| REGRESSORS[j] != "accepts" && ops.iter().any(|w| get(w, REGRESSORS[j]) != 0.0))
        .collect();
    let mut out = BTreeMap::new();
    for t in TARGETS {
        let mut beta = vec![f64::NAN; REGRESSORS.len()];
        let mut err = vec![f64::NAN; REGRESSORS.len()];
        let rows: Vec<&&BTreeMap<String, f64>> = ops.iter().filter(|w| w.contains_key(t)).collect();
        let x: Vec<Vec<f64>> = rows.iter().map(|w| used.iter().map(|&j| get(w, REGRESSORS[j])).collect()).collect();
        let y: Vec<f64> = rows.iter().map(|w| w[t]).collect();
        if let Some((b, se)) = least_squares(&x, &y) {
            for (k, &j) in used.iter().enumerate() {
                beta[j] = b[k];
                err[j] = se[k];
            }
        }
        let quiet: Vec<&&BTreeMap<String, f64>> = rows
            .iter()
            .copied()
            .filter(|w| REGRESSORS[2..].iter().all(|r| get(w, r) == 0.0) && get(w, "seconds") > 0.0)
            .collect();
        let quiet_secs: f64 = quiet.iter().map(|w| get(w, "seconds")).sum();
        let idle = if quiet_secs > 0.0 {
            quiet.iter().map(|w| w[t]).sum::<f64>() / quiet_secs
        } else if beta[0].is_nan() {
            0.0
        } else {
            beta[0]
        };
        let per: Vec<(f64, f64)> = accepts
            .iter()
            .filter(|w| w.contains_key(t))
            .map(|w| ((w[t] - idle * get(w, "seconds")) / get(w, "accepts"), get(w, "accepts")))
            .collect();
        if !per.is_empty() {
            let n: f64 = per.iter().map(|p| p.1).sum();
            let mean = per.iter().map(|p| p.0 * p.1).sum::<f64>() / n;
            beta[1] = mean;
            err[1] = if per.len() > 1 {
                (per.iter().map(|p| (p.0 - mean).powi(2)).sum::<f64>() / (per.len() - 1) as f64).sqrt()
            } else {
                f64::NAN
            };
        }
        if beta.iter().any(|b| !b.is_nan()) {
            out.insert(t, (beta, err));
        }
    }
    out
}

/// `kiln bench control-plane --fit FILE…`: the `control_window_*` lines of
/// earlier outputs fitted to a cost per operation, printed as
/// `fit_<target>_per_<regressor>: value ± standard error`.
pub(crate) fn run_fit(files: &[impl AsRef<Path>]) -> anyhow::Result<()> {
    let mut windows = vec![];
    for f in files {
        let text = std::fs::read_to_string(f.as_ref()).map_err(|e| anyhow::anyhow!("{}: {e}", f.as_ref().display()))?;
        windows.extend(text.lines().filter_map(parse_window));
    }
    anyhow::ensure!(!windows.is_empty(), "no control_window lines in the files given");
    kiln_cmd::outln!("fit_windows: {}", windows.len());
    for (t, (beta, se)) in fit(&windows) {
        for (j, r) in REGRESSORS.iter().enumerate() {
            if beta[j].is_nan() {
                continue;
            }
            let per = if *r == "seconds" { "second_idle".to_string() } else { r.trim_end_matches('s').to_string() };
            kiln_cmd::outln!("fit_{t}_per_{per}: {} ± {}", sig(beta[j]), sig(se[j]));
        }
    }
    Ok(())
}

/// Three significant digits, without an exponent.
fn sig(v: f64) -> String {
    if !v.is_finite() || v == 0.0 {
        return format!("{v}");
    }
    let digits = (2 - v.abs().log10().floor() as i32).max(0) as usize;
    format!("{v:.digits$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_line_is_read_into_its_fields_and_other_lines_are_not() {
        let w = parse_window(
            "control_window_2: seconds=10.000 claims=2300 completions=0 heartbeats=27600 server_cpu_ms=4100 wal_bytes=123",
        )
        .expect("a window");
        assert_eq!(w["seconds"], 10.0);
        assert_eq!(w["claims"], 2300.0);
        assert_eq!(w["wal_bytes"], 123.0);
        assert!(parse_window("control_claims_per_s: 230").is_none());
        assert!(parse_window("control_window_1: no fields").is_none());
    }

    #[test]
    fn least_squares_recovers_exact_costs_and_refuses_dependent_columns() {
        // y = 2 + 3a + 0.5b, exactly.
        let x: Vec<Vec<f64>> = [(1.0, 0.0), (2.0, 1.0), (0.0, 4.0), (5.0, 2.0), (3.0, 3.0)]
            .iter()
            .map(|&(a, b)| vec![1.0, a, b])
            .collect();
        let y: Vec<f64> = x.iter().map(|r| 2.0 + 3.0 * r[1] + 0.5 * r[2]).collect();
        let (b, se) = least_squares(&x, &y).expect("a fit");
        for (got, want) in b.iter().zip([2.0, 3.0, 0.5]) {
            assert!((got - want).abs() < 1e-9, "{b:?}");
        }
        assert!(se.iter().all(|s| *s < 1e-6), "{se:?}");
        // The second column twice the first: no unique answer.
        let dep: Vec<Vec<f64>> = (1..6).map(|i| vec![i as f64, 2.0 * i as f64]).collect();
        assert!(least_squares(&dep, &[1.0, 2.0, 3.0, 4.0, 5.0]).is_none());
        // As many rows as columns: no error left to estimate.
        assert!(least_squares(&x[..3], &y[..3]).is_none());
    }

    #[test]
    fn the_fit_separates_claims_completions_and_heartbeats_from_windows_that_mix_them() {
        // Costs per second idle, accept, claim, completion, heartbeat.
        let cost = [50.0, 4.0, 2.0, 3.0, 0.25];
        let mix = [
            (10.0, 0.0, 0.0, 0.0, 0.0),
            (8.0, 3000.0, 0.0, 0.0, 0.0),
            (5.0, 0.0, 1150.0, 0.0, 6000.0),
            (15.0, 0.0, 3450.0, 3440.0, 41000.0),
            (5.0, 0.0, 0.0, 1160.0, 7000.0),
            (20.0, 0.0, 0.0, 0.0, 55000.0),
            (10.0, 0.0, 4600.0, 4590.0, 27000.0),
        ];
        let windows: Vec<BTreeMap<String, f64>> = mix
            .iter()
            .map(|m| {
                let v = [m.0, m.1, m.2, m.3, m.4];
                let mut w: BTreeMap<String, f64> = REGRESSORS.iter().zip(v).map(|(k, x)| (k.to_string(), x)).collect();
                w.insert("server_cpu_ms".into(), v.iter().zip(cost).map(|(x, c)| x * c).sum());
                w
            })
            .collect();
        let f = fit(&windows);
        let (beta, _) = &f["server_cpu_ms"];
        for (got, want) in beta.iter().zip(cost) {
            assert!((got - want).abs() < 1e-6, "{beta:?}");
        }
        // Targets missing from the windows are not fitted.
        assert!(!f.contains_key("wal_bytes"));
    }

    #[test]
    fn figures_keep_three_significant_digits() {
        assert_eq!(sig(1234.4), "1234");
        assert_eq!(sig(0.012345), "0.0123");
        assert_eq!(sig(2.5), "2.50");
    }
}
