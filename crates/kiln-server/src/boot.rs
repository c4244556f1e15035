//! Startup: the data dir's token files and the metadata store the
//! configuration names.

use crate::config::ServerConfig;
use anyhow::Context;
use kiln_store::{PgStore, SqliteStore, Store};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Read `DATA_DIR/NAME`, or create it with a fresh random token (mode 0600).
pub(crate) fn load_or_create_token(dir: &std::path::Path, name: &str) -> anyhow::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let read = || std::fs::read_to_string(&path).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
    if let Some(t) = read() {
        return Ok(t);
    }
    // Replicas starting at once on one data dir must agree: write a private
    // file, then link it into place only if no other process did first.
    let token = format!("kiln_{}", hex::encode(rand::random::<[u8; 24]>()));
    let tmp = dir.join(format!(".{name}.{}.{}", std::process::id(), hex::encode(rand::random::<[u8; 6]>())));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    writeln!(f, "{token}")?;
    f.sync_all()?;
    drop(f);
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(token),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            read().with_context(|| format!("{} exists but is empty", path.display()))
        }
        Err(e) => Err(e).with_context(|| format!("cannot write {}", path.display())),
    }
}

/// Creates `dir` (and its parents) and makes it 0700: only the server's
/// user may list or traverse it. A symbolic link is left as it is (its
/// target is the operator's choice).
pub(crate) fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.is_dir() && meta.permissions().mode() & 0o777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// The SQLite database and its `-wal` / `-shm` files are 0600: created so
/// before SQLite opens them (SQLite gives the WAL the database's mode), and
/// tightened when an older server left them readable.
fn private_db_files(db: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(db) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        let p = PathBuf::from(p);
        if let Ok(meta) = std::fs::symlink_metadata(&p)
            && meta.is_file()
            && meta.permissions().mode() & 0o077 != 0
        {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

/// Open the metadata store the configuration names (see
/// [`ServerConfig::database_url`]).
pub(crate) async fn open_store(config: &ServerConfig) -> anyhow::Result<Arc<dyn Store>> {
    let backoff = kiln_core::Backoff { base_ms: config.retry_base.as_millis() as u64, max_ms: 60_000 };
    let url = config.database_url.as_deref().unwrap_or("");
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = PgStore::connect(url).await.with_context(|| format!("cannot open database {}", redact(url)))?;
        return Ok(Arc::new(store.with_backoff(backoff)));
    }
    let db_path = match url.strip_prefix("sqlite:") {
        _ if url.is_empty() => config.data_dir.join("kiln.db"),
        Some(p) if !p.trim_start_matches("//").is_empty() => PathBuf::from(p.trim_start_matches("//")),
        _ => anyhow::bail!("--database-url {url}: expected postgres://USER@HOST:PORT/DB or sqlite:PATH"),
    };
    private_db_files(&db_path).with_context(|| format!("cannot create database {}", db_path.display()))?;
    let store =
        SqliteStore::open(&db_path).await.with_context(|| format!("cannot open database {}", db_path.display()))?;
    Ok(Arc::new(store.with_backoff(backoff)))
}

/// Seal secrets an earlier version stored in clear (each only if unchanged
/// meanwhile, all in one transaction); how many.
pub(crate) async fn seal_legacy_secrets(store: &dyn Store, secrets: &crate::sealing::SecretBox) -> anyhow::Result<u64> {
    let changes: Vec<_> = store
        .all_secrets()
        .await?
        .into_iter()
        .filter(|(_, _, v)| !crate::sealing::SecretBox::is_sealed(v))
        .map(|(repo, name, v)| {
            let sealed = secrets.seal(&repo, &name, &v);
            (repo, name, v, sealed)
        })
        .collect();
    if changes.is_empty() {
        return Ok(0);
    }
    Ok(store.replace_secrets(&changes).await?)
}

/// A database URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => match url[s + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
            None => url.to_string(),
        },
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod mode_tests {
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &std::path::Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_data_dir_is_made_private_also_when_it_existed() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("a/data");
        super::private_dir(&data).unwrap();
        assert_eq!(mode(&data), 0o700);
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        super::private_dir(&data).unwrap();
        assert_eq!(mode(&data), 0o700);
    }

    #[test]
    fn database_files_are_private_before_sqlite_opens_them() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("kiln.db");
        super::private_db_files(&db).unwrap();
        assert_eq!(mode(&db), 0o600);
        assert_eq!(std::fs::metadata(&db).unwrap().len(), 0, "an empty file is an empty database");
        // An older server's world-readable files are tightened.
        let wal = dir.path().join("kiln.db-wal");
        std::fs::write(&wal, b"").unwrap();
        std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
        super::private_db_files(&db).unwrap();
        assert_eq!((mode(&db), mode(&wal)), (0o600, 0o600));
    }
}

#[cfg(test)]
mod token_tests {
    #[test]
    fn concurrent_starts_on_one_data_dir_agree_on_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let tokens: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> =
                (0..8).map(|_| s.spawn(|| super::load_or_create_token(dir.path(), "agent.token").unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(tokens.iter().all(|t| *t == tokens[0]), "{tokens:?}");
        assert_eq!(std::fs::read_to_string(dir.path().join("agent.token")).unwrap().trim(), tokens[0]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("agent.token")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary files left");
    }
}

/// `kiln up --agents N` started: offline agents `local-M` (M > N) of the
/// default pool are left over from an earlier start with more agents; they
/// would stay offline forever. Removed (audit `agent.remove`).
pub(crate) async fn forget_surplus_local_agents(store: &dyn kiln_store::Store, keep: u32) -> anyhow::Result<()> {
    for a in store.list_agents().await? {
        let surplus = a.pool == "default"
            && a.name.strip_prefix("local-").and_then(|n| n.parse::<u32>().ok()).is_some_and(|n| n > keep);
        if surplus && store.remove_agent(&a.id).await? {
            tracing::info!(agent = %a.id, name = %a.name, "removed a local agent of an earlier `kiln up` with more agents");
            let e = kiln_store::NewAudit {
                actor: "kiln up".into(),
                action: "agent.remove".into(),
                target: a.id.clone(),
                detail: format!("{}: kiln up now runs {keep} local agent(s)", a.name),
            };
            store.audit(&e).await?;
        }
    }
    Ok(())
}
