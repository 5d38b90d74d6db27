//! Token shards and training windows: round trips, error paths, window semantics.

mod common;

use common::err;
use foxlm::data::{
    prepare, windows_per_epoch, Dataset, Loader, LoaderState, PrepareOptions, Split, ValBy, FILES_LIST, MANIFEST_FILE,
};
use foxlm::tokenizer::{TextFormat, Tokenizer, BOS_ID, EOS_ID};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, text).unwrap();
    p
}

fn opts(val_fraction: f64) -> PrepareOptions {
    PrepareOptions {
        text_format: TextFormat::Plain,
        val_fraction,
        shard_tokens: 1 << 20,
        overwrite: false,
        progress: false,
        ..Default::default()
    }
}

/// Ten documents doc_0..doc_9 of different lengths, in a folder with a subfolder and a jsonl.
fn corpus(dir: &Path) -> Vec<String> {
    let mut texts = Vec::new();
    for i in 0..6 {
        let t = format!("Document number {i}. ") + &"The whale swims. ".repeat(i * 3 + 1);
        write(dir, &format!("in/doc_{i}.txt"), &t);
        texts.push(t);
    }
    for i in 6..8 {
        let t = format!("Document number {i} in a subfolder. ") + &"Call me Ishmael. ".repeat(i);
        write(dir, &format!("in/sub/doc_{i}.txt"), &t);
        texts.push(t);
    }
    // Natural order: doc_10.jsonl sorts after doc_9 ... but "sub" sorts after "doc_*" anyway.
    let j8 = "Line document eight — with a dash.";
    let j9 = "Line document nine.\nTwo lines.";
    write(
        dir,
        "in/zz.jsonl",
        &format!("{}\n\n{}\n", serde_json::json!({"text": j8}), serde_json::json!({"text": j9, "id": 9})),
    );
    texts.push(j8.into());
    texts.push(j9.into());
    texts
}

#[test]
fn prepare_round_trips_documents_and_splits_by_document() {
    let tmp = tempfile::tempdir().unwrap();
    let texts = corpus(tmp.path());
    let out = tmp.path().join("ds");
    let m = prepare(&[tmp.path().join("in")], &out, &opts(0.2)).unwrap();
    // 10 documents, every fifth held out: documents 4 and 9.
    assert_eq!((m.train.documents, m.val.documents), (8, 2));
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.manifest(), &m);
    assert_eq!(ds.manifest().text_format, TextFormat::Plain);
    assert_eq!(ds.manifest().vocab_size, 50257);
    let tok = Tokenizer::gpt2(TextFormat::Plain).unwrap();
    let train_texts: Vec<&String> =
        texts.iter().enumerate().filter(|(i, _)| *i != 4 && *i != 9).map(|(_, t)| t).collect();
    for (i, t) in train_texts.iter().enumerate() {
        let doc = ds.document(Split::Train, i);
        assert_eq!(doc, tok.encode(t, false), "train document {i}");
        assert_eq!(tok.decode(&doc), **t);
    }
    assert_eq!(ds.document(Split::Val, 0), tok.encode(&texts[4], false));
    assert_eq!(ds.document(Split::Val, 1), tok.encode(&texts[9], false));
    let total: usize = (0..8).map(|i| ds.document(Split::Train, i).len()).sum();
    assert_eq!(ds.num_tokens(Split::Train), total);
    assert_eq!(ds.num_documents(Split::Val), 2);
    // u16 storage: two bytes per token.
    let sh = &ds.manifest().train.shards[0];
    assert_eq!(std::fs::metadata(out.join(&sh.tokens_file)).unwrap().len() as usize, 2 * total);
    assert!(ds.summary().contains("8 documents"));
}

#[test]
fn small_shards_split_documents_across_files() {
    let tmp = tempfile::tempdir().unwrap();
    corpus(tmp.path());
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    prepare(&[tmp.path().join("in")], &a, &opts(0.0)).unwrap();
    prepare(&[tmp.path().join("in")], &b, &PrepareOptions { shard_tokens: 40, ..opts(0.0) }).unwrap();
    let (da, db) = (Dataset::open(&a).unwrap(), Dataset::open(&b).unwrap());
    assert!(db.manifest().train.shards.len() > 2);
    assert_eq!(da.num_documents(Split::Train), 10);
    for i in 0..10 {
        assert_eq!(da.document(Split::Train, i), db.document(Split::Train, i));
    }
}

#[test]
fn json_escaped_format_is_recorded_and_used() {
    let tmp = tempfile::tempdir().unwrap();
    let f = write(tmp.path(), "x.txt", "naïve line\nsecond");
    let out = tmp.path().join("ds");
    prepare(&[f], &out, &PrepareOptions { text_format: TextFormat::JsonEscaped, ..opts(0.0) }).unwrap();
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.manifest().text_format, TextFormat::JsonEscaped);
    let tok = Tokenizer::gpt2(TextFormat::JsonEscaped).unwrap();
    assert_eq!(tok.decode(&ds.document(Split::Train, 0)), "naïve line\nsecond");
    let text = std::fs::read_to_string(out.join(MANIFEST_FILE)).unwrap();
    assert!(text.contains("\"json-escaped\""), "{text}");
}

#[test]
fn open_errors_name_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    corpus(tmp.path());
    let out = tmp.path().join("ds");
    prepare(&[tmp.path().join("in")], &out, &opts(0.2)).unwrap();

    // Missing folder, missing manifest.
    assert!(err(Dataset::open(&tmp.path().join("nope"))).contains("nope"));
    let e = err(Dataset::open(&tmp.path().join("in")));
    assert!(e.contains("manifest.json"), "{e}");

    // Corrupt manifest.
    let mpath = out.join(MANIFEST_FILE);
    let good = std::fs::read(&mpath).unwrap();
    std::fs::write(&mpath, b"{ not json").unwrap();
    let e = err(Dataset::open(&out));
    assert!(e.contains("manifest.json") && e.contains("corrupt"), "{e}");
    std::fs::write(&mpath, &good).unwrap();

    // A flipped byte in a shard: checksum mismatch naming the shard.
    let shard = out.join("train-00000.tokens");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[3] ^= 1;
    std::fs::write(&shard, &bytes).unwrap();
    let e = err(Dataset::open(&out));
    assert!(e.contains("train-00000.tokens") && e.contains("checksum mismatch"), "{e}");
    // open_unverified does not hash, but still checks sizes.
    assert!(Dataset::open_unverified(&out).is_ok());

    // A truncated shard.
    bytes.truncate(bytes.len() - 2);
    std::fs::write(&shard, &bytes).unwrap();
    let e = err(Dataset::open_unverified(&out));
    assert!(e.contains("train-00000.tokens") && e.contains("truncated"), "{e}");

    // A missing shard.
    std::fs::remove_file(&shard).unwrap();
    let e = err(Dataset::open(&out));
    assert!(e.contains("train-00000.tokens"), "{e}");
}

#[test]
fn prepare_errors() {
    let tmp = tempfile::tempdir().unwrap();
    // Nothing but empty files: a clear error, no manifest.
    write(tmp.path(), "empty/a.txt", "");
    write(tmp.path(), "empty/b.txt", "");
    let out = tmp.path().join("ds");
    let e = err(prepare(&[tmp.path().join("empty")], &out, &opts(0.0)));
    assert!(e.contains("no text"), "{e}");
    assert!(!out.join(MANIFEST_FILE).exists());
    // An empty folder, a missing input.
    std::fs::create_dir_all(tmp.path().join("nothing")).unwrap();
    assert!(err(prepare(&[tmp.path().join("nothing")], &out, &opts(0.0))).contains("no files"));
    assert!(err(prepare(&[tmp.path().join("missing")], &out, &opts(0.0))).contains("missing"));
    // A bad fraction.
    write(tmp.path(), "t.txt", "some text");
    assert!(err(prepare(&[tmp.path().join("t.txt")], &out, &opts(1.0))).contains("--val-fraction"));
    // An existing dataset is not overwritten without --overwrite.
    prepare(&[tmp.path().join("t.txt")], &out, &opts(0.0)).unwrap();
    assert!(err(prepare(&[tmp.path().join("t.txt")], &out, &opts(0.0))).contains("--overwrite"));
    prepare(&[tmp.path().join("t.txt")], &out, &PrepareOptions { overwrite: true, ..opts(0.0) }).unwrap();
    // A bad jsonl line names the file and line.
    write(tmp.path(), "bad.jsonl", "{\"text\": \"ok\"}\n{\"body\": 1}\n");
    let e = err(prepare(&[tmp.path().join("bad.jsonl")], &tmp.path().join("ds2"), &opts(0.0)));
    assert!(e.contains("bad.jsonl:2"), "{e}");
}

#[test]
fn windows_start_with_bos_pack_with_eos_and_cover_the_stream() {
    let tmp = tempfile::tempdir().unwrap();
    corpus(tmp.path());
    let out = tmp.path().join("ds");
    prepare(&[tmp.path().join("in")], &out, &opts(0.0)).unwrap();
    let ds = Dataset::open(&out).unwrap();
    let seq = 16;
    let n_windows = windows_per_epoch(&ds, Split::Train, seq);
    let stream_len = ds.num_tokens(Split::Train) + ds.num_documents(Split::Train);
    assert_eq!(n_windows as usize, stream_len / seq);

    // Unshuffled: window k is BOS + stream[kT, kT+T) with the stream doc0 EOS doc1 EOS ...
    let mut stream = Vec::new();
    for i in 0..ds.num_documents(Split::Train) {
        stream.extend(ds.document(Split::Train, i));
        stream.push(EOS_ID);
    }
    let mut l = Loader::new(&ds, Split::Train, seq, 7, false).unwrap();
    for k in 0..n_windows as usize {
        let w = l.next_window();
        assert_eq!(w.len(), seq + 1);
        assert_eq!(w[0], BOS_ID);
        assert_eq!(&w[1..], &stream[k * seq..(k + 1) * seq], "window {k}");
    }
    // The epoch wraps.
    assert_eq!(l.state(), LoaderState { seed: 7, epoch: 0, index: n_windows });
    assert_eq!(&l.next_window()[1..], &stream[..seq]);
    assert_eq!(l.state().epoch, 1);

    // Shuffled: the same multiset of windows per epoch, in a seeded order; a batch's targets
    // are its ids shifted by one.
    let mut a = Loader::new(&ds, Split::Train, seq, 1, true).unwrap();
    let mut b = Loader::new(&ds, Split::Train, seq, 1, true).unwrap();
    let mut c = Loader::new(&ds, Split::Train, seq, 2, true).unwrap();
    let wa: Vec<Vec<u32>> = (0..n_windows).map(|_| a.next_window()).collect();
    let wb: Vec<Vec<u32>> = (0..n_windows).map(|_| b.next_window()).collect();
    let wc: Vec<Vec<u32>> = (0..n_windows).map(|_| c.next_window()).collect();
    assert_eq!(wa, wb);
    assert_ne!(wa, wc);
    let count = |ws: &[Vec<u32>]| ws.iter().flat_map(|w| w[1..].iter()).filter(|&&t| t == EOS_ID).count();
    // Each epoch's stream holds every document once (the tail shorter than a window is dropped).
    let total: usize = wa.iter().map(|w| w.len() - 1).sum();
    assert_eq!(total, n_windows as usize * seq);
    assert!(count(&wa) >= ds.num_documents(Split::Train) - 2, "packed with EOS between documents");
    // Next epoch: a different order.
    let wa2: Vec<Vec<u32>> = (0..n_windows).map(|_| a.next_window()).collect();
    assert_ne!(wa, wa2);

    // Resuming from a saved state continues identically.
    let mut d = Loader::new(&ds, Split::Train, seq, 1, true).unwrap();
    for _ in 0..5 {
        d.next_window();
    }
    let st = d.state();
    let expect = d.next_batch(3);
    let mut e = Loader::new(&ds, Split::Train, seq, 1, true).unwrap();
    e.set_state(st);
    let got = e.next_batch(3);
    assert_eq!(got, expect);
    assert_eq!(got.ids.len(), 3 * seq);
    for r in 0..3 {
        assert_eq!(got.ids[r * seq], BOS_ID);
        for t in 0..seq - 1 {
            assert_eq!(got.targets[r * seq + t], Some(got.ids[r * seq + t + 1]));
        }
    }
}

#[test]
fn corpus_shorter_than_a_window_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let f = write(tmp.path(), "t.txt", "A short text of a few tokens.");
    let out = tmp.path().join("ds");
    prepare(&[f], &out, &opts(0.0)).unwrap();
    let ds = Dataset::open(&out).unwrap();
    let e = err(Loader::new(&ds, Split::Train, 512, 0, true));
    assert!(e.contains("fewer than one window"), "{e}");
    // The empty validation split too.
    let e = err(Loader::new(&ds, Split::Val, 4, 0, false));
    assert!(e.contains("val split"), "{e}");
}

#[test]
fn moby_dick_sample_prepares() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sample/moby-dick");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("md");
    let m = prepare(&[root], &out, &PrepareOptions { val_fraction: 0.05, ..opts(0.0) }).unwrap();
    assert_eq!(m.train.documents + m.val.documents, 138);
    assert_eq!(m.val.documents, 6);
    assert!(m.train.tokens > 250_000, "{}", m.train.tokens);
    let ds = Dataset::open(&out).unwrap();
    let tok = Tokenizer::gpt2(TextFormat::Plain).unwrap();
    // Natural order: the first training document is chapter 1.
    assert!(tok.decode(&ds.document(Split::Train, 0)).starts_with("CHAPTER 1. Loomings."));
}

// ---------------------------------------------------------------------------------------------
// Tree mode (--glob).

fn write_bytes(dir: &Path, name: &str, bytes: &[u8]) {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, bytes).unwrap();
}

/// A site-packages-like tree under `root`: twelve packages of two folders each, three files per
/// folder (distinct contents), one licence header copied to three places (two duplicates), two
/// files that are not UTF-8, an empty file, and files that no pattern should pick (a .txt, a
/// hidden folder's .py, a .pyc). Returns the contents of the distinct valid .py files by path.
fn tree(root: &Path) -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    for p in 0..12 {
        for d in ["core", "util"] {
            for f in 0..3 {
                let rel = format!("pkg{p}/{d}/mod{f}.py");
                let text = format!("# {rel}\ndef f_{p}_{f}(x):\n    return x * {}\n", p * 10 + f)
                    + &"    # padding line\n".repeat(p + f);
                write(root, &rel, &text);
                files.insert(rel, text);
            }
        }
    }
    let header = "# Licensed under the Apache License, Version 2.0\n# (the same header everywhere)\n";
    for rel in ["pkg0/LICENSE_HEADER.py", "pkg5/core/LICENSE_HEADER.py", "pkg9/util/LICENSE_HEADER.py"] {
        write(root, rel, header);
    }
    // Natural order of the walk: pkg0 < pkg5 < pkg9, so the first copy is pkg0's.
    files.insert("pkg0/LICENSE_HEADER.py".into(), header.into());
    write_bytes(root, "pkg3/core/latin1.py", b"# caf\xe9\nx = 1\n");
    write_bytes(root, "pkg7/binary.py", &[0u8, 159, 146, 150, 0xff, 0xfe]);
    write(root, "pkg4/util/empty.py", "");
    write(root, "pkg1/README.txt", "not python");
    write(root, ".hidden/secret.py", "print('hidden')\n");
    write_bytes(root, "pkg2/__pycache__/mod0.cpython-311.pyc", b"\x00\x01pyc");
    files
}

fn tree_opts(val_by: ValBy, val_fraction: f64) -> PrepareOptions {
    PrepareOptions { globs: vec!["**/*.py".into()], val_by, ..opts(val_fraction) }
}

/// files.jsonl as (path, status) pairs, in order.
fn listing(out: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(out.join(FILES_LIST))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["path"].as_str().unwrap().to_string(), v["status"].as_str().unwrap().to_string())
        })
        .collect()
}

fn parent(rel: &str) -> &str {
    rel.rsplit_once('/').map_or("", |(d, _)| d)
}

#[test]
fn glob_dedups_skips_non_utf8_and_holds_out_whole_folders() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("site-packages");
    let files = tree(&root);
    let out = tmp.path().join("ds");
    let m = prepare(std::slice::from_ref(&root), &out, &tree_opts(ValBy::Dir, 0.2)).unwrap();
    let t = m.tree.clone().unwrap();
    // 72 module files + 3 header copies + 2 non-UTF-8 + 1 empty; not the .txt, .pyc or hidden one.
    assert_eq!(t.files, 78);
    assert_eq!(t.duplicates, 2);
    assert_eq!(t.skipped_not_utf8, 2);
    assert_eq!(m.skipped_empty, 1);
    assert_eq!((t.skipped_unreadable, t.skipped_too_large), (0, 0));
    assert_eq!(m.train.documents + m.val.documents, 73);
    assert_eq!(m.train.documents + m.val.documents, files.len());
    assert_eq!(m.val_by, ValBy::Dir);
    // 24 package folders plus pkg0 itself (its header file).
    assert_eq!(t.groups, 25);
    assert!(t.val_groups >= 2, "{t:?}");
    let frac = t.val_bytes as f64 / (t.train_bytes + t.val_bytes) as f64;
    assert!(frac > 0.1 && frac <= 0.2, "held-out fraction {frac}");

    let rows = listing(&out);
    assert_eq!(rows.len(), 78);
    let status: BTreeMap<&str, &str> = rows.iter().map(|(p, s)| (p.as_str(), s.as_str())).collect();
    assert_eq!(status["pkg5/core/LICENSE_HEADER.py"], "duplicate");
    assert_eq!(status["pkg9/util/LICENSE_HEADER.py"], "duplicate");
    assert_ne!(status["pkg0/LICENSE_HEADER.py"], "duplicate");
    assert_eq!(status["pkg3/core/latin1.py"], "not-utf8");
    assert_eq!(status["pkg7/binary.py"], "not-utf8");
    assert_eq!(status["pkg4/util/empty.py"], "empty");
    // No folder has files in both splits.
    let dirs =
        |want: &str| -> BTreeSet<&str> { rows.iter().filter(|(_, s)| s == want).map(|(p, _)| parent(p)).collect() };
    let (train_dirs, val_dirs) = (dirs("train"), dirs("val"));
    assert_eq!(val_dirs.len(), t.val_groups);
    assert!(train_dirs.is_disjoint(&val_dirs), "{train_dirs:?} / {val_dirs:?}");
    // The shards hold exactly those files, in listing order.
    let ds = Dataset::open(&out).unwrap();
    let tok = Tokenizer::gpt2(TextFormat::Plain).unwrap();
    for (split, want) in [(Split::Train, "train"), (Split::Val, "val")] {
        let paths: Vec<&String> = rows.iter().filter(|(_, s)| s == want).map(|(p, _)| p).collect();
        assert_eq!(ds.num_documents(split), paths.len());
        for (i, p) in paths.iter().enumerate() {
            assert_eq!(tok.decode(&ds.document(split, i)), files[*p], "{split} document {i} ({p})");
        }
    }
    assert!(ds.summary().contains("2 duplicates, 2 not UTF-8"), "{}", ds.summary());
}

#[test]
fn glob_hold_out_by_top_level_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sp");
    tree(&root);
    write(&root, "six.py", "import sys\nPY3 = True\n");
    let out = tmp.path().join("ds");
    let m = prepare(std::slice::from_ref(&root), &out, &tree_opts(ValBy::Top, 0.25)).unwrap();
    let t = m.tree.unwrap();
    // pkg0..pkg11 and six.py (a top-level file is its own group).
    assert_eq!(t.groups, 13);
    let rows = listing(&out);
    let top = |want: &str| -> BTreeSet<String> {
        rows.iter().filter(|(_, s)| s == want).map(|(p, _)| p.split('/').next().unwrap().to_string()).collect()
    };
    let (train, val) = (top("train"), top("val"));
    assert!(!val.is_empty() && train.is_disjoint(&val), "{train:?} / {val:?}");
    assert_eq!(train.len() + val.len(), 13);
}

#[test]
fn glob_prepare_is_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("site-packages");
    tree(&root);
    // Different thread counts, the same bytes: nothing depends on scheduling.
    let run = |threads: usize, out: &Path| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let o = PrepareOptions { shard_tokens: 300, ..tree_opts(ValBy::Dir, 0.2) };
        pool.install(|| prepare(std::slice::from_ref(&root), out, &o)).unwrap();
    };
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    run(1, &a);
    run(4, &b);
    let names = |d: &Path| -> BTreeSet<String> {
        std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
    };
    let na = names(&a);
    assert_eq!(na, names(&b));
    assert!(na.len() > 5, "several shards: {na:?}");
    for n in &na {
        assert_eq!(std::fs::read(a.join(n)).unwrap(), std::fs::read(b.join(n)).unwrap(), "{n} differs");
    }
}

#[test]
fn glob_options_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sp");
    tree(&root);
    let out = tmp.path().join("ds");
    let e = err(prepare(std::slice::from_ref(&root), &out, &PrepareOptions { val_by: ValBy::Dir, ..opts(0.1) }));
    assert!(e.contains("--val-by dir needs --glob"), "{e}");
    let e = err(prepare(&[root.join("six.py")], &out, &tree_opts(ValBy::Dir, 0.1)));
    assert!(e.contains("six.py"), "{e}");
    let e = err(prepare(&[root.join("pkg1/README.txt")], &out, &tree_opts(ValBy::Dir, 0.1)));
    assert!(e.contains("README.txt") && e.contains("folders"), "{e}");
    let none = PrepareOptions { globs: vec!["**/*.rs".into()], ..opts(0.1) };
    let e = err(prepare(std::slice::from_ref(&root), &out, &none));
    assert!(e.contains("no file") && e.contains("**/*.rs"), "{e}");
    let bad = PrepareOptions { globs: vec!["*.{py".into()], ..opts(0.1) };
    assert!(err(prepare(std::slice::from_ref(&root), &out, &bad)).contains("*.{py"));
    assert!(!out.exists(), "nothing is written when the inputs are wrong");
    // Large files are skipped when asked.
    let small = PrepareOptions { max_file_bytes: Some(60), ..tree_opts(ValBy::Document, 0.0) };
    let m = prepare(std::slice::from_ref(&root), &out, &small).unwrap();
    let t = m.tree.unwrap();
    assert!(t.skipped_too_large > 30 && t.skipped_too_large < 78, "{t:?}");
    assert_eq!(m.train.documents + t.skipped_too_large + t.duplicates + t.skipped_not_utf8 + m.skipped_empty, 78);
}

#[test]
fn glob_from_the_command_line_reports_what_it_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("site-packages");
    tree(&root);
    let out = tmp.path().join("ds");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_foxlm"))
        .args(["data", "prepare", "--quiet", "--text-format", "plain", "--glob", "*.py", "--val-by", "top"])
        .args(["--max-file-bytes", "1K", "--val-fraction", "0.2", "--input"])
        .arg(&root)
        .arg("--output")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("78 files matched")
            && stderr.contains("2 duplicates dropped; skipped 2 not UTF-8, 0 unreadable"),
        "{stderr}"
    );
    assert!(stderr.contains("of 12 groups (--val-by top)"), "{stderr}");
    let m = Dataset::open(&out).unwrap().manifest().clone();
    assert_eq!((m.globs, m.val_by), (vec!["*.py".to_string()], ValBy::Top));
    // A bad size and a bad --val-by are usage errors.
    for bad in [["--max-file-bytes", "lots"], ["--val-by", "package"]] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_foxlm"))
            .args(["data", "prepare", "--glob", "*.py", "--input"])
            .arg(&root)
            .arg("--output")
            .arg(tmp.path().join("x"))
            .args(bad)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
}
