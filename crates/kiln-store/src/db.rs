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
            Tx::Sqlite(t) => Stmt::Sqlite(t.conn(), sqlx::query(text.text(d))),
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
            Conn::Sqlite(c) => Stmt::Sqlite(c, sqlx::query(text.text(d))),
            Conn::Pg(c) => Stmt::Pg(c, sqlx::query(text.text(d))),
        }
    }
}

/// One statement with its bound parameters, on the connection it runs on.
pub(crate) enum Stmt<'c> {
    Sqlite(&'c mut SqliteConnection, Query<'static, Sqlite, SqliteArguments>),
    Pg(&'c mut PgConnection, Query<'static, Postgres, PgArguments>),
}

impl Stmt<'_> {
    pub(crate) fn bind<'t>(self, value: impl Param<'t>) -> Self {
        match self {
            Stmt::Sqlite(c, q) => Stmt::Sqlite(c, q.bind(value)),
            Stmt::Pg(c, q) => Stmt::Pg(c, q.bind(value)),
        }
    }

    /// Run it; the number of rows it changed.
    pub(crate) async fn execute(self) -> Result<u64> {
        match self {
            Stmt::Sqlite(c, q) => q.execute(c).await.map(|r| r.rows_affected()).map_err(db_err),
            Stmt::Pg(c, q) => q.execute(c).await.map(|r| r.rows_affected()).map_err(pg_err),
        }
    }

    pub(crate) async fn fetch_optional(self) -> Result<Option<Row>> {
        match self {
            Stmt::Sqlite(c, q) => q.fetch_optional(c).await.map(|r| r.map(Row::Sqlite)).map_err(db_err),
            Stmt::Pg(c, q) => q.fetch_optional(c).await.map(|r| r.map(Row::Pg)).map_err(pg_err),
        }
    }

    pub(crate) async fn fetch_all(self) -> Result<Vec<Row>> {
        match self {
            Stmt::Sqlite(c, q) => {
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
            Stmt::Sqlite(c, q) => q.try_map(|r: SqliteRow| O::from_row(&r)).fetch_optional(c).await.map_err(db_err),
            Stmt::Pg(c, q) => q.try_map(|r: PgRow| O::from_row(&r)).fetch_optional(c).await.map_err(pg_err),
        }
    }

    /// Every row, as tuples.
    pub(crate) async fn all<O: Record>(self) -> Result<Vec<O>> {
        match self {
            Stmt::Sqlite(c, q) => q.try_map(|r: SqliteRow| O::from_row(&r)).fetch_all(c).await.map_err(db_err),
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
