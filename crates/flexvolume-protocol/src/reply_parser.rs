//! Finding a reply in a driver's output and judging it with the exit status.
//!
//! Pure: no process, no filesystem. The runner hands us the raw output and exit status.
//! The scanner is more tolerant than kubelet's (which fails on all of these): log lines before
//! the JSON, several JSON objects in a row, `-ne ` from dash's `echo`, junk after the JSON, and
//! JSON on stderr when stdout has none.

use std::fmt;

use serde_json::Value;

use crate::call_out::CallOutKind;
use crate::error::ProtocolError;
use crate::reply::{Reply, Status};

/// How many `{` positions the scanner tries before giving up. Bounds the work on hostile
/// output (a megabyte of `{"a":"{"a":"…` would otherwise cost quadratic time).
const MAX_PARSE_ATTEMPTS: usize = 256;

/// Finds the reply in a driver's output: the first JSON object, anywhere in the text, that has a
/// recognisable `status`. Objects without one (log records in JSON, say) are skipped.
pub fn find_reply(output: &[u8]) -> Option<Reply> {
    let text = String::from_utf8_lossy(output);
    let mut attempts = 0;
    let mut pos = 0;
    while let Some(offset) = text[pos..].find('{') {
        attempts += 1;
        if attempts > MAX_PARSE_ATTEMPTS {
            return None;
        }
        let start = pos + offset;
        let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        let mut parsed_any = false;
        // Consecutive objects (`{…}{…}` or `{…}\n{…}`) are read in one go.
        while let Some(Ok(value)) = stream.next() {
            parsed_any = true;
            if let Some(reply) = value.as_object().and_then(Reply::from_object) {
                return Some(reply);
            }
        }
        pos = if parsed_any {
            start + stream.byte_offset().max(1)
        } else {
            start + 1
        };
    }
    None
}

/// How a driver process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Code(c) => write!(f, "exit status {c}"),
            Self::Signal(s) => write!(f, "killed by signal {s}"),
        }
    }
}

/// Longest excerpt of driver output quoted in an error message.
pub const QUOTE_LIMIT: usize = 512;

/// Applies the exit-status rules: the JSON status decides, except that `Success` together with a
/// failing exit is a driver bug. `quote` turns raw output into a redacted excerpt for errors.
pub fn interpret(
    kind: CallOutKind,
    exit: ExitStatus,
    stdout: &[u8],
    stderr: &[u8],
    quote: impl Fn(&[u8]) -> String,
) -> Result<Reply, ProtocolError> {
    // A reply on stdout wins; stderr is read only when stdout has none (some drivers log to
    // stdout and answer on stderr, or print everything to stderr).
    let reply = find_reply(stdout).or_else(|| find_reply(stderr));
    match reply {
        Some(reply) if reply.status == Status::Success && exit != ExitStatus::Code(0) => {
            Err(ProtocolError::SuccessWithBadExit { kind, exit })
        }
        Some(reply) => Ok(reply),
        None => {
            let shown = if stdout.iter().all(u8::is_ascii_whitespace) {
                stderr
            } else {
                stdout
            };
            Err(ProtocolError::NoReply {
                kind,
                exit,
                output: quote(shown),
            })
        }
    }
}

/// A lossy, truncated excerpt of output, for error messages. Redaction is the caller's job.
pub fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.len() <= QUOTE_LIMIT {
        return text.to_owned();
    }
    let mut end = QUOTE_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], bytes.len())
}
