//! The reply parser on arbitrary driver output: never panics, and whatever it returns is a
//! reply it would find again in that reply's own JSON.
use flexvolume_protocol::{CallOutKind, ExitStatus};

/// Panics when an invariant breaks.
pub fn check(data: &[u8]) {
    // Split the input into stdout and stderr at the first NUL, as two streams.
    let (stdout, stderr) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    if let Some(reply) = flexvolume_protocol::find_reply(stdout) {
        let json = serde_json::to_vec(&reply).expect("a reply serialises");
        let again = flexvolume_protocol::find_reply(&json).expect("a serialised reply parses");
        assert_eq!(again.status, reply.status);
        assert_eq!(again.capabilities, reply.capabilities);
    }
    for exit in [
        ExitStatus::Code(0),
        ExitStatus::Code(1),
        ExitStatus::Signal(9),
    ] {
        let _ = flexvolume_protocol::interpret(
            CallOutKind::Mount,
            exit,
            stdout,
            stderr,
            flexvolume_protocol::excerpt,
        );
    }
}
