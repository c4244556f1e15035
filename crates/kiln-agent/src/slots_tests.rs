use super::*;

fn sh(dir: &Path, cmd: &str) {
    let out = std::process::Command::new("sh").arg("-c").arg(cmd).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Every entry under `dir` (relative path, type, mode, content or target),
/// sorted: two trees with equal listings are the same tree.
fn listing(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            let what = if m.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                walk(base, &p, out);
                "dir".into()
            } else {
                format!("{:?}", std::fs::read(&p).unwrap())
            };
            out.push(format!("{rel} {:o} {what}", m.mode() & 0o7777));
        }
    }
    let mut out = vec![];
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn pristine(dir: &Path) -> PathBuf {
    let p = dir.join("pristine");
    std::fs::create_dir(&p).unwrap();
    sh(
        &p,
        "mkdir -p sub/deep .git/objects/info && echo hi > f && echo deep > sub/deep/g && chmod 755 sub/deep/g \
         && ln -s f link && echo ref > .git/HEAD && echo /x > .git/objects/info/alternates",
    );
    p
}

/// What a job may do to its workspace, undone: files added, changed in
/// place (same size), made read-only or executable, replaced by links or
/// directories (and the reverse), hard-linked from outside, given an
/// extended attribute; directories made unreadable, links retargeted.
/// Nothing outside the tree is touched through a link or a hard link.
#[test]
fn a_used_workspace_is_brought_back_to_the_pristine_tree_without_following_anything() {
    let dir = tempfile::tempdir().unwrap();
    let src = pristine(dir.path());
    let ws = dir.path().join("ws");
    copy_tree(&src, &ws, &mut Budget::unlimited()).unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"hi\n").unwrap();
    sh(
        &ws,
        &format!(
            "echo HI > f && echo new > added && mkdir -p target/debug && echo o > target/debug/bin \
             && chmod 000 target && rm sub/deep/g && ln -s {out}/secret sub/deep/g && rm link && mkdir link \
             && chmod 700 sub && echo x > .git/hooks-post && echo '[core] fsmonitor = evil' >> .git/HEAD \
             && ln {out}/secret hardlinked && rm -r .git/objects/info && echo not-a-dir > .git/objects/info",
            out = outside.display()
        ),
    );
    // The same bytes as the pristine file, but hard-linked from outside:
    // rewritten as a file of its own, the outside name left alone.
    std::fs::remove_file(ws.join("f")).unwrap();
    std::fs::hard_link(outside.join("secret"), ws.join("f")).unwrap();
    let with_xattr = ws.join("sub/x");
    std::fs::write(src.join("sub/x"), b"same").unwrap();
    std::fs::write(&with_xattr, b"same").unwrap();
    let xattrs = xattr::set(&with_xattr, "user.kiln-test", b"1").is_ok();
    // An inode flag a user may set (no dump), where the file system has them.
    let flagged =
        std::process::Command::new("chattr").arg("+d").arg(ws.join("sub/deep")).status().is_ok_and(|s| s.success());
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let mut doomed = Doomed::new(&root);
    sync_tree(&src, &ws, None, &mut doomed).unwrap();
    assert_eq!(listing(&ws), listing(&src));
    if xattrs {
        assert!(xattr::list(&with_xattr).unwrap().next().is_none(), "the attribute went with the old file");
    }
    if flagged {
        let f = std::fs::File::open(ws.join("sub/deep")).unwrap();
        let flags = rustix::fs::ioctl_getflags(&f).unwrap();
        assert!(!flags.contains(rustix::fs::IFlags::NODUMP), "the flagged directory was replaced");
    }
    assert_eq!(std::fs::symlink_metadata(ws.join("f")).unwrap().nlink(), 1);
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"hi\n", "nothing written through a link");
    assert_eq!(std::fs::symlink_metadata(outside.join("secret")).unwrap().nlink(), 3, "the doomed names still link it");
    // What was moved out sits in the root until it is buried.
    assert!(std::fs::read_dir(&root).unwrap().count() >= 5);
    doomed.bury();
    for _ in 0..200 {
        if std::fs::read_dir(&root).unwrap().next().is_none() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0, "doomed entries are deleted");
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"hi\n");
    // A second sync finds nothing to do.
    let mut doomed = Doomed::new(&root);
    sync_tree(&src, &ws, None, &mut doomed).unwrap();
    assert!(doomed.paths.is_empty(), "{:?}", doomed.paths);
}

#[test]
fn a_skipped_path_is_neither_checked_removed_nor_filled() {
    let dir = tempfile::tempdir().unwrap();
    let src = pristine(dir.path());
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::create_dir_all(ws.join(".git/objects/pack")).unwrap();
    std::fs::write(ws.join(".git/objects/pack/p"), b"x").unwrap();
    let mut doomed = Doomed::new(dir.path());
    sync_tree(&src, &ws, Some(&ws.join(".git/objects")), &mut doomed).unwrap();
    assert!(ws.join(".git/objects/pack/p").exists());
    assert!(!ws.join(".git/objects/info").exists(), "not filled from the pristine tree either");
    assert_eq!(std::fs::read(ws.join("f")).unwrap(), b"hi\n");
}

#[test]
fn a_workspace_that_is_not_a_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let src = pristine(dir.path());
    let ws = dir.path().join("ws");
    std::os::unix::fs::symlink(&src, &ws).unwrap();
    let e = sync_tree(&src, &ws, None, &mut Doomed::new(dir.path())).unwrap_err();
    assert!(e.to_string().contains("is not a directory like"), "{e}");
}

/// Object files stay only as the mirror's own inodes.
#[test]
fn only_hard_links_to_the_mirrors_objects_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mirror = dir.path().join("mirror");
    std::fs::create_dir_all(mirror.join("ab")).unwrap();
    std::fs::write(mirror.join("ab/cdef"), b"obj").unwrap();
    std::fs::write(mirror.join("ab/other"), b"obj2").unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("ab")).unwrap();
    std::fs::hard_link(mirror.join("ab/cdef"), ws.join("ab/cdef")).unwrap();
    std::fs::write(ws.join("ab/other"), b"forged").unwrap();
    std::fs::write(ws.join("ab/extra"), b"x").unwrap();
    std::fs::create_dir(ws.join("info")).unwrap();
    std::os::unix::fs::symlink("/etc", ws.join("cd")).unwrap();
    let mut doomed = Doomed::new(dir.path());
    prune_objects(&ws, &mirror, &mut doomed).unwrap();
    assert_eq!(listing(&ws), ["ab 755 dir", "ab/cdef 644 [111, 98, 106]"].map(String::from).to_vec());
}

/// `home/`, `tmp/` and the output file are emptied, anything else in the
/// slot moved out; a home replaced by a link is moved out, not followed.
#[test]
fn a_slots_skeleton_is_emptied_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let slot = root.join("slot-0-x");
    std::fs::create_dir_all(slot.join("ws")).unwrap();
    std::fs::create_dir_all(slot.join("home/.ssh")).unwrap();
    std::fs::write(slot.join("home/.ssh/id"), b"key").unwrap();
    std::fs::create_dir_all(slot.join("tmp")).unwrap();
    std::fs::write(slot.join("tmp/t"), b"t").unwrap();
    std::fs::create_dir_all(slot.join("outputs")).unwrap();
    std::fs::write(slot.join("outputs/output"), b"a=1\n").unwrap();
    std::fs::write(slot.join("outputs/more"), b"b").unwrap();
    std::fs::write(slot.join(".removed-0"), b"r").unwrap();
    std::fs::write(slot.join("ws/keep"), b"the caller's").unwrap();
    let out = slot.join("outputs/output");
    let ino = std::fs::metadata(&out).unwrap().ino();
    let mut doomed = Doomed::new(&root);
    reset_skeleton(&slot, &root, &mut doomed).unwrap();
    doomed.bury();
    let mut names: Vec<_> =
        std::fs::read_dir(&slot).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["home", "outputs", "tmp", "ws"]);
    assert_eq!(std::fs::read_dir(slot.join("home")).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(slot.join("tmp")).unwrap().count(), 0);
    assert_eq!(listing(&slot.join("outputs")), ["output 644 []"]);
    assert_eq!(std::fs::metadata(&out).unwrap().ino(), ino, "the same file, emptied");
    assert!(slot.join("ws/keep").exists());
    assert_eq!(std::fs::metadata(&slot).unwrap().mode() & 0o7777, 0o700);

    // A home that became a link to somewhere else is moved out unfollowed.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("precious"), b"p").unwrap();
    std::fs::remove_dir(slot.join("home")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, slot.join("home")).unwrap();
    // And an output file with a second name.
    std::fs::hard_link(&out, dir.path().join("second")).unwrap();
    let mut doomed = Doomed::new(&root);
    reset_skeleton(&slot, &root, &mut doomed).unwrap();
    assert!(!slot.join("home").exists() && std::fs::symlink_metadata(slot.join("home")).is_err());
    assert!(!out.exists(), "an output file with another name is moved out");
    assert!(elsewhere.join("precious").exists());
}

/// A directory that once held many entries keeps ext4's hash index flag
/// after they are gone: that is the file system's, not a job's, and
/// does not cost the slot its sandbox.
#[test]
fn the_file_systems_own_flags_do_not_count_as_a_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let slot = root.join("slot-0-x");
    std::fs::create_dir_all(slot.join("home")).unwrap();
    // The job filled its home (the reset empties it).
    for i in 0..400 {
        std::fs::write(slot.join(format!("home/an-entry-with-a-rather-long-name-{i}")), b"").unwrap();
    }
    let home = std::fs::metadata(slot.join("home")).unwrap().ino();
    let mut doomed = Doomed::new(&root);
    reset_skeleton(&slot, &root, &mut doomed).unwrap();
    assert_eq!(std::fs::metadata(slot.join("home")).unwrap().ino(), home, "kept");
    assert_eq!(std::fs::read_dir(slot.join("home")).unwrap().count(), 0, "and emptied");
}
