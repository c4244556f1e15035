//! One way to run a statement on either backend.
//!
//! Why this shape: the store's transactions are written once and run on
//! SQLite and PostgreSQL. Making them generic over `sqlx::Database` needs a
//! bound for every type bound or decoded and for `Executor` on `&mut
//! Connection`, repeated on every function (Rust does not carry such where
//! clauses along with a helper trait) and fragile under `async_trait`'s
//! `Send` requirement; sqlx's `Any` driver loses SQLite's connect options
//! and PostgreSQL's arrays. Instead a statement is an enum over the two
//! drivers' own `Query` values, created from a connection of the matching
//! backend ([`Tx`], [`Conn`]), so a statement can never meet the wrong
//! driver. Binding and running dispatch with one `match`; rows stay the
//! driver's rows ([`Row`] wraps them, values are decoded in place): nothing
//! is converted or allocated per call beyond what sqlx does anyway. The
//! bounds a bound or decoded value needs are collected once, in [`Param`]
//! and [`Value`]. Database errors are mapped per backend here
//! (`pg_err`: serialization failures are `Retryable`).

use crate::dialect::{Backend, Dialect, POSTGRES, SQLITE, Sql, SqlText};
use crate::error::{Result, StoreError, db_err, pg_err};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Decode, Encode, FromRow, PgConnection, Postgres, Sqlite, SqliteConnection, Type};

/// A value a statement can bind, on either backend (`'t`: how long a
/// borrowed value lives; sqlx encodes it when bound).
pub(crate) trait Param<'t>: Encode<'t, Sqlite> + Type<Sqlite> + Encode<'t, Postgres> + Type<Postgres> {}
impl<'t, T> Param<'t> for T where T: Encode<'t, Sqlite> + Type<Sqlite> + Encode<'t, Postgres> + Type<Postgres> {}

/// A value a row column decodes into, on either backend.
pub(crate) trait Value:
    for<'r> Decode<'r, Sqlite> + Type<Sqlite> + for<'r> Decode<'r, Postgres> + Type<Postgres> + Send + Unpin
{
}
impl<T> Value for T where
    T: for<'r> Decode<'r, Sqlite> + Type<Sqlite> + for<'r> Decode<'r, Postgres> + Type<Postgres> + Send + Unpin
{
}

/// A row type (a tuple) a whole row decodes into, on either backend.
pub(crate) trait Record: for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin {}
impl<T> Record for T where T: for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin {}

/// An open transaction.
pub(crate) enum Tx {
    Sqlite(crate::lanes::SqliteTx),
    Pg(sqlx::Transaction<'static, Postgres>),
}

impl Tx {
    pub(crate) async fn commit(self) -> Result<()> {
        match self {
            Tx::Sqlite(t) => t.commit().await,
            Tx::Pg(t) => t.commit().await.map_err(pg_err),
        }
    }

    /// Roll back; an error is ignored (the connection is discarded or the
    /// rollback happens when it returns to the pool).
    pub(crate) async fn rollback(self) {
        let _ = match self {
            Tx::Sqlite(t) => t.rollback().await.map_err(drop),
            Tx::Pg(t) => t.rollback().await.map_err(drop),
        };
    }
}

/// A pooled connection, for statements outside an explicit transaction.
pub(crate) enum Conn {
    Sqlite(crate::lanes::Lease),
    Pg(PoolConnection<Postgres>),
}

/// Something statements run on: a transaction or a pooled connection.
pub(crate) trait Exec: Send {
    fn dialect(&self) -> &'static Dialect;
    /// A statement on this connection.
    fn sql(&mut self, text: impl SqlText) -> Stmt<'_>;
}

/// The database clock (unix ms): "now" of a transaction is read once, from
/// the database, so lease decisions never depend on a caller's clock.
/// Embedded SQLite's clock is this process's own (`unixepoch('subsec')`
/// reads the same system clock), so it is read here without a statement:
/// each statement is a round trip to SQLite's worker thread.
pub(crate) async fn now(ex: &mut impl Exec) -> Result<i64> {
    static NOW: Sql = Sql::new(|d| format!("SELECT {}", d.now_ms));
    if ex.dialect().backend == Backend::Sqlite {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        return Ok(i64::try_from(since.as_millis()).unwrap_or(i64::MAX));
    }
    ex.sql(&NOW).scalar().await
}

impl Exec for Tx {
    fn dialect(&self) -> &'static Dialect {
        match self {
            Tx::Sqlite(_) => &SQLITE,
            Tx::Pg(_) => &POSTGRES,
        }
    }

    fn sql(&mut self, text: impl SqlText) -> Stmt<'_> {
        let d = self.dialect();
        match self {
            Tx::Sqlite(t) => {
                let (conn, pending_begin) = t.parts();
                let text = text.text(d);
                match pending_begin {
                    Some(p) => Stmt::Sqlite(conn, sqlx::query(crate::lanes::with_begin(text)), Some(p)),
                    None => Stmt::Sqlite(conn, sqlx::query(text), None),
                }
            }
            Tx::Pg(t) => Stmt::Pg(t, sqlx::query(text.text(d))),
        }
    }
}

impl Exec for Conn {
    fn dialect(&self) -> &'static Dialect {
        match self {
            Conn::Sqlite(_) => &SQLITE,
            Conn::Pg(_) => &POSTGRES,
        }
    }

    fn sql(&mut self, text: impl SqlText) -> Stmt<'_> {
        let d = self.dialect();
        match self {
            Conn::Sqlite(c) => Stmt::Sqlite(c, sqlx::query(text.text(d)), None),
            Conn::Pg(c) => Stmt::Pg(c, sqlx::query(text.text(d))),
        }
    }
}

/// One statement with its bound parameters, on the connection it runs on.
/// A SQLite statement carries its transaction's "`BEGIN` not sent yet"
/// flag when it is the transaction's first and has `BEGIN` in front
/// ([`crate::lanes::SqliteTx::parts`]): running it clears the flag.
pub(crate) enum Stmt<'c> {
    Sqlite(&'c mut SqliteConnection, Query<'static, Sqlite, SqliteArguments>, Option<&'c mut bool>),
    Pg(&'c mut PgConnection, Query<'static, Postgres, PgArguments>),
}

/// The statement is about to run: a `BEGIN` in front of it is sent now.
fn sent(pending_begin: Option<&mut bool>) {
    if let Some(p) = pending_begin {
        *p = false;
    }
}

impl Stmt<'_> {
    pub(crate) fn bind<'t>(self, value: impl Param<'t>) -> Self {
        match self {
            Stmt::Sqlite(c, q, b) => Stmt::Sqlite(c, q.bind(value), b),
            Stmt::Pg(c, q) => Stmt::Pg(c, q.bind(value)),
        }
    }

    /// Run it; the number of rows it changed.
    pub(crate) async fn execute(self) -> Result<u64> {
        match self {
            Stmt::Sqlite(c, q, None) => q.execute(c).await.map(|r| r.rows_affected()).map_err(db_err),
            Stmt::Sqlite(c, q, b @ Some(_)) => {
                // `BEGIN` in front: SQLite's change count after it is the
                // previous statement's, so only the statement's own counts.
                use futures::TryStreamExt;
                sent(b);
                #[allow(deprecated)] // SQLite runs several statements in one query.
                let counts: Vec<_> = q.execute_many(c).await.try_collect().await.map_err(db_err)?;
                Ok(counts.iter().skip(1).map(|r| r.rows_affected()).sum())
            }
            Stmt::Pg(c, q) => q.execute(c).await.map(|r| r.rows_affected()).map_err(pg_err),
        }
    }

    pub(crate) async fn fetch_optional(self) -> Result<Option<Row>> {
        match self {
            Stmt::Sqlite(c, q, b) => {
                sent(b);
                q.fetch_optional(c).await.map(|r| r.map(Row::Sqlite)).map_err(db_err)
            }
            Stmt::Pg(c, q) => q.fetch_optional(c).await.map(|r| r.map(Row::Pg)).map_err(pg_err),
        }
    }

    pub(crate) async fn fetch_all(self) -> Result<Vec<Row>> {
        match self {
            Stmt::Sqlite(c, q, b) => {
                sent(b);
                q.fetch_all(c).await.map(|rows| rows.into_iter().map(Row::Sqlite).collect()).map_err(db_err)
            }
            Stmt::Pg(c, q) => q.fetch_all(c).await.map(|rows| rows.into_iter().map(Row::Pg).collect()).map_err(pg_err),
        }
    }

    /// The one row, as a tuple; none is `NotFound`.
    pub(crate) async fn one<O: Record>(self) -> Result<O> {
        self.optional().await?.ok_or_else(|| StoreError::NotFound("row".into()))
    }

    /// The first row, if any, as a tuple.
    pub(crate) async fn optional<O: Record>(self) -> Result<Option<O>> {
        match self {
            Stmt::Sqlite(c, q, b) => {
                sent(b);
                q.try_map(|r: SqliteRow| O::from_row(&r)).fetch_optional(c).await.map_err(db_err)
            }
            Stmt::Pg(c, q) => q.try_map(|r: PgRow| O::from_row(&r)).fetch_optional(c).await.map_err(pg_err),
        }
    }

    /// Every row, as tuples.
    pub(crate) async fn all<O: Record>(self) -> Result<Vec<O>> {
        match self {
            Stmt::Sqlite(c, q, b) => {
                sent(b);
                q.try_map(|r: SqliteRow| O::from_row(&r)).fetch_all(c).await.map_err(db_err)
            }
            Stmt::Pg(c, q) => q.try_map(|r: PgRow| O::from_row(&r)).fetch_all(c).await.map_err(pg_err),
        }
    }

    /// The first column of the one row; none is `NotFound`.
    pub(crate) async fn scalar<O: Value>(self) -> Result<O> {
        self.one::<(O,)>().await.map(|(v,)| v)
    }

    /// The first column of the first row, if any.
    pub(crate) async fn scalar_optional<O: Value>(self) -> Result<Option<O>> {
        self.optional::<(O,)>().await.map(|r| r.map(|(v,)| v))
    }

    /// The first column of every row.
    pub(crate) async fn scalars<O: Value>(self) -> Result<Vec<O>> {
        self.all::<(O,)>().await.map(|rows| rows.into_iter().map(|(v,)| v).collect())
    }
}

/// A row as the driver returned it.
pub(crate) enum Row {
    Sqlite(SqliteRow),
    Pg(PgRow),
}

impl Row {
    /// One column, decoded; a bad value is `Invalid`, not an outage.
    pub(crate) fn get<T: Value>(&self, column: &str) -> Result<T> {
        use sqlx::Row as _;
        match self {
            Row::Sqlite(r) => r.try_get(column),
            Row::Pg(r) => r.try_get(column),
        }
        .map_err(|e| StoreError::Invalid(e.to_string()))
    }

    /// A text column, borrowed from the row.
    pub(crate) fn str(&self, column: &str) -> Result<&str> {
        use sqlx::Row as _;
        match self {
            Row::Sqlite(r) => r.try_get(column),
            Row::Pg(r) => r.try_get(column),
        }
        .map_err(|e| StoreError::Invalid(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lanes::{Lanes, SqliteTx};
    use crate::sqlite::open_pools;
    use std::sync::Arc;

    async fn rows(lanes: &Arc<Lanes>) -> Vec<i64> {
        let rows: Vec<(i64,)> = sqlx::query_as("SELECT x FROM scratch ORDER BY x")
            .fetch_all(&mut *lanes.acquire().await.unwrap())
            .await
            .unwrap();
        rows.into_iter().map(|(x,)| x).collect()
    }

    /// A transaction dropped before its end (a cancelled request) leaves
    /// neither its writes nor an open transaction behind: the next one on
    /// the single writer begins, commits, and is what readers see.
    #[tokio::test]
    async fn a_transaction_dropped_midway_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, reader) = open_pools(&dir.path().join("kiln.db")).await.unwrap();
        sqlx::query("CREATE TABLE scratch (x INTEGER)").execute(&mut *writer.acquire().await.unwrap()).await.unwrap();
        {
            let mut tx = Tx::Sqlite(SqliteTx::begin(&writer).await.unwrap());
            tx.sql("INSERT INTO scratch VALUES (1)").execute().await.unwrap();
        }
        let mut tx = Tx::Sqlite(SqliteTx::begin(&writer).await.unwrap());
        tx.sql("INSERT INTO scratch VALUES (2)").execute().await.unwrap();
        assert_eq!(rows(&reader).await, Vec::<i64>::new(), "nothing before the commit");
        tx.commit().await.unwrap();
        assert_eq!(rows(&reader).await, vec![2]);

        // Rolled back: nothing; the connection is clean for the next one.
        // A first statement's count is its own, not the one SQLite still
        // reports after the BEGIN in front of it (the last statement's).
        let mut w = writer.acquire().await.unwrap();
        sqlx::query("INSERT INTO scratch VALUES (7), (8)").execute(&mut *w).await.unwrap();
        sqlx::query("DELETE FROM scratch WHERE x > 2").execute(&mut *w).await.unwrap();
        drop(w);
        let mut tx = Tx::Sqlite(SqliteTx::begin(&writer).await.unwrap());
        assert_eq!(tx.sql("UPDATE scratch SET x = x WHERE x = 99").execute().await.unwrap(), 0);
        assert_eq!(tx.sql("UPDATE scratch SET x = x WHERE x = 2").execute().await.unwrap(), 1);
        tx.commit().await.unwrap();

        // The first statement carries the BEGIN: a read returns its row,
        // and everything after it is inside the transaction.
        let mut tx = Tx::Sqlite(SqliteTx::begin(&writer).await.unwrap());
        assert_eq!(tx.sql("SELECT count(*) FROM scratch").scalar::<i64>().await.unwrap(), 1);
        tx.sql("INSERT INTO scratch VALUES (3)").execute().await.unwrap();
        tx.sql("INSERT INTO scratch VALUES (4)").execute().await.unwrap();
        tx.rollback().await;
        let tx = Tx::Sqlite(SqliteTx::begin(&writer).await.unwrap());
        tx.commit().await.unwrap();
        assert_eq!(rows(&reader).await, vec![2]);
    }

    /// A failed `COMMIT` discards its connection: the next transaction does
    /// not run inside the one that could not end (its writes would vanish).
    #[tokio::test]
    async fn a_failed_commit_does_not_leave_the_next_transaction_inside_it() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, reader) = open_pools(&dir.path().join("kiln.db")).await.unwrap();
        let mut w = writer.acquire().await.unwrap();
        sqlx::query("CREATE TABLE scratch (x INTEGER)").execute(&mut *w).await.unwrap();
        sqlx::query("CREATE TABLE parent (id INTEGER PRIMARY KEY)").execute(&mut *w).await.unwrap();
        sqlx::query("CREATE TABLE child (p INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)")
            .execute(&mut *w)
            .await
            .unwrap();
        drop(w);
        // A deferred foreign key fails at COMMIT and leaves the
        // transaction open.
        let mut tx = Tx::Sqlite(SqliteTx::begin(&writer).await.unwrap());
        tx.sql("INSERT INTO scratch VALUES (1)").execute().await.unwrap();
        tx.sql("INSERT INTO child VALUES (42)").execute().await.unwrap();
        assert!(tx.commit().await.is_err());
        let mut tx = Tx::Sqlite(SqliteTx::begin(&writer).await.unwrap());
        tx.sql("INSERT INTO scratch VALUES (2)").execute().await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(rows(&reader).await, vec![2], "the failed transaction's row is gone, the next one's committed");
    }
}
