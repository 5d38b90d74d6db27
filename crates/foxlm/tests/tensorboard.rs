//! `foxlm train --tensorboard DIR`: the event file, read back with a decoder of its own (TFRecord
//! framing, bitwise CRC-32C, the protobuf fields of Event/Summary/Value), holds the metrics of
//! metrics.jsonl: the same steps, tags and values.

use foxlm::data::{prepare, PrepareOptions};
use foxlm::presets::{self, Variant};
use foxlm::train::{read_metrics, train, RunConfig, TrainOptions};
use std::path::Path;

/// CRC-32C bit by bit (no table), independent of the writer's.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 == 1 { (c >> 1) ^ 0x82f6_3b78 } else { c >> 1 };
        }
    }
    !c
}

fn masked(bytes: &[u8]) -> u32 {
    let c = crc32c(bytes);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap())
}

/// The records of a TFRecord file, each CRC checked.
fn records(file: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![];
    let mut i = 0;
    while i < file.len() {
        let len_bytes = &file[i..i + 8];
        let n = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        assert_eq!(u32_at(file, i + 8), masked(len_bytes), "length CRC of the record at byte {i}");
        let data = &file[i + 12..i + 12 + n];
        assert_eq!(u32_at(file, i + 12 + n), masked(data), "data CRC of the record at byte {i}");
        out.push(data.to_vec());
        i += 16 + n;
    }
    assert_eq!(i, file.len());
    out
}

fn varint(b: &[u8], i: &mut usize) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let x = b[*i];
        *i += 1;
        v |= ((x & 0x7f) as u64) << shift;
        if x < 0x80 {
            return v;
        }
        shift += 7;
    }
}

/// A protobuf field's value: varint, fixed64, length-delimited or fixed32.
#[derive(Debug, Clone)]
enum Field {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(Vec<u8>),
    Fixed32([u8; 4]),
}

fn fields(b: &[u8]) -> Vec<(u64, Field)> {
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        let key = varint(b, &mut i);
        let f = match key & 7 {
            0 => Field::Varint(varint(b, &mut i)),
            1 => {
                i += 8;
                Field::Fixed64(b[i - 8..i].try_into().unwrap())
            }
            2 => {
                let n = varint(b, &mut i) as usize;
                i += n;
                Field::Bytes(b[i - n..i].to_vec())
            }
            5 => {
                i += 4;
                Field::Fixed32(b[i - 4..i].try_into().unwrap())
            }
            w => panic!("wire type {w}"),
        };
        out.push((key >> 3, f));
    }
    out
}

/// An Event: wall time, step, file_version, and the summary's (tag, simple_value) pairs.
struct Event {
    wall_time: f64,
    step: u64,
    file_version: Option<String>,
    values: Vec<(String, f32)>,
}

fn event(data: &[u8]) -> Event {
    let mut e = Event { wall_time: 0.0, step: 0, file_version: None, values: vec![] };
    for (k, f) in fields(data) {
        match (k, f) {
            (1, Field::Fixed64(b)) => e.wall_time = f64::from_le_bytes(b),
            (2, Field::Varint(v)) => e.step = v,
            (3, Field::Bytes(b)) => e.file_version = Some(String::from_utf8(b).unwrap()),
            (5, Field::Bytes(summary)) => {
                for (k, v) in fields(&summary) {
                    let (1, Field::Bytes(v)) = (k, v) else { panic!("Summary field {k}") };
                    let (mut tag, mut value) = (None, None);
                    for (k, f) in fields(&v) {
                        match (k, f) {
                            (1, Field::Bytes(t)) => tag = Some(String::from_utf8(t).unwrap()),
                            (2, Field::Fixed32(x)) => value = Some(f32::from_le_bytes(x)),
                            (k, f) => panic!("Value field {k}: {f:?}"),
                        }
                    }
                    e.values.push((tag.unwrap(), value.unwrap()));
                }
            }
            (k, f) => panic!("Event field {k}: {f:?}"),
        }
    }
    e
}

#[test]
fn the_decoders_crc32c_is_the_standard_one() {
    assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
    assert_eq!(foxlm::tensorboard::crc32c(b"The quick brown fox"), crc32c(b"The quick brown fox"));
}

#[test]
fn event_files_hold_the_metrics_of_metrics_jsonl() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("md");
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sample/moby-dick");
    prepare(&[sample], &data, &PrepareOptions::default()).unwrap();
    let mut t = presets::tiny().train;
    (t.context, t.batch_size, t.micro_batch, t.total_tokens, t.warmup_tokens) = (32, 2, 2, 4 * 64, 64);
    (t.eval_every, t.eval_tokens, t.checkpoint_every, t.log_every) = (2, 64, 0, 1);
    let run = RunConfig { model: Variant::FoxPro.config(64, 1, 1), train: t };
    let (out, tb) = (tmp.path().join("run"), tmp.path().join("tb"));
    let opts = TrainOptions {
        tensorboard: Some(tb.clone()),
        ..TrainOptions::new(&data, &out, foxlm::backend::DeviceArg::Cpu)
    };
    let t0 = foxlm::tensorboard::now();
    train(Some(run), &opts).unwrap();

    let files: Vec<_> = std::fs::read_dir(&tb).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().to_string();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    let events: Vec<Event> = records(&std::fs::read(&files[0]).unwrap()).iter().map(|r| event(r)).collect();
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    assert!(events.iter().all(|e| e.wall_time >= t0.floor() && e.wall_time < t0 + 600.0));

    // One event per metrics line, in order, with the same values (as f32).
    let ms = read_metrics(&out);
    assert_eq!(ms.len(), 4 + 3, "four steps; validation at 0, 2 and 4");
    assert_eq!(events.len(), 1 + ms.len());
    for (m, e) in ms.iter().zip(&events[1..]) {
        assert_eq!(e.step, m.step);
        let want: Vec<(String, f32)> = match m.kind.as_str() {
            "train" => vec![
                ("train/loss".into(), m.loss.unwrap() as f32),
                ("train/lr".into(), m.lr.unwrap() as f32),
                ("train/grad_norm".into(), m.grad_norm.unwrap() as f32),
                ("train/tokens_per_s".into(), m.tokens_per_s.unwrap() as f32),
                ("train/tokens_seen".into(), m.tokens as f32),
            ],
            _ => vec![("val/loss".into(), m.val_loss.unwrap() as f32)],
        };
        assert_eq!(e.values, want, "step {} ({})", m.step, m.kind);
    }
    let steps: Vec<u64> = events[1..].iter().map(|e| e.step).collect();
    assert_eq!(steps, [0, 1, 2, 2, 3, 4, 4]);
}
