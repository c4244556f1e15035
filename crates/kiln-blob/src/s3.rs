//! The S3-compatible object store (spec 000 §12 at scale), through the
//! `object_store` crate.
//!
//! The server holds the credentials; agents get short-lived presigned URLs
//! and move bytes straight to and from the store:
//! - an artifact is one S3 multipart upload, created on the first part URL
//!   asked for; each part URL is presigned for `UploadPart` with the part's
//!   `Content-MD5` bound into the signature, so the store refuses bytes other
//!   than the ones the agent hashed (`BadDigest`, nothing written);
//! - the server completes the upload with the agents' ETags at seal, then
//!   reads the object back once and checks size and sha256 before anything
//!   may bind it (a mismatch deletes the object);
//! - downloads are presigned `GET`s.
//!
//! The first writer of a key is decided in the metadata store, never by a
//! conditional PUT (some S3-compatible stores ignore `If-None-Match`).

use crate::{BlobError, ObjectInfo, Result, check_key};
use futures::StreamExt;
use object_store::ObjectStoreExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as OsPath;
use object_store::signer::{HeaderName, HeaderValue, Method, SignedUrlOptions, Signer};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bytes this process read back from S3 buckets (whole-object hashes,
/// reads, ranges): what `kiln bench artifacts` reports per GB uploaded.
static BYTES_READ: AtomicU64 = AtomicU64::new(0);

/// Bytes this process has read from S3 so far.
pub fn bytes_read() -> u64 {
    BYTES_READ.load(Ordering::Relaxed)
}

/// Where and how to reach the bucket, parsed from
/// `s3://BUCKET[/PREFIX]?endpoint=URL&region=REGION`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Config {
    pub bucket: String,
    /// Keys are stored under this prefix (no leading or trailing `/`).
    pub prefix: String,
    pub endpoint: Option<String>,
    pub region: String,
    /// Path-style addressing (`endpoint/bucket/key`); the default whenever an
    /// endpoint is given, since self-hosted stores rarely serve bucket
    /// subdomains. `virtual_hosted=true` turns it off.
    pub path_style: bool,
}

impl S3Config {
    pub fn parse(url: &str) -> std::result::Result<S3Config, String> {
        let u = url::Url::parse(url).map_err(|e| format!("object store URL `{url}`: {e}"))?;
        if u.scheme() != "s3" {
            return Err(format!("object store URL `{url}`: the scheme must be s3://"));
        }
        let bucket = u
            .host_str()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| format!("object store URL `{url}` names no bucket (s3://BUCKET?endpoint=…&region=…)"))?;
        let prefix = u.path().trim_matches('/').to_string();
        if !prefix.is_empty() {
            check_key(&prefix).map_err(|_| format!("object store URL `{url}`: prefix `{prefix}` is not valid"))?;
        }
        let mut cfg = S3Config {
            bucket: bucket.to_string(),
            prefix,
            endpoint: None,
            region: "us-east-1".into(),
            path_style: false,
        };
        let mut virtual_hosted = None;
        for (k, v) in u.query_pairs() {
            match &*k {
                "endpoint" => {
                    let e = url::Url::parse(&v).map_err(|e| format!("object store endpoint `{v}`: {e}"))?;
                    if !matches!(e.scheme(), "http" | "https") {
                        return Err(format!("object store endpoint `{v}` must be http:// or https://"));
                    }
                    cfg.endpoint = Some(v.trim_end_matches('/').to_string());
                }
                "region" => cfg.region = v.to_string(),
                "virtual_hosted" => {
                    virtual_hosted = Some(
                        v.parse::<bool>()
                            .map_err(|_| format!("object store URL: virtual_hosted=`{v}` is not a bool"))?,
                    )
                }
                other => {
                    return Err(format!(
                        "object store URL `{url}`: unknown parameter `{other}` (known: endpoint, region, virtual_hosted)"
                    ));
                }
            }
        }
        cfg.path_style = match virtual_hosted {
            Some(v) => !v,
            None => cfg.endpoint.is_some(),
        };
        Ok(cfg)
    }
}

/// An S3 bucket (or a prefix of one) as Kiln's object store.
#[derive(Debug, Clone)]
pub struct S3BlobStore {
    cfg: S3Config,
    s3: std::sync::Arc<AmazonS3>,
}

/// What an agent sends for one part: `PUT url` with exactly these headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresignedRequest {
    pub url: String,
    pub headers: BTreeMap<String, String>,
}

fn os_err(key: &str, e: object_store::Error) -> BlobError {
    match e {
        object_store::Error::NotFound { .. } => BlobError::NotFound(key.into()),
        object_store::Error::AlreadyExists { .. } => BlobError::Exists(key.into()),
        e => BlobError::Io(std::io::Error::other(format!("S3 ({key}): {e}"))),
    }
}

impl S3BlobStore {
    /// Credentials come from the environment (`AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, optionally `AWS_SESSION_TOKEN`, or the
    /// instance's role), as with every AWS tool.
    pub fn new(cfg: S3Config) -> Result<S3BlobStore> {
        Self::build(cfg, None)
    }

    /// With explicit credentials instead of the environment's.
    pub fn with_keys(cfg: S3Config, access_key_id: &str, secret_access_key: &str) -> Result<S3BlobStore> {
        Self::build(cfg, Some((access_key_id, secret_access_key)))
    }

    fn build(cfg: S3Config, keys: Option<(&str, &str)>) -> Result<S3BlobStore> {
        let mut b = AmazonS3Builder::from_env();
        if let Some((id, secret)) = keys {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
        }
        let mut b =
            b.with_bucket_name(&cfg.bucket).with_region(&cfg.region).with_virtual_hosted_style_request(!cfg.path_style);
        if let Some(e) = &cfg.endpoint {
            b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
        }
        let s3 = b.build().map_err(|e| BlobError::Io(std::io::Error::other(format!("S3 configuration: {e}"))))?;
        Ok(S3BlobStore { cfg, s3: std::sync::Arc::new(s3) })
    }

    pub fn config(&self) -> &S3Config {
        &self.cfg
    }

    fn path(&self, key: &str) -> Result<OsPath> {
        check_key(key)?;
        Ok(if self.cfg.prefix.is_empty() {
            OsPath::from(key)
        } else {
            OsPath::from(format!("{}/{key}", self.cfg.prefix))
        })
    }

    /// Start the multipart upload that will hold `key`; returns its id.
    pub async fn begin_upload(&self, key: &str) -> Result<String> {
        let p = self.path(key)?;
        self.s3.create_multipart(&p).await.map_err(|e| os_err(key, e))
    }

    /// A presigned `UploadPart` for part `part` (0-based) of `upload_id`,
    /// valid for `ttl`, bound to the part's MD5 (base64 of the digest).
    pub async fn presign_part(
        &self,
        key: &str,
        upload_id: &str,
        part: u64,
        content_md5: &str,
        ttl: Duration,
    ) -> Result<PresignedRequest> {
        let p = self.path(key)?;
        let md5 = HeaderValue::from_str(content_md5).map_err(|_| BlobError::BadKey(content_md5.into()))?;
        let opts = SignedUrlOptions::default()
            .with_query([("partNumber", (part + 1).to_string()), ("uploadId", upload_id.to_string())])
            .with_signed_header(HeaderName::from_static("content-md5"), md5);
        let url = self.s3.signed_url_opts(Method::PUT, &p, ttl, &opts).await.map_err(|e| os_err(key, e))?;
        Ok(PresignedRequest {
            url: url.to_string(),
            headers: [("content-md5".to_string(), content_md5.to_string())].into(),
        })
    }

    /// A presigned `GET` of the whole object, valid for `ttl`.
    pub async fn presign_get(&self, key: &str, ttl: Duration) -> Result<String> {
        let p = self.path(key)?;
        Ok(self.s3.signed_url(Method::GET, &p, ttl).await.map_err(|e| os_err(key, e))?.to_string())
    }

    /// Complete `upload_id` from the parts' ETags (in part order), then check
    /// the assembled object against `expected` without reading it back
    /// (issue 40, item 10; spec 000 §12): each part's bytes were checked by
    /// the store against the MD5 signed into its URL, and one `HEAD` shows
    /// the object's size and its multipart ETag, the MD5 of those parts'
    /// MD5s — so the object is exactly the uploaded parts, in order. The
    /// sha256 is the uploading attempt's word for those bytes, checked by
    /// every consumer as it downloads. A mismatch deletes the object. A
    /// repeated call (lost response) verifies what is there.
    pub async fn complete(
        &self,
        key: &str,
        upload_id: &str,
        etags: &[String],
        expected: &ObjectInfo,
    ) -> Result<ObjectInfo> {
        let p = self.path(key)?;
        if self.head(key).await?.is_none() {
            if expected.size == 0 {
                // S3 refuses a multipart upload without parts: an empty
                // artifact is a plain empty object.
                self.s3.put(&p, Vec::<u8>::new().into()).await.map_err(|e| os_err(key, e))?;
                if !upload_id.is_empty() {
                    let _ = self.s3.abort_multipart(&p, &upload_id.to_string()).await;
                }
            } else {
                if upload_id.is_empty() || etags.is_empty() {
                    return Err(BlobError::NotFound(key.into()));
                }
                let parts = etags.iter().map(|e| PartId { content_id: e.clone() }).collect();
                if let Err(e) = self.s3.complete_multipart(&p, &upload_id.to_string(), parts).await {
                    // Another seal of the same session may have completed it.
                    if self.head(key).await?.is_none() {
                        return Err(BlobError::Invalid(format!("the store refused to assemble the parts: {e}")));
                    }
                }
            }
        }
        let meta = self.s3.head(&p).await.map_err(|e| os_err(key, e))?;
        let etag = meta.e_tag.as_deref().unwrap_or("").trim_matches('"').to_ascii_lowercase();
        let want = if expected.size == 0 {
            // An empty object's digest needs no reading.
            (expected.sha256 == EMPTY_SHA256).then(|| etag.clone())
        } else {
            multipart_etag(etags)
        };
        if meta.size != expected.size || want.as_deref() != Some(etag.as_str()) {
            let _ = self.s3.delete(&p).await;
            return Err(BlobError::Mismatch {
                expected_size: expected.size,
                expected_sha256: expected.sha256.clone(),
                size: meta.size,
                sha256: format!("unknown (the store's ETag {etag:?}, expected {:?})", want.unwrap_or_default()),
            });
        }
        Ok(ObjectInfo { size: meta.size, sha256: expected.sha256.clone() })
    }

    /// Discard an unfinished multipart upload (its parts stop costing space).
    pub async fn abort_upload(&self, key: &str, upload_id: &str) -> Result<()> {
        let p = self.path(key)?;
        match self.s3.abort_multipart(&p, &upload_id.to_string()).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(os_err(key, e)),
        }
    }

    /// Size of the object, `None` when it does not exist.
    pub async fn head(&self, key: &str) -> Result<Option<u64>> {
        let p = self.path(key)?;
        match self.s3.head(&p).await {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(os_err(key, e)),
        }
    }

    /// Size and sha256 of the stored object, streamed.
    pub async fn hash(&self, key: &str) -> Result<ObjectInfo> {
        let p = self.path(key)?;
        let r = self.s3.get(&p).await.map_err(|e| os_err(key, e))?;
        let mut stream = r.into_stream();
        let mut h = Sha256::new();
        let mut n = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| os_err(key, e))?;
            n += chunk.len() as u64;
            BYTES_READ.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            h.update(&chunk);
        }
        Ok(ObjectInfo { size: n, sha256: hex::encode(h.finalize()) })
    }

    /// Publish small server-written bytes (log segments) in one request.
    /// The same bytes again are a no-op; different bytes are refused.
    pub async fn put_object(&self, key: &str, data: &[u8]) -> Result<ObjectInfo> {
        let p = self.path(key)?;
        let info = ObjectInfo { size: data.len() as u64, sha256: hex::encode(Sha256::digest(data)) };
        if self.head(key).await?.is_some() {
            let have = self.hash(key).await?;
            return if have == info { Ok(info) } else { Err(BlobError::Exists(key.into())) };
        }
        self.s3.put(&p, bytes::Bytes::copy_from_slice(data).into()).await.map_err(|e| os_err(key, e))?;
        Ok(info)
    }

    pub async fn read_all(&self, key: &str) -> Result<Vec<u8>> {
        let p = self.path(key)?;
        let r = self.s3.get(&p).await.map_err(|e| os_err(key, e))?;
        let b = r.bytes().await.map_err(|e| os_err(key, e))?;
        BYTES_READ.fetch_add(b.len() as u64, Ordering::Relaxed);
        Ok(b.to_vec())
    }

    pub async fn read_range(&self, key: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
        let p = self.path(key)?;
        if len == 0 {
            return Ok(vec![]);
        }
        let b = self.s3.get_range(&p, offset..offset + len as u64).await.map_err(|e| os_err(key, e))?;
        BYTES_READ.fetch_add(b.len() as u64, Ordering::Relaxed);
        if b.len() != len {
            return Err(BlobError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("object `{key}`: asked for {len} bytes at {offset}, got {}", b.len()),
            )));
        }
        Ok(b.to_vec())
    }

    /// [`BlobStore::promote`](crate::BlobStore::promote): `from` read back
    /// and checked, copied server-side unless `to` exists, then deleted.
    pub async fn promote(&self, from: &str, to: &str, expected: &ObjectInfo) -> Result<()> {
        if self.head(from).await?.is_none() {
            return if self.head(to).await?.is_some() { Ok(()) } else { Err(BlobError::NotFound(from.into())) };
        }
        self.copy_to_content(from, to, expected).await?;
        self.delete(from).await
    }

    /// [`BlobStore::copy_to_content`](crate::BlobStore::copy_to_content).
    pub async fn copy_to_content(&self, from: &str, to: &str, expected: &ObjectInfo) -> Result<()> {
        if self.head(to).await?.is_some() {
            return Ok(());
        }
        self.hash(from).await?.matching(expected)?;
        let (src, dst) = (self.path(from)?, self.path(to)?);
        self.s3.copy(&src, &dst).await.map_err(|e| os_err(from, e))
    }

    /// Remove the object; absent keys are fine.
    pub async fn delete(&self, key: &str) -> Result<()> {
        let p = self.path(key)?;
        match self.s3.delete(&p).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(os_err(key, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_object_store_urls() {
        let c = S3Config::parse("s3://kiln?endpoint=http://127.0.0.1:3900&region=garage").unwrap();
        assert_eq!(c.bucket, "kiln");
        assert_eq!(c.prefix, "");
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:3900"));
        assert_eq!(c.region, "garage");
        assert!(c.path_style);
        let c = S3Config::parse("s3://b/ci/kiln/").unwrap();
        assert_eq!((c.prefix.as_str(), c.region.as_str(), c.path_style), ("ci/kiln", "us-east-1", false));
        let c = S3Config::parse("s3://b?endpoint=https://s3.example.com&virtual_hosted=true").unwrap();
        assert!(!c.path_style);
        for bad in [
            "http://b",
            "s3://",
            "s3://b?endpoint=ftp://x",
            "s3://b?endpoint=127.0.0.1:3900",
            "s3://b?regoin=x",
            "s3://b/x%20y",
            "s3://b?virtual_hosted=maybe",
        ] {
            assert!(S3Config::parse(bad).is_err(), "{bad} should be refused");
        }
    }
}

/// The sha256 of nothing.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// The ETag S3 gives an object assembled from parts whose ETags (their
/// MD5s, in hex) are `etags`, in order: the MD5 of the parts' MD5s, `-`,
/// the number of parts. None if a part's ETag is not an MD5.
pub fn multipart_etag(etags: &[String]) -> Option<String> {
    use md5::Digest as _;
    let mut h = md5::Md5::new();
    for e in etags {
        let raw = hex::decode(e.trim_matches('"')).ok().filter(|r| r.len() == 16)?;
        h.update(raw);
    }
    Some(format!("{}-{}", hex::encode(h.finalize()), etags.len()))
}

#[cfg(test)]
mod etag_tests {
    /// S3's documented rule, on two parts whose MD5s are known.
    #[test]
    fn a_multipart_etag_is_the_md5_of_the_parts_md5s() {
        use md5::Digest as _;
        let (a, b) = (md5::Md5::digest(b"first part"), md5::Md5::digest(b"second"));
        let mut both = a.to_vec();
        both.extend_from_slice(&b);
        let want = format!("{}-2", hex::encode(md5::Md5::digest(&both)));
        let etags = [format!("\"{}\"", hex::encode(a)), hex::encode(b)];
        assert_eq!(super::multipart_etag(&etags).as_deref(), Some(want.as_str()));
        assert_eq!(super::multipart_etag(&["not-md5".to_string()]), None);
    }
}
