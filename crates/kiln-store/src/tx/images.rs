//! Images a Dockerfile job built (spec 000 §5): the first digest the live
//! epoch commits is the job's; later ones do not replace it.

use crate::db::Exec;
use crate::dialect::Isolation;
use crate::error::Result;
use crate::store::{SqlStore, lock_job};
use crate::tx::attempt::require_live;

/// `AttemptStore::commit_image_digest`.
/// With `local`, the first commit also records the committing attempt's
/// agent as the only one holding the image (issue 40, item 7).
pub(crate) async fn commit_image_digest(
    store: &SqlStore,
    job_id: &str,
    epoch: i64,
    digest: &str,
    local: bool,
) -> Result<String> {
    store
        .transaction(Isolation::Serializable, &(job_id, epoch, digest, local), |tx, &(job_id, epoch, digest, local)| {
            Box::pin(async move {
                lock_job(tx, job_id).await?;
                require_live(tx, job_id, epoch).await?;
                if local {
                    tx.sql(
                        "UPDATE jobs SET image_agent = (SELECT runner FROM attempts WHERE job_id = $1 AND epoch = $2) \
                         WHERE id = $1 AND image_digest IS NULL",
                    )
                    .bind(job_id)
                    .bind(epoch)
                    .execute()
                    .await?;
                }
                let stored: Option<String> = tx
                .sql("UPDATE jobs SET image_digest = COALESCE(image_digest, $1) WHERE id = $2 RETURNING image_digest")
                .bind(digest)
                .bind(job_id)
                .scalar()
                .await?;
                Ok(stored.unwrap_or_else(|| digest.to_string()))
            })
        })
        .await
}
