//! Driver names from arbitrary strings: never panics; an accepted name keeps every invariant
//! the rest of flexd relies on before building a path from it.
use flexvolume_protocol::name::{DriverName, MAX_NAME_LEN};

/// Panics when an invariant breaks.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for parsed in [DriverName::parse(text), DriverName::from_dir_name(text)] {
        let Ok(name) = parsed else { continue };
        let s = name.as_str();
        assert!(!s.is_empty() && s.len() <= MAX_NAME_LEN);
        for segment in s.split('/') {
            assert!(!segment.is_empty());
            assert!(!segment.starts_with('.') && !segment.starts_with('-'));
            assert!(segment
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)));
        }
        let exe = name.executable_name();
        assert!(!exe.is_empty() && !exe.contains('/') && exe != "." && exe != "..");
        let dir = name.dir_name();
        assert!(!dir.contains('/') && !dir.starts_with('.'));
        assert_eq!(DriverName::from_dir_name(&dir).as_ref(), Ok(&name));
    }
}
