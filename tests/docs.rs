//! The documentation (README.md and docs/*.md) against the code: no dead link, and no documented
//! `approx-bench` command line that the binary would refuse. Offline; nothing of ../shared needed.
//!
//! - **Links.** Every relative markdown link or image outside code resolves to a file of the
//!   repository, and a `#fragment` to a heading of the file it points into (GitHub's slugs).
//! - **Commands in code blocks.** Every command line of a fenced shell block that runs the binary —
//!   `approx-bench ARGS`, `cargo run --release -- ARGS`, also one quoted in a shell comment — is run
//!   for real with the built binary (`CARGO_BIN_EXE_approx-bench`) in an empty scratch directory
//!   (so `--out` writes there), offline (`HF_HUB_OFFLINE=1`, an empty `HF_HOME`, a refused
//!   `HF_ENDPOINT`) and killed after [`LIMIT`]. Their inputs (the hub, `../shared/data`, a GPU)
//!   are absent there, so a command passes when it finishes, runs past the limit, or stops with an
//!   error that names what is absent here (an input of its arguments that does not exist in the
//!   scratch directory, as a path or as `--flag VALUE`; the hub under `HF_HUB_OFFLINE`; CUDA in a
//!   CPU build). Anything else fails:
//!   a refusal by the argument parser (clap's "For more information, try '--help'": an unknown
//!   flag, an invalid value, a missing argument), a value the library rejects (`--lengths 512,x`),
//!   a panic. `$VAR` and `${VAR}` stand for 1 and a lone
//!   `...` (the elided rest of a line) is dropped. The same lines run on the real data in `.ci/run`
//!   (its end-to-end runs, `dump-qkv`, `check --rerun`, `plot`), and the Python ones through
//!   `examples/score_window.py` there; the lines of other tools (cargo, pip, the CUDA build script)
//!   are not run here, but every repository script or example a block names must exist.
//! - **Synopses in prose.** Every `--flag` of an inline `` `approx-bench [SUBCOMMAND] …` `` span,
//!   and of the first cell of a flag table row (`| `--flag …` |`), is one that the subcommand's
//!   `--help` lists. These spans carry placeholders (DIR, N), so they are checked, not run.
//! - **Cited sections.** Every `§N(.N)*` that README.md, docs/*.md and the help texts of
//!   src/cli.rs cite is a heading of docs/reference.md, and none of them names `METHODS.md` (the
//!   specification outside the repository).
//!
//! Each check was seen to fail on a dead link, a dead anchor, a renamed flag and a bad value.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;

/// How long one documented command may run before it is killed (an accepted command line that
/// found its inputs and started working is killed here, not failed).
const LIMIT: Duration = Duration::from_secs(30);

/// clap's closing line of every error it reports (and only of those).
const CLAP_ERROR: &str = "For more information, try '--help'";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_approx-bench"))
}

/// README.md and every docs/*.md, with their text.
fn documents() -> Vec<(PathBuf, String)> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/ holds no markdown file");
    files.extend(docs);
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// A markdown text split into prose lines (fenced code blanked out) and fenced blocks
/// (info string, lines).
struct Parsed {
    prose: Vec<String>,
    blocks: Vec<(String, Vec<String>)>,
}

fn parse(text: &str) -> Parsed {
    let mut prose = Vec::new();
    let mut blocks = Vec::new();
    let mut open: Option<(String, Vec<String>)> = None;
    for line in text.lines() {
        let fence = line.trim_start().starts_with("```");
        match (&mut open, fence) {
            (None, true) => {
                open = Some((line.trim_start()[3..].trim().to_string(), Vec::new()));
                prose.push(String::new());
            }
            (Some(_), true) => {
                blocks.push(open.take().unwrap());
                prose.push(String::new());
            }
            (Some((_, lines)), false) => {
                lines.push(line.to_string());
                prose.push(String::new());
            }
            (None, false) => prose.push(line.to_string()),
        }
    }
    assert!(open.is_none(), "an unclosed code fence");
    Parsed { prose, blocks }
}

/// `line` without its inline code spans.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            out.push_str(part);
        }
    }
    out
}

/// The inline code spans of `line`.
fn code_spans(line: &str) -> Vec<&str> {
    let parts: Vec<&str> = line.split('`').collect();
    // An odd part sits between two backticks only if a closing one follows.
    (1..parts.len().saturating_sub(1))
        .step_by(2)
        .map(|i| parts[i])
        .collect()
}

/// The targets of the markdown links and images `[text](target)` in `line`.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        match after.find(')') {
            Some(end) => {
                let target = after[..end].split_whitespace().next().unwrap_or("");
                out.push(target.to_string());
                rest = &after[end..];
            }
            None => break,
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, spaces to '-', punctuation dropped (letters,
/// digits, '-' and '_' kept), inline code marks dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown file's headings (outside code), with GitHub's -1, -2… for repeats.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in parse(text).prose {
        let t = line.trim_start();
        if !t.starts_with('#') {
            continue;
        }
        let heading = t.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading);
        let mut s = base.clone();
        let mut k = 0;
        while seen.contains(&s) {
            k += 1;
            s = format!("{base}-{k}");
        }
        seen.insert(s);
    }
    seen
}

/// Every dead relative link of the documents, as "file: target (why)".
fn dead_links(docs: &[(PathBuf, String)]) -> Vec<String> {
    let mut dead = Vec::new();
    for (file, text) in docs {
        for line in parse(text).prose {
            for target in link_targets(&without_code_spans(&line)) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, fragment) = match target.split_once('#') {
                    Some((p, f)) => (p, Some(f)),
                    None => (target.as_str(), None),
                };
                let resolved = if path.is_empty() {
                    file.clone()
                } else {
                    file.parent().unwrap().join(path)
                };
                if !resolved.exists() {
                    dead.push(format!("{}: {target} (no such file)", file.display()));
                    continue;
                }
                if let Some(fragment) = fragment {
                    let text = std::fs::read_to_string(&resolved).unwrap_or_default();
                    if !anchors(&text).contains(fragment) {
                        dead.push(format!("{}: {target} (no such heading)", file.display()));
                    }
                }
            }
        }
    }
    dead
}

#[test]
fn every_relative_link_resolves() {
    let dead = dead_links(&documents());
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
}

/// Shell words of a command line: quotes grouped, `$VAR`/`${VAR}` as 1, a trailing `# comment`
/// dropped.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '#') if !in_word => break,
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (q, '$') if q != Some('\'') => {
                if chars.peek() == Some(&'{') {
                    for c in chars.by_ref() {
                        if c == '}' {
                            break;
                        }
                    }
                } else {
                    while chars
                        .peek()
                        .is_some_and(|c| c.is_alphanumeric() || *c == '_')
                    {
                        chars.next();
                    }
                }
                cur.push('1');
                in_word = true;
            }
            (_, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

/// The binary's arguments of a code block's command line, if it runs the binary.
fn binary_args(line: &str) -> Option<Vec<String>> {
    let mut line = line.trim();
    if line.starts_with('#') {
        // A command quoted in a comment ("# afterwards, once:  approx-bench merge …").
        line = &line[line.find("approx-bench ")?..];
    }
    let mut words = shell_words(line);
    // Leading environment assignments.
    while words
        .first()
        .is_some_and(|w| w.contains('=') && !w.starts_with('-'))
    {
        words.remove(0);
    }
    let args: Vec<String> = if words.first().map(String::as_str) == Some("approx-bench") {
        words[1..].to_vec()
    } else if words.starts_with(&["cargo".into(), "run".into()]) {
        let dash = words.iter().position(|w| w == "--")?;
        words[dash + 1..].to_vec()
    } else {
        return None;
    };
    Some(args.into_iter().filter(|a| a != "...").collect())
}

/// The logical lines of a shell block: `\` continuations joined.
fn logical_lines(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for l in lines {
        match l.trim_end().strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head);
                cur.push(' ');
            }
            None => {
                cur.push_str(l);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn is_shell(info: &str) -> bool {
    matches!(info, "" | "bash" | "sh" | "shell" | "console")
}

/// Every documented command line that runs the binary, as (where, args).
fn documented_commands(docs: &[(PathBuf, String)]) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for (file, text) in docs {
        for (info, lines) in parse(text).blocks {
            if !is_shell(&info) {
                continue;
            }
            for line in logical_lines(&lines) {
                if let Some(args) = binary_args(&line) {
                    out.push((format!("{}: {}", file.display(), line.trim()), args));
                }
            }
        }
    }
    out
}

/// Runs the binary with `args` in `cwd`, offline, at most [`LIMIT`]; true if it was killed.
fn run_offline(cwd: &Path, args: &[String]) -> (Output, bool) {
    let home = cwd.join(".hf-home");
    std::fs::create_dir_all(&home).unwrap();
    let child = Command::new(bin())
        .args(args)
        .current_dir(cwd)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HOME", &home)
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_TOKEN")
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .env("APPROX_BENCH_QKV_CACHE", cwd.join(".qkv-cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run approx-bench");
    let (out, took) = common::wait(child, LIMIT);
    (out, took > LIMIT)
}

/// How an error names an input of `args` that does not exist in `cwd`: a path (with a '/') as
/// it is written, any other as "--flag VALUE" (`--qkv qkv: cannot read the directory`).
fn absent_inputs(cwd: &Path, args: &[String]) -> Vec<String> {
    let missing = |a: &String| !a.starts_with('-') && !cwd.join(a).exists();
    let mut out: Vec<String> = args
        .iter()
        .filter(|a| a.contains('/') && missing(a))
        .cloned()
        .collect();
    for pair in args.windows(2) {
        if pair[0].starts_with("--") && missing(&pair[1]) {
            out.push(format!("{} {}", pair[0], pair[1]));
        }
    }
    out
}

/// What an error says when an input of a documented command is absent from the scratch
/// directory: the hub (offline, empty cache) or a GPU (a CPU build, or no driver).
const ABSENT_HERE: [&str; 3] = [
    "HF_HUB_OFFLINE is set",
    "this build has no CUDA support",
    "(the NVIDIA driver)",
];

/// Why the binary's answer to a documented command fails it (None: it passes). `status`: the
/// exit code, None if it was killed past the limit; `absent`: the command's path arguments that
/// do not exist in its working directory.
fn refusal(status: Option<i32>, stderr: &str, absent: &[&str]) -> Option<&'static str> {
    if stderr.contains(CLAP_ERROR) {
        return Some("the argument parser refused it");
    }
    if stderr.contains("panicked") {
        return Some("it panicked");
    }
    // Finished, or killed past the limit (no exit code): the command line was taken.
    if status.is_none() || status == Some(0) {
        return None;
    }
    let error = stderr.rsplit("error:").next().unwrap_or("");
    let names_absent =
        absent.iter().any(|p| error.contains(p)) || ABSENT_HERE.iter().any(|m| error.contains(m));
    (!names_absent).then_some("it failed, and not for an input absent here")
}

#[test]
fn every_documented_command_line_is_accepted() {
    let commands = documented_commands(&documents());
    assert!(
        commands.len() >= 5,
        "expected the documented command lines, found {commands:?}"
    );
    let scratch = tempfile::tempdir().unwrap();
    let mut refused = Vec::new();
    for (i, (place, args)) in commands.iter().enumerate() {
        let cwd = scratch.path().join(i.to_string());
        std::fs::create_dir_all(&cwd).unwrap();
        let absent = absent_inputs(&cwd, args);
        let absent: Vec<&str> = absent.iter().map(String::as_str).collect();
        let (out, killed) = run_offline(&cwd, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // A signal other than our kill has no code: -1, a failure.
        let status = (!killed).then(|| out.status.code().unwrap_or(-1));
        if let Some(why) = refusal(status, &stderr, &absent) {
            refused.push(format!("{place}\n  {why}:\n{stderr}"));
        }
    }
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}

/// The flags the binary's `--help` lists, for `sub` (None: the sweep's).
fn help_flags(sub: Option<&str>) -> BTreeSet<String> {
    let mut c = Command::new(bin());
    c.args(sub).arg("--help");
    let o = c.output().unwrap();
    assert!(o.status.success(), "--help of {sub:?} failed");
    flags(&String::from_utf8_lossy(&o.stdout))
}

/// The `--flag` names in `text`.
fn flags(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in text.match_indices("--") {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '-') {
            continue;
        }
        let name: String = text[at + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
            out.insert(format!("--{}", name.trim_end_matches('-')));
        }
    }
    out
}

/// The subcommands the binary's `--help` lists.
fn subcommands() -> BTreeSet<String> {
    let o = Command::new(bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&o.stdout).into_owned();
    let list = help
        .split("Commands:")
        .nth(1)
        .expect("a Commands: section")
        .split("\n\n")
        .next()
        .unwrap();
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Every flag named in a prose synopsis or a flag table that the binary does not know.
fn unknown_flags(docs: &[(PathBuf, String)]) -> Vec<String> {
    let subs = subcommands();
    let mut unknown = Vec::new();
    let mut known: std::collections::HashMap<Option<String>, BTreeSet<String>> = Default::default();
    let mut check = |place: String, sub: Option<String>, named: BTreeSet<String>| {
        let help = known
            .entry(sub.clone())
            .or_insert_with(|| help_flags(sub.as_deref()));
        for f in named.difference(help) {
            unknown.push(format!(
                "{place}: {f} (not in `approx-bench {} --help`)",
                sub.as_deref().unwrap_or("")
            ));
        }
    };
    for (file, text) in docs {
        for (n, line) in parse(text).prose.iter().enumerate() {
            let place = format!("{}:{}", file.display(), n + 1);
            for span in code_spans(line) {
                let mut words = span.split_whitespace();
                if words.next() != Some("approx-bench") {
                    continue;
                }
                let sub = words
                    .next()
                    .filter(|w| subs.contains(*w))
                    .map(str::to_string);
                check(place.clone(), sub, flags(span));
            }
            if line.starts_with("| `--") {
                let cell = line.split('|').nth(1).unwrap_or("");
                check(place.clone(), None, flags(cell));
            }
        }
    }
    unknown
}

#[test]
fn every_flag_of_a_synopsis_or_flag_table_exists() {
    let unknown = unknown_flags(&documents());
    assert!(unknown.is_empty(), "{}", unknown.join("\n"));
}

#[test]
fn every_script_or_example_a_code_block_names_exists() {
    let mut missing = Vec::new();
    for (file, text) in documents() {
        for (_, lines) in parse(&text).blocks {
            for line in lines {
                for w in shell_words(&line) {
                    let named = ["scripts/", "examples/", "tests/reference/", ".ci/"]
                        .iter()
                        .any(|d| w.starts_with(d));
                    if named && !root().join(&w).exists() {
                        missing.push(format!("{}: {w}", file.display()));
                    }
                }
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// The parsers above on made-up text: they must find what they are meant to check.
#[test]
fn the_checks_find_what_they_look_for() {
    let text = "# Top\n## `check`: a test\nSee [a](#top) and [b](x.md#y), `[c](z.md)` not.\n\
                ```bash\n# a heading-like comment\napprox-bench --lengths 1 \\\n  --out d  # note\n\
                # afterwards:  approx-bench merge s/* --out r\nHF_HUB_OFFLINE=1 cargo run --release -- --x ${A}/2 ...\n\
                pip install ./python\n```\n";
    let a = anchors(text);
    assert!(a.contains("top") && a.contains("check-a-test"), "{a:?}");
    assert!(!a.contains("a-heading-like-comment"), "{a:?}");
    let prose = parse(text).prose;
    let links: Vec<String> = prose
        .iter()
        .flat_map(|l| link_targets(&without_code_spans(l)))
        .collect();
    assert_eq!(links, ["#top", "x.md#y"]);
    let docs = vec![(root().join("docs/made-up.md"), text.to_string())];
    let cmds: Vec<Vec<String>> = documented_commands(&docs)
        .into_iter()
        .map(|(_, a)| a)
        .collect();
    assert_eq!(
        cmds,
        vec![
            vec!["--lengths", "1", "--out", "d"],
            vec!["merge", "s/*", "--out", "r"],
            vec!["--x", "1/2"],
        ]
    );
    let dead = dead_links(&docs);
    // The made-up file is not on disk: neither x.md beside it nor its own #top resolves.
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert_eq!(
        flags("`approx-bench plot --from DIR [--out DIR] [--statistic mean|median]`"),
        ["--from", "--out", "--statistic"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    let clap = "error: unexpected argument '--x' found\n\nFor more information, try '--help'.\n";
    assert!(refusal(Some(2), clap, &[]).is_some());
    let absent = "error: --model-dir d/x: not a directory\n";
    assert!(refusal(Some(2), absent, &["d/x"]).is_none());
    let bad_value = "error: --lengths: 'x' is not a positive integer\n";
    assert!(refusal(Some(2), bad_value, &["d/x"]).is_some());
    assert!(refusal(None, "", &[]).is_none());
}

/// The section number `N(.N)*` at the start of `s` (a sentence's closing dot is not part of it),
/// and the rest of `s` after it.
fn section_number(s: &str) -> (Option<String>, &str) {
    let b = s.as_bytes();
    let digits = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let mut end = digits(0);
    if end == 0 {
        return (None, s);
    }
    while end < b.len() && b[end] == b'.' && digits(end + 1) > 0 {
        end += 1 + digits(end + 1);
    }
    (Some(s[..end].to_string()), &s[end..])
}

/// Every section number that `text` cites: each `§N(.N)*`, and the end of a range
/// `§N.N–N.N`.
fn cited_sections(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for cite in text.split('§').skip(1) {
        let (number, after) = section_number(cite);
        if let Some(number) = number {
            out.push(number);
            if let Some(range) = after.strip_prefix('–') {
                out.extend(section_number(range).0);
            }
        }
    }
    out
}

/// The section numbers that headings of the markdown `text` start with (`## §7.5 …` → 7.5).
fn heading_sections(text: &str) -> BTreeSet<String> {
    parse(text)
        .prose
        .iter()
        .filter_map(|line| {
            let t = line.trim_start();
            let heading = t.trim_start_matches('#');
            if !t.starts_with('#') || !heading.starts_with(' ') {
                return None;
            }
            section_number(heading.trim_start().strip_prefix('§')?).0
        })
        .collect()
}

/// The string literals and doc comments of the Rust source `src` (what `--help` prints is
/// among them), one per line; plain `//` comments and code are left out.
fn help_texts(src: &str) -> String {
    let mut out = String::new();
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                // From the second '/': "//…" for `///`, "/!…" for `//!`, "/ …" for `//`.
                let line: String = chars.by_ref().take_while(|&c| c != '\n').collect();
                if line.starts_with("//") || line.starts_with("/!") {
                    out.push_str(&line);
                    out.push('\n');
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    match (escaped, c) {
                        (true, _) => escaped = false,
                        (false, '\\') => escaped = true,
                        (false, '"') => break,
                        (false, c) => out.push(c),
                    }
                }
                out.push('\n');
            }
            '\'' => {
                // A char literal ('x', '\'', '"') is skipped whole; a lifetime is code.
                let mut ahead = chars.clone();
                match (ahead.next(), ahead.next(), ahead.next()) {
                    (Some('\\'), Some(_), Some('\'')) => chars = ahead,
                    (Some(_), Some('\''), _) => {
                        chars.next();
                        chars.next();
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    out
}

/// Each text's citations without a heading in `reference`, and each mention of `METHODS.md`.
fn citation_problems(reference: &str, texts: &[(String, String)]) -> Vec<String> {
    let headings = heading_sections(reference);
    let mut problems = Vec::new();
    for (name, text) in texts {
        let cited: BTreeSet<String> = cited_sections(text).into_iter().collect();
        for s in cited.difference(&headings) {
            problems.push(format!(
                "{name}: cites §{s}, but no heading of docs/reference.md starts with §{s}"
            ));
        }
        if text.contains("METHODS.md") {
            problems.push(format!(
                "{name}: names METHODS.md, which a clone does not hold; cite docs/reference.md §N"
            ));
        }
    }
    problems
}

/// The specification the rows depend on is readable from a clone: every section that a user-facing
/// text cites — README.md, docs/*.md (docs/decisions.md included; docs/reference.md itself is the
/// target) and the help texts of src/cli.rs (string literals and doc comments) — is a heading of
/// docs/reference.md that starts with exactly that number (§7.5 needs a `§7.5 …` heading; a
/// `§7.5.3 …` one does not do), and none of them names `METHODS.md` or `../shared/METHODS.md`.
/// Code comments elsewhere in src/ may still cite METHODS.md sections for now: the code cites the
/// same numbers, which docs/reference.md now holds.
#[test]
fn every_cited_section_is_a_heading_of_the_reference() {
    // The checker on made-up text: a missing section, a prefix match and a mention are caught.
    let made_up = "# R\n## §7 D\n### §7.5.3 quest — pages\n```text\n## §9 in code\n```\n";
    let texts = vec![(
        "made-up".to_string(),
        "See [§7.5.3](x#y), §7.5 and §7.\nAlso §9. And (METHODS.md §7) and §4.1–4.2.".to_string(),
    )];
    let found = citation_problems(made_up, &texts);
    for s in ["§7.5,", "§9,", "§4.1,", "§4.2,", "METHODS.md"] {
        assert!(
            found.iter().any(|p| p.contains(s)),
            "{s} not caught: {found:?}"
        );
    }
    assert_eq!(found.len(), 5, "{found:?}");
    let rust =
        "//! a §1\n// plain §2\n/// doc §3\nlet c = '\"'; f(\"lit \\\"§4\\\" //x §5\"); '_';";
    assert_eq!(cited_sections(&help_texts(rust)), ["1", "3", "4", "5"]);

    let reference =
        std::fs::read_to_string(root().join("docs/reference.md")).expect("docs/reference.md");
    let mut texts: Vec<(String, String)> = documents()
        .into_iter()
        .filter(|(p, _)| !p.ends_with("docs/reference.md"))
        .map(|(p, t)| (p.display().to_string(), t))
        .collect();
    let cli = std::fs::read_to_string(root().join("src/cli.rs")).unwrap();
    texts.push(("src/cli.rs (help texts)".to_string(), help_texts(&cli)));
    assert!(
        texts
            .iter()
            .map(|(_, t)| cited_sections(t).len())
            .sum::<usize>()
            > 50,
        "the citations were not found"
    );
    let problems = citation_problems(&reference, &texts);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
