//! Spawning: placement, descriptors, namespaces, process groups.

use super::*;
use std::io::Read;

fn run_by(
    program: &str,
    argv: &[&str],
    inherit: Vec<RawFd>,
    try_clone3: bool,
) -> (ExitStatus, String, String) {
    let argv: Vec<&OsStr> = argv.iter().map(OsStr::new).collect();
    let request = Request::new(Path::new(program), &argv, environment(), inherit, None).unwrap();
    let mut process = request.spawn_by(Placement::Inherited, try_clone3).unwrap();
    let mut out = String::new();
    let mut err = String::new();
    std::fs::File::from(process.stdout.take().unwrap())
        .read_to_string(&mut out)
        .unwrap();
    std::fs::File::from(process.stderr.take().unwrap())
        .read_to_string(&mut err)
        .unwrap();
    (process.wait().unwrap(), out, err)
}

#[test]
fn the_child_gets_what_std_would_give_it() {
    child_gets_what_std_would_give_it(true);
}

#[test]
fn the_child_gets_what_std_would_give_it_without_clone3() {
    child_gets_what_std_would_give_it(false);
}

fn child_gets_what_std_would_give_it(try_clone3: bool) {
    let (status, out, err) = run_by(
        "sh",
        &[
            "-c",
            "readlink /proc/self/fd/0; \
                 echo pgid=$(cut -d' ' -f5 /proc/$$/stat) pid=$$; \
                 grep -E '^Sig(Blk|Ign)' /proc/self/status; ls /proc/self/fd; echo oops >&2",
        ],
        Vec::new(),
        try_clone3,
    );
    assert!(status.success(), "{status:?} {err}");
    assert_eq!(err, "oops\n");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("/dev/null"), "{out}");
    let ids = lines.next().unwrap();
    let pgid = ids
        .split_whitespace()
        .next()
        .unwrap()
        .trim_start_matches("pgid=");
    let pid = ids
        .split_whitespace()
        .nth(1)
        .unwrap()
        .trim_start_matches("pid=");
    // `sh` is the process spawned (it runs `cut` as a child).
    assert_eq!(pgid.trim(), pid, "its own process group: {out}");
    assert_eq!(lines.next(), Some("SigBlk:\t0000000000000000"), "{out}");
    // What flexd ignores stays ignored (exec keeps it, as with std), but SIGPIPE, which
    // every Rust program ignores.
    let ours = std::fs::read_to_string("/proc/self/status").unwrap();
    let ignored = |status: &str| {
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .unwrap();
        u64::from_str_radix(hex.trim(), 16).unwrap()
    };
    let sigpipe = 1 << (libc::SIGPIPE - 1);
    assert_ne!(ignored(&ours) & sigpipe, 0);
    assert_eq!(
        ignored(lines.next().unwrap()),
        ignored(&ours) & !sigpipe,
        "{out}"
    );
    // The same descriptors as a child of std's: 0, 1, 2, what this test process got
    // without close-on-exec from whoever started it (cargo's jobserver, a VM's console),
    // and the directory handle `ls` opens on the lowest free one. Nothing of ours.
    let ours: Vec<&str> = lines.collect();
    let std_child = std::process::Command::new("sh")
        .args(["-c", "ls /proc/self/fd"])
        .output()
        .unwrap();
    let std_child = String::from_utf8(std_child.stdout).unwrap();
    assert_eq!(ours, std_child.lines().collect::<Vec<_>>(), "{out}");
}

#[test]
fn asked_for_descriptors_are_inherited() {
    let file = tempfile::tempfile().unwrap();
    let fd = file.as_raw_fd();
    for try_clone3 in [true, false] {
        let (status, out, _) = run_by(
            "sh",
            &["-c", &format!("test -e /proc/self/fd/{fd} && echo open")],
            vec![fd],
            try_clone3,
        );
        assert!(status.success());
        assert_eq!(out, "open\n");
    }
    // And only for that child: flexd's copy stays close-on-exec.
    let flags = rustix::io::fcntl_getfd(&file).unwrap();
    assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
}

#[test]
fn a_failed_exec_is_the_error_and_leaves_no_zombie() {
    let request = Request::new(
        Path::new("/nonexistent/driver"),
        &[],
        environment(),
        Vec::new(),
        None,
    )
    .unwrap();
    for try_clone3 in [true, false] {
        let err = request
            .spawn_by(Placement::Inherited, try_clone3)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("not-executable");
    std::fs::write(&text, "data").unwrap();
    let err = Request::new(&text, &[], environment(), Vec::new(), None)
        .unwrap()
        .spawn(Placement::Inherited)
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
    // Both children were reaped. One not reaped would be a zombie that never exec'd, so
    // still named as this test binary (other tests' children are named as what they run).
    let comm = |pid: &str| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let me = comm("self");
    let zombies = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|children| {
            children
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|pid| comm(pid) == me)
        .count();
    assert_eq!(zombies, 0);
}

#[test]
fn a_pidfd_comes_with_the_process_where_clone3_works() {
    let request =
        Request::new(Path::new("/bin/true"), &[], environment(), Vec::new(), None).unwrap();
    let mut process = request.spawn(Placement::Inherited).unwrap();
    let pidfd = process.take_pidfd();
    assert!(process.wait().unwrap().success());
    match CLONE3.load(Ordering::Relaxed) {
        CLONE3_WORKS => assert!(pidfd.is_some()),
        _ => assert!(pidfd.is_none()),
    }
}
