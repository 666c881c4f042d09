//! Hand-written bindings of foxcute.h (keep them in step with the header of the export you
//! link: manifest.json's header sha256 names it). Pointers are CUDA device pointers (cudarc's
//! `CudaSlice::device_ptr()` as `*const f32`), the stream a `cudaStream_t` (cudarc's
//! `CudaStream::cu_stream()` cast: the runtime and driver handles are the same object).
#![allow(non_snake_case)] // the header's argument names (W1, B, SH2)
#![allow(dead_code)] // the whole header is bound; the example calls a few of its functions

use std::ffi::{c_char, c_int, c_void, CStr};

pub type Stream = *mut c_void; // cudaStream_t

pub const OK: c_int = 0;
pub const ERR_NULL_POINTER: c_int = 1;
pub const ERR_MISALIGNED: c_int = 2;
pub const ERR_SIZE: c_int = 3;
pub const ERR_VALUE: c_int = 4;
pub const ERR_NOT_LOADED: c_int = 5;
pub const ERR_WORKSPACE: c_int = 6;
pub const ERR_CUDA: c_int = 1000; // ERR_CUDA + e: cudaError_t e

extern "C" {
    pub fn foxcute_load() -> c_int;
    pub fn foxcute_unload() -> c_int;
    pub fn foxcute_status_string(status: c_int) -> *const c_char;

    pub fn foxcute_column_sum_workspace_bytes(M: i32, N: i32, bytes: *mut usize) -> c_int;
    pub fn foxcute_column_sum(G: *const f32, out: *mut f32, M: i32, N: i32, workspace: *mut c_void,
                              workspace_bytes: usize, stream: Stream) -> c_int;

    pub fn foxcute_q_denoise_workspace_bytes(B: i32, A: i32, H: i32, bytes: *mut usize) -> c_int;
    pub fn foxcute_q_denoise_loss_and_grads(q: *const f32, q_target: *const f32, W1: *const f32, b1: *const f32,
                                            W2: *const f32, b2: *const f32, dq: *mut f32, grads: *mut f32, B: i32,
                                            A: i32, H: i32, workspace: *mut c_void, workspace_bytes: usize,
                                            stream: Stream) -> c_int;

    pub fn foxcute_risk_budget_forward(h: *const f32, isv: *const f32, e: *const f32, W1: *const f32,
                                       b1: *const f32, w2: *const f32, b2: f32, risk: *mut f32, B: i32, SH2: i32,
                                       I: i32, H: i32, stream: Stream) -> c_int;

    pub fn foxcute_kan_forward(x: *const f32, C: *const f32, Wb: *const f32, y: *mut f32, B: i32, I: i32, O: i32,
                               G: i32, stream: Stream) -> c_int;
    pub fn foxcute_kan_backward_workspace_bytes(B: i32, I: i32, O: i32, G: i32, bytes: *mut usize) -> c_int;
    pub fn foxcute_kan_backward(dy: *const f32, x: *const f32, C: *const f32, Wb: *const f32, dx: *mut f32,
                                grads: *mut f32, B: i32, I: i32, O: i32, G: i32, workspace: *mut c_void,
                                workspace_bytes: usize, stream: Stream) -> c_int;

    pub fn foxcute_curiosity_workspace_bytes(B: i32, F: i32, A: i32, H: i32, bytes: *mut usize) -> c_int;
    pub fn foxcute_curiosity_forward_backward(s: *const f32, a: *const i32, s_next: *const f32, W1: *const f32,
                                              b1: *const f32, W2: *const f32, b2: *const f32, r: *mut f32,
                                              ds: *mut f32, dW1: *mut f32, dW2: *mut f32, sums: *mut f32, B: i32,
                                              F: i32, A: i32, H: i32, workspace: *mut c_void, workspace_bytes: usize,
                                              stream: Stream) -> c_int;

    pub fn foxcute_mamba2_forward(h_hist: *const f32, h: *const f32, W_A: *const f32, W_B: *const f32,
                                  W_C: *const f32, w: *const f32, sigma: f32, out: *mut f32, B: i32, K: i32,
                                  SH2: i32, D: i32, stream: Stream) -> c_int;
    pub fn foxcute_mamba2_backward_workspace_bytes(B: i32, K: i32, SH2: i32, D: i32, bytes: *mut usize) -> c_int;
    pub fn foxcute_mamba2_backward(dout: *const f32, h_hist: *const f32, h: *const f32, W_A: *const f32,
                                   W_B: *const f32, W_C: *const f32, w: *const f32, sigma: f32, dh_hist: *mut f32,
                                   dh: *mut f32, grads: *mut f32, B: i32, K: i32, SH2: i32, D: i32,
                                   workspace: *mut c_void, workspace_bytes: usize, stream: Stream) -> c_int;
}

/// A status as a Result, with foxcute's name of the failure.
pub fn check(status: c_int) -> Result<(), String> {
    if status == OK {
        return Ok(());
    }
    let name = unsafe { CStr::from_ptr(foxcute_status_string(status)) };
    Err(format!("foxcute status {status}: {}", name.to_string_lossy()))
}
