//! The fuzz targets' checks (`fuzz/fuzz_targets/`): each panics when an invariant breaks. The
//! normal suite runs every committed seed through them (crates/flexd/tests/integration/fuzz_seeds.rs).

pub mod driver_name;
pub mod reply_parser;
pub mod volume_spec;
