//! `foxlm eval compare` on hand-made `eval loss` outputs: the table's range means and
//! differences, the inputs it reads (folder, loss.json, loss.csv, training folders), its plots,
//! and its errors.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_foxlm");

fn foxlm(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run foxlm")
}

fn ok(args: &[&str]) -> String {
    let o = foxlm(args);
    assert!(o.status.success(), "foxlm {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let o = foxlm(args);
    assert!(!o.status.success(), "foxlm {args:?} should fail");
    String::from_utf8(o.stderr).unwrap()
}

/// T = 8, N = 16. fox: 2 - 0.05 i everywhere; transformer: the same inside the training context,
/// then 2 + 0.1 (i - 8); norope (CSV, another folder): 3 everywhere.
fn inputs(dir: &Path) {
    let fox: Vec<f64> = (0..16).map(|i| 2.0 - 0.05 * i as f64).collect();
    let tr: Vec<f64> =
        (0..16).map(|i| if i < 8 { 2.0 - 0.05 * i as f64 } else { 2.0 + 0.1 * (i - 8) as f64 }).collect();
    let json = serde_json::json!({
        "context": 16,
        "models": [
            {"name": "fox", "train_context": 8, "loss": fox},
            {"name": "transformer", "train_context": 8, "loss": tr},
        ]
    });
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("a/loss.json"), json.to_string()).unwrap();
    // As eval loss writes it: a smoothed column beside each model's, names quoted when needed.
    let mut csv = String::from("position,\"no, rope\",\"no, rope (smoothed)\"\n");
    for i in 0..16 {
        csv += &format!("{i},3,2.5\n");
    }
    std::fs::create_dir_all(dir.join("b")).unwrap();
    std::fs::write(dir.join("b/loss.csv"), csv).unwrap();
    // Training folders: metrics.jsonl with train and val lines.
    for (name, val, secs) in [("fox", 1.5, 272.4), ("transformer", 1.6, 250.0), ("norope", 2.9, 61.0)] {
        let run = dir.join("runs").join(name);
        std::fs::create_dir_all(&run).unwrap();
        let lines = [
            serde_json::json!({"kind": "val", "step": 0, "tokens": 0, "val_loss": 10.8, "elapsed_s": 1.0}),
            serde_json::json!({"kind": "train", "step": 100, "tokens": 6400, "loss": 2.0, "elapsed_s": secs - 1.0}),
            serde_json::json!({"kind": "val", "step": 100, "tokens": 6400, "val_loss": val, "elapsed_s": secs}),
        ];
        let text: String = lines.iter().map(|l| l.to_string() + "\n").collect();
        std::fs::write(run.join("metrics.jsonl"), text).unwrap();
    }
}

#[test]
fn compare_tabulates_range_means_and_differences() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    inputs(d);
    let out = d.join("cmp");
    let p = |s: &str| d.join(s).to_str().unwrap().to_string();
    let args = [
        "eval",
        "compare",
        "--input",
        &p("a"),
        "--input",
        &p("b/loss.csv"),
        "--baseline",
        "transformer",
        "--run",
        &p("runs/fox"),
        "--run",
        &p("runs/transformer"),
        "--run",
        &p("runs/norope"),
        "--window",
        "3",
        "--out",
        &p("cmp"),
    ];
    let stdout = ok(&args);
    let md = std::fs::read_to_string(out.join("compare.md")).unwrap();
    assert!(stdout.contains(&md));
    let lines: Vec<&str> = md.lines().collect();
    // the range table, then the bands' means and their differences to the baseline
    assert_eq!(lines.len(), 17, "{md}");
    assert_eq!(
        lines[0],
        "| model | final val. loss | L(i), i ∈ [6, 8) | L(i), i ∈ [8, 16) | Δ [6, 8) vs transformer | \
         Δ [8, 16) vs transformer | steps | tokens | training time |"
    );
    // fox: [6, 8) = mean(1.70, 1.65); [8, 16) = mean(1.60 .. 1.25) = 1.425.
    // transformer: 1.675 and mean(2.0 .. 2.7) = 2.35; norope: 3 and 3.
    assert_eq!(lines[2], "| fox | 1.5000 | 1.6750 | 1.4250 | +0.0000 | -0.9250 | 100 | 6400 | 4 min 32 s |");
    assert_eq!(lines[3], "| transformer | 1.6000 | 1.6750 | 2.3500 | +0.0000 | +0.0000 | 100 | 6400 | 4 min 10 s |");
    assert_eq!(lines[4], "| no, rope | 2.9000 | 3.0000 | 3.0000 | +1.3250 | +0.6500 | 100 | 6400 | 1 min 01 s |");
    // bands of T = 8 over 16 positions: [0, T/32) is empty at this T and dropped
    assert_eq!(lines[6], "| mean L(i), i ∈ | [0, 1) | [1, 2) | [2, 4) | [4, 8) | [8, 12) | [12, 16) |");
    assert_eq!(lines[8], "| fox | 2.0000 | 1.9500 | 1.8750 | 1.7250 | 1.5250 | 1.3250 |");
    assert_eq!(lines[9], "| transformer | 2.0000 | 1.9500 | 1.8750 | 1.7250 | 2.1500 | 2.5500 |");
    assert_eq!(lines[12], "| Δ vs transformer | [0, 1) | [1, 2) | [2, 4) | [4, 8) | [8, 12) | [12, 16) |");
    assert_eq!(lines[14], "| fox | +0.0000 | +0.0000 | +0.0000 | +0.0000 | -0.6250 | -1.2250 |");
    assert_eq!(lines[16], "| no, rope | +1.0000 | +1.0500 | +1.1250 | +1.2750 | +0.8500 | +0.4500 |");

    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("compare.json")).unwrap()).unwrap();
    assert_eq!(j["train_context"], 8);
    assert_eq!(j["positions"], 16);
    assert_eq!(j["baseline"], "transformer");
    let close = |v: &serde_json::Value, want: f64| (v.as_f64().unwrap() - want).abs() < 1e-12;
    assert!(close(&j["models"][0]["extrapolated_diff"], -0.925));
    assert!(close(&j["models"][2]["late_diff"], 1.325));
    assert!(close(&j["models"][1]["train_seconds"], 250.0));
    assert_eq!(j["bands"], serde_json::json!([[0, 1], [1, 2], [2, 4], [4, 8], [8, 12], [12, 16]]));
    assert!(close(&j["models"][1]["band_means"][5], 2.55));

    for png in ["compare-loss.png", "compare-diff.png"] {
        let img = image::open(out.join(png)).unwrap();
        assert_eq!((img.width(), img.height()), (1000, 640), "{png}");
    }
}

#[test]
fn compare_without_runs_and_its_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    inputs(d);
    let p = |s: &str| d.join(s).to_str().unwrap().to_string();
    // No training folders: no run columns; the baseline is the first model; T from loss.json.
    ok(&["eval", "compare", "--input", &p("a/loss.json"), "--out", &p("c1")]);
    let md = std::fs::read_to_string(d.join("c1/compare.md")).unwrap();
    assert_eq!(md.lines().nth(3).unwrap(), "| transformer | – | 1.6750 | 2.3500 | +0.0000 | +0.9250 |");
    // A CSV alone records no training context.
    let e = fails(&["eval", "compare", "--input", &p("b/loss.csv"), "--out", &p("c2")]);
    assert!(e.contains("--train-context"), "{e}");
    ok(&["eval", "compare", "--input", &p("b/loss.csv"), "--train-context", "12", "--out", &p("c2")]);
    let md = std::fs::read_to_string(d.join("c2/compare.md")).unwrap();
    assert!(md.contains("| no, rope | – | 3.0000 | 3.0000 | +0.0000 | +0.0000 |"), "{md}");
    // Wrong baseline, wrong number of training folders, a missing input.
    let e = fails(&["eval", "compare", "--input", &p("a"), "--baseline", "gpt", "--out", &p("c3")]);
    assert!(e.contains("\"gpt\"") && e.contains("\"fox\""), "{e}");
    let e = fails(&["eval", "compare", "--input", &p("a"), "--run", &p("runs/fox"), "--out", &p("c3")]);
    assert!(e.contains("--run is given 1 times for 2 models"), "{e}");
    let e = fails(&["eval", "compare", "--input", &p("nothing"), "--out", &p("c3")]);
    assert!(e.contains("nothing"), "{e}");
    // Disagreeing training contexts.
    let other = serde_json::json!({"models": [{"name": "x", "train_context": 4, "loss": [1.0, 2.0, 3.0, 4.0, 5.0]}]});
    std::fs::write(d.join("x.json"), other.to_string()).unwrap();
    let e = fails(&["eval", "compare", "--input", &p("a"), "--input", &p("x.json"), "--out", &p("c3")]);
    assert!(e.contains("differ") && e.contains("x.json"), "{e}");
    // A non-finite loss names the file and position.
    let bad = r#"{"models": [{"name": "x", "loss": [1.0, "nan"]}]}"#;
    std::fs::write(d.join("bad.json"), bad).unwrap();
    let e = fails(&["eval", "compare", "--input", &p("bad.json"), "--train-context", "4", "--out", &p("c3")]);
    assert!(e.contains("bad.json") && e.contains("loss[1]"), "{e}");
}

/// Two training folders: "fast" logs loss 10 - 0.5k at 10k tokens (k = 1..10), "slow" 10 - 0.2k,
/// each validated at 50 and 100 tokens.
fn train_runs(dir: &Path) {
    for (name, rate, val) in [("fast", 0.5, 6.0), ("slow", 0.2, 8.5)] {
        let mut text = String::new();
        for k in 1..=10u64 {
            let l = 10.0 - rate * k as f64;
            let line = serde_json::json!({"kind": "train", "step": k, "tokens": 10 * k, "loss": l, "lr": 1e-3,
                                          "elapsed_s": k as f64});
            text += &format!("{line}\n");
            if k % 5 == 0 {
                let v = serde_json::json!({"kind": "val", "step": k, "tokens": 10 * k, "val_loss": val + 0.1 * (10 - k) as f64,
                                           "elapsed_s": k as f64 + 0.5});
                text += &format!("{v}\n");
            }
        }
        std::fs::create_dir_all(dir.join(name)).unwrap();
        std::fs::write(dir.join(name).join("metrics.jsonl"), text).unwrap();
    }
}

#[test]
fn compare_overlays_training_curves_smoothed_over_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    train_runs(d);
    let p = |s: &str| d.join(s).display().to_string();
    let stdout = ok(&[
        "eval",
        "compare",
        "--run",
        &p("fast"),
        "--run",
        &p("slow"),
        "--smooth-tokens",
        "20",
        "--val-loss",
        "--out",
        &p("c"),
    ]);
    // The table: the last two logged losses' mean (a 20-token window holds two 10-token steps).
    assert!(stdout.contains("| fast | 10 | 100 | 5.2500 | 6.0000 | 11 s |"), "{stdout}");
    assert!(stdout.contains("| slow | 10 | 100 | 8.1000 | 8.5000 | 11 s |"), "{stdout}");
    let csv = std::fs::read_to_string(d.join("c/compare-train.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows[0], "run,tokens,train_loss,train_loss_smoothed,val_loss");
    assert_eq!(rows.len(), 1 + 2 * (10 + 2));
    assert_eq!(rows[1], "fast,10,9.5,9.5,");
    assert_eq!(rows[2], "fast,20,9,9.25,");
    assert_eq!(rows[11], "fast,50,,,6.5");
    let last_slow: Vec<f64> = rows[22].split(',').skip(1).take(3).map(|x| x.parse().unwrap()).collect();
    assert!(rows[22].starts_with("slow,100,") && (last_slow[2] - 8.1).abs() < 1e-12, "{csv}");
    assert_eq!(rows[24], "slow,100,,,8.5");
    assert_eq!(std::fs::read_to_string(d.join("c/compare-train.md")).unwrap().lines().count(), 4);
    let img = image::open(d.join("c/compare-train.png")).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (1000, 640));
    // Both runs are drawn, each in its own palette colour (Palette99's first two).
    let has = |c: [u8; 3]| img.pixels().any(|p| p.0 == c);
    assert!(has([230, 25, 75]) && has([60, 180, 75]), "the two curves' colours");

    // Without --input the default smoothing is 2% of the longest run; errors name what is wrong.
    ok(&["eval", "compare", "--run", &p("fast"), "--out", &p("c2")]);
    let e = fails(&["eval", "compare", "--run", &p("fast"), "--smooth-tokens", "0", "--out", &p("c3")]);
    assert!(e.contains("--smooth-tokens"), "{e}");
    std::fs::create_dir_all(d.join("empty")).unwrap();
    std::fs::write(
        d.join("empty/metrics.jsonl"),
        "{\"kind\": \"val\", \"step\": 0, \"tokens\": 0, \"val_loss\": 1.0, \"elapsed_s\": 0}\n",
    )
    .unwrap();
    let e = fails(&["eval", "compare", "--run", &p("empty"), "--out", &p("c3")]);
    assert!(e.contains("empty") && e.contains("no training loss line"), "{e}");
    let e = fails(&["eval", "compare", "--out", &p("c3")]);
    assert!(e.contains("--input") || e.contains("--run"), "{e}");
}

#[test]
fn with_inputs_the_training_curves_take_the_models_names() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    inputs(d);
    let p = |s: &str| d.join(s).display().to_string();
    let args = ["eval", "compare", "--input", &p("a"), "--input", &p("b/loss.csv"), "--run", &p("runs/fox")];
    let mut args: Vec<&str> = args.to_vec();
    let (tr, nr, out) = (p("runs/transformer"), p("runs/norope"), p("c"));
    args.extend(["--run", &tr, "--run", &nr, "--out", &out]);
    ok(&args);
    let md = std::fs::read_to_string(d.join("c/compare-train.md")).unwrap();
    for row in
        ["| fox | 100 | 6400 | 2.0000 | 1.5000 |", "| transformer |", "| no, rope | 100 | 6400 | 2.0000 | 2.9000 |"]
    {
        assert!(md.contains(row), "{row}: {md}");
    }
    assert!(d.join("c/compare-loss.png").is_file() && d.join("c/compare-train.png").is_file());
}
