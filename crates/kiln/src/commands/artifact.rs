//! `kiln artifact get RUN JOB NAME -o PATH`.

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
    let d = c.artifact(run, job, name).await?;
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
