//! The protocol layer's errors.

use crate::call_out::CallOutKind;
use crate::reply_parser::ExitStatus;

/// Errors of the protocol layer: a reply that is not one, or an answer that breaks the rules.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    #[error("call-out {kind} takes {} argument(s) ({}), {given} given", kind.arity(), kind.usage())]
    Arity { kind: CallOutKind, given: usize },
    #[error("driver gave no parsable reply to {kind} ({exit}); output: {output:?}")]
    NoReply {
        kind: CallOutKind,
        exit: ExitStatus,
        /// Redacted and truncated.
        output: String,
    },
    #[error("driver bug: {kind} answered Success but ended with {exit}")]
    SuccessWithBadExit { kind: CallOutKind, exit: ExitStatus },
}
