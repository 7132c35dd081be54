//! `memory::trim` really gives freed memory back. One test, alone in its process, so that no
//! other test allocates while the resident memory is read.

use outpost_agent::host::memory::{TRIM_AVAILABLE, anon_resident_bytes, trim};

const MIB: u64 = 1 << 20;

#[test]
fn a_trim_gives_back_what_was_freed_below_a_live_chunk() {
    if !TRIM_AVAILABLE {
        return;
    }
    // 32 MiB in 4 KiB blocks: below the mmap threshold, so they come from a heap. All but the last
    // are freed; the last keeps the heap's top in use, so glibc cannot give the rest back by itself.
    let mut blocks: Vec<Box<[u8]>> = (0..8192u32)
        .map(|i| vec![i.to_le_bytes()[0] | 1; 4096].into_boxed_slice())
        .collect();
    let pin = blocks.pop();
    drop(blocks);
    let before = anon_resident_bytes().expect("procfs");
    trim();
    let after = anon_resident_bytes().expect("procfs");
    assert!(
        before.saturating_sub(after) >= 16 * MIB,
        "a trim gave back only {} KiB of 32 MiB freed ({before} -> {after} bytes)",
        before.saturating_sub(after) / 1024
    );
    assert!(pin.is_some_and(|p| p[0] == (8191u32.to_le_bytes()[0] | 1)));
}
