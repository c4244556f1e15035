//! The workflow language as far as this crate's tests need it: the status
//! functions with kiln-workflow's semantics (kiln-core does not depend on
//! kiln-workflow; the store plugs the real evaluator in).

use crate::advance::{Conditions, NeedResult};

pub(crate) struct Lang;

impl Conditions for Lang {
    fn eval_if(&self, expr: &str, needs: &[NeedResult], quorum: Option<u32>) -> Result<bool, String> {
        let ok = needs.iter().filter(|r| **r == NeedResult::Success).count();
        let needed = quorum.map(|q| (q as usize).min(needs.len())).unwrap_or(needs.len());
        match expr {
            "success()" => Ok(ok >= needed),
            "failure()" => Ok(needs.contains(&NeedResult::Failure)),
            "always()" => Ok(true),
            other => Err(format!("unknown function in `{other}`")),
        }
    }

    fn render_group(&self, template: &str) -> Result<String, String> {
        if template.contains("${{ bad") {
            return Err("unknown name".into());
        }
        Ok(template.replace("${{ branch }}", "main"))
    }
}
