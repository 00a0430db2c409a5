//! `flexd ownership apply` through the real binary. Needs root (arbitrary groups).

use std::os::unix::fs::MetadataExt;

use test_support::run_flexd as flexd;

#[test]
fn apply_reports_changes_as_json_then_finds_nothing_to_do() {
    test_support::require_root!("needs root to give entries an arbitrary group");
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().join("v");
    std::fs::create_dir_all(root.join("a/b")).unwrap();
    for i in 0..50 {
        std::fs::write(root.join(format!("a/b/f{i}")), b"x").unwrap();
    }
    let dir = root.to_str().unwrap();
    let run = |policy: &str| {
        let out = flexd(&[
            "--output",
            "json",
            "ownership",
            "apply",
            dir,
            "--fs-group",
            "5151",
            "--policy",
            policy,
        ]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let first = run("always");
    assert_eq!(first["entries"], 53, "{first}");
    assert_eq!(first["chowned"], 53, "{first}");
    assert_eq!(first["error_count"], 0);
    assert_eq!(std::fs::metadata(root.join("a/b/f7")).unwrap().gid(), 5151);
    let second = run("always");
    assert_eq!(second["chowned"], 0, "{second}");
    assert_eq!(second["chmodded"], 0, "{second}");
    let skipped = run("on-root-mismatch");
    assert_eq!(skipped["skipped"], true, "{skipped}");
}

#[test]
fn apply_on_a_missing_dir_fails_naming_it_and_text_output_summarises() {
    let out = flexd(&[
        "ownership",
        "apply",
        "/nonexistent/flexd-no-such-volume",
        "--fs-group",
        "1",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("flexd-no-such-volume"), "{stderr}");
    assert!(stderr.contains("cannot open the volume root"), "{stderr}");

    let temp = tempfile::tempdir().unwrap();
    let gid = rustix::process::getegid().as_raw().to_string();
    let out = flexd(&[
        "ownership",
        "apply",
        temp.path().to_str().unwrap(),
        "--fs-group",
        &gid,
    ]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 entries"), "{stdout}");
}
