//! How deep the input's YAML flow collections (`{…}`, `[…]`) nest, found before parsing.
//!
//! libyaml's scanner, which serde_yaml_ng parses with, checks every open flow collection for a
//! stale simple key at every token: a document nested `n` levels deep costs `n²` (100,000
//! levels, 500 KB, took 38 s in a release build), all of it before serde_yaml_ng's own
//! recursion limit of 128 refuses the document anyway. So the same scanner is run here first,
//! alone, and stopped at the first collection deeper than that limit: each token then costs at
//! most the limit, and the input is refused where it goes too deep. Using the parser's own
//! scanner (rather than counting brackets) means a `{` inside a quoted or block scalar or a
//! comment is never taken for nesting, and real nesting is never missed.

use std::mem::MaybeUninit;

use unsafe_libyaml::{
    yaml_parser_delete, yaml_parser_initialize, yaml_parser_scan, yaml_parser_set_input_string,
    yaml_parser_t, yaml_token_delete, yaml_token_t, yaml_token_type_t,
};

/// serde_yaml_ng's recursion limit: a document nested deeper is refused by the parse anyway.
pub(crate) const MAX_NESTING: usize = 128;

/// Where flow collections first nest deeper than the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooDeep {
    /// 1-based, as `migrate` counts documents.
    pub document: usize,
    /// 1-based.
    pub line: u64,
    /// 1-based.
    pub column: u64,
}

/// `Err` at the first flow collection opened more than `limit` deep. A syntax error ends the
/// scan with `Ok`: the parse that follows reports it, and meets no deeper nesting before it.
pub(crate) fn check_flow_nesting(text: &str, limit: usize) -> Result<(), TooDeep> {
    // Nesting deeper than the limit takes more opening brackets than that: block-style YAML
    // (kubectl's) has few, and is not scanned twice.
    if text.bytes().filter(|b| matches!(b, b'{' | b'[')).count() <= limit {
        return Ok(());
    }
    let Some(mut scanner) = Scanner::new(text) else {
        return Ok(());
    };
    let (mut document, mut document_started, mut depth) = (1, false, 0usize);
    while let Some(token) = scanner.next_token() {
        use yaml_token_type_t::{
            YAML_DOCUMENT_START_TOKEN, YAML_FLOW_MAPPING_END_TOKEN, YAML_FLOW_MAPPING_START_TOKEN,
            YAML_FLOW_SEQUENCE_END_TOKEN, YAML_FLOW_SEQUENCE_START_TOKEN, YAML_STREAM_END_TOKEN,
            YAML_STREAM_START_TOKEN,
        };
        match token.kind {
            YAML_STREAM_END_TOKEN => break,
            YAML_STREAM_START_TOKEN => {}
            YAML_DOCUMENT_START_TOKEN if document_started => {
                document += 1;
                depth = 0;
            }
            YAML_FLOW_SEQUENCE_START_TOKEN | YAML_FLOW_MAPPING_START_TOKEN => {
                depth += 1;
                if depth > limit {
                    return Err(TooDeep {
                        document,
                        line: token.line + 1,
                        column: token.column + 1,
                    });
                }
            }
            YAML_FLOW_SEQUENCE_END_TOKEN | YAML_FLOW_MAPPING_END_TOKEN => {
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        if token.kind != YAML_STREAM_START_TOKEN {
            document_started = true;
        }
    }
    Ok(())
}

/// What the check needs of one token.
struct Token {
    kind: yaml_token_type_t,
    line: u64,
    column: u64,
}

/// A libyaml scanner over a string it borrows, deleted on drop.
struct Scanner<'text> {
    /// Boxed: libyaml keeps a pointer to the parser inside it, so it must never move.
    parser: Box<MaybeUninit<yaml_parser_t>>,
    _text: std::marker::PhantomData<&'text str>,
}

impl<'text> Scanner<'text> {
    fn new(text: &'text str) -> Option<Self> {
        let mut parser = Box::new(MaybeUninit::<yaml_parser_t>::uninit());
        let length = u64::try_from(text.len()).ok()?;
        // SAFETY: initialize fills the parser (or fails, leaving nothing to delete); the input
        // is `text`, which the returned scanner borrows for as long as it lives.
        unsafe {
            if yaml_parser_initialize(parser.as_mut_ptr()).fail {
                return None;
            }
            yaml_parser_set_input_string(parser.as_mut_ptr(), text.as_ptr(), length);
        }
        Some(Self {
            parser,
            _text: std::marker::PhantomData,
        })
    }

    /// The next token; `None` after a syntax error.
    fn next_token(&mut self) -> Option<Token> {
        let mut token = MaybeUninit::<yaml_token_t>::uninit();
        // SAFETY: the parser was initialized in `new`; scan fills the token (zeroed on failure,
        // when it owns nothing), and a filled token is read, then deleted, exactly once.
        unsafe {
            if yaml_parser_scan(self.parser.as_mut_ptr(), token.as_mut_ptr()).fail {
                return None;
            }
            let filled = token.assume_init_mut();
            let scanned = Token {
                kind: filled.type_,
                line: filled.start_mark.line,
                column: filled.start_mark.column,
            };
            yaml_token_delete(filled);
            Some(scanned)
        }
    }
}

impl Drop for Scanner<'_> {
    fn drop(&mut self) {
        // SAFETY: the parser was initialized in `new` and is deleted only here.
        unsafe { yaml_parser_delete(self.parser.as_mut_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_is_counted_by_the_parsers_own_tokens() {
        assert_eq!(check_flow_nesting("a: {b: [c]}\n", 2), Ok(()));
        let too_deep = TooDeep {
            document: 1,
            line: 1,
            column: 9,
        };
        assert_eq!(check_flow_nesting("a: {b: [{c: d}]}\n", 2), Err(too_deep));
        // Brackets in scalars and comments are text, not nesting.
        let text = "a: '[[[['\nb: \"{{{{\"\nc: |\n  [[[[\n# {{{{\nd: x[[[[\n";
        assert_eq!(check_flow_nesting(text, 1), Ok(()));
        // Each document starts at the top.
        let text = "a: [[1]]\n---\nb: [[2]]\n---\nc: [[[3]]]\n";
        assert_eq!(
            check_flow_nesting(text, 2),
            Err(TooDeep {
                document: 3,
                line: 5,
                column: 6
            })
        );
        assert_eq!(
            check_flow_nesting("---\na: 1\n---\nb: [[[x]]]\n", 2).map_err(|e| e.document),
            Err(2)
        );
        // A syntax error is the parse's to report.
        assert_eq!(check_flow_nesting("a: [\"unterminated\n", 2), Ok(()));
    }
}
