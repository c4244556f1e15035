//! The S3 object store against a real S3-compatible server (Garage on
//! loopback, one per test): presigned multipart uploads by a client holding
//! no credentials, per-part digests enforced by the store, verification at
//! completion, presigned downloads.

use base64::Engine;
use kiln_blob::{BlobError, ObjectInfo, PresignedRequest, S3BlobStore, S3Config};
use kiln_testkit::{GARAGE_KEY_ID, GARAGE_SECRET, TempGarage, garage_available};
use md5::Md5;
use sha2::{Digest, Sha256};
use std::time::Duration;

const MIB: usize = 1024 * 1024;
const TTL: Duration = Duration::from_secs(300);

fn store(g: &TempGarage, prefix: &str) -> S3BlobStore {
    S3BlobStore::with_keys(S3Config::parse(&g.url(prefix)).unwrap(), GARAGE_KEY_ID, GARAGE_SECRET).unwrap()
}

fn info(b: &[u8]) -> ObjectInfo {
    ObjectInfo { size: b.len() as u64, sha256: hex::encode(Sha256::digest(b)) }
}

fn md5_b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(Md5::digest(b))
}

/// What an agent does with a presigned part: PUT with exactly the signed
/// headers and no credentials; the ETag on success.
async fn put(req: &PresignedRequest, body: Vec<u8>) -> Result<String, (u16, String)> {
    let mut r = reqwest::Client::new().put(&req.url).body(body);
    for (k, v) in &req.headers {
        r = r.header(k, v);
    }
    let resp = r.send().await.map_err(|e| (0, e.to_string()))?;
    let status = resp.status().as_u16();
    let etag = resp.headers().get("etag").and_then(|v| v.to_str().ok()).map(str::to_string);
    let text = resp.text().await.unwrap_or_default();
    match (status, etag) {
        (200, Some(e)) => Ok(e),
        _ => Err((status, text)),
    }
}

fn data(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8).collect()
}

#[tokio::test]
async fn presigned_parts_out_of_order_then_verified_and_downloaded() {
    if !garage_available() {
        return;
    }
    let g = TempGarage::start().unwrap();
    let s = store(&g, "ci");
    let bytes = data(11 * MIB + 12_345, 1);
    let ps = 5 * MIB; // S3's smallest part but the last
    let parts: Vec<&[u8]> = bytes.chunks(ps).collect();
    assert_eq!(parts.len(), 3);
    let key = "artifacts/r/j/1/g1";
    let upload = s.begin_upload(key).await.unwrap();
    let mut etags = vec![String::new(); parts.len()];
    for n in [2usize, 0, 1, 0] {
        let req = s.presign_part(key, &upload, n as u64, &md5_b64(parts[n]), TTL).await.unwrap();
        assert!(!req.url.contains(GARAGE_SECRET), "a presigned URL carries no secret");
        etags[n] = put(&req, parts[n].to_vec()).await.unwrap();
    }
    assert_eq!(s.head(key).await.unwrap(), None, "nothing visible before completion");
    let got = s.complete(key, &upload, &etags, &info(&bytes)).await.unwrap();
    assert_eq!(got, info(&bytes));
    // A lost response: completing again verifies what is there.
    assert_eq!(s.complete(key, &upload, &etags, &info(&bytes)).await.unwrap(), info(&bytes));
    // The collector aborts the upload of every generation it deletes; for a
    // completed upload that is a no-op, not an error, and the object stays.
    s.abort_upload(key, &upload).await.unwrap();
    let url = s.presign_get(key, TTL).await.unwrap();
    let back = reqwest::get(&url).await.unwrap();
    assert_eq!(back.status(), 200);
    assert_eq!(back.bytes().await.unwrap().to_vec(), bytes);
    assert_eq!(s.read_range(key, 5 * MIB as u64 - 3, 6).await.unwrap(), bytes[5 * MIB - 3..5 * MIB + 3]);
    // Without a signature the bucket is closed.
    let plain = format!("{}/{}/ci/{key}", g.endpoint(), kiln_testkit::GARAGE_BUCKET);
    assert_eq!(reqwest::get(&plain).await.unwrap().status(), 403);
}

#[tokio::test]
async fn the_store_refuses_bytes_other_than_the_signed_digest() {
    if !garage_available() {
        return;
    }
    let g = TempGarage::start().unwrap();
    let s = store(&g, "");
    let good = data(MIB, 2);
    let mut bad = good.clone();
    bad[777] ^= 1;
    let key = "artifacts/r/j/1/g2";
    let upload = s.begin_upload(key).await.unwrap();
    let req = s.presign_part(key, &upload, 0, &md5_b64(&good), TTL).await.unwrap();
    let (status, body) = put(&req, bad).await.unwrap_err();
    assert_eq!(status, 400, "corrupted part refused: {body}");
    // A header other than the signed one is refused as well.
    let mut forged = req.clone();
    forged.headers.insert("content-md5".into(), md5_b64(&good[1..]));
    assert_eq!(put(&forged, good[1..].to_vec()).await.unwrap_err().0, 403);
    // The retry with the right bytes goes through and verifies.
    let etag = put(&req, good.clone()).await.unwrap();
    s.complete(key, &upload, &[etag], &info(&good)).await.unwrap();
    assert_eq!(s.hash(key).await.unwrap(), info(&good));
}

/// Completion checks the assembled object with one HEAD (issue 40, item
/// 10), never reading it back: a size other than the one named, or parts
/// other than the ones uploaded, keep nothing. The sha256 is the uploader's
/// word, checked by each consumer as it downloads (the store holds exactly
/// the uploaded parts, so a wrong word is the uploader's own failure).
#[tokio::test]
async fn completion_of_other_bytes_than_named_keeps_nothing() {
    if !garage_available() {
        return;
    }
    let g = TempGarage::start().unwrap();
    let s = store(&g, "");
    let bytes = data(300_000, 3);
    let key = "artifacts/r/j/1/g3";
    let upload = s.begin_upload(key).await.unwrap();
    let req = s.presign_part(key, &upload, 0, &md5_b64(&bytes), TTL).await.unwrap();
    let etag = put(&req, bytes.clone()).await.unwrap();
    let mut claimed = info(&bytes);
    claimed.size += 1;
    match s.complete(key, &upload, std::slice::from_ref(&etag), &claimed).await {
        Err(BlobError::Mismatch { size, .. }) => assert_eq!(size, bytes.len() as u64),
        other => panic!("expected a mismatch, got {other:?}"),
    }
    assert_eq!(s.head(key).await.unwrap(), None, "a mismatching object is deleted");

    // Parts named by ETags other than the uploaded ones are not assembled.
    let key = "artifacts/r/j/1/g4";
    let upload = s.begin_upload(key).await.unwrap();
    let req = s.presign_part(key, &upload, 0, &md5_b64(&bytes), TTL).await.unwrap();
    put(&req, bytes.clone()).await.unwrap();
    let other = format!("\"{}\"", hex::encode(Md5::digest(b"other bytes")));
    assert!(s.complete(key, &upload, &[other], &info(&bytes)).await.is_err());
    assert_eq!(s.head(key).await.unwrap(), None);
    // Completing without parts (an upload never started) is refused.
    assert!(matches!(s.complete("artifacts/r/j/1/none", "", &[], &info(b"x")).await, Err(BlobError::NotFound(_))));
}

#[tokio::test]
async fn empty_objects_small_objects_abort_and_delete() {
    if !garage_available() {
        return;
    }
    let g = TempGarage::start().unwrap();
    let s = store(&g, "p");
    // An empty artifact: no parts at all.
    let upload = s.begin_upload("a/empty").await.unwrap();
    assert_eq!(s.complete("a/empty", &upload, &[], &info(b"")).await.unwrap(), info(b""));
    assert_eq!(s.read_all("a/empty").await.unwrap(), b"");
    // Server-written objects: same bytes again is a no-op, other bytes refused.
    assert_eq!(s.put_object("logs/seg", b"hello").await.unwrap(), info(b"hello"));
    assert_eq!(s.put_object("logs/seg", b"hello").await.unwrap(), info(b"hello"));
    assert!(matches!(s.put_object("logs/seg", b"other").await, Err(BlobError::Exists(_))));
    assert_eq!(s.read_range("logs/seg", 1, 3).await.unwrap(), b"ell");
    assert!(s.read_range("logs/seg", 3, 5).await.is_err(), "past the end");
    // An abandoned upload is aborted: its parts can no longer be completed.
    let upload = s.begin_upload("a/abandoned").await.unwrap();
    let part = data(1000, 4);
    let req = s.presign_part("a/abandoned", &upload, 0, &md5_b64(&part), TTL).await.unwrap();
    let etag = put(&req, part.clone()).await.unwrap();
    s.abort_upload("a/abandoned", &upload).await.unwrap();
    assert!(s.complete("a/abandoned", &upload, &[etag], &info(&part)).await.is_err());
    s.abort_upload("a/abandoned", &upload).await.unwrap();
    s.delete("logs/seg").await.unwrap();
    s.delete("logs/seg").await.unwrap();
    assert_eq!(s.head("logs/seg").await.unwrap(), None);
    assert!(matches!(s.read_all("logs/seg").await, Err(BlobError::NotFound(_))));
}

#[tokio::test]
async fn presigned_urls_expire() {
    if !garage_available() {
        return;
    }
    let g = TempGarage::start().unwrap();
    let s = store(&g, "");
    s.put_object("x/y", b"bytes").await.unwrap();
    let url = s.presign_get("x/y", Duration::from_secs(3)).await.unwrap();
    assert_eq!(reqwest::get(&url).await.unwrap().status(), 200);
    tokio::time::sleep(Duration::from_millis(4500)).await;
    // AWS answers 403, Garage 400: either way, refused.
    let status = reqwest::get(&url).await.unwrap().status().as_u16();
    assert!(matches!(status, 400 | 403), "an expired URL is refused, got {status}");
}
