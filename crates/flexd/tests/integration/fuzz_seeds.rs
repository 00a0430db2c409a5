//! The committed fuzz corpora (`fuzz/seeds/<target>/`) go through the fuzz targets' own checks
//! in the normal suite, without cargo-fuzz or a nightly toolchain. A crash the fuzzer finds is
//! committed there as a file of its own, and from then on it is a regression test.

/// Runs every seed of `target` through `check`; returns how many there were.
fn run_seeds(target: &str, check: fn(&[u8])) -> usize {
    let dir = test_support::repo_path("fuzz/seeds").join(target);
    let mut seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    seeds.sort();
    for seed in &seeds {
        let data = std::fs::read(seed).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(outcome.is_ok(), "{target}: seed {} fails", seed.display());
    }
    assert!(!seeds.is_empty(), "{target}: no seeds in {}", dir.display());
    seeds.len()
}

#[test]
fn reply_parser_seeds_keep_their_invariants() {
    let n = run_seeds("reply_parser", test_support::fuzz::reply_parser::check);
    eprintln!("reply_parser: {n} seeds");
}

#[test]
fn driver_name_seeds_keep_their_invariants() {
    let n = run_seeds("driver_name", test_support::fuzz::driver_name::check);
    eprintln!("driver_name: {n} seeds");
}

#[test]
fn volume_spec_seeds_keep_their_invariants() {
    let n = run_seeds("volume_spec", test_support::fuzz::volume_spec::check);
    eprintln!("volume_spec: {n} seeds");
}
