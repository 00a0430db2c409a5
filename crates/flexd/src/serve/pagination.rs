//! ListVolumes' pages (docs/csi.md#list-volumes): `max_entries` entries at most (0: flexd's
//! page), and a `next_token` that carries where the records' store resumes: the last record
//! returned (the state dir), or the API server's continue token.
//!
//! Why not an index: volumes come and go between two pages (a CreateVolume, a detach). An index
//! shifts with every volume removed before it, and the next page then skips a volume that was
//! never returned; resuming where the store left off is immune to that: a volume removed is
//! simply not there, and no volume is ever returned twice. flexd keeps no record of the
//! listing, so a token stays usable across restarts and replicas (the API server's for a few
//! minutes: an expired one is ABORTED, and the CO lists again).
//!
//! The token is `after:` and the store's token's bytes in hex: opaque to the CO, free of any
//! character a header or a log might mangle, and recognisably flexd's, so that anything else
//! (csi-sanity's `invalid-token`, a token of another plugin) is ABORTED, as CSI asks for a token
//! that cannot be used. Pure: no I/O, no clock.

use std::fmt::Write as _;

use tonic::Status;

/// What every token flexd hands out starts with.
const TOKEN_PREFIX: &str = "after:";

/// The longest store token a ListVolumes token carries (an API server's continue token is a
/// few hundred bytes).
const MAX_STORE_TOKEN: usize = 4096;

/// The token of a page after which the store resumes at `id`.
pub fn token_after(id: &str) -> String {
    let mut token = String::with_capacity(TOKEN_PREFIX.len() + 2 * id.len());
    token.push_str(TOKEN_PREFIX);
    for byte in id.bytes() {
        let _ = write!(token, "{byte:02x}");
    }
    token
}

/// Where the store resumes for a `starting_token` (`None`: from the start, an empty token). A
/// token flexd cannot have handed out is ABORTED, as CSI asks.
pub fn resume_after(token: &str) -> Result<Option<String>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    let refuse = || {
        Status::aborted(format!(
            "starting_token {:?} is not one flexd handed out (start again with no token)",
            token.chars().take(64).collect::<String>()
        ))
    };
    let hex = token.strip_prefix(TOKEN_PREFIX).ok_or_else(refuse)?;
    if hex.is_empty() || hex.len() % 2 != 0 || hex.len() > 2 * MAX_STORE_TOKEN {
        return Err(refuse());
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| refuse())?;
    let id = String::from_utf8(bytes).map_err(|_| refuse())?;
    if id.chars().any(char::is_control) {
        return Err(refuse());
    }
    Ok(Some(id))
}

/// `max_entries` as a page size (`None`: none asked, flexd's own); negative is
/// INVALID_ARGUMENT (CSI: it "MUST NOT be negative").
pub fn page_size(max_entries: i32) -> Result<Option<usize>, Status> {
    match max_entries {
        0 => Ok(None),
        n if n < 0 => Err(Status::invalid_argument(format!(
            "max_entries is {n}: it must not be negative (0 means no limit)"
        ))),
        n => Ok(Some(n as usize)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn tokens_round_trip_any_id_and_refuse_anything_else() {
        for id in ["pvc-1", "a b", "é~.x", &"v".repeat(MAX_STORE_TOKEN)] {
            let token = token_after(id);
            assert!(token.is_ascii(), "{token}");
            assert_eq!(resume_after(&token).unwrap().as_deref(), Some(id));
        }
        assert_eq!(resume_after("").unwrap(), None);
        let too_long = token_after(&"v".repeat(MAX_STORE_TOKEN + 1));
        for bad in [
            "invalid-token",
            "after:",
            "after:7",
            "after:zz",
            "after:610a62",
            "after:ff",
            "AFTER:61",
            too_long.as_str(),
        ] {
            let err = resume_after(bad).unwrap_err();
            assert_eq!(err.code(), Code::Aborted, "{bad}");
        }
        let huge = "x".repeat(1 << 20);
        assert!(resume_after(&huge).unwrap_err().message().len() < 200);
    }

    #[test]
    fn max_entries_zero_is_flexds_choice_and_negative_is_invalid() {
        assert_eq!(page_size(0).unwrap(), None);
        assert_eq!(page_size(3).unwrap(), Some(3));
        assert_eq!(page_size(-1).unwrap_err().code(), Code::InvalidArgument);
    }
}
