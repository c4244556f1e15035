//! The `${{ }}` parts of a job that are decided outside its steps (spec 000
//! §5): `runs-on` labels, `timeout` and `image` are evaluated over the run's
//! frozen data (event, ref, branch, inputs) when the run is accepted, so the
//! frozen definition holds plain values; an `image` that reads
//! `needs.<job>.outputs.*` is evaluated when the job is claimed, from the
//! outputs bound by its needs' completions, and must then name an image by
//! digest (nothing is resolved after acceptance).

use crate::expr::{ConditionContext, render_group, template_output_refs};
use crate::model::{Image, Workflow};
use crate::validate::MAX_TIMEOUT_SECS;

impl Workflow {
    /// Evaluate every job's `runs-on`, `timeout` and `image` templates over
    /// the run's data. An error names the job and the key; nothing is
    /// changed then.
    pub fn render_accepted(&mut self, ctx: &ConditionContext) -> Result<(), String> {
        let mut jobs = self.jobs.clone();
        for job in &mut jobs {
            for (label, value) in job.runs_on.iter_mut() {
                if !value.contains("${{") {
                    continue;
                }
                let what = format!("label `{label}` in `runs-on` of job `{}`", job.name);
                let rendered = render_group(value, ctx).map_err(|e| format!("{what}: {e}"))?;
                check_plain(&rendered, &what)?;
                *value = rendered;
            }
            if let Some(template) = job.timeout_expr.take() {
                let what = format!("`timeout` of job `{}`", job.name);
                let rendered = render_group(&template, ctx).map_err(|e| format!("{what}: {e}"))?;
                job.timeout_secs = Some(timeout_secs(&rendered).map_err(|e| format!("{what} is `{rendered}`: {e}"))?);
            }
            if let Some(Image::Ref { reference }) = &mut job.image
                && reference.contains("${{")
                && template_output_refs(reference).is_empty()
            {
                let what = format!("the image reference of job `{}`", job.name);
                let rendered = render_group(reference, ctx).map_err(|e| format!("{what}: {e}"))?;
                check_plain(&rendered, &what)?;
                *reference = rendered;
            }
        }
        self.jobs = jobs;
        Ok(())
    }
}

/// An image reference that reads outputs, evaluated at claim over `ctx`
/// (whose `needs_outputs` are the bound outputs). Returns the reference and
/// its digest; anything not of the form `name@sha256:<64 hex>` is refused,
/// since an image is never resolved after acceptance.
pub fn render_claimed_image(template: &str, ctx: &ConditionContext) -> Result<(String, String), String> {
    let what = format!("the image reference `{template}`");
    let rendered = render_group(template, ctx).map_err(|e| format!("{what}: {e}"))?;
    check_plain(&rendered, &what)?;
    let digest = rendered.rsplit_once('@').map(|(_, d)| d).filter(|d| {
        d.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    });
    match digest {
        Some(d) if !rendered.starts_with('@') => Ok((rendered.clone(), d.to_ascii_lowercase())),
        _ => Err(format!(
            "{what} read from outputs is `{rendered}`, which does not name an image by digest \
             (`name@sha256:<64 hex digits>`); images read from outputs are not resolved after the run is accepted, \
             so the output must carry the digest"
        )),
    }
}

fn check_plain(value: &str, what: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        return Err(format!("{what} is empty for this run"));
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{what} is `{}`, which contains whitespace or control characters", value.escape_debug()));
    }
    Ok(())
}

fn timeout_secs(text: &str) -> Result<u64, String> {
    let d = crate::parse_duration(text)?;
    if d.subsec_nanos() != 0 {
        return Err("a timeout is a whole number of seconds".into());
    }
    match d.as_secs() {
        0 => Err("a timeout must be greater than zero".into()),
        n if n > MAX_TIMEOUT_SECS => Err(format!("a timeout is at most 7d ({MAX_TIMEOUT_SECS} seconds)")),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn wf(yaml: &str) -> Workflow {
        crate::parse(yaml).unwrap_or_else(|d| panic!("{d}"))
    }

    fn ctx(inputs: &[(&str, &str)]) -> ConditionContext {
        ConditionContext {
            event: "manual".into(),
            git_ref: Some("refs/heads/main".into()),
            branch: Some("main".into()),
            inputs: inputs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        }
    }

    const YAML: &str = r#"
version: 1
inputs:
  os: {type: string, default: linux}
  limit: {type: string, default: 10m}
  tag: {type: string, default: "3.20"}
jobs:
  - name: a
    runs-on: {os: "${{ inputs.os }}", pool: "${{ branch }}-pool"}
    timeout: ${{ inputs.limit }}
    image: "registry.example/alpine:${{ inputs.tag }}"
    steps: [{run: "true"}]
"#;

    #[test]
    fn runs_on_timeout_and_image_are_evaluated_at_acceptance() {
        let mut w = wf(YAML);
        assert_eq!(w.jobs[0].timeout_expr.as_deref(), Some("${{ inputs.limit }}"));
        w.render_accepted(&ctx(&[("os", "freebsd"), ("limit", "1h30m"), ("tag", "3.21")])).unwrap();
        let j = &w.jobs[0];
        assert_eq!(j.runs_on, BTreeMap::from([("os".into(), "freebsd".into()), ("pool".into(), "main-pool".into())]));
        assert_eq!(j.timeout_secs, Some(5400));
        assert_eq!(j.timeout_expr, None);
        assert_eq!(j.image, Some(Image::Ref { reference: "registry.example/alpine:3.21".into() }));
        // The frozen definition holds plain values only.
        assert!(!serde_json::to_string(&w).unwrap().contains("${{"));
    }

    #[test]
    fn bad_values_are_refused_naming_the_job_and_nothing_changes() {
        let base = wf(YAML);
        for (inputs, want) in [
            (vec![("limit", "soon")], "`timeout` of job `a` is `soon`"),
            (vec![("limit", "0s")], "greater than zero"),
            (vec![("limit", "30d")], "at most 7d"),
            (vec![("os", "")], "label `os` in `runs-on` of job `a` is empty"),
            (vec![("os", "linux; rm")], "whitespace"),
            (vec![("tag", "x y")], "the image reference of job `a`"),
        ] {
            let mut w = base.clone();
            let mut all = vec![("os", "linux"), ("limit", "1m"), ("tag", "1")];
            all.retain(|(k, _)| !inputs.iter().any(|(i, _)| i == k));
            all.extend(inputs);
            let err = w.render_accepted(&ctx(&all)).unwrap_err();
            assert!(err.contains(want), "{err}");
            assert_eq!(w, base, "a refused render changes nothing");
        }
    }

    #[test]
    fn matrix_values_reach_timeout_and_image() {
        let mut w = wf(r#"
version: 1
jobs:
  - name: t
    matrix: {v: ["1m", "2m"]}
    timeout: ${{ matrix.v }}
    image: "registry.example/img:${{ matrix.v }}"
    steps: [{run: "true"}]
"#);
        w.render_accepted(&ctx(&[])).unwrap();
        let t: Vec<_> = w.jobs.iter().map(|j| j.timeout_secs).collect();
        assert_eq!(t, vec![Some(60), Some(120)]);
        assert_eq!(w.jobs[1].image, Some(Image::Ref { reference: "registry.example/img:2m".into() }));
    }

    #[test]
    fn an_image_from_outputs_waits_for_the_claim_and_must_carry_a_digest() {
        let yaml = r#"
version: 1
jobs:
  - name: pick
    outputs: [image]
    steps: [{run: "true"}]
  - name: use
    needs: [pick]
    image: "${{ needs.pick.outputs.image }}"
    steps: [{run: "true"}]
"#;
        let mut w = wf(yaml);
        w.render_accepted(&ctx(&[])).unwrap();
        let Some(Image::Ref { reference }) = &w.jobs[1].image else { panic!() };
        assert_eq!(reference, "${{ needs.pick.outputs.image }}", "left for the claim");
        let hex = "ab".repeat(32);
        let mut c = ctx(&[]);
        c.needs_outputs.insert("pick".into(), BTreeMap::from([("image".into(), format!("reg:5000/x@sha256:{hex}"))]));
        assert_eq!(
            render_claimed_image(reference, &c).unwrap(),
            (format!("reg:5000/x@sha256:{hex}"), format!("sha256:{hex}"))
        );
        for bad in ["reg/x:latest", "reg/x@sha256:abc", "@sha256:00", "", "reg/x@sha256:AB; rm"] {
            c.needs_outputs.insert("pick".into(), BTreeMap::from([("image".into(), bad.to_string())]));
            assert!(render_claimed_image(reference, &c).is_err(), "{bad:?}");
        }
        c.needs_outputs.clear();
        assert!(render_claimed_image(reference, &c).unwrap_err().contains("empty"));
    }

    #[test]
    fn outputs_are_refused_where_the_value_is_decided_at_acceptance() {
        for (key, value) in
            [("runs-on", "{os: \"${{ needs.pick.outputs.os }}\"}"), ("timeout", "${{ needs.pick.outputs.t }}")]
        {
            let yaml = format!(
                "version: 1\njobs:\n  - name: pick\n    outputs: [os, t]\n    steps: [{{run: \"true\"}}]\n  - name: use\n    needs: [pick]\n    {key}: {value}\n    steps: [{{run: \"true\"}}]\n"
            );
            let err = crate::parse(&yaml).unwrap_err().to_string();
            assert!(err.contains("decided when the run is accepted"), "{key}: {err}");
        }
        let err = crate::parse("version: 1\njobs:\n  - name: \"b-${{ inputs.x }}\"\n    steps: [{run: \"true\"}]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("a job's name is its identity"), "{err}");
    }
}
