//! Criterion benchmarks for Outpost live beside this file, one `[[bench]]` each; this library is
//! empty and only exists so the package has a target. Run them with `cargo bench -p outpost-benches`.
