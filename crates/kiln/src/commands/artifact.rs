//! `kiln artifact get RUN JOB NAME -o PATH`, `kiln artifact list RUN [JOB]`.

use super::shared::client;
use crate::cli::Conn;
use futures::StreamExt;
use kiln_api::exit;
use kiln_cmd::{CmdResult, Failure, usage};
use std::io::Write;
use std::path::Path;

/// `kiln artifact get`: resolve the bound generation, download it with its
/// short-lived capability, verify size and sha256, then move it into place.
pub(super) async fn get(conn: &Conn, run: &str, job: &str, name: &str, output: &Path) -> CmdResult {
    use sha2::{Digest, Sha256};
    let c = client(conn)?;
    let d = match c.artifact(run, job, name).await {
        Ok(d) => d,
        Err(e) if e.code() == Some(kiln_api::codes::EXPIRED) => {
            return Err(Failure {
                message: format!(
                    "artifact {job}/{name} of run {run} has expired: its bytes were deleted when its retention \
                     (`expire-in`, or the server's --artifact-expire-in) ran out; `kiln artifact list {run}` shows it"
                ),
                code: exit::REFUSED,
            });
        }
        Err(e) => return Err(e.into()),
    };
    let resp = c.download(&d.url).await?;
    let to_stdout = output.as_os_str() == "-";
    let tmp = output.with_file_name(format!(
        ".{}.kiln-partial",
        output.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_else(|| "artifact".into())
    ));
    let mut file = if to_stdout {
        None
    } else {
        Some(std::fs::File::create(&tmp).map_err(|e| usage(format!("cannot write {}: {e}", tmp.display())))?)
    };
    let bar = indicatif::ProgressBar::new(d.size);
    if to_stdout || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bytes}/{total_bytes} {wide_bar} {bytes_per_sec} eta {eta}")
            .expect("template"),
    );
    let mut hasher = Sha256::new();
    let mut n: u64 = 0;
    let mut stream = resp.bytes_stream();
    let mut out = std::io::stdout().lock();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| Failure { message: format!("download failed: {e}"), code: exit::UNAVAILABLE })?;
        hasher.update(&chunk);
        n += chunk.len() as u64;
        match file.as_mut() {
            Some(f) => f.write_all(&chunk).map_err(|e| usage(format!("cannot write {}: {e}", tmp.display())))?,
            None => out.write_all(&chunk).map_err(|e| usage(format!("cannot write to stdout: {e}")))?,
        }
        bar.set_position(n);
    }
    bar.finish_and_clear();
    let sha = hex::encode(hasher.finalize());
    if n != d.size || sha != d.sha256 {
        let _ = std::fs::remove_file(&tmp);
        return Err(Failure {
            message: format!(
                "artifact {job}/{name} failed verification: expected {} bytes sha256 {}, got {n} bytes sha256 {sha}; nothing was written",
                d.size, d.sha256
            ),
            code: exit::UNAVAILABLE,
        });
    }
    if let Some(f) = file {
        f.sync_all().map_err(|e| usage(e.to_string()))?;
        std::fs::rename(&tmp, output).map_err(|e| usage(format!("cannot write {}: {e}", output.display())))?;
        eprintln!("{job}/{name} (from attempt {}): {n} bytes, sha256 {sha} -> {}", d.epoch, output.display());
    }
    Ok(exit::OK)
}

/// One line of `kiln artifact list --json`: the run view's artifact with
/// its job.
#[derive(serde::Serialize)]
struct Listed<'a> {
    job: &'a str,
    #[serde(flatten)]
    artifact: &'a kiln_api::Artifact,
}

/// `kiln artifact list RUN [JOB]`: the bound artifacts of the run (or of one
/// job), from the run view.
pub(super) async fn list(conn: &Conn, run: &str, job: Option<&str>, json: bool) -> CmdResult {
    let c = client(conn)?;
    let r = c.get_run(run).await?;
    let jobs = super::logs::select_jobs(&r, job)?;
    let listed: Vec<Listed> =
        jobs.iter().flat_map(|j| j.artifacts.iter().map(|a| Listed { job: &j.name, artifact: a })).collect();
    if json {
        kiln_cmd::outln!("{}", serde_json::to_string_pretty(&listed).expect("json"));
        return Ok(exit::OK);
    }
    if listed.is_empty() {
        eprintln!(
            "run {} has no published artifacts{}",
            r.id,
            job.map(|j| format!(" in job `{j}`")).unwrap_or_default()
        );
        return Ok(exit::OK);
    }
    let out = |s: String| kiln_cmd::outln!("{}", crate::term::for_stdout(&s));
    out(format!("{:<24} {:<24} {:>12} {:<12} {:<8} EXPIRES", "NAME", "JOB", "SIZE", "SHA256", "KIND"));
    for l in &listed {
        let a = l.artifact;
        let expiry = match (a.expired, a.expires_at) {
            (true, _) => "expired".to_string(),
            (false, Some(at)) => super::shared::when(at),
            (false, None) => "never".to_string(),
        };
        let short: String = a.sha256.chars().take(12).collect();
        out(format!("{:<24} {:<24} {:>12} {short:<12} {:<8} {expiry}", a.name, l.job, a.size, a.kind));
    }
    Ok(exit::OK)
}
