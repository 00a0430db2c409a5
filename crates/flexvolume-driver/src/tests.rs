//! Every call-out, argv built by the host library exactly as flexd (and kubelet) passes it,
//! parsed here, answered, and the reply's bytes and exit status checked.

use std::cell::RefCell;
use std::ffi::OsString;
use std::path::Path;

use flexvolume_protocol::{CallOut, DriverName, Options, VolumeSpec};

use super::*;

fn spec() -> VolumeSpec {
    let mut spec = VolumeSpec::new("pv-1".into(), DriverName::parse("flexd/loop").unwrap());
    spec.fs_type = "xfs".into();
    spec.options.insert("size".into(), "1Gi".into());
    spec
}

fn mount_options() -> Options {
    let mut spec = spec();
    spec.secrets.insert("password".into(), b"hunter2".to_vec());
    let pod = PodInfo {
        name: "web-0".into(),
        namespace: "prod".into(),
        uid: "uid-1".into(),
        service_account: "sa".into(),
    };
    Options::for_mount(&spec, &pod, Some(2000))
}

/// argv after the executable, as the host builds it.
fn argv(call: &CallOut) -> Vec<OsString> {
    let mut args = vec![OsString::from(call.kind.as_str())];
    args.extend(call.args.iter().cloned());
    args
}

/// Answers everything, recording what it was given.
#[derive(Default)]
struct Recorder {
    seen: RefCell<Vec<String>>,
}

impl Recorder {
    fn saw(&self, what: String) {
        self.seen.borrow_mut().push(what);
    }
}

impl Driver for Recorder {
    fn init(&self) -> DriverResult<Capabilities> {
        Ok(Capabilities {
            attach: false,
            supports_metrics: true,
            ..Capabilities::default()
        })
    }
    fn get_volume_name(&self, o: &VolumeOptions) -> DriverResult<String> {
        Ok(format!("vol/{}", o.pv_or_volume_name().unwrap_or("?")))
    }
    fn attach(&self, o: &VolumeOptions, node: &str) -> DriverResult<String> {
        self.saw(format!("attach {} {node}", o.get("size").unwrap_or("?")));
        Ok("/dev/loop7".into())
    }
    fn wait_for_attach(&self, device: &str, _: &VolumeOptions) -> DriverResult<String> {
        Ok(device.to_owned())
    }
    fn is_attached(&self, _: &VolumeOptions, node: &str) -> DriverResult<bool> {
        Ok(node == "node-1")
    }
    fn mount_device(&self, dir: &Path, device: &str, o: &VolumeOptions) -> DriverResult<()> {
        self.saw(format!(
            "mountdevice {} {device} {:?} {}",
            dir.display(),
            o.fs_type(),
            o.read_only()
        ));
        Ok(())
    }
    fn detach(&self, name: &str, node: &str) -> DriverResult<()> {
        self.saw(format!("detach {name} {node}"));
        Ok(())
    }
    fn unmount_device(&self, dir: &Path) -> DriverResult<()> {
        self.saw(format!("unmountdevice {}", dir.display()));
        Ok(())
    }
    fn mount(&self, target: &Path, o: &VolumeOptions) -> DriverResult<()> {
        let pod = o.pod();
        self.saw(format!(
            "mount {} {} {} {} {} {:?} {:?}",
            target.display(),
            pod.name,
            pod.namespace,
            pod.uid,
            pod.service_account,
            o.fs_group(),
            o.secret("password").map(|s| s.expose().to_vec())
        ));
        Ok(())
    }
    fn unmount(&self, target: &Path) -> DriverResult<()> {
        self.saw(format!("unmount {}", target.display()));
        Ok(())
    }
    fn expand_volume(
        &self,
        _: &VolumeOptions,
        dir: &Path,
        new: u64,
        old: u64,
    ) -> DriverResult<u64> {
        self.saw(format!("expandvolume {} {new} {old}", dir.display()));
        Ok(new + 1)
    }
    fn expand_fs(
        &self,
        _: &VolumeOptions,
        device: &str,
        dir: &Path,
        new: u64,
        old: u64,
    ) -> DriverResult<()> {
        self.saw(format!("expandfs {device} {} {new} {old}", dir.display()));
        Ok(())
    }
    fn provision(&self, o: &VolumeOptions) -> DriverResult<Provisioned> {
        self.saw(format!(
            "provision {} {:?} {}",
            o.pv_or_volume_name().unwrap_or("?"),
            o.request_bytes(),
            o.get("requestGiB").unwrap_or("?")
        ));
        Ok(Provisioned::from([(
            "volumeID".to_owned(),
            "v-1".to_owned(),
        )]))
    }
    fn delete(&self, o: &VolumeOptions) -> DriverResult<()> {
        if o.get("volumeID") == Some("gone") {
            return Err(DriverError::not_found("no volume gone"));
        }
        self.saw(format!("delete {}", o.get("volumeID").unwrap_or("?")));
        Ok(())
    }
}

/// Only init: everything else must answer Not supported, exit 1.
struct Minimal;
impl Driver for Minimal {
    fn init(&self) -> DriverResult<Capabilities> {
        Ok(Capabilities::default())
    }
}

/// One host-built call-out per kind, with the reply the Recorder must give (exact bytes) and
/// what it must have seen.
fn every_call_out() -> Vec<(CallOut, &'static str, Option<&'static str>)> {
    let volume = Options::for_volume(&spec());
    let dir = Path::new("/var/lib/flexd/devices/flexd~loop/pv-1");
    let target = Path::new("/pods/p/volumes/my vol");
    vec![
        (
            CallOut::init(),
            r#"{"status":"Success","capabilities":{"attach":false,"selinuxRelabel":true,"supportsMetrics":true,"fsGroup":true,"requiresFSResize":true}}"#,
            None,
        ),
        (
            CallOut::get_volume_name(&volume),
            r#"{"status":"Success","volumeName":"vol/pv-1"}"#,
            None,
        ),
        (
            CallOut::attach(&volume, "node-1"),
            r#"{"status":"Success","device":"/dev/loop7"}"#,
            Some("attach 1Gi node-1"),
        ),
        (
            CallOut::wait_for_attach("/dev/loop7", &volume),
            r#"{"status":"Success","device":"/dev/loop7"}"#,
            None,
        ),
        (
            CallOut::is_attached(&volume, "node-2"),
            r#"{"status":"Success","attached":false}"#,
            None,
        ),
        (
            CallOut::mount_device(dir, "/dev/loop7", &volume),
            r#"{"status":"Success"}"#,
            Some("mountdevice /var/lib/flexd/devices/flexd~loop/pv-1 /dev/loop7 Some(\"xfs\") false"),
        ),
        (
            CallOut::detach("flexd~pv-1", "node-1"),
            r#"{"status":"Success"}"#,
            Some("detach flexd~pv-1 node-1"),
        ),
        (
            CallOut::unmount_device(dir),
            r#"{"status":"Success"}"#,
            Some("unmountdevice /var/lib/flexd/devices/flexd~loop/pv-1"),
        ),
        (
            CallOut::mount(target, &mount_options()),
            r#"{"status":"Success"}"#,
            Some("mount /pods/p/volumes/my vol web-0 prod uid-1 sa Some(2000) Some([104, 117, 110, 116, 101, 114, 50])"),
        ),
        (
            CallOut::unmount(target),
            r#"{"status":"Success"}"#,
            Some("unmount /pods/p/volumes/my vol"),
        ),
        (
            CallOut::expand_volume(&volume, dir, 2 << 30, 1 << 30),
            r#"{"status":"Success","volumeNewSize":2147483649}"#,
            Some("expandvolume /var/lib/flexd/devices/flexd~loop/pv-1 2147483648 1073741824"),
        ),
        (
            CallOut::expand_fs(&volume, "/dev/loop7", dir, 2 << 30, 1 << 30),
            r#"{"status":"Success"}"#,
            Some("expandfs /dev/loop7 /var/lib/flexd/devices/flexd~loop/pv-1 2147483648 1073741824"),
        ),
        (
            CallOut::provision(&Options::for_provision(&spec(), Some((1 << 30) + 1))),
            r#"{"status":"Success","options":{"volumeID":"v-1"}}"#,
            Some("provision pv-1 Some(1073741825) 2"),
        ),
        (
            CallOut::delete(&Options::for_provision(&provisioned(), None)),
            r#"{"status":"Success"}"#,
            Some("delete v-1"),
        ),
    ]
}

fn provisioned() -> VolumeSpec {
    let mut spec = spec();
    spec.options.insert("volumeID".into(), "v-1".into());
    spec
}

#[test]
fn a_named_failure_carries_its_code_and_the_host_reads_it() {
    let mut spec = spec();
    spec.options.insert("volumeID".into(), "gone".into());
    let call = CallOut::delete(&Options::for_provision(&spec, None));
    let response = handle(&Recorder::default(), &argv(&call));
    assert_eq!(
        response.to_json(),
        r#"{"status":"Failure","message":"no volume gone","code":"NotFound"}"#
    );
    assert_eq!(response.exit_code, 1);
    let back = flexvolume_protocol::find_reply(response.to_json().as_bytes()).unwrap();
    assert_eq!(back.code, Some(ErrorCode::NotFound));
    // A driver that does not provision says so, and the host falls back to static volumes.
    let call = CallOut::provision(&Options::for_provision(&spec, None));
    let response = handle(&Minimal, &argv(&call));
    assert_eq!(response.reply.status, Status::NotSupported);
}

#[test]
fn every_call_out_parses_the_hosts_argv_and_answers_exact_bytes() {
    let cases = every_call_out();
    let kinds: Vec<CallOutKind> = cases.iter().map(|(c, _, _)| c.kind).collect();
    assert_eq!(kinds, CallOutKind::ALL, "one case per call-out");
    for (call, want_reply, want_seen) in cases {
        let driver = Recorder::default();
        let args = argv(&call);
        assert_eq!(Request::parse(&args).unwrap().kind(), call.kind);
        let response = handle(&driver, &args);
        assert_eq!(response.to_json(), want_reply, "{}", call.kind);
        assert_eq!(response.exit_code, 0, "{}", call.kind);
        assert_eq!(
            driver.seen.borrow().first().map(String::as_str),
            want_seen,
            "{}",
            call.kind
        );
        // What the host's own parser reads from these bytes is the same reply.
        let back = flexvolume_protocol::find_reply(response.to_json().as_bytes()).unwrap();
        assert_eq!(back, response.reply, "{}", call.kind);
    }
}

#[test]
fn unimplemented_call_outs_answer_not_supported_with_exit_1() {
    for (call, _, _) in every_call_out() {
        let response = handle(&Minimal, &argv(&call));
        if call.kind == CallOutKind::Init {
            assert_eq!(response.exit_code, 0);
            continue;
        }
        assert_eq!(response.reply.status, Status::NotSupported, "{}", call.kind);
        assert_eq!(response.exit_code, 1);
        assert_eq!(
            response.to_json(),
            format!(
                r#"{{"status":"Not supported","message":"{} is not supported by this driver"}}"#,
                call.kind
            )
        );
    }
}

#[test]
fn parsed_requests_carry_every_argument() {
    let volume = Options::for_volume(&spec());
    let dir = Path::new("/d");
    let parsed = Request::parse(&argv(&CallOut::expand_fs(&volume, "/dev/x", dir, 9, 4))).unwrap();
    let Request::ExpandFs { options, .. } = &parsed else {
        panic!("{parsed:?}")
    };
    assert_eq!(options.options().to_json(), volume.to_json());
    let expected = Request::ExpandFs {
        options: options.clone(),
        device: "/dev/x".into(),
        dir: "/d".into(),
        new_bytes: 9,
        old_bytes: 4,
    };
    assert_eq!(parsed, expected);
    let mount = Request::parse(&argv(&CallOut::mount(Path::new("/t"), &mount_options()))).unwrap();
    let Request::Mount { options, .. } = mount else {
        panic!()
    };
    assert_eq!(options.pv_or_volume_name(), Some("pv-1"));
    assert_eq!(options.fs_type(), Some("xfs"));
    assert!(!options.read_only());
    assert_eq!(options.fs_group(), Some(2000));
    assert_eq!(options.get("size"), Some("1Gi"));
    // Debug never shows a secret, raw or base64.
    let shown = format!("{options:?} {:?}", options.secret("password"));
    assert!(
        !shown.contains("hunter2") && !shown.contains("aHVudGVyMg=="),
        "{shown}"
    );
}

#[test]
fn unknown_call_outs_answer_not_supported_and_bad_argv_answers_failure() {
    let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
    let unknown = handle(&Recorder::default(), &os(&["getdevicepath", "x"]));
    assert_eq!(unknown.reply.status, Status::NotSupported);
    assert_eq!(unknown.exit_code, 1);

    for (args, message) in [
        (os(&[]), "no call-out given"),
        (
            os(&["mount", "/t"]),
            "mount takes 2 argument(s) (mount <target-dir> <json>), 1 given",
        ),
        (os(&["init", "extra"]), "init takes 0 argument(s)"),
        (os(&["mount", "/t", "{not json"]), "mount: bad <json>"),
        (
            os(&["attach", r#"{"a":["b"]}"#, "n"]),
            "option \"a\" is not a string",
        ),
        (
            os(&["attach", r#"{"kubernetes.io/readwrite":"rx"}"#, "n"]),
            "kubernetes.io/readwrite is \"rx\"",
        ),
        (
            os(&[
                "mount",
                "/t",
                r#"{"kubernetes.io/mounterArgs.FsGroup":"staff"}"#,
            ]),
            "FsGroup is \"staff\"",
        ),
        (
            os(&["expandvolume", "{}", "/d", "lots", "1"]),
            "<new-bytes> is \"lots\", not a number of bytes",
        ),
        (
            os(&["expandfs", "{}", "/dev/x", "/d", "1", "-1"]),
            "<old-bytes> is \"-1\"",
        ),
    ] {
        let response = handle(&Recorder::default(), &args);
        assert_eq!(response.reply.status, Status::Failure, "{args:?}");
        assert_eq!(response.exit_code, 1);
        assert!(
            response.reply.message.contains(message),
            "{args:?}: {}",
            response.reply.message
        );
    }

    use std::os::unix::ffi::OsStringExt;
    let not_utf8 = vec![
        OsString::from("detach"),
        OsString::from_vec(vec![0xff]),
        "n".into(),
    ];
    let response = handle(&Recorder::default(), &not_utf8);
    assert_eq!(
        response.reply.message,
        "detach: argument <volume-name> is not UTF-8"
    );
    // Paths need not be UTF-8.
    let unmount = vec![
        OsString::from("unmount"),
        OsString::from_vec(vec![b'/', 0xff]),
    ];
    assert_eq!(handle(&Recorder::default(), &unmount).exit_code, 0);
}

#[test]
fn a_bad_secret_is_refused_without_quoting_it() {
    let args: Vec<OsString> = vec![
        "mount".into(),
        "/t".into(),
        r#"{"kubernetes.io/secret/pw":"s3cret!!"}"#.into(),
    ];
    let response = handle(&Recorder::default(), &args);
    assert_eq!(response.reply.status, Status::Failure);
    assert!(
        !response.to_json().contains("s3cret"),
        "{}",
        response.to_json()
    );
}

/// Fails quoting its options and panics on unmount.
struct Careless;
impl Driver for Careless {
    fn init(&self) -> DriverResult<Capabilities> {
        Ok(Capabilities::default())
    }
    fn mount(&self, _: &Path, o: &VolumeOptions) -> DriverResult<()> {
        let pw = o.secret("password").unwrap();
        Err(DriverError::failure(format!(
            "login with {} failed; options {}",
            String::from_utf8_lossy(pw.expose()),
            o.options().to_json()
        )))
    }
    fn unmount(&self, _: &Path) -> DriverResult<()> {
        let v: Vec<u8> = Vec::new();
        let _ = v[3];
        Ok(())
    }
}

#[test]
fn failure_messages_are_redacted_and_panics_become_failures() {
    let response = handle(
        &Careless,
        &argv(&CallOut::mount(Path::new("/t"), &mount_options())),
    );
    assert_eq!(response.reply.status, Status::Failure);
    let json = response.to_json();
    assert!(
        !json.contains("hunter2") && !json.contains("aHVudGVyMg=="),
        "{json}"
    );
    assert!(json.contains("login with <redacted> failed"), "{json}");

    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let response = handle(&Careless, &argv(&CallOut::unmount(Path::new("/t"))));
    std::panic::set_hook(quiet);
    assert_eq!(response.reply.status, Status::Failure);
    assert_eq!(response.exit_code, 1);
    assert!(
        response
            .reply
            .message
            .starts_with("driver bug: unmount panicked: index out of bounds"),
        "{}",
        response.reply.message
    );
}

#[test]
fn context_turns_any_error_into_a_failure() {
    let err: DriverResult<()> = std::fs::read("/nonexistent/flexd")
        .map(drop)
        .context("read x");
    match err {
        Err(DriverError::Failure(m)) => assert!(m.starts_with("read x: "), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// A shared-storage driver's attach runs in the controller and knows no device (the node that
/// mounts makes its own): it answers an empty one. kubelet's FlexVolume attacher passes that on
/// as waitforattach's first argument, an empty argv entry, which the driver must receive as is.
#[test]
fn an_empty_device_from_attach_is_waitforattachs_empty_argument() {
    struct Shared;
    impl Driver for Shared {
        fn init(&self) -> DriverResult<Capabilities> {
            Ok(Capabilities::default())
        }
        fn attach(&self, _: &VolumeOptions, _: &str) -> DriverResult<String> {
            Ok(String::new())
        }
        fn wait_for_attach(&self, device: &str, o: &VolumeOptions) -> DriverResult<String> {
            if !device.is_empty() {
                return Err(DriverError::failure(format!("given {device:?}")));
            }
            Ok(format!("/dev/{}", o.pv_or_volume_name().unwrap_or("?")))
        }
    }
    let volume = Options::for_volume(&spec());
    let attach = handle(&Shared, &argv(&CallOut::attach(&volume, "node-1")));
    assert_eq!(attach.to_json(), r#"{"status":"Success","device":""}"#);
    assert_eq!(attach.exit_code, 0);
    let back = flexvolume_protocol::find_reply(attach.to_json().as_bytes()).unwrap();
    assert_eq!(back.device.as_deref(), Some(""));
    // What the host builds from it, and kubelet's argv written out by hand.
    let call = CallOut::wait_for_attach("", &volume);
    let by_hand: Vec<OsString> = vec!["waitforattach".into(), "".into(), volume.to_json().into()];
    assert_eq!(argv(&call), by_hand);
    let parsed = Request::parse(&by_hand).unwrap();
    assert!(
        matches!(&parsed, Request::WaitForAttach { device, .. } if device.is_empty()),
        "{parsed:?}"
    );
    let wait = handle(&Shared, &by_hand);
    assert_eq!(
        wait.to_json(),
        r#"{"status":"Success","device":"/dev/pv-1"}"#
    );
    assert_eq!(wait.exit_code, 0);
}
