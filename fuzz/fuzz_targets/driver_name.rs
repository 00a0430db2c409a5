//! Driver names from arbitrary strings: never panics; an accepted name keeps every invariant
//! the rest of flexd relies on before building a path from it.
#![no_main]
use libfuzzer_sys::fuzz_target;

use test_support::fuzz::driver_name as checks;

fuzz_target!(|data: &[u8]| checks::check(data));
