//! How every command's errors are printed: one line, each cause once. Shared by the CLI's
//! `flexd: error:` line and the CSI statuses `flexd serve` answers.

/// The error with its causes, as one message. A cause whose text the message already holds
/// (many errors quote their source) is not repeated.
pub fn message_of(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}
