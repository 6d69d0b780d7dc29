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
}
