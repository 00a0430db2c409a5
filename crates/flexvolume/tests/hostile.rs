//! Hostile input, run in the normal test suite: every reply in tests/hostile/replies (plus a few
//! generated ones too big to commit) goes through a real driver process; hostile directory
//! names and symlink tricks go through the real plugin-dir scan; misbehaving drivers go through
//! the real runner. Each has an exact expected class of outcome, a bounded error message, and
//! leaves no process behind.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use flexvolume::layout::{self, LayoutError, LayoutPolicy};
use flexvolume::prober;
use flexvolume::protocol::{CallOut, CallOutKind, ProtocolError, Status};
use flexvolume::runner::{self, CallError, RunnerConfig};

fn write_exe(path: &Path, script: &str) {
    std::fs::write(path, script).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Longest error message we accept: output quotes are truncated, so errors stay readable.
const MAX_ERROR_LEN: usize = 2048;

#[derive(Debug, PartialEq)]
enum Class {
    Success,
    Failure,
    NotSupported,
    NoReply,
}

fn classify(result: &Result<flexvolume::Reply, CallError>) -> Class {
    match result {
        Ok(r) => {
            assert_eq!(r.status, Status::Success);
            Class::Success
        }
        Err(CallError::Failure { .. }) => Class::Failure,
        Err(CallError::NotSupported { .. }) => Class::NotSupported,
        Err(CallError::Protocol {
            source: ProtocolError::NoReply { .. },
            ..
        }) => Class::NoReply,
        Err(other) => panic!("unexpected error class: {other:?}"),
    }
}

fn expected(file_name: &str) -> Class {
    match file_name.split('-').next() {
        Some("success") => Class::Success,
        Some("failure") => Class::Failure,
        Some("notsupported") => Class::NotSupported,
        Some("noreply") => Class::NoReply,
        _ => panic!("corpus file {file_name} has no expected-outcome prefix"),
    }
}

/// A driver that prints the file named by its first argument (`mount <file> {}`).
fn emitter(dir: &Path) -> PathBuf {
    let exe = dir.join("emit");
    write_exe(&exe, "#!/bin/sh\ncat \"$2\"\n");
    exe
}

fn emit(exe: &Path, file: &Path) -> Result<flexvolume::Reply, CallError> {
    let call = CallOut::from_raw(CallOutKind::Mount, vec![file.into(), "{}".into()]).unwrap();
    let config = RunnerConfig::default().with_timeout_for_all(Duration::from_secs(60));
    runner::call(&config, exe, &call)
}

#[test]
fn every_hostile_reply_has_its_exact_outcome_and_a_bounded_error() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile/replies");
    let work = tempfile::tempdir().unwrap();
    let exe = emitter(work.path());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();

    // Too big or too binary to commit: generated here.
    let generated = [
        ("noreply-10mb-string", {
            let mut v = br#"{"status":"Success","message":""#.to_vec();
            v.extend(std::iter::repeat_n(b'x', 10 * 1024 * 1024));
            v.extend(br#""}"#);
            v
        }),
        (
            "noreply-binary",
            (0..200_000u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
                .filter(|b| *b != b'{')
                .collect(),
        ),
        ("success-reply-then-10mb", {
            let mut v = br#"{"status":"Success"}"#.to_vec();
            v.extend(std::iter::repeat_n(b'{', 10 * 1024 * 1024));
            v
        }),
        ("noreply-1mb-of-braces", vec![b'{'; 1024 * 1024]),
        ("noreply-nested-strings", br#"{"a":""#.repeat(150_000)),
    ];
    for (name, bytes) in generated {
        let path = work.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        files.push(path);
    }
    assert!(files.len() >= 50, "the corpus has {} replies", files.len());
    files.sort();
    for file in files {
        let name = file.file_name().unwrap().to_str().unwrap().to_owned();
        let result = emit(&exe, &file);
        assert_eq!(classify(&result), expected(&name), "{name}: {result:?}");
        if let Err(e) = &result {
            let message = e.to_string();
            assert!(
                message.len() <= MAX_ERROR_LEN,
                "{name}: error of {} bytes",
                message.len()
            );
        }
    }
}

/// A driver executable that leaves a marker file when it is run: proof that it never was.
fn tripwire(path: &Path, marker: &Path) {
    write_exe(
        path,
        &format!(
            "#!/bin/sh\ntouch '{}'\necho '{{\"status\":\"Success\"}}'\n",
            marker.display()
        ),
    );
}

#[test]
fn hostile_directory_names_are_reported_and_never_executed() {
    use std::os::unix::ffi::OsStrExt;
    let plugin = tempfile::tempdir().unwrap();
    let marker = plugin.path().join(".ran");
    let long = "a".repeat(254);
    let names: Vec<&[u8]> = vec![
        b"-rf",
        b"a~~b",
        b"~x",
        b"x~",
        b"a b",
        b"a\nb",
        b"a$(touch pwned)",
        b"a;rm -rf x",
        "é".as_bytes(),
        long.as_bytes(),
        b"a\\b",
        b"a*b",
        b"a?b",
        b"a|b",
        b"a>b",
        b"a'b",
        b"a\"b",
        b"a`id`",
        b"a\tb",
        b"v~-x",
        b"v~.x",
        b"\x01ctl",
        b"\xff\xfe",
        b"v~x~-y",
    ];
    assert!(names.len() >= 20);
    for raw in &names {
        let dir = plugin.path().join(std::ffi::OsStr::from_bytes(raw));
        std::fs::create_dir(&dir).unwrap();
        // Put tripwires under every plausible executable name.
        let last = raw.rsplit(|b| *b == b'~').next().unwrap();
        let exe_name = if last.is_empty() {
            b"x".as_slice()
        } else {
            last
        };
        tripwire(&dir.join(std::ffi::OsStr::from_bytes(exe_name)), &marker);
    }
    // Hidden entries are invisible: never reported, never run.
    let hidden = plugin.path().join(".staging~drv");
    std::fs::create_dir(&hidden).unwrap();
    tripwire(&hidden.join("drv"), &marker);

    let probed = prober::probe_all(
        plugin.path(),
        LayoutPolicy::default(),
        &RunnerConfig::default(),
        8,
    )
    .unwrap();
    assert_eq!(
        probed.len(),
        names.len(),
        "every visible entry is reported once, hidden ones not at all"
    );
    for p in &probed {
        let err = p.result.as_ref().expect_err(&p.name).to_string();
        assert!(
            err.contains("not a valid driver name") || err.contains("not valid UTF-8"),
            "{:?}: {err}",
            p.name
        );
        assert!(err.len() <= MAX_ERROR_LEN);
    }
    assert!(!marker.exists(), "a hostile entry was executed");
}

#[test]
fn symlink_tricks_give_clear_errors_and_nothing_outside_runs() {
    let plugin = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let p = plugin.path();
    let marker = outside.path().join("ran");
    let escaped = outside.path().join("x");
    tripwire(&escaped, &marker);
    let symlink = |target: &Path, link: &Path| std::os::unix::fs::symlink(target, link).unwrap();

    // A valid driver, and an alias directory pointing at it (inside: allowed).
    std::fs::create_dir(p.join("acme~x")).unwrap();
    write_exe(
        &p.join("acme~x/x"),
        "#!/bin/sh\necho '{\"status\":\"Success\"}'\n",
    );
    symlink(Path::new("acme~x"), &p.join("alias~x"));
    // Loops, escapes, dangling links, wrong file types.
    symlink(Path::new("loop~x"), &p.join("loop~x"));
    std::fs::create_dir(p.join("esc~x")).unwrap();
    symlink(&escaped, &p.join("esc~x/x"));
    symlink(outside.path(), &p.join("escdir~x"));
    std::fs::create_dir(p.join("dangling~x")).unwrap();
    symlink(Path::new("/nonexistent/flexd"), &p.join("dangling~x/x"));
    std::fs::create_dir(p.join("devnull~x")).unwrap();
    symlink(Path::new("/dev/null"), &p.join("devnull~x/x"));
    std::fs::create_dir_all(p.join("isdir~x/x")).unwrap();
    std::fs::create_dir(p.join("fifo~x")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p.join("fifo~x/x"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o755),
        0,
    )
    .unwrap();
    std::fs::create_dir(p.join("selfloop~x")).unwrap();
    symlink(Path::new("x"), &p.join("selfloop~x/x"));

    let entries = layout::scan(p, LayoutPolicy::default()).unwrap();
    let outcome = |name: &str| {
        entries
            .iter()
            .find(|e| e.dir_name == name)
            .unwrap()
            .outcome
            .clone()
    };
    assert!(outcome("acme~x").is_ok());
    assert!(
        outcome("alias~x").is_ok(),
        "a symlink inside the plugin dir is fine"
    );
    assert!(
        matches!(outcome("loop~x"), Err(LayoutError::Io { .. })),
        "{:?}",
        outcome("loop~x")
    );
    assert!(matches!(outcome("esc~x"), Err(LayoutError::Escapes { .. })));
    assert!(matches!(
        outcome("escdir~x"),
        Err(LayoutError::Escapes { .. })
    ));
    assert!(matches!(
        outcome("dangling~x"),
        Err(LayoutError::MissingExecutable { .. })
    ));
    assert!(matches!(
        outcome("devnull~x"),
        Err(LayoutError::NotAFile { .. })
    ));
    assert!(matches!(
        outcome("isdir~x"),
        Err(LayoutError::NotAFile { .. })
    ));
    assert!(matches!(
        outcome("fifo~x"),
        Err(LayoutError::NotAFile { .. })
    ));
    assert!(matches!(outcome("selfloop~x"), Err(LayoutError::Io { .. })));
    for e in &entries {
        if let Err(err) = &e.outcome {
            assert!(err.to_string().len() <= MAX_ERROR_LEN);
        }
    }
    // Probing everything runs only the valid drivers.
    let probed =
        prober::probe_all(p, LayoutPolicy::default(), &RunnerConfig::default(), 8).unwrap();
    assert_eq!(probed.iter().filter(|p| p.result.is_ok()).count(), 2);
    assert!(
        !marker.exists(),
        "an executable outside the plugin dir was run"
    );
}

/// Processes still in a process group.
fn group_members(pgid: i32) -> Vec<i32> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        // fields[0] = state, fields[2] = pgrp
        if fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid)
            && fields.first() != Some(&"Z")
        {
            members.push(pid);
        }
    }
    members
}

fn wait_group_empty(pgid: i32) -> Vec<i32> {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let members = group_members(pgid);
        if members.is_empty() || std::time::Instant::now() > deadline {
            return members;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn misbehaving_drivers_end_with_a_clear_error_and_leave_no_process() {
    let work = tempfile::tempdir().unwrap();
    let cases = [
        (
            "children",
            "for i in $(seq 50); do sleep 100 & done\necho $$ > \"$2\"\nwait\n",
            "timed out",
        ),
        ("flood", "echo $$ > \"$2\"\nyes flood\n", "timed out"),
        (
            "ignore-term",
            "trap '' TERM\necho $$ > \"$2\"\nwhile :; do sleep 1; done\n",
            "timed out",
        ),
        (
            "busy-loop",
            "echo $$ > \"$2\"\nwhile :; do :; done\n",
            "timed out",
        ),
    ];
    let config = RunnerConfig {
        kill_grace: Duration::from_millis(300),
        ..RunnerConfig::default()
    }
    .with_timeout_for_all(Duration::from_millis(700));
    for (name, body, want) in cases {
        let exe = work.path().join(name);
        write_exe(&exe, &format!("#!/bin/sh\n{body}"));
        let pidfile = work.path().join(format!("{name}.pid"));
        let call = CallOut::from_raw(
            CallOutKind::Mount,
            vec![pidfile.clone().into(), "{}".into()],
        )
        .unwrap();
        let err = runner::call(&config, &exe, &call).unwrap_err();
        assert!(err.to_string().contains(want), "{name}: {err}");
        let pgid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let left = wait_group_empty(pgid);
        assert!(left.is_empty(), "{name}: processes left behind: {left:?}");
    }
}

#[test]
fn a_driver_that_closes_stdout_early_is_still_heard_on_stderr() {
    let work = tempfile::tempdir().unwrap();
    let exe = work.path().join("closer");
    write_exe(
        &exe,
        "#!/bin/sh\nexec 1>&-\nsleep 0.2\necho '{\"status\":\"Success\",\"message\":\"late, on stderr\"}' >&2\n",
    );
    let reply = runner::call(&RunnerConfig::default(), &exe, &CallOut::init()).unwrap();
    assert_eq!(reply.message, "late, on stderr");
}
