//! ListVolumes' pages (docs/csi.md#list-volumes): entries sorted by volume id, `max_entries` of
//! them at most (0: all), and a `next_token` that names the last id returned, so that the next
//! page starts after it.
//!
//! Why the last id and not an index: volumes come and go between two pages (a CreateVolume, a
//! detach). An index shifts with every volume removed before it, and the next page then skips
//! a volume that was never returned; resuming after an id is immune to that: a volume removed
//! is simply not there, one added later in the order is returned, one added earlier in the order
//! is missed (CSI allows that), and no volume is ever returned twice. The id needs no record of
//! the listing on flexd's side, so a token stays usable across restarts.
//!
//! The token is `after:` and the id's bytes in hex: opaque to the CO, free of any character a
//! header or a log might mangle, and recognisably flexd's, so that anything else (csi-sanity's
//! `invalid-token`, a token of another plugin) is ABORTED, as CSI asks for a token that cannot
//! be used. Pure: no I/O, no clock.

use std::fmt::Write as _;

use tonic::Status;

/// What every token flexd hands out starts with.
const TOKEN_PREFIX: &str = "after:";

/// The token of a page that ended at volume `id`.
pub fn token_after(id: &str) -> String {
    let mut token = String::with_capacity(TOKEN_PREFIX.len() + 2 * id.len());
    token.push_str(TOKEN_PREFIX);
    for byte in id.bytes() {
        let _ = write!(token, "{byte:02x}");
    }
    token
}

/// The id a `starting_token` resumes after (`None`: from the start, an empty token). A token
/// flexd cannot have handed out is ABORTED, as CSI asks.
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
    // A volume id is at most 128 bytes: a longer token was not made from one.
    if hex.is_empty() || hex.len() % 2 != 0 || hex.len() > 2 * super::request::MAX_ID_BYTES {
        return Err(refuse());
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| refuse())?;
    let id = String::from_utf8(bytes).map_err(|_| refuse())?;
    super::request::volume_id(&id).map_err(|_| refuse())?;
    Ok(Some(id))
}

/// `max_entries` as a page size (`None`: no limit); negative is INVALID_ARGUMENT (CSI: it
/// "MUST NOT be negative").
pub fn page_size(max_entries: i32) -> Result<Option<usize>, Status> {
    match max_entries {
        0 => Ok(None),
        n if n < 0 => Err(Status::invalid_argument(format!(
            "max_entries is {n}: it must not be negative (0 means no limit)"
        ))),
        n => Ok(Some(n as usize)),
    }
}

/// One page of entries.
#[derive(Debug, PartialEq, Eq)]
pub struct Page<T> {
    pub entries: Vec<T>,
    /// Empty on the last page.
    pub next_token: String,
}

/// The page of `sorted` (sorted by `id`, each id once) that starts after the id `after`
/// (`None`: at the first) and holds at most `size` entries (`None`: all the rest).
pub fn page<T>(
    sorted: Vec<T>,
    id: impl Fn(&T) -> &str,
    after: Option<&str>,
    size: Option<usize>,
) -> Page<T> {
    debug_assert!(sorted.windows(2).all(|w| id(&w[0]) < id(&w[1])));
    let mut rest = sorted
        .into_iter()
        .skip_while(|entry| after.is_some_and(|after| id(entry) <= after))
        .peekable();
    let mut entries = Vec::new();
    while let Some(entry) = rest.next_if(|_| size.is_none_or(|size| entries.len() < size)) {
        entries.push(entry);
    }
    let next_token = match (rest.peek(), entries.last()) {
        (Some(_), Some(last)) => token_after(id(last)),
        _ => String::new(),
    };
    Page {
        entries,
        next_token,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn ids(page: &Page<&'static str>) -> Vec<&'static str> {
        page.entries.clone()
    }

    /// Every page of `all`, `size` at a time, followed by its tokens.
    fn walk(all: &[&'static str], size: usize) -> Vec<Vec<&'static str>> {
        let mut pages = Vec::new();
        let mut token = String::new();
        loop {
            let after = resume_after(&token).unwrap();
            let p = page(all.to_vec(), |s| s, after.as_deref(), Some(size));
            pages.push(ids(&p));
            if p.next_token.is_empty() {
                return pages;
            }
            token = p.next_token;
        }
    }

    #[test]
    fn pages_walk_every_entry_once_and_the_last_has_no_token() {
        let all = ["a", "b", "c", "d", "e"];
        assert_eq!(walk(&all, 2), [vec!["a", "b"], vec!["c", "d"], vec!["e"]]);
        assert_eq!(walk(&all, 1).len(), 5);
        assert_eq!(walk(&all, 5), [all.to_vec()], "exactly one page: no token");
        assert_eq!(walk(&all, 9), [all.to_vec()]);
        let whole = page(all.to_vec(), |s| s, None, None);
        assert_eq!((whole.entries.len(), whole.next_token.as_str()), (5, ""));
        let none = page(Vec::<&str>::new(), |s| s, None, Some(3));
        assert_eq!(
            none,
            Page {
                entries: vec![],
                next_token: String::new()
            }
        );
    }

    #[test]
    fn a_token_survives_volumes_removed_and_added_between_pages() {
        let first = page(vec!["a", "b", "c", "d"], |s| s, None, Some(2));
        assert_eq!(first.entries, ["a", "b"]);
        let after = resume_after(&first.next_token).unwrap();
        assert_eq!(after.as_deref(), Some("b"));
        // "b", the last returned, and "a" are deleted; "aa" (earlier in the order) and "e" are
        // created. An index (2) would now skip "d"; the id resumes right after "b".
        let second = page(vec!["aa", "c", "d", "e"], |s| s, after.as_deref(), Some(2));
        assert_eq!(second.entries, ["c", "d"]);
        let third = page(
            vec!["aa", "c", "d", "e"],
            |s| s,
            resume_after(&second.next_token).unwrap().as_deref(),
            Some(2),
        );
        assert_eq!(
            (third.entries, third.next_token),
            (vec!["e"], String::new())
        );
    }

    #[test]
    fn tokens_round_trip_any_id_and_refuse_anything_else() {
        for id in ["pvc-1", "a b", "é~.x", &"v".repeat(128)] {
            let token = token_after(id);
            assert!(token.is_ascii(), "{token}");
            assert_eq!(resume_after(&token).unwrap().as_deref(), Some(id));
        }
        assert_eq!(resume_after("").unwrap(), None);
        let too_long = token_after(&"v".repeat(129));
        for bad in [
            "invalid-token",
            "after:",
            "after:7",
            "after:zz",
            "after:2e2e",
            "after:612f62",
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
    fn max_entries_zero_is_all_and_negative_is_invalid() {
        assert_eq!(page_size(0).unwrap(), None);
        assert_eq!(page_size(3).unwrap(), Some(3));
        assert_eq!(page_size(-1).unwrap_err().code(), Code::InvalidArgument);
    }
}
