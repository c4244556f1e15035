//! Process-table queries through `/proc` (Linux).
//!
//! Zombies are ignored on purpose: an orphaned zombie is dead, and inside
//! containers whose PID 1 does not reap, zombies may linger indefinitely.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::fs;

/// (state, pgrp, session) of a process, from `/proc/<pid>/stat`.
fn stat(pid: &str) -> Option<(char, i32, i32)> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: parse after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let _ppid = f.next()?;
    let pgrp = f.next()?.parse().ok()?;
    let session = f.next()?.parse().ok()?;
    Some((state, pgrp, session))
}

/// Start time of a process (clock ticks after boot, `/proc/<pid>/stat`
/// field 22): with the boot id, it names one process for good, pid reuse or not.
pub(crate) fn start_time(pid: i32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 1..].split_whitespace().nth(19)?.parse().ok()
}

fn live(state: char) -> bool {
    !matches!(state, 'Z' | 'X' | 'x')
}

/// True while a non-zombie process runs with the given pid.
pub fn process_alive(pid: i32) -> bool {
    stat(&pid.to_string()).is_some_and(|(state, _, _)| live(state))
}

/// True while some non-zombie process in /proc satisfies `f(pgrp, sid)`.
/// Without /proc, falls back to the kernel's view of the group (which counts
/// zombies too).
fn any_live_process(pgid: i32, f: impl Fn(i32, i32) -> bool) -> bool {
    let Ok(dir) = fs::read_dir("/proc") else {
        return killpg(Pid::from_raw(pgid), None).is_ok();
    };
    dir.flatten().any(|e| {
        let name = e.file_name();
        let Some(name) = name.to_str() else {
            return false;
        };
        name.bytes().all(|b| b.is_ascii_digit())
            && stat(name).is_some_and(|(state, pgrp, sid)| live(state) && f(pgrp, sid))
    })
}

/// True while some non-zombie process belongs to process group `pgid`.
pub(crate) fn group_alive(pgid: i32) -> bool {
    // Fast path: no member at all (not even a zombie). Only when the kernel
    // still knows the group do we scan /proc to ignore zombies.
    if killpg(Pid::from_raw(pgid), None).is_err() {
        return false;
    }
    any_live_process(pgid, |pgrp, _| pgrp == pgid)
}

/// True while a non-zombie process of group `pgid` is also in session `pgid`:
/// our step groups are session leaders, which guards against pgid reuse.
pub(crate) fn step_group_alive(pgid: i32) -> bool {
    any_live_process(pgid, |pgrp, sid| pgrp == pgid && sid == pgid)
}

pub(crate) fn signal_group(pgid: i32, sig: Signal) {
    // ESRCH (already gone) is the expected race; nothing else can go wrong
    // for a group we created ourselves.
    let _ = killpg(Pid::from_raw(pgid), sig);
}

/// This boot's id, to recognise pgid records written before a reboot.
pub(crate) fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}
