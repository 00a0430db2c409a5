//! The reply parser on arbitrary driver output: never panics, and whatever it returns is a
//! reply it would find again in that reply's own JSON.
#![no_main]
use libfuzzer_sys::fuzz_target;

use test_support::fuzz::reply_parser as checks;

fuzz_target!(|data: &[u8]| checks::check(data));
