//! `kiln bench provenance` (issue 45): what the server adds per bound
//! artifact to sign its provenance — the SLSA v1 statement built from the
//! run's facts, serialized, signed over PAE with ECDSA P-256 and wrapped
//! in a DSSE envelope — beside the baseline of building and serializing
//! the same statement unsigned, in the same process.

use kiln_provenance::dsse;
use kiln_provenance::statement::{BuildFacts, Dependency, Subject, provenance};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const N: usize = 2000;

fn facts() -> BuildFacts {
    let dep = |name: &str, i: u8| Dependency {
        name: Some(name.into()),
        uri: format!("kiln:runs/01a2/jobs/build/artifacts/{name}"),
        digest: BTreeMap::from([("sha256".into(), format!("{i:02x}").repeat(32))]),
        annotations: BTreeMap::from([("generation".into(), "01a2-g".into())]),
    };
    BuildFacts {
        repository: "shop".into(),
        git_ref: Some("refs/heads/main".into()),
        commit: "3e72549cf1215b0afd9a853f63438e9e9c0738b7".into(),
        workflow_path: ".kiln/release.yaml".into(),
        workflow_sha256: "ab".repeat(32),
        event: "push".into(),
        inputs: BTreeMap::from([("channel".into(), "stable".into())]),
        run: "01a24d3d-1b09-71a9-a154-98d7d313d206".into(),
        run_number: 1234,
        job: "build".into(),
        matrix: BTreeMap::from([("os".into(), "linux".into()), ("rust".into(), "1.95".into())]),
        epoch: 1,
        trust: "trusted".into(),
        executor: "container".into(),
        pool: "default".into(),
        dependencies: vec![dep("git", 1), dep("image", 2), dep("deps", 3), dep("schema", 4)],
        builder_id: "https://ci.example.com/builders/default".into(),
        kiln_version: env!("CARGO_PKG_VERSION").into(),
        invocation_id: "01a24d3d/build/1".into(),
        started_on: "2026-12-06T21:00:00.000Z".into(),
        finished_on: "2026-12-06T21:00:05.000Z".into(),
    }
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].as_secs_f64() * 1000.0
}

pub fn run() -> anyhow::Result<i32> {
    let key = loop {
        if let Ok(k) = p256::ecdsa::SigningKey::from_bytes(&rand::random::<[u8; 32]>().into()) {
            break k;
        }
    };
    let kid = dsse::thumbprint(key.verifying_key());
    let facts = facts();
    let subject = |i: usize| vec![Subject::sha256(&format!("app-{i}"), &format!("{:064x}", i))];
    let (mut plain, mut signed) = (Vec::with_capacity(N), Vec::with_capacity(N));
    for i in 0..N {
        let t = Instant::now();
        let bytes = serde_json::to_vec(&provenance(subject(i), &facts))?;
        std::hint::black_box(&bytes);
        plain.push(t.elapsed());
        let t = Instant::now();
        let bytes = serde_json::to_vec(&provenance(subject(i), &facts))?;
        let env = serde_json::to_vec(&dsse::sign(dsse::IN_TOTO, &bytes, &key, &kid))?;
        std::hint::black_box(&env);
        signed.push(t.elapsed());
    }
    let secs: f64 = signed.iter().map(Duration::as_secs_f64).sum();
    kiln_cmd::outln!("provenance_artifacts: {N}");
    kiln_cmd::outln!("provenance_signed_p50_ms: {:.3}", pct(&mut signed, 0.5));
    kiln_cmd::outln!("provenance_signed_p95_ms: {:.3}", pct(&mut signed, 0.95));
    kiln_cmd::outln!("provenance_signed_p99_ms: {:.3}", pct(&mut signed, 0.99));
    kiln_cmd::outln!("baseline_statement_unsigned_p50_ms: {:.3}", pct(&mut plain, 0.5));
    kiln_cmd::outln!("baseline_statement_unsigned_p95_ms: {:.3}", pct(&mut plain, 0.95));
    kiln_cmd::outln!("provenance_signed_per_s: {:.0}", N as f64 / secs);
    Ok(0)
}
