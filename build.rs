// Records the versions of the numerical dependencies from Cargo.lock for manifest.json.
fn main() {
    println!("cargo:rerun-if-changed=Cargo.lock");
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let wanted = [
        "candle-core",
        "candle-nn",
        "candle-transformers",
        "hf-hub",
        "tokenizers",
        "nalgebra",
        "rand_chacha",
    ];
    let mut found = Vec::new();
    let mut name = String::new();
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = n.trim_matches('"').to_string();
        } else if let Some(v) = line.strip_prefix("version = ") {
            if wanted.contains(&name.as_str()) {
                found.push(format!("{name} {}", v.trim_matches('"')));
            }
        }
    }
    println!("cargo:rustc-env=APPROX_BENCH_DEPS={}", found.join(", "));

    // scripts/build-cuda.sh: a directory whose libcudart.a (NVIDIA's libcudart_static.a) satisfies
    // candle-kernels' `-lcudart`, so the binary needs no CUDA library to start (README.md, "GPU").
    println!("cargo:rerun-if-env-changed=APPROX_BENCH_CUDA_LINK_DIR");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        if let Some(dir) = std::env::var_os("APPROX_BENCH_CUDA_LINK_DIR") {
            println!("cargo:rustc-link-search=native={}", dir.to_string_lossy());
            // The static runtime's own needs (part of libc since glibc 2.34; dropped there by --as-needed).
            for lib in ["dl", "rt", "pthread"] {
                println!("cargo:rustc-link-lib=dylib={lib}");
            }
        }
    }
}
