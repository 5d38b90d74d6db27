//! The commands in README.md and docs/ work as written: `cargo run` at the repository root runs
//! foxlm, CI runs exactly the README's test command, and every `foxlm`, `fox-attn`, script and
//! `cargo test --test` line of the documentation parses with the real command line and names only
//! repository files that exist. A broken line fails with its file and line number.

use clap::error::ErrorKind;
use clap::Parser;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// README.md, docs/*.md and experiments/*/README.md, relative to the root.
fn doc_files() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![PathBuf::from("README.md")];
    for dir in ["docs", "experiments"] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("cannot list {dir}/: {e}"))
            .map(|e| e.expect("folder entry").path())
            .flat_map(|p| if p.is_dir() { vec![p.join("README.md")] } else { vec![p] })
            .filter(|p| p.extension().is_some_and(|e| e == "md") && p.is_file())
            .map(|p| p.strip_prefix(&root).expect("under the root").to_path_buf())
            .collect();
        found.sort();
        files.extend(found);
    }
    files
}

/// A command line of the documentation.
#[derive(Debug)]
struct DocLine {
    file: String,
    line: usize,
    text: String,
    /// In a code block (a whole command) rather than an inline `code` span in prose (which may
    /// leave out required arguments: "`foxlm eval loss` writes ...").
    block: bool,
    /// Index of the code block, for `F=...` assignments that later lines of the block use.
    block_id: usize,
}

/// The lines of fenced (```sh, ```bash, ``` without a language) and indented code blocks, with
/// backslash continuations joined, and the inline code spans of prose that start with `foxlm `.
fn code_lines(rel: &Path) -> Vec<DocLine> {
    let text = read(&root().join(rel));
    let file = rel.display().to_string();
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<DocLine> = vec![];
    let (mut fence, mut shell, mut block_id) = (false, false, 0usize);
    let mut pending: Option<(usize, String)> = None;
    let mut prev_blank = true;
    let mut in_indented = false;
    for (i, raw) in lines.iter().enumerate() {
        let n = i + 1;
        let trimmed = raw.trim_start();
        if let Some(lang) = trimmed.strip_prefix("```") {
            if !fence {
                block_id += 1;
                shell = matches!(lang.trim(), "" | "sh" | "bash" | "shell" | "console");
            }
            fence = !fence;
            prev_blank = false;
            continue;
        }
        let indented = !fence && raw.starts_with("    ") && !trimmed.is_empty() && (prev_blank || in_indented);
        if indented && !in_indented {
            block_id += 1;
        }
        in_indented = indented || (in_indented && trimmed.is_empty());
        prev_blank = trimmed.is_empty();
        if (fence && shell) || indented {
            let (start, mut joined) = pending.take().unwrap_or((n, String::new()));
            let body = trimmed.strip_suffix('\\');
            joined.push_str(body.unwrap_or(trimmed));
            if body.is_some() {
                joined.push(' ');
                pending = Some((start, joined));
            } else {
                out.push(DocLine { file: file.clone(), line: start, text: joined, block: true, block_id });
            }
            continue;
        }
        if fence {
            continue;
        }
        // Inline spans of prose: `foxlm ...`.
        for (k, span) in raw.split('`').enumerate() {
            if k % 2 == 1 && span.starts_with("foxlm ") {
                out.push(DocLine { file: file.clone(), line: n, text: span.to_string(), block: false, block_id: 0 });
            }
        }
    }
    out
}

/// Splits a shell line into commands of words: quotes and backslashes as the shell reads them,
/// `#` comments dropped, split at `|`, `&&`, `||`, `;` and `&`; redirections and their targets
/// dropped; `$VAR` and `${VAR}` replaced from `vars` (or by the variable's name, a placeholder).
fn shell_commands(line: &str, vars: &HashMap<String, String>) -> Result<Vec<Vec<String>>, String> {
    let mut cmds: Vec<Vec<String>> = vec![vec![]];
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    let mut redirect = false;
    let expand = |chars: &mut std::iter::Peekable<std::str::Chars>, w: &mut String| {
        let braced = chars.peek() == Some(&'{');
        if braced {
            chars.next();
        }
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                name.push(c);
                chars.next();
            } else {
                break;
            }
        }
        if braced {
            chars.next();
        }
        w.push_str(vars.get(&name).map(String::as_str).unwrap_or(&name));
    };
    let end_word = |cmds: &mut Vec<Vec<String>>, word: &mut Option<String>, redirect: &mut bool| {
        if let Some(w) = word.take() {
            if *redirect {
                *redirect = false;
            } else {
                cmds.last_mut().expect("a command").push(w);
            }
        }
    };
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => end_word(&mut cmds, &mut word, &mut redirect),
            '#' if word.is_none() => break,
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err("unterminated '".into()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => w.extend(chars.next()),
                        Some('$') => expand(&mut chars, w),
                        Some(c) => w.push(c),
                        None => return Err("unterminated \"".into()),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            '$' => expand(&mut chars, word.get_or_insert_with(String::new)),
            '|' | ';' | '&' => {
                end_word(&mut cmds, &mut word, &mut redirect);
                if matches!(chars.peek(), Some('|') | Some('&')) {
                    chars.next();
                }
                cmds.push(vec![]);
            }
            '>' | '<' => {
                // `2>&1`, `>file`, `> file`: drop the redirection and its target.
                if word.as_deref().is_some_and(|w| w.chars().all(|c| c.is_ascii_digit())) {
                    word = None;
                }
                end_word(&mut cmds, &mut word, &mut redirect);
                if chars.peek() == Some(&'&') {
                    chars.next();
                    chars.next();
                } else {
                    redirect = true;
                }
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    end_word(&mut cmds, &mut word, &mut redirect);
    cmds.retain(|c| !c.is_empty());
    Ok(cmds)
}

/// A usage synopsis (`foxlm serve --model DIR [--port 8000] [--device cpu|auto]`) as one command:
/// optional parts taken, the first of alternatives.
fn synopsis_to_command(line: &str) -> String {
    if !line.contains(" [-") {
        return line.to_string();
    }
    let code = line.split(" # ").next().unwrap_or(line);
    code.split_whitespace()
        .map(|w| w.trim_matches(['[', ']']).split('|').next().unwrap_or("").to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

enum Unwrapped {
    Words(Vec<String>),
    /// `bash -c STRING`: the commands in STRING.
    Script(String),
}

/// The command under launchers (`srun OPTIONS`, `env`, `time`, `nohup`) and `bash -c`.
fn unwrap_command(words: &[String]) -> Unwrapped {
    let mut w: Vec<String> = words.to_vec();
    while let Some(first) = w.first() {
        if matches!(first.as_str(), "srun" | "env" | "time" | "nohup") {
            w.remove(0);
            while w.first().is_some_and(|a| a.starts_with('-')) {
                w.remove(0);
            }
        } else {
            break;
        }
    }
    match w.iter().position(|a| !is_assignment(a)) {
        Some(k) if matches!(w[k].as_str(), "bash" | "sh") && w.get(k + 1).is_some_and(|a| a == "-c") => {
            Unwrapped::Script(w.get(k + 2).cloned().unwrap_or_default())
        }
        _ => Unwrapped::Words(w),
    }
}

/// What the documentation runs.
enum Invocation {
    Foxlm(Vec<String>),
    FoxAttn(Vec<String>),
    Script(String),
    CargoTest { package: Option<String>, test: String },
}

/// The program a command runs, with its arguments; `VAR=value` prefixes skipped.
fn invocation(words: &[String]) -> Option<Invocation> {
    let words: Vec<&str> = words.iter().map(String::as_str).skip_while(|w| is_assignment(w)).collect();
    let (&prog, args) = words.split_first()?;
    let rest = || args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let name = prog.rsplit('/').next().unwrap_or(prog);
    match name {
        "foxlm" if prog == "foxlm" || prog.ends_with("target/release/foxlm") => Some(Invocation::Foxlm(rest())),
        "fox-attn" => Some(Invocation::FoxAttn(rest())),
        "bash" | "sh" => args.first().map(|s| Invocation::Script(s.to_string())),
        _ if prog.ends_with(".sh") => Some(Invocation::Script(prog.to_string())),
        "cargo" => {
            let sub = *args.first()?;
            let (opts, after) = match args.iter().position(|&a| a == "--") {
                Some(k) => (&args[1..k], &args[k + 1..]),
                None => (&args[1..], &[][..]),
            };
            let value = |flag: &str| opts.iter().position(|&a| a == flag).and_then(|k| opts.get(k + 1)).copied();
            let after = after.iter().map(|s| s.to_string()).collect();
            match sub {
                "run" if value("--bin") == Some("fox-attn") => Some(Invocation::FoxAttn(after)),
                "run" => Some(Invocation::Foxlm(after)),
                "test" => value("--test")
                    .map(|t| Invocation::CargoTest { package: value("-p").map(String::from), test: t.to_string() }),
                _ => None,
            }
        }
        _ => None,
    }
}

fn is_assignment(w: &str) -> bool {
    w.split_once('=').is_some_and(|(k, _)| {
        !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !k.starts_with(char::is_numeric)
    })
}

/// Words that name files of this repository (they must exist).
fn repository_paths(words: &[String]) -> Vec<String> {
    const TOP: [&str; 8] = ["tests/", "data/", "bench/", "docs/", "crates/", "experiments/", "assets/", ".ci/"];
    words
        .iter()
        .flat_map(|w| w.split_once('=').map_or(w.as_str(), |(_, v)| v).split(','))
        .map(|w| w.trim_start_matches("./"))
        .filter(|w| TOP.iter().any(|t| w.starts_with(t)) && !w.contains(['*', '?', '[', '{']))
        .map(String::from)
        .collect()
}

/// The subcommands and flags fox-attn reads, from its source (it parses its arguments by hand).
fn fox_attn_vocabulary() -> (BTreeSet<String>, BTreeSet<String>) {
    let src = read(&root().join("crates/fox-checks/src/bin/fox-attn.rs"));
    let literals = |s: &str| -> Vec<String> { s.split('"').skip(1).step_by(2).map(String::from).collect() };
    let mut commands = BTreeSet::new();
    let mut flags = BTreeSet::new();
    for line in src.lines() {
        let t = line.trim_start();
        if t.starts_with('"') && t.contains("=>") {
            commands.extend(literals(t.split("=>").next().unwrap_or("")));
        }
        flags.extend(literals(line).into_iter().filter(|l| l.starts_with('-') && !l.contains(' ')));
    }
    (commands, flags)
}

/// Prose names a flag without its value ("`foxlm train --out`") or with a placeholder
/// ("`--gpus N`"); a code block must give a real value.
fn inline_placeholder(e: &clap::Error) -> bool {
    use clap::error::{ContextKind, ContextValue};
    match e.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(v)) => v.is_empty() || v.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
        _ => false,
    }
}

/// Checks one command; Err names what is wrong.
fn check(words: &[String], block: bool, fox_attn: &(BTreeSet<String>, BTreeSet<String>)) -> Result<bool, String> {
    let root = root();
    for p in repository_paths(words) {
        if !root.join(&p).exists() {
            return Err(format!("{p}: no such file in the repository"));
        }
    }
    let Some(inv) = invocation(words) else { return Ok(false) };
    match inv {
        Invocation::Foxlm(args) => {
            let argv = std::iter::once("foxlm".to_string()).chain(args);
            if let Err(e) = foxlm::cli::Cli::try_parse_from(argv) {
                let ok = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                    || (!block
                        && matches!(
                            e.kind(),
                            ErrorKind::MissingRequiredArgument
                                | ErrorKind::MissingSubcommand
                                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                        ))
                    || (!block
                        && matches!(e.kind(), ErrorKind::InvalidValue | ErrorKind::ValueValidation)
                        && inline_placeholder(&e));
                if !ok {
                    let msg = e.to_string();
                    return Err(msg.lines().find(|l| l.starts_with("error:")).unwrap_or(&msg).to_string());
                }
            }
        }
        Invocation::FoxAttn(args) => {
            let (commands, flags) = fox_attn;
            let cmd = args.first().map(String::as_str).unwrap_or("help");
            if !commands.contains(cmd) {
                return Err(format!("fox-attn has no subcommand {cmd:?} (it has {commands:?})"));
            }
            for a in &args[1..] {
                let a = a.trim_matches(['[', ']']);
                if a.starts_with('-') && !flags.contains(a) {
                    return Err(format!("fox-attn does not read {a}"));
                }
            }
        }
        Invocation::Script(s) => {
            if !root.join(&s).is_file() {
                return Err(format!("{s}: no such script in the repository"));
            }
        }
        Invocation::CargoTest { package, test } => {
            let packages = match &package {
                Some(p) => vec![p.clone()],
                None => vec!["foxlm".into(), "fox-kernels".into()],
            };
            if !packages.iter().any(|p| root.join("crates").join(p).join("tests").join(format!("{test}.rs")).is_file())
            {
                return Err(format!("--test {test}: no tests/{test}.rs in {}", packages.join(" or ")));
            }
        }
    }
    Ok(true)
}

#[test]
fn every_documented_command_parses_and_names_existing_files() {
    let fox_attn = fox_attn_vocabulary();
    assert!(fox_attn.0.contains("check") && fox_attn.1.contains("--filter"), "fox-attn's vocabulary: {fox_attn:?}");
    let (mut checked, mut foxlm_blocks, mut failures) = (0, 0, vec![]);
    for file in doc_files() {
        let mut vars: HashMap<String, String> = HashMap::new();
        let mut block = usize::MAX;
        let mut carry: Option<DocLine> = None;
        for l in code_lines(&file) {
            if l.block && l.block_id != block {
                vars.clear();
                block = l.block_id;
            }
            // A quote left open continues on the block's next line (`bash -c '` ... `'`).
            let mut l = l;
            if let Some(open) = carry.take() {
                let open: DocLine = open;
                if open.block_id == l.block_id && open.file == l.file {
                    l = DocLine { text: format!("{} {}", open.text, l.text), line: open.line, ..l };
                }
            }
            let cmds = match shell_commands(&synopsis_to_command(&l.text), &vars) {
                Ok(c) => c,
                Err(_) if l.block => {
                    carry = Some(l);
                    continue;
                }
                Err(e) => {
                    if l.text.contains("foxlm ") {
                        failures.push(format!("{}:{}: `{}`: {e}", l.file, l.line, l.text));
                    }
                    continue;
                }
            };
            let cmds: Vec<Vec<String>> = cmds
                .into_iter()
                .flat_map(|words| match unwrap_command(&words) {
                    Unwrapped::Script(s) => shell_commands(&s, &vars).unwrap_or_default(),
                    Unwrapped::Words(w) => vec![w],
                })
                .collect();
            for words in cmds {
                // `F=path` alone on a line: later lines of the block use $F.
                if words.iter().all(|w| is_assignment(w)) {
                    for w in &words {
                        let (k, v) = w.split_once('=').expect("an assignment");
                        vars.insert(k.to_string(), v.to_string());
                    }
                }
                match check(&words, l.block, &fox_attn) {
                    Ok(true) => {
                        checked += 1;
                        foxlm_blocks +=
                            usize::from(l.block && matches!(invocation(&words), Some(Invocation::Foxlm(_))));
                    }
                    Ok(false) => {}
                    Err(e) => failures.push(format!("{}:{}: `{}`: {e}", l.file, l.line, l.text.trim())),
                }
            }
        }
        if let Some(l) = carry {
            failures.push(format!("{}:{}: `{}`: a quote is never closed", l.file, l.line, l.text));
        }
    }
    assert!(
        failures.is_empty(),
        "{} documented command(s) do not work as written:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The documentation holds dozens of foxlm commands: finding few means the extraction broke.
    eprintln!("{checked} documented commands checked, {foxlm_blocks} of them foxlm lines of code blocks");
    assert!(foxlm_blocks >= 30 && checked >= 80, "only {foxlm_blocks} foxlm command lines ({checked} in all) found");
}

#[test]
fn the_readme_setup_commands_are_what_ci_and_cargo_run() {
    let root = root();
    let readme = read(&root.join("README.md"));
    let setup: Vec<&str> = readme
        .split("## Set-up")
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("README.md: a ```sh block under ## Set-up")
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .collect();
    assert_eq!(setup, ["cargo run --release -- demo", "cargo test --release --workspace"], "README.md's set-up");
    // CI runs exactly the README's test command.
    let ci = read(&root.join(".ci/run"));
    let ci_cmds: Vec<&str> = ci.lines().map(str::trim).filter(|l| l.starts_with("cargo ")).collect();
    assert_eq!(ci_cmds, [setup[1]], ".ci/run's cargo commands");

    // `cargo run` picks the binary as cargo's run command does: of the packages it builds by
    // default (the workspace's default members), the one binary named by a `default-run`; without
    // one, the only binary there is; else it gives up ("could not determine which binary to run").
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(&cargo)
        .args(["metadata", "--no-deps", "--offline", "--format-version", "1"])
        .current_dir(&root)
        .output()
        .expect("run cargo metadata");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let members =
        meta["workspace_default_members"].as_array().or(meta["workspace_members"].as_array()).expect("members");
    let packages: Vec<&serde_json::Value> =
        meta["packages"].as_array().expect("packages").iter().filter(|p| members.contains(&p["id"])).collect();
    let default_runs: Vec<&str> = packages.iter().filter_map(|p| p["default_run"].as_str()).collect();
    let bins: Vec<&str> = packages
        .iter()
        .flat_map(|p| p["targets"].as_array().expect("targets").iter())
        .filter(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "bin")))
        .filter_map(|t| t["name"].as_str())
        .collect();
    let runs = match (default_runs.as_slice(), bins.as_slice()) {
        ([one], _) => Some(*one),
        ([], [one]) => Some(*one),
        _ => None,
    };
    assert_eq!(runs, Some("foxlm"), "`cargo run` at the root: default-run {default_runs:?} among binaries {bins:?}");
    // ... and `cargo build --release` builds every binary the documentation then runs.
    assert!(bins.contains(&"foxlm") && bins.contains(&"fox-attn"), "default members' binaries: {bins:?}");
}

#[test]
fn the_shell_reader_splits_and_expands_as_the_shell_does() {
    let vars: HashMap<String, String> = [("F".to_string(), "tests/x".to_string())].into();
    let c = shell_commands(r#"A=1 foxlm x --model $F "a b" 'c d' 2>&1 | head -3 && bash y.sh # note"#, &vars).unwrap();
    assert_eq!(
        c,
        vec![vec!["A=1", "foxlm", "x", "--model", "tests/x", "a b", "c d"], vec!["head", "-3"], vec!["bash", "y.sh"]]
    );
    let c = shell_commands("foxlm a > out.txt; foxlm b --p ${G}/z", &vars).unwrap();
    assert_eq!(c, vec![vec!["foxlm", "a"], vec!["foxlm", "b", "--p", "G/z"]]);
    assert!(shell_commands("foxlm 'x", &vars).is_err());
    // The checks themselves fail on what they exist to catch.
    let fa = fox_attn_vocabulary();
    let w = |s: &str| shell_commands(s, &vars).unwrap().remove(0);
    assert!(check(&w("foxlm train --no-such-flag"), true, &fa).unwrap_err().contains("--no-such-flag"));
    assert!(check(&w("foxlm inspect --model tests/fixtures/nope"), true, &fa)
        .unwrap_err()
        .contains("tests/fixtures/nope"));
    assert!(check(&w("foxlm eval loss"), true, &fa).is_err());
    assert_eq!(check(&w("foxlm eval loss"), false, &fa), Ok(true));
    assert!(check(&w("fox-attn frobnicate"), true, &fa).is_err());
    assert!(check(&w("bash bench/no_such.sh"), true, &fa).is_err());
    assert!(check(&w("cargo test --release -p foxlm --test no_such_test"), true, &fa).is_err());
    assert_eq!(check(&w("cargo run --release -- demo --help"), true, &fa), Ok(true));
    assert!(check(&w("cargo run --release -- demo --steps x"), true, &fa).is_err());
    assert_eq!(check(&w("echo hello"), true, &fa), Ok(false));
}
