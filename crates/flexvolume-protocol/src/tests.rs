//! Call-outs' argv and replies as kubelet builds and reads them.

use super::*;

fn reply(s: &str) -> Option<Reply> {
    find_reply(s.as_bytes())
}

#[test]
fn plain_reply() {
    let r = reply(r#"{"status":"Success","message":"ok","device":"/dev/sdb"}"#).unwrap();
    assert_eq!(r.status, Status::Success);
    assert_eq!(r.message, "ok");
    assert_eq!(r.device.as_deref(), Some("/dev/sdb"));
    assert_eq!(r.capabilities, None);
}

#[test]
fn capitalised_keys_and_partial_capabilities() {
    let r = reply(r#"{"Status":"Success","Capabilities":{"Attach":false}}"#).unwrap();
    let caps = r.capabilities.unwrap();
    assert!(!caps.attach);
    assert!(caps.selinux_relabel && caps.fs_group && caps.requires_fs_resize);
    assert!(!caps.supports_metrics);
    let r =
        reply(r#"{"status":"Success","capabilities":{"supportsMetrics":"true","FSGroup":false}}"#)
            .unwrap();
    let caps = r.capabilities.unwrap();
    assert!(caps.attach && caps.supports_metrics && !caps.fs_group);
}

#[test]
fn status_spellings() {
    for (s, want) in [
        ("Success", Status::Success),
        ("success", Status::Success),
        ("Failure", Status::Failure),
        ("Not supported", Status::NotSupported),
        ("Not Supported", Status::NotSupported),
        ("NotSupported", Status::NotSupported),
        ("not_supported", Status::NotSupported),
    ] {
        let r = reply(&format!(r#"{{"status":"{s}"}}"#)).unwrap();
        assert_eq!(r.status, want, "{s}");
    }
    assert_eq!(reply(r#"{"status":"Maybe"}"#), None);
    assert_eq!(reply(r#"{"status":1}"#), None);
}

#[test]
fn noise_around_the_json() {
    let noisy = [
        "starting driver\nmounting...\n{\"status\":\"Success\"}\n",
        "-ne {\"status\":\"Success\"}",
        "{\"status\":\"Success\"}trailing junk }}{",
        "{\"status\":\"Success\"}\n\n\n",
        "log {not json} then {\"status\":\"Success\"}",
        "{\"level\":\"info\",\"msg\":\"no status here\"}\n{\"status\":\"Success\"}",
    ];
    for text in noisy {
        assert_eq!(
            reply(text).map(|r| r.status),
            Some(Status::Success),
            "{text:?}"
        );
    }
}

#[test]
fn first_object_with_status_wins() {
    let r = reply(r#"{"status":"Failure","message":"no"}{"status":"Not supported"}"#).unwrap();
    assert_eq!((r.status, r.message.as_str()), (Status::Failure, "no"));
    let r = reply("{\"status\":\"Failure\"}\n{\"status\":\"Success\"}").unwrap();
    assert_eq!(r.status, Status::Failure);
}

#[test]
fn attached_and_sizes_tolerate_strings() {
    let r = reply(r#"{"status":"Success","attached":"true","volumeNewSize":"1024"}"#).unwrap();
    assert_eq!((r.attached, r.volume_new_size), (Some(true), Some(1024)));
    let r = reply(r#"{"status":"Success","attached":false,"volumeNewSize":2048}"#).unwrap();
    assert_eq!((r.attached, r.volume_new_size), (Some(false), Some(2048)));
}

#[test]
fn named_errors_provision_capability_and_options() {
    let r = reply(r#"{"status":"Failure","message":"gone","code":"NotFound"}"#).unwrap();
    assert_eq!(r.code, Some(ErrorCode::NotFound));
    for (raw, want) in [
        ("not_found", Some(ErrorCode::NotFound)),
        ("Already Exists", Some(ErrorCode::AlreadyExists)),
        ("outofcapacity", Some(ErrorCode::OutOfCapacity)),
        ("Busy", None),
    ] {
        assert_eq!(ErrorCode::parse(raw), want, "{raw}");
    }
    let r = reply(r#"{"status":"Failure","code":7}"#).unwrap();
    assert_eq!(r.code, None);
    let r = reply(r#"{"status":"Success","capabilities":{"provision":true}}"#).unwrap();
    assert!(r.capabilities.unwrap().provision);
    assert!(!Capabilities::default().provision);
    let json = serde_json::to_string(&Capabilities::default()).unwrap();
    assert!(!json.contains("provision"), "{json}");
    let r = reply(r#"{"status":"Success","options":{"volumeID":"v","size":5,"x":{}}}"#).unwrap();
    let options = r.options.unwrap();
    assert_eq!(options["volumeID"], "v");
    assert_eq!(options["size"], "5");
    assert!(!options.contains_key("x"));
}

#[test]
fn no_reply_in_garbage() {
    for text in [
        "",
        "usage: driver <cmd>",
        "{",
        "{{{{",
        "[1,2]",
        "\"status\"",
        "{\"a\":1}",
    ] {
        assert_eq!(reply(text), None, "{text:?}");
    }
}

#[test]
fn hostile_output_is_bounded() {
    // A megabyte of nested unterminated strings must not take quadratic time; it is simply
    // not a reply.
    let hostile = "{\"a\":\"".repeat(200_000);
    assert_eq!(reply(&hostile), None);
    let deep = "{\"a\":".repeat(100_000);
    assert_eq!(reply(&deep), None);
}

fn run(exit: ExitStatus, out: &str, err: &str) -> Result<Reply, ProtocolError> {
    interpret(
        CallOutKind::Mount,
        exit,
        out.as_bytes(),
        err.as_bytes(),
        excerpt,
    )
}

#[test]
fn exit_status_rules() {
    let ok = run(ExitStatus::Code(0), r#"{"status":"Success"}"#, "").unwrap();
    assert_eq!(ok.status, Status::Success);
    let failure = run(
        ExitStatus::Code(0),
        r#"{"status":"Failure","message":"m"}"#,
        "",
    )
    .unwrap();
    assert_eq!(failure.status, Status::Failure);
    let ns = run(ExitStatus::Code(1), r#"{"status":"Not supported"}"#, "").unwrap();
    assert_eq!(ns.status, Status::NotSupported);
    assert_eq!(
        run(ExitStatus::Code(2), r#"{"status":"Success"}"#, ""),
        Err(ProtocolError::SuccessWithBadExit {
            kind: CallOutKind::Mount,
            exit: ExitStatus::Code(2)
        })
    );
    assert!(matches!(
        run(ExitStatus::Signal(11), r#"{"status":"Success"}"#, ""),
        Err(ProtocolError::SuccessWithBadExit { .. })
    ));
}

#[test]
fn stderr_is_used_only_when_stdout_is_empty() {
    let r = run(ExitStatus::Code(0), "", r#"{"status":"Success"}"#).unwrap();
    assert_eq!(r.status, Status::Success);
    let r = run(
        ExitStatus::Code(0),
        r#"{"status":"Failure"}"#,
        r#"{"status":"Success"}"#,
    )
    .unwrap();
    assert_eq!(r.status, Status::Failure);
}

#[test]
fn no_reply_quotes_output_and_exit() {
    let err = run(ExitStatus::Code(1), "usage: drv init|mount\n", "").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("usage: drv init|mount"), "{msg}");
    assert!(msg.contains("exit status 1"), "{msg}");
    let err = run(ExitStatus::Code(1), "", "boom on stderr").unwrap_err();
    assert!(err.to_string().contains("boom on stderr"));
}

#[test]
fn excerpt_truncates_on_char_boundary() {
    let long = "é".repeat(1000);
    let e = excerpt(long.as_bytes());
    assert!(e.contains("2000 bytes in all"));
    assert!(e.len() < QUOTE_LIMIT + 40);
}

#[test]
fn call_out_names_round_trip_and_arity_is_checked() {
    for kind in CallOutKind::ALL {
        assert_eq!(kind.as_str().parse::<CallOutKind>(), Ok(kind));
        assert_eq!(kind.usage().split(' ').count() - 1, kind.arity());
    }
    let err = CallOut::from_raw(CallOutKind::Mount, vec!["/t".into()]).unwrap_err();
    assert!(err.to_string().contains("mount <target-dir> <json>"));
}
