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

    // The commit this binary is built from, for manifest.json: `git rev-parse --short=12 HEAD`,
    // "-dirty" when tracked files differ from it, "unknown" outside a git checkout. Rerun when the
    // sources or the checked-out commit change (only paths that exist: a missing one would rerun
    // this script on every build).
    for path in [
        "src",
        ".git/HEAD",
        ".git/index",
        ".git/refs",
        ".git/packed-refs",
    ] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let build = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(commit) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{commit}-dirty")
            } else {
                commit
            }
        }
        None => "unknown".into(),
    };
    println!("cargo:rustc-env=APPROX_BENCH_BUILD={build}");

    // scripts/build-cuda.sh: a directory whose libcudart.a (NVIDIA's libcudart_static.a) satisfies
    // candle-kernels' `-lcudart`, so the binary needs no CUDA library to start (docs/gpu.md).
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
