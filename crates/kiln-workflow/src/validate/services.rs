//! A job's `services:` (see [`Service`]): names that are DNS labels (a
//! container job reaches a service by its name), image references pinned at
//! acceptance, plain `env` (no `${{ }}`: a service is not a step and gets
//! no expression values or secrets), ports, an optional `command` and a
//! health check.

use super::{Ctx, as_map, as_nonempty_text, as_seq, check_keys, env_key_ok, get, show};
use crate::model::{MAX_SERVICE_PORTS, MAX_SERVICES, Service, ServiceHealth};
use crate::tree::{Node, ScalarKind, Value};
use std::collections::BTreeMap;

pub(super) const SERVICE_KEYS: &[&str] = &["image", "env", "ports", "command", "health"];
pub(super) const HEALTH_KEYS: &[&str] = &["cmd", "interval", "retries"];
/// Longest service name (a DNS label is at most 63).
const MAX_SERVICE_NAME: usize = 32;
/// Default time between two health checks.
pub(crate) const DEFAULT_INTERVAL_MS: u64 = 1000;
/// Default number of health checks before the service counts as failed.
pub(crate) const DEFAULT_RETRIES: u32 = 60;
const MAX_RETRIES: u32 = 1000;
const MAX_COMMAND_ARGS: usize = 64;

fn name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_SERVICE_NAME
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && !name.ends_with('-')
}

/// Text that must not hold `${{ }}` (services get no expression values).
fn plain(ctx: &mut Ctx, node: &Node, text: &str, subject: &str) -> bool {
    if text.contains("${{") {
        ctx.err(
            node.pos,
            format!("{subject} cannot use `${{{{ }}}}`: services get literal values only (no inputs, secrets or matrix values)"),
        );
        return false;
    }
    true
}

pub(super) fn services(ctx: &mut Ctx, label: &str, node: &Node) -> Option<BTreeMap<String, Service>> {
    let subject = format!("`services` of {label}");
    let entries = as_map(ctx, node, &subject, "a map of service names to `{image, env, ports, health}`")?;
    if entries.len() > MAX_SERVICES {
        ctx.err(node.pos, format!("{label} declares {} services; at most {MAX_SERVICES} are allowed", entries.len()));
        return None;
    }
    let mut out = BTreeMap::new();
    let mut ok = true;
    for e in entries {
        if !name_ok(&e.key) {
            ctx.err(
                e.key_pos,
                format!(
                    "service name `{}` in {label} must be lowercase letters, digits and `-`, start with a letter and be at most {MAX_SERVICE_NAME} characters: the job reaches the service by this name",
                    show(&e.key)
                ),
            );
            ok = false;
            continue;
        }
        match service(ctx, &format!("service `{}` of {label}", e.key), &e.value) {
            Some(s) => {
                out.insert(e.key.clone(), s);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

fn service(ctx: &mut Ctx, subject: &str, node: &Node) -> Option<Service> {
    let entries = as_map(ctx, node, subject, "a map with `image` (and `env`, `ports`, `command`, `health`)")?;
    check_keys(ctx, entries, SERVICE_KEYS, &format!("in {subject}"));
    let mut ok = true;
    let image = match get(entries, "image") {
        None => {
            ctx.err(node.pos, format!("{subject} has no `image`; add `image: <image reference>`"));
            None
        }
        Some(e) => {
            let s = format!("`image` of {subject}");
            as_nonempty_text(ctx, &e.value, &s, "an image reference").filter(|t| {
                if !plain(ctx, &e.value, t, &s) {
                    false
                } else if t.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    ctx.err(e.value.pos, format!("{s} contains whitespace or control characters"));
                    false
                } else {
                    true
                }
            })
        }
    };
    let mut env = BTreeMap::new();
    if let Some(e) = get(entries, "env") {
        let s = format!("`env` of {subject}");
        match as_map(ctx, &e.value, &s, "a map of variable names to values") {
            None => ok = false,
            Some(vars) => {
                for v in vars {
                    if !env_key_ok(&v.key) {
                        ctx.err(v.key_pos, format!("`{}` in {s} is not a valid variable name", show(&v.key)));
                        ok = false;
                        continue;
                    }
                    let value = match &v.value.value {
                        Value::Scalar(sc) if sc.kind() != ScalarKind::Null => Some(sc.text.as_str()),
                        _ => {
                            ctx.err(v.value.pos, format!("`{}` in {s} must be a string, number or boolean", v.key));
                            None
                        }
                    };
                    match value.filter(|t| plain(ctx, &v.value, t, &format!("`{}` in {s}", v.key))) {
                        Some(t) => {
                            env.insert(v.key.clone(), t.to_string());
                        }
                        None => ok = false,
                    }
                }
            }
        }
    }
    let mut ports = Vec::new();
    if let Some(e) = get(entries, "ports") {
        let s = format!("`ports` of {subject}");
        match as_seq(ctx, &e.value, &s, "a list of port numbers") {
            None => ok = false,
            Some(items) if items.len() > MAX_SERVICE_PORTS => {
                ctx.err(e.value.pos, format!("{s} lists {} ports; at most {MAX_SERVICE_PORTS}", items.len()));
                ok = false;
            }
            Some(items) => {
                for item in items {
                    match &item.value {
                        Value::Scalar(sc) if sc.as_int().is_some_and(|p| (1..=65535).contains(&p)) => {
                            let p = sc.as_int().expect("checked") as u16;
                            if ports.contains(&p) {
                                ctx.err(item.pos, format!("port {p} is listed twice in {s}"));
                                ok = false;
                            } else {
                                ports.push(p);
                            }
                        }
                        _ => {
                            ctx.err(item.pos, format!("a port in {s} is a number from 1 to 65535, e.g. `5432`"));
                            ok = false;
                        }
                    }
                }
            }
        }
    }
    let mut command = Vec::new();
    if let Some(e) = get(entries, "command") {
        let s = format!("`command` of {subject}");
        match as_seq(ctx, &e.value, &s, "a list of arguments, e.g. `[httpd, -f, -p, \"8080\"]`") {
            None => ok = false,
            Some(items) if items.is_empty() || items.len() > MAX_COMMAND_ARGS => {
                ctx.err(e.value.pos, format!("{s} has 1 to {MAX_COMMAND_ARGS} arguments"));
                ok = false;
            }
            Some(items) => {
                for item in items {
                    match &item.value {
                        Value::Scalar(sc) if sc.kind() != ScalarKind::Null && plain(ctx, item, &sc.text, &s) => {
                            command.push(sc.text.clone());
                        }
                        Value::Scalar(sc) if sc.kind() != ScalarKind::Null => ok = false,
                        _ => {
                            ctx.err(item.pos, format!("an argument in {s} is a string"));
                            ok = false;
                        }
                    }
                }
            }
        }
    }
    let health = match get(entries, "health") {
        None => None,
        Some(e) => {
            let h = health(ctx, &format!("`health` of {subject}"), &e.value);
            ok &= h.is_some();
            h
        }
    };
    let image = image?;
    ok.then(|| Service { image: image.to_string(), digest: None, env, ports, command, health })
}

fn health(ctx: &mut Ctx, subject: &str, node: &Node) -> Option<ServiceHealth> {
    let entries = as_map(ctx, node, subject, "a map with `cmd` (and `interval`, `retries`)")?;
    check_keys(ctx, entries, HEALTH_KEYS, &format!("in {subject}"));
    let cmd = match get(entries, "cmd") {
        None => {
            ctx.err(
                node.pos,
                format!("{subject} has no `cmd`; add the command that exits 0 once the service is ready"),
            );
            None
        }
        Some(e) => {
            let s = format!("`cmd` of {subject}");
            as_nonempty_text(ctx, &e.value, &s, "a command string").filter(|t| plain(ctx, &e.value, t, &s))
        }
    };
    let interval_ms = match get(entries, "interval") {
        None => Some(DEFAULT_INTERVAL_MS),
        Some(e) => {
            let text = match &e.value.value {
                Value::Scalar(sc) => Some(sc.text.as_str()),
                _ => None,
            };
            match text.and_then(|t| crate::parse_duration(t).ok()) {
                Some(d) if d.as_millis() >= 100 && d.as_secs() <= 300 => Some(d.as_millis() as u64),
                _ => {
                    ctx.err(e.value.pos, format!("`interval` of {subject} is a duration from 100ms to 5m, e.g. `2s`"));
                    None
                }
            }
        }
    };
    let retries = match get(entries, "retries") {
        None => Some(DEFAULT_RETRIES),
        Some(e) => match &e.value.value {
            Value::Scalar(sc) if sc.as_int().is_some_and(|n| (1..=i128::from(MAX_RETRIES)).contains(&n)) => {
                Some(sc.as_int().expect("checked") as u32)
            }
            _ => {
                ctx.err(e.value.pos, format!("`retries` of {subject} is a number from 1 to {MAX_RETRIES}"));
                None
            }
        },
    };
    Some(ServiceHealth { cmd: cmd?.to_string(), interval_ms: interval_ms?, retries: retries? })
}
