//! TensorBoard event files (`foxlm train --tensorboard DIR`): the metrics of metrics.jsonl as
//! scalar summaries that `tensorboard --logdir DIR` reads.
//!
//! The format, written by hand (a few fields; no crate for it is maintained): a file
//! `events.out.tfevents.<seconds>.<host>` of TFRecord records, each
//!
//! ```text
//! u64 LE length | u32 LE masked CRC-32C of those 8 bytes | data | u32 LE masked CRC-32C of data
//! ```
//!
//! where the mask is `((crc >> 15) | (crc << 17)) + 0xa282ead8`, and each record's data is an
//! `Event` protocol buffer: wall_time (field 1, double), step (2, int64), then file_version (3,
//! string "brain.Event:2", the first record) or summary (5, a `Summary` of repeated `value`
//! (1) messages, each tag (1, string) and simple_value (2, float)).

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), as TFRecord uses.
pub fn crc32c(bytes: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ 0x82f6_3b78 } else { c >> 1 };
            }
            *e = c;
        }
        t
    });
    !bytes.iter().fold(!0u32, |c, &b| table[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8))
}

/// TFRecord's masked CRC (so that a CRC stored in data does not look like data's CRC).
pub fn masked_crc(bytes: &[u8]) -> u32 {
    let c = crc32c(bytes);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord around `data`.
pub fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field (wire type 2).
fn bytes_field(field: u32, data: &[u8], out: &mut Vec<u8>) {
    varint(((field as u64) << 3) | 2, out);
    varint(data.len() as u64, out);
    out.extend_from_slice(data);
}

/// An `Event` with wall_time and step, and either file_version or a summary of scalars.
pub fn event(wall_time: f64, step: i64, file_version: Option<&str>, scalars: &[(&str, f32)]) -> Vec<u8> {
    let mut out = vec![];
    varint((1 << 3) | 1, &mut out); // wall_time: fixed64 double
    out.extend_from_slice(&wall_time.to_le_bytes());
    varint(2 << 3, &mut out); // step: varint int64 (two's complement as u64)
    varint(step as u64, &mut out);
    if let Some(v) = file_version {
        bytes_field(3, v.as_bytes(), &mut out);
    }
    if !scalars.is_empty() {
        let mut summary = vec![];
        for (tag, value) in scalars {
            let mut v = vec![];
            bytes_field(1, tag.as_bytes(), &mut v);
            varint((2 << 3) | 5, &mut v); // simple_value: fixed32 float
            v.extend_from_slice(&value.to_le_bytes());
            bytes_field(1, &v, &mut summary);
        }
        bytes_field(5, &summary, &mut out);
    }
    out
}

/// The event file's host part: the machine's name, with characters other than letters, digits,
/// '-', '_' and '.' replaced (it becomes part of a file name).
fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let h: String =
        raw.trim().chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
    if h.is_empty() {
        "localhost".into()
    } else {
        h
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// An open event file. Each event is written whole and flushed, so TensorBoard sees it at once
/// and a crash loses at most the event being written.
pub struct EventWriter {
    file: std::fs::File,
    pub path: PathBuf,
}

impl EventWriter {
    /// Creates `dir` (if needed) and a new event file in it, starting with the file_version event.
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--tensorboard {}: cannot create the folder", dir.display()))?;
        let t = now();
        // A second file within the same second (a quick resume) gets its own name.
        let mut path = dir.join(format!("events.out.tfevents.{}.{}", t as u64, host_name()));
        let mut k = 1;
        while path.exists() {
            path = dir.join(format!("events.out.tfevents.{}.{}.{k}", t as u64, host_name()));
            k += 1;
        }
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("--tensorboard: cannot create {}", path.display()))?;
        let mut w = Self { file, path };
        w.write(&event(t, 0, Some("brain.Event:2"), &[]))?;
        Ok(w)
    }

    /// One event with the scalars (tag, value) at `step`.
    pub fn scalars(&mut self, wall_time: f64, step: u64, scalars: &[(&str, f32)]) -> Result<()> {
        self.write(&event(wall_time, step.min(i64::MAX as u64) as i64, None, scalars))
    }

    fn write(&mut self, data: &[u8]) -> Result<()> {
        self.file.write_all(&record(data)).with_context(|| format!("cannot write {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_values() {
        // The CRC catalogue's check value of CRC-32C, and RFC 3720's 32 zero bytes.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn varints_and_events_encode_as_protobuf() {
        let mut v = vec![];
        varint(300, &mut v);
        assert_eq!(v, [0xac, 0x02]);
        // wall_time 1.0, step 5, one scalar "a" = 0.5
        let e = event(1.0, 5, None, &[("a", 0.5)]);
        let mut want = vec![0x09];
        want.extend_from_slice(&1.0f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 5, 0x2a, 10, 0x0a, 8, 0x0a, 1, b'a', 0x15]);
        want.extend_from_slice(&0.5f32.to_le_bytes());
        assert_eq!(e, want);
        let r = record(&e);
        assert_eq!(&r[..8], &(e.len() as u64).to_le_bytes());
        assert_eq!(r.len(), e.len() + 16);
    }
}
