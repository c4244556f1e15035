//! Size limits of a submission (inputs; the definition cap is exercised end
//! to end by the hostile-input suite).

use crate::services::limits::*;
use std::collections::BTreeMap;

#[test]
fn inputs_past_the_limits_are_refused() {
    let one = |k: &str, v: String| check_inputs(&BTreeMap::from([(k.to_string(), v)]));
    assert!(one("suite", "unit".into()).is_ok());
    assert!(one("suite", "x".repeat(MAX_INPUT_VALUE)).is_ok());
    assert_eq!(one("suite", "x".repeat(MAX_INPUT_VALUE + 1)).unwrap_err().status.as_u16(), 422);
    assert!(one("a=b", "v".into()).is_err());
    assert!(one("", "v".into()).is_err());
    assert!(one("k", "a\0b".into()).is_err());
    let many: BTreeMap<_, _> = (0..=MAX_INPUTS).map(|i| (format!("k{i}"), "v".to_string())).collect();
    assert!(check_inputs(&many).is_err());
    let big: BTreeMap<_, _> = (0..8).map(|i| (format!("k{i}"), "x".repeat(MAX_INPUT_VALUE))).collect();
    assert!(check_inputs(&big).unwrap_err().message.contains("total"));
}
