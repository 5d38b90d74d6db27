//! Shared checks for everything foxlm reads from outside (config.json, safetensors headers, data
//! manifests, trainer state, input files, options): sizes in checked arithmetic, memory needs
//! compared with what the machine has before anything is allocated, paths that must stay inside
//! their folder, and text that must be UTF-8. Each error names the file, field or option at fault.
//! See docs/input-checking.md.

use anyhow::{bail, Context, Result};
use std::path::{Component, Path, PathBuf};

/// Environment variable that caps the memory foxlm assumes it may use, in bytes (or with a
/// K/M/G/T suffix, powers of 1024). Below the machine's available memory it wins; tests use it.
pub const MEMORY_LIMIT_ENV: &str = "FOXLM_MEMORY_LIMIT";

/// Bytes as "12.3 GiB".
pub fn human_bytes(bytes: u128) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

/// Bytes in GiB, for messages with a chosen precision.
pub fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Parses "123", "4K", "2G", "1.5T" (powers of 1024).
pub fn parse_bytes(s: &str) -> Option<u128> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => {
            let m: u128 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return None,
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let v: f64 = num.trim().parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some((v * mult as f64) as u128)
}

/// MemAvailable of /proc/meminfo, in bytes (None where there is no such file).
fn mem_available() -> Option<u128> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The memory foxlm may plan to use: MemAvailable, capped by FOXLM_MEMORY_LIMIT. None when
/// neither is known (then only the address-space bound applies).
pub fn memory_budget() -> Option<u128> {
    let limit = std::env::var(MEMORY_LIMIT_ENV).ok().and_then(|v| parse_bytes(&v));
    match (mem_available(), limit) {
        (Some(a), Some(l)) => Some(a.min(l)),
        (a, l) => a.or(l),
    }
}

/// Fails, saying how much is needed and how much there is, when `bytes` cannot be allocated:
/// more than the address space allows or more than [`memory_budget`]. `what` says what for,
/// e.g. "model.safetensors: the parameters (f32)".
pub fn check_memory(bytes: u128, what: &str) -> Result<()> {
    if bytes > isize::MAX as u128 {
        bail!("{what} need {}, more than this machine can address", human_bytes(bytes));
    }
    if let Some(avail) = memory_budget() {
        if bytes > avail {
            bail!("{what} need {}, but only {} of memory is available", human_bytes(bytes), human_bytes(avail));
        }
    }
    Ok(())
}

/// The product of `dims` in u128, None on overflow (u128 holds any product of a few usizes that
/// could matter; a longer one overflowing is itself an error for the caller to report).
pub fn product(dims: &[usize]) -> Option<u128> {
    dims.iter().try_fold(1u128, |acc, &d| acc.checked_mul(d as u128))
}

/// `dims` multiplied out as usize, or an error naming `what` and the dimensions.
pub fn checked_numel(dims: &[usize], what: &str) -> Result<usize> {
    product(dims).and_then(|p| usize::try_from(p).ok()).with_context(|| format!("{what}: size {dims:?} overflows"))
}

/// Reads a text file, failing with the file's name and the byte offset of the first invalid
/// sequence when it is not UTF-8.
pub fn read_text(path: &Path) -> Result<String> {
    if let Ok(m) = std::fs::metadata(path) {
        check_memory(m.len() as u128, &format!("{}: reading it", path.display()))?;
    }
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    text_from_bytes(bytes, path)
}

/// `bytes` as a String, or an error naming `path` and where the invalid UTF-8 starts.
pub fn text_from_bytes(bytes: Vec<u8>, path: &Path) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        anyhow::anyhow!(
            "{}: not UTF-8 text (invalid byte 0x{:02x} at offset {at}); convert it to UTF-8 first",
            path.display(),
            e.as_bytes()[at]
        )
    })
}

/// `rel`, a file name from `listing` (a manifest or an index), joined to `dir` — refused when it is
/// absolute, empty or climbs out of `dir` with `..`, so a file from elsewhere cannot make foxlm
/// read outside the folder it was pointed at.
pub fn file_in_dir(dir: &Path, rel: &str, listing: &Path) -> Result<PathBuf> {
    let p = Path::new(rel);
    let ok = !rel.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !ok {
        bail!(
            "{}: file name {rel:?} points outside {} (only names inside the folder are allowed)",
            listing.display(),
            dir.display()
        );
    }
    Ok(dir.join(p))
}

/// Bytes of the KV cache (k, v per layer and k/v head, the gate's prefix sum per query head) for
/// `batch` sequences of `tokens` tokens, as `model::cache` allocates it; saturating.
pub fn kv_cache_bytes(cfg: &crate::config::Config, batch: usize, tokens: usize) -> u128 {
    if cfg.arch() == crate::config::Arch::Mamba2 {
        // A fixed-size state per layer, whatever the number of tokens.
        let m = cfg.mamba2();
        let per_row = (m.heads as u128).saturating_mul(m.head_dim as u128).saturating_mul(m.state as u128)
            + (m.conv.saturating_sub(1) as u128).saturating_mul(m.conv_dim() as u128);
        return per_row.saturating_mul(batch as u128).saturating_mul(cfg.num_hidden_layers as u128).saturating_mul(4);
    }
    if cfg.is_deltanet() {
        // A fixed-size state per layer: S [H, K, V] and the three convolutions' last inputs.
        let m = cfg.deltanet();
        let s = |a: u128, b: u128| a.saturating_mul(b);
        let (h, k, v) = (m.heads as u128, m.head_k as u128, m.head_v as u128);
        let per_row = s(s(h, k), v).saturating_add(s(m.conv.saturating_sub(1) as u128, s(h, 2 * k + v)));
        return s(s(s(per_row, batch as u128), cfg.num_hidden_layers as u128), 4);
    }
    if cfg.arch() == crate::config::Arch::Hgrn2 {
        // A fixed-size state per layer: S [H, K, K] and the three convolutions' last inputs.
        let m = cfg.hgrn2();
        let s = |a: u128, b: u128| a.saturating_mul(b);
        let conv = s(m.conv.map_or(0, |w| w.saturating_sub(1)) as u128, s(3, cfg.hidden_size as u128));
        let per_row = s(s(m.heads as u128, m.head_dim as u128), m.head_dim as u128).saturating_add(conv);
        return s(s(s(per_row, batch as u128), cfg.num_hidden_layers as u128), 4);
    }
    if cfg.arch() == crate::config::Arch::Samba {
        // The attention layers' KV caches (every position is kept; the window masks) and the
        // Mamba layers' fixed states.
        let (h, hkv, _) = cfg.samba_attn();
        let m = cfg.mamba();
        let (b, t, hd) = (batch as u128, tokens.max(1) as u128, cfg.head_dim() as u128);
        let s = |a: u128, b: u128| a.saturating_mul(b);
        let attn =
            s(s(b, t), s(2 * hkv as u128, hd).saturating_add(h as u128)).saturating_add(s(s(2 * b, hkv as u128), hd));
        let mamba = s(
            b,
            s(m.inner as u128, m.state as u128).saturating_add(s(m.conv.saturating_sub(1) as u128, m.inner as u128)),
        );
        // attn.layers null: the odd layers are attention.
        let n_attn = (cfg.num_hidden_layers / 2) as u128;
        let n_mamba = cfg.num_hidden_layers as u128 - n_attn;
        return s(s(attn, n_attn).saturating_add(s(mamba, n_mamba)), 4);
    }
    let (b, h, hd, t) = (batch as u128, cfg.num_heads as u128, cfg.head_dim() as u128, tokens.max(1) as u128);
    let hkv = cfg.kv_heads() as u128;
    let m = |a: u128, b: u128| a.saturating_mul(b);
    let per_layer = m(m(b, t), m(2 * hkv, hd).saturating_add(h)).saturating_add(m(m(2 * b, hkv), hd));
    m(m(per_layer, cfg.num_hidden_layers as u128), 4)
}

/// Roughly the memory of one forward pass over `batch` x `seq` tokens: the logits, a layer's
/// activations (all layers' and the gradients too `with_grads`). A lower bound, used to refuse
/// inputs that cannot fit before allocating for them; saturating.
pub fn forward_bytes(cfg: &crate::config::Config, batch: usize, seq: usize, with_grads: bool) -> u128 {
    let m = |a: u128, b: u128| a.saturating_mul(b);
    let rows = m(batch as u128, seq as u128);
    let (d, i, v) = (cfg.hidden_size as u128, cfg.intermediate() as u128, cfg.vocab_size as u128);
    let layer = m(rows, 20 * d + 3 * i);
    let layers = if with_grads { cfg.num_hidden_layers as u128 } else { 1 };
    let logits = m(m(rows, v), 1 + with_grads as u128);
    let grads = if with_grads { cfg.param_bytes() } else { 0 };
    m(logits.saturating_add(m(layer, layers)), 4).saturating_add(grads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_and_print() {
        assert_eq!(parse_bytes("1024"), Some(1024));
        assert_eq!(parse_bytes("2G"), Some(2 << 30));
        assert_eq!(parse_bytes("1.5k"), Some(1536));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes("-1"), None);
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(2199023255552), "2.0 TiB");
    }

    #[test]
    fn memory_beyond_the_address_space_is_refused() {
        let e = check_memory(1 << 70, "the test tensors").unwrap_err().to_string();
        assert!(e.contains("the test tensors need 1024.0 EiB"), "{e}");
        assert!(check_memory(1024, "a little").is_ok());
    }

    #[test]
    fn products_are_checked() {
        assert_eq!(product(&[3, 4, 5]), Some(60));
        assert_eq!(product(&[usize::MAX, usize::MAX, 2]), None);
        assert!(checked_numel(&[usize::MAX, 2], "t").unwrap_err().to_string().contains("t: size"));
    }

    #[test]
    fn paths_stay_inside_the_folder() {
        let m = Path::new("/d/manifest.json");
        assert_eq!(file_in_dir(Path::new("/d"), "a/b.tokens", m).unwrap(), PathBuf::from("/d/a/b.tokens"));
        for bad in ["../x", "/etc/passwd", "a/../../x", ""] {
            let e = file_in_dir(Path::new("/d"), bad, m).unwrap_err().to_string();
            assert!(e.contains("points outside /d") && e.contains("manifest.json"), "{bad}: {e}");
        }
    }

    #[test]
    fn invalid_utf8_names_the_file_and_offset() {
        let e = text_from_bytes(b"ok\xff".to_vec(), Path::new("in.txt")).unwrap_err().to_string();
        assert_eq!(e, "in.txt: not UTF-8 text (invalid byte 0xff at offset 2); convert it to UTF-8 first");
    }
}
