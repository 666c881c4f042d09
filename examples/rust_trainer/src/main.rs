//! The calls a trainer makes, in order, without a GPU: every call below is refused by the
//! library's own checks before CUDA is touched, which is what this example demonstrates
//! (and what `cargo build` proves links). On the GPU the same calls take cudarc's device
//! pointers and stream after `foxcute_load()`.
mod foxcute;

use std::ptr;

fn main() {
    // A workspace query for sizes that were not compiled (N = 4097 > 4096) fails fast.
    let mut bytes = 0usize;
    let status = unsafe { foxcute::foxcute_column_sum_workspace_bytes(64, 4097, &mut bytes) };
    assert_eq!(status, foxcute::ERR_SIZE);
    // A pass with a null pointer is refused before anything launches.
    let status = unsafe {
        foxcute::foxcute_column_sum(ptr::null(), ptr::null_mut(), 64, 3, ptr::null_mut(), 0, ptr::null_mut())
    };
    assert_eq!(status, foxcute::ERR_NULL_POINTER);
    println!("{}", foxcute::check(status).unwrap_err());
}
