//! The loop driver's pure parts: names, sizes, escapes, image dirs. Claims, and the call-outs
//! on real loop devices: [`claims`].

use std::fs::File;
use std::process::Command;

use super::*;
use crate::volume::same_file;

mod claims;

fn options(json: &str) -> VolumeOptions {
    VolumeOptions::parse(json).unwrap()
}

#[test]
fn names_and_dirs_are_checked_before_any_path_is_built() {
    let v = Volume::from_options(
        &options(r#"{"kubernetes.io/pvOrVolumeName":"pv-1"}"#),
        Path::new(DEFAULT_IMAGE_DIR),
    )
    .unwrap();
    assert_eq!(v.image(), Path::new("/var/lib/flexd-loop/pv-1.img"));
    let v = Volume::from_options(
        &options(
            r#"{"kubernetes.io/pvOrVolumeName":"pv-1","volumeID":"data","imageDir":"/srv/img"}"#,
        ),
        Path::new(DEFAULT_IMAGE_DIR),
    )
    .unwrap();
    assert_eq!(v.image(), Path::new("/srv/img/data.img"));
    for bad in [
        r#"{"volumeID":"../etc/passwd"}"#,
        r#"{"volumeID":"a/b"}"#,
        r#"{"volumeID":".hidden"}"#,
        r#"{"volumeID":"-rf"}"#,
        r#"{"volumeID":"a b"}"#,
        r#"{"volumeID":"a@b"}"#,
        r#"{}"#,
        r#"{"volumeID":"v","imageDir":"relative"}"#,
        r#"{"volumeID":"v","imageDir":"/srv/../etc"}"#,
    ] {
        assert!(
            Volume::from_options(&options(bad), Path::new(DEFAULT_IMAGE_DIR)).is_err(),
            "{bad}"
        );
    }
    let v = Volume::from_options(
        &options(r#"{"volumeID":"v","imageDir":"//srv/./x/"}"#),
        Path::new(DEFAULT_IMAGE_DIR),
    );
    assert_eq!(v.unwrap().dir, Path::new("/srv/x"));
    let long = format!(r#"{{"volumeID":"{}"}}"#, "a".repeat(MAX_NAME_LEN + 1));
    assert!(Volume::from_options(&options(&long), Path::new(DEFAULT_IMAGE_DIR)).is_err());
}

#[test]
fn the_detach_name_is_stable_and_finds_the_image_again() {
    for (json, want) in [
        (r#"{"volumeID":"v1"}"#, "v1"),
        (
            r#"{"volumeID":"v1","imageDir":"/tmp/a b~c@d%"}"#,
            "v1@%2Ftmp%2Fa%20b%7Ec%40d%25",
        ),
    ] {
        let volume = Volume::from_options(&options(json), Path::new(DEFAULT_IMAGE_DIR)).unwrap();
        let name = volume.detach_name();
        assert_eq!(name, want);
        assert!(!name.contains(['/', '~']));
        assert_eq!(Volume::from_detach_name(&name).unwrap(), volume);
    }
    for bad in ["v@%2", "v@%zz", "v@relative", "../x", "v@%2Fa%2F..%2Fb"] {
        assert!(Volume::from_detach_name(bad).is_err(), "{bad}");
    }
}

#[test]
fn sizes() {
    assert_eq!(parse_size("1Gi"), Some(1 << 30));
    assert_eq!(parse_size("512Mi"), Some(512 << 20));
    assert_eq!(parse_size("1G"), Some(1_000_000_000));
    assert_eq!(parse_size("4096"), Some(4096));
    assert_eq!(parse_size("1Ei"), Some(1 << 60));
    for bad in ["", "0", "-1", "1 Gi", "lots", "99999999999Ti", "16Ei"] {
        assert_eq!(parse_size(bad), None, "{bad}");
    }
    assert_eq!(size_of(&options("{}")).unwrap(), DEFAULT_SIZE);
    assert!(size_of(&options(r#"{"size":"big"}"#)).is_err());
}

#[test]
fn a_new_image_is_sparse_and_an_existing_one_is_reused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let volume = Volume::new("v", dir.path()).unwrap();
    let _lock = volume.lock().unwrap();
    assert!(volume.create_or_reuse_image(1 << 30).unwrap().is_some());
    let meta = fs::metadata(volume.image()).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    use std::os::unix::fs::MetadataExt;
    assert!(
        meta.blocks() * 512 < 1 << 20,
        "sparse: {} blocks",
        meta.blocks()
    );
    fs::write(volume.image(), b"data").unwrap();
    assert!(volume.create_or_reuse_image(1 << 30).unwrap().is_none());
    assert_eq!(fs::read(volume.image()).unwrap(), b"data");
    // A symlink where the image should be is refused, not followed.
    let other = Volume::new("w", dir.path()).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", other.image()).unwrap();
    assert!(other.create_or_reuse_image(1 << 20).is_err());
}

#[test]
fn data_is_found_anywhere_in_a_sparse_image_and_zeros_are_not_data() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("i.img");
    let mut f = File::create(&image).unwrap();
    f.set_len(64 << 20).unwrap();
    assert!(!image_holds_data(&image).unwrap(), "fresh sparse image");
    f.seek(SeekFrom::Start(10 << 20)).unwrap();
    f.write_all(&[0u8; 8192]).unwrap();
    f.sync_all().unwrap();
    assert!(!image_holds_data(&image).unwrap(), "written zeros");
    f.seek(SeekFrom::Start(40 << 20)).unwrap();
    f.write_all(b"x").unwrap();
    f.sync_all().unwrap();
    assert!(image_holds_data(&image).unwrap(), "one byte deep inside");
    assert!(image_holds_data(&dir.path().join("absent")).is_err());
}

#[test]
fn provision_sizes_the_image_delete_removes_it_and_attach_without_size_needs_it() {
    let dir = tempfile::tempdir().unwrap();
    let driver = LoopDriver::new(ImageDirs::new([dir.path()]).unwrap());
    let images = dir.path().display().to_string();
    let json = |extra: &str| {
        options(&format!(
            r#"{{"imageDir":"{images}","kubernetes.io/pvOrVolumeName":"pvc-1"{extra}}}"#
        ))
    };
    let image = dir.path().join("pvc-1.img");
    // Attaching a volume that was never created names the error, and creates nothing.
    let err = driver.attach(&json(""), "node-1").unwrap_err();
    assert!(
        matches!(
            &err,
            DriverError::Named {
                code: flexvolume_driver::ErrorCode::NotFound,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!image.exists());
    let made = driver
        .provision(&json(r#","requestBytes":"5242880""#))
        .unwrap();
    assert_eq!(
        made.options.get(VOLUME_ID_OPTION).map(String::as_str),
        Some("pvc-1")
    );
    assert_eq!(made.capacity_bytes, Some(5 << 20));
    assert_eq!(fs::metadata(&image).unwrap().len(), 5 << 20);
    // Repeated (a retry after a crash): the same image.
    driver
        .provision(&json(r#","requestBytes":"5242880""#))
        .unwrap();
    let bigger = driver
        .provision(&json(r#","requestBytes":"10485760""#))
        .unwrap_err();
    assert!(matches!(
        bigger,
        DriverError::Named {
            code: flexvolume_driver::ErrorCode::AlreadyExists,
            ..
        }
    ));
    if which("losetup") {
        driver.delete(&json("")).unwrap();
        assert!(!image.exists());
    }
    // Deleting what is not there is done already.
    fs::remove_file(&image).ok();
    driver.delete(&json("")).unwrap();
}

fn code_of(error: &DriverError) -> Option<flexvolume_driver::ErrorCode> {
    match error {
        DriverError::Named { code, .. } => Some(*code),
        _ => None,
    }
}

/// Every entry of `dir`, sorted: what a call left behind.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn only_the_operators_image_dirs_are_used_and_none_is_made_deep() {
    use flexvolume_driver::ErrorCode;
    let root = tempfile::tempdir().unwrap();
    let allowed = root.path().join("images");
    let driver = LoopDriver::new(ImageDirs::new([&allowed]).unwrap());
    let provision = |dir: &Path| {
        driver.provision(&options(&format!(
            r#"{{"imageDir":"{}","kubernetes.io/pvOrVolumeName":"v","requestBytes":"1048576"}}"#,
            dir.display()
        )))
    };
    for refused in [
        PathBuf::from("/etc"),
        PathBuf::from("/"),
        root.path().to_owned(),
        allowed.join("deeper"),
    ] {
        let err = provision(&refused).unwrap_err();
        assert_eq!(code_of(&err), Some(ErrorCode::InvalidArgument), "{err}");
        assert!(err.to_string().contains("not an image dir"), "{err}");
    }
    assert!(!Path::new("/etc/v.img").exists() && !Path::new("/etc/.v.lock").exists());
    assert!(!Path::new("/v.img").exists());
    assert_eq!(entries(root.path()), Vec::<String>::new());
    // Every other call-out refuses it too: attach would make an image, detach a lock.
    let static_options = options(r#"{"imageDir":"/etc","volumeID":"v","size":"1Mi"}"#);
    assert!(driver.attach(&static_options, "n").is_err());
    assert!(driver.get_volume_name(&static_options).is_err());
    assert!(driver.detach("v@%2Fetc", "n").is_err());
    assert!(!Path::new("/etc/.v.lock").exists());
    // The allowed dir itself is made, one level; its parent must exist.
    provision(&allowed).unwrap();
    assert!(allowed.join("v.img").is_file());
    let orphan = root.path().join("missing/images");
    let driver = LoopDriver::new(ImageDirs::new([&orphan]).unwrap());
    let err = driver
        .provision(&options(&format!(
            r#"{{"imageDir":"{}","kubernetes.io/pvOrVolumeName":"v"}}"#,
            orphan.display()
        )))
        .unwrap_err();
    assert!(err.to_string().contains("its parent must exist"), "{err}");
    assert!(!root.path().join("missing").exists());
    // No imageDir: the operator's first dir, not the driver's built-in default.
    let driver = LoopDriver::new(ImageDirs::new([&allowed]).unwrap());
    driver
        .provision(&options(
            r#"{"kubernetes.io/pvOrVolumeName":"w","requestBytes":"1048576"}"#,
        ))
        .unwrap();
    assert!(allowed.join("w.img").is_file());
    assert!(!Path::new(DEFAULT_IMAGE_DIR).join("w.img").exists());
}

#[test]
fn provision_names_the_volume_itself_and_never_adopts_or_deletes_anothers_image() {
    use flexvolume_driver::ErrorCode;
    let dir = tempfile::tempdir().unwrap();
    let driver = LoopDriver::new(ImageDirs::new([dir.path()]).unwrap());
    let json = |name: &str, extra: &str| {
        options(&format!(
            r#"{{"imageDir":"{}","kubernetes.io/pvOrVolumeName":"{name}"{extra}}}"#,
            dir.path().display()
        ))
    };
    // A static volume's image, made by attach.
    let victim = dir.path().join("victim.img");
    fs::write(&victim, b"someone's data").unwrap();
    let err = driver
        .provision(&json("new", r#","volumeID":"victim""#))
        .unwrap_err();
    assert_eq!(code_of(&err), Some(ErrorCode::InvalidArgument), "{err}");
    let err = driver.provision(&json("victim", "")).unwrap_err();
    assert_eq!(code_of(&err), Some(ErrorCode::AlreadyExists), "{err}");
    assert!(err.to_string().contains("not made by a provision"), "{err}");
    let err = driver
        .delete(&json("victim", r#","volumeID":"victim""#))
        .unwrap_err();
    assert!(err.to_string().contains("not made by a provision"), "{err}");
    assert_eq!(fs::read(&victim).unwrap(), b"someone's data");
    // An image put in the place of a provisioned one is not the one provision made.
    driver.provision(&json("mine", "")).unwrap();
    let mine = dir.path().join("mine.img");
    assert_eq!(fs::metadata(&mine).unwrap().len(), DEFAULT_SIZE);
    fs::remove_file(&mine).unwrap();
    fs::write(&mine, b"planted").unwrap();
    assert!(driver.delete(&json("mine", "")).is_err());
    assert_eq!(fs::read(&mine).unwrap(), b"planted");
    assert_eq!(
        code_of(&driver.provision(&json("mine", "")).unwrap_err()),
        Some(ErrorCode::AlreadyExists)
    );
}

#[test]
fn a_failed_provision_names_its_reason_and_leaves_nothing_behind() {
    use flexvolume_driver::ErrorCode;
    let dir = tempfile::tempdir().unwrap();
    let driver = LoopDriver::new(ImageDirs::new([dir.path()]).unwrap());
    let json = |extra: &str| {
        options(&format!(
            r#"{{"imageDir":"{}","kubernetes.io/pvOrVolumeName":"v"{extra}}}"#,
            dir.path().display()
        ))
    };
    for (extra, code) in [
        (r#","size":"1Ei""#, ErrorCode::OutOfRange),
        (r#","size":"16Ei""#, ErrorCode::OutOfRange),
        (r#","size":"0""#, ErrorCode::InvalidArgument),
        (r#","size":"big""#, ErrorCode::InvalidArgument),
        (
            r#","requestBytes":"9223372036854775808""#,
            ErrorCode::OutOfRange,
        ),
    ] {
        let err = driver.provision(&json(extra)).unwrap_err();
        assert_eq!(code_of(&err), Some(code), "{extra}: {err}");
        assert_eq!(entries(dir.path()), Vec::<String>::new(), "{extra}");
    }
    let err = driver
        .provision(&options(&format!(
            r#"{{"imageDir":"{}","kubernetes.io/pvOrVolumeName":"../x"}}"#,
            dir.path().display()
        )))
        .unwrap_err();
    assert_eq!(code_of(&err), Some(ErrorCode::InvalidArgument), "{err}");
    // The corrected retry under the same name.
    let made = driver.provision(&json(r#","size":"2Mi""#)).unwrap();
    assert_eq!(made.capacity_bytes, Some(2 << 20));
    assert_eq!(entries(dir.path()), [".v.lock", ".v.provisioned", "v.img"]);
    if which("losetup") {
        driver.delete(&json("")).unwrap();
        assert_eq!(entries(dir.path()), Vec::<String>::new());
    }
}

#[test]
fn a_lock_whose_file_was_removed_meanwhile_is_taken_again() {
    let dir = tempfile::tempdir().unwrap();
    let volume = Volume::new("v", dir.path()).unwrap();
    let held = volume.lock().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = {
        let volume = volume.clone();
        std::thread::spawn(move || {
            let lock = volume.lock().unwrap();
            tx.send(()).unwrap();
            same_file(&lock, &volume.lock_path()).unwrap()
        })
    };
    // Give the waiter time to open the old file and block on it.
    std::thread::sleep(std::time::Duration::from_millis(200));
    volume.remove_lock_file();
    drop(held);
    rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap();
    assert!(
        waiter.join().unwrap(),
        "the waiter holds the file at the path"
    );
}

fn which(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn init_reports_attach_and_metrics() {
    let caps = LoopDriver::default().init().unwrap();
    assert!(caps.attach && caps.supports_metrics && caps.requires_fs_resize);
    assert!(caps.provision);
}
