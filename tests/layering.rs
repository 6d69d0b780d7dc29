//! The layering rules of the library (../shared/ARCHITECTURE.md, "What must never import what"),
//! checked on the source text: a module names another through a path (`crate::sweep::run`,
//! `use crate::{config::Choice, …}`, `$crate::config::…` in a macro), so a rule is broken exactly
//! when a forbidden `crate::<module>` path appears in code. Comment lines (`//`, `//!`, `///`) are skipped:
//! a doc link names a module without depending on it.
//!
//! - `report/` never imports `sweep` or `inputs`: outputs read runs; running one is the caller's job
//!   (`check.rs`, `main`).
//! - `attention/` never imports `config`, `inputs`, `report`, `sweep`, `score`, `check` or `bench`:
//!   a method sees tensors and d, not files, models or runs.
//! - `numerics/` never imports `attention` (or anything above it).
//! - `config` never imports `inputs` (or the sweep, the outputs, `score`, `check`): they read the
//!   configuration, so it cannot point back at them.
//! - `models/` never imports `protocol`, `sweep`, `report`, `inputs` or a face: a forward does not
//!   know it is being measured.
//! - `inputs/` never imports `score`, `sweep`, `report`, `check` or `bench`: they read its outputs.
//! - `protocol/` never imports `config`, `inputs`, `sweep`, `score`, `check`, `bench` or `e2e`: it
//!   measures a model's layers through the methods; the runs around it are its callers'.
//! - `e2e/` never imports `sweep`, `score`, `check` or `bench`: a face of its own over the protocol.
//! - The ground floor (`tensor_util`, `file_hash`, `runtime`, `choice`, `device`, `interrupt`,
//!   `atomic_file`) imports nothing of the house.
//! - No import circle: the graph of files (A names a path into B) has none (issue 54).
//! - The library never sees clap (only `main.rs` and `cli.rs`, the binary, do) and never PyO3.

use std::path::{Path, PathBuf};

/// The modules above the ground floor.
const HOUSE: &[&str] = &[
    "attention",
    "bench",
    "check",
    "config",
    "inputs",
    "models",
    "numerics",
    "protocol",
    "report",
    "score",
    "sweep",
];

/// The ground floor's files.
const GROUND: &[&str] = &[
    "tensor_util.rs",
    "file_hash.rs",
    "runtime.rs",
    "choice.rs",
    "device.rs",
    "interrupt.rs",
    "atomic_file.rs",
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every .rs file at or below `path`.
fn rust_files(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())) {
        let p = entry.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The paths a line of code names after `crate::`: `crate::a::b` gives `a`; a grouped import
/// `crate::{a::x, b}` gives `a` and `b` (its braces may run over the following lines, `rest`).
fn crate_modules(line: &str, rest: &[&str]) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in line.match_indices("crate::") {
        let after = &line[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // The group's text up to its closing brace, over as many lines as it takes.
            let mut text = group.to_string();
            for more in rest {
                if text.matches('{').count() < text.matches('}').count() {
                    break;
                }
                text.push_str(more);
            }
            let mut depth = 0;
            let mut item = String::new();
            for c in text.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            names.push(item);
        } else {
            names.push(after.to_string());
        }
    }
    names
        .iter()
        .map(|n| {
            n.trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        })
        .filter(|n: &String| !n.is_empty())
        .collect()
}

/// The lines of `text` (1-based numbers) that name one of `modules` as `crate::<module>`, outside
/// comment lines.
fn forbidden_paths(text: &str, modules: &[&str]) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut hits = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        if crate_modules(line, &lines[i + 1..])
            .iter()
            .any(|n| modules.contains(&n.as_str()))
        {
            hits.push((i + 1, line.trim().to_string()));
        }
    }
    hits
}

/// The lines of `text` that use the crate `name` (`name::`, `use name`), outside comment lines.
fn crate_uses(text: &str, name: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(|(_, l)| {
            l.contains(&format!("{name}::")) || l.trim_start().starts_with(&format!("use {name}"))
        })
        .map(|(i, l)| (i + 1, l.trim().to_string()))
        .collect()
}

/// Every line under `under` (a folder or file of src/) that names one of `modules`.
fn violations(under: &str, modules: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in rust_files(&src().join(under)) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, code) in forbidden_paths(&text, modules) {
            found.push(format!("{}:{line}: {code}", file.display()));
        }
    }
    found
}

fn assert_none(rule: &str, found: Vec<String>) {
    assert!(found.is_empty(), "{rule}, but:\n{}", found.join("\n"));
}

#[test]
fn the_inputs_know_nothing_of_their_readers() {
    assert_none(
        "inputs/ never imports score, sweep, report, check or bench (the dump's sidecar format lives with its writer)",
        violations("inputs", &["score", "sweep", "report", "check", "bench"]),
    );
}

/// protocol/ measures a model's layers through the methods (one trial, one point); the runs around
/// it (files, flags, resumes) are its callers' (issue 54).
#[test]
fn a_protocol_knows_no_run_around_it() {
    assert_none(
        "protocol/ never imports config, inputs, sweep, score, check, bench or e2e",
        violations(
            "protocol",
            &[
                "config", "inputs", "sweep", "score", "check", "bench", "e2e",
            ],
        ),
    );
}

/// e2e/ is a face of its own: it reads the protocol, not the sweep's or score's runs (issue 54).
#[test]
fn the_end_to_end_run_is_not_built_on_the_sweep() {
    assert_none(
        "e2e/ (and e2e.rs) never imports sweep, score, check or bench",
        [
            violations("e2e", &["sweep", "score", "check", "bench"]),
            violations("e2e.rs", &["sweep", "score", "check", "bench"]),
        ]
        .concat(),
    );
}

#[test]
fn a_forward_does_not_know_it_is_measured() {
    assert_none(
        "models/ never imports protocol, sweep, report, inputs or a face (score, check, bench, e2e)",
        violations(
            "models",
            &["protocol", "sweep", "report", "inputs", "score", "check", "bench", "e2e"],
        ),
    );
}

#[test]
fn report_reads_runs_and_runs_none() {
    assert_none(
        "report/ never imports sweep or inputs",
        violations("report", &["sweep", "inputs"]),
    );
}

#[test]
fn a_method_sees_tensors_not_runs() {
    assert_none(
        "attention/ never imports config, inputs, report, sweep, score, check or bench",
        violations(
            "attention",
            &[
                "config", "inputs", "report", "sweep", "score", "check", "bench",
            ],
        ),
    );
}

#[test]
fn the_configuration_does_not_point_at_its_readers() {
    let mut found = violations(
        "config.rs",
        &["inputs", "sweep", "report", "score", "check"],
    );
    found.extend(violations(
        "config",
        &["inputs", "sweep", "report", "score", "check"],
    ));
    assert_none(
        "config never imports inputs, sweep, report, score or check (they read it)",
        found,
    );
}

#[test]
fn numerics_sit_below_the_methods() {
    let above: Vec<&str> = HOUSE.iter().copied().filter(|m| *m != "numerics").collect();
    assert_none(
        "numerics/ never imports attention (or anything above it)",
        violations("numerics", &above),
    );
}

#[test]
fn the_ground_floor_imports_nothing_of_the_house() {
    let mut found = Vec::new();
    for f in GROUND {
        found.extend(violations(f, HOUSE));
    }
    assert_none("the ground floor imports nothing of the house", found);
}

#[test]
fn the_library_never_sees_clap_or_pyo3() {
    let mut found = Vec::new();
    for file in rust_files(&src()) {
        let name = file.file_name().unwrap();
        if file.parent() == Some(src().as_path()) && (name == "main.rs" || name == "cli.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for krate in ["clap", "pyo3"] {
            for (line, code) in crate_uses(&text, krate) {
                found.push(format!("{}:{line}: {code}", file.display()));
            }
        }
    }
    assert_none(
        "only main.rs and cli.rs use clap; PyO3 stays in python/",
        found,
    );
}

/// The scanner itself: it finds a forbidden path in code, in a macro and in a grouped import, and
/// passes over comments and longer names.
#[test]
fn the_scanner_finds_what_the_rules_forbid() {
    let code = "use crate::sweep::SweepOutcome;\n\
                // crate::sweep in a comment\n\
                /// [`crate::sweep::run`]\n\
                impl $crate::config::Choice for T {}\n\
                let x = crate::sweeps::y;\n\
                fn f() { crate::sweep::run(a, b) }\n\
                use crate::{\n\
                    report::x,\n\
                    sweep::{run, SweepOptions},\n\
                };\n\
                use crate::{tensor_util::{a, b}, usage};\n";
    let hits = forbidden_paths(code, &["sweep", "config"]);
    let lines: Vec<usize> = hits.iter().map(|(l, _)| *l).collect();
    assert_eq!(lines, vec![1, 4, 6, 7], "{hits:?}");
    assert_eq!(
        crate_uses("use clap::Parser;\n// clap::x\n", "clap").len(),
        1
    );
}

/// The module of each source file (`src/a/b.rs` and `src/a/b/mod.rs` are `a::b`), test files and
/// the binary left out.
fn modules() -> std::collections::BTreeMap<Vec<String>, PathBuf> {
    let mut out = std::collections::BTreeMap::new();
    for file in rust_files(&src()) {
        let rel = file.strip_prefix(src()).unwrap().with_extension("");
        let mut parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let last = parts.last().cloned().unwrap_or_default();
        if last.ends_with("_tests")
            || last == "tests"
            || last == "test_util"
            || last == "main"
            || last == "cli"
        {
            continue;
        }
        if last == "mod" || last == "lib" {
            parts.pop();
        }
        out.insert(parts, file);
    }
    out
}

/// Every path a file's code names from `crate::`, `super::` or `self::`, with grouped imports
/// (`use super::{a::{b, c}, d}`) expanded, as segments; its `#[cfg(test)] mod tests` is left out.
fn named_paths(text: &str) -> Vec<Vec<String>> {
    let code: String = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    }
    .lines()
    .filter(|l| !l.trim_start().starts_with("//"))
    .collect::<Vec<_>>()
    .join("\n");
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let at_word = i == 0
            || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_' || chars[i - 1] == '$');
        let rest: String = chars[i..chars.len().min(i + 7)].iter().collect();
        if at_word
            && (rest.starts_with("crate::")
                || rest.starts_with("super::")
                || rest.starts_with("self::"))
        {
            i = path_at(&chars, i, Vec::new(), &mut out);
        } else {
            i += 1;
        }
    }
    out
}

/// Reads the path starting at `i` (after `prefix`), pushing each full path into `out`; returns
/// where it ends.
fn path_at(chars: &[char], mut i: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut segs = prefix;
    loop {
        let start = i;
        while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
            i += 1;
        }
        if i > start {
            segs.push(chars[start..i].iter().collect());
        }
        if i + 2 < chars.len() && chars[i] == ':' && chars[i + 1] == ':' {
            i += 2;
            if chars[i] == '{' {
                i += 1;
                loop {
                    while i < chars.len() && (chars[i].is_whitespace() || chars[i] == ',') {
                        i += 1;
                    }
                    if i >= chars.len() || chars[i] == '}' {
                        out.push(segs.clone());
                        return i + 1;
                    }
                    i = path_at(chars, i, segs.clone(), out);
                    // `name as alias`, or a glob: skip to the next item.
                    while i < chars.len() && chars[i] != ',' && chars[i] != '}' {
                        i += 1;
                    }
                }
            }
            continue;
        }
        out.push(segs);
        return i.max(start + 1);
    }
}

/// The import graph of src/ (file A names a path into file B) has no circle (issue 54): every
/// strongly connected component is one file.
#[test]
fn no_import_circle_runs_through_src() {
    let mods = modules();
    let resolve = |path: &[String]| -> Option<Vec<String>> {
        (1..=path.len())
            .rev()
            .map(|k| path[..k].to_vec())
            .find(|p| mods.contains_key(p))
    };
    let mut edges: std::collections::BTreeMap<
        Vec<String>,
        std::collections::BTreeSet<Vec<String>>,
    > = Default::default();
    for (module, file) in &mods {
        let text = std::fs::read_to_string(file).unwrap();
        for path in named_paths(&text) {
            let mut base: Vec<String> = Vec::new();
            let mut segs = path.as_slice();
            if segs.first().is_some_and(|s| s == "crate") {
                segs = &segs[1..];
            } else {
                base = module.clone();
                while let Some(s) = segs.first() {
                    match s.as_str() {
                        "super" => {
                            base.pop();
                        }
                        "self" => {}
                        _ => break,
                    }
                    segs = &segs[1..];
                }
            }
            base.extend(segs.iter().cloned());
            if let Some(target) = resolve(&base) {
                if &target != module && !target.is_empty() {
                    edges.entry(module.clone()).or_default().insert(target);
                }
            }
        }
    }
    // A circle: a module that reaches itself through the edges.
    let mut circles = Vec::new();
    for start in mods.keys() {
        let mut seen = std::collections::BTreeSet::new();
        let mut stack: Vec<Vec<String>> = edges.get(start).into_iter().flatten().cloned().collect();
        while let Some(m) = stack.pop() {
            if &m == start {
                circles.push(start.join("/"));
                break;
            }
            if seen.insert(m.clone()) {
                stack.extend(edges.get(&m).into_iter().flatten().cloned());
            }
        }
    }
    assert!(
        circles.is_empty(),
        "these files import themselves through others: {circles:?}"
    );
}

/// The path scanner expands grouped imports and resolves nothing in comments.
#[test]
fn the_path_scanner_reads_grouped_imports() {
    let paths =
        named_paths("use super::{a::{b, c as d}, e};\n// crate::x\nfn f() { crate::y::z(1) }\n");
    let s = |p: &[&str]| p.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        paths,
        vec![
            s(&["super", "a", "b"]),
            s(&["super", "a", "c"]),
            s(&["super", "a"]),
            s(&["super", "e"]),
            s(&["super"]),
            s(&["crate", "y", "z"])
        ]
    );
}
