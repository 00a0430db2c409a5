//! The options / YAML spec parsers on arbitrary text: PV and pod Volume manifests, Secret
//! manifests, and the options JSON a driver receives. Never panics; an accepted spec names a
//! valid driver; an error about a Secret never quotes the input's content.
#![no_main]
use libfuzzer_sys::fuzz_target;

use test_support::fuzz::volume_spec as checks;

fuzz_target!(|data: &[u8]| checks::check(data));
