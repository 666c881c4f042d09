//! Link directives only: libfoxcute.a from `foxcute export --out $FOXCUTE_EXPORT_DIR`, and the
//! CUDA runtime's static library from $CUDA_LIB_DIR (default /usr/local/cuda/lib64). Nothing
//! is compiled here; the trainer's cudarc already loads the driver (libcuda) at run time.
use std::env;

fn main() {
    let export = env::var("FOXCUTE_EXPORT_DIR").expect("set FOXCUTE_EXPORT_DIR to a `foxcute export --out` folder");
    let cuda = env::var("CUDA_LIB_DIR").unwrap_or_else(|_| "/usr/local/cuda/lib64".to_string());
    println!("cargo:rerun-if-env-changed=FOXCUTE_EXPORT_DIR");
    println!("cargo:rerun-if-env-changed=CUDA_LIB_DIR");
    println!("cargo:rerun-if-changed={export}/libfoxcute.a");
    println!("cargo:rustc-link-search=native={export}");
    println!("cargo:rustc-link-search=native={cuda}");
    println!("cargo:rustc-link-lib=static=foxcute");
    println!("cargo:rustc-link-lib=static=cudart_static");
    for lib in ["dl", "rt", "pthread"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
}
