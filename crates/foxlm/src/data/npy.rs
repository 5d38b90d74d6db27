//! The NumPy .npy header: magic, version, header length, and a Python dict literal with
//! 'descr', 'fortran_order' and 'shape'.

use super::import::Elem;
use anyhow::{bail, Result};

pub struct Header {
    pub elem: Elem,
    pub shape: Vec<usize>,
    pub data_offset: usize,
}

pub fn parse_header(b: &[u8]) -> Result<Header> {
    const MAGIC: &[u8] = b"\x93NUMPY";
    if b.len() < 10 || &b[..6] != MAGIC {
        bail!("no .npy magic (\\x93NUMPY) at the start");
    }
    let (major, minor) = (b[6], b[7]);
    let (len, start) = match major {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10usize),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        2 | 3 => bail!("truncated header"),
        _ => bail!("format version {major}.{minor}; versions 1, 2 and 3 are read"),
    };
    let end = start.checked_add(len).filter(|&e| e <= b.len());
    let Some(end) = end else { bail!("the header says it has {len} bytes, more than the file holds") };
    let text = std::str::from_utf8(&b[start..end]).map_err(|_| anyhow::anyhow!("the header is not text"))?;
    let mut p = Parser { s: text.as_bytes(), i: 0 };
    let dict = p.value()?;
    let Value::Dict(items) = dict else { bail!("the header is not a dict: {}", text.trim()) };
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    for (k, v) in items {
        match (k.as_str(), v) {
            ("descr", Value::Str(s)) => descr = Some(s),
            ("fortran_order", Value::Bool(f)) => fortran = Some(f),
            ("shape", Value::Tuple(dims)) => {
                shape = Some(
                    dims.into_iter()
                        .map(|d| match d {
                            Value::Int(n) => {
                                usize::try_from(n).map_err(|_| anyhow::anyhow!("shape dimension {n} too large"))
                            }
                            _ => bail!("shape holds something other than integers"),
                        })
                        .collect::<Result<Vec<_>>>()?,
                )
            }
            (k, _) => bail!("header field {k:?} is unknown or of the wrong type"),
        }
    }
    let (Some(descr), Some(fortran), Some(shape)) = (descr, fortran, shape) else {
        bail!("the header lacks 'descr', 'fortran_order' or 'shape': {}", text.trim())
    };
    if fortran {
        bail!("fortran_order is True: save the array in C order (numpy.ascontiguousarray)");
    }
    let elem = match descr.as_str() {
        "|u1" | "<u1" | "u1" => Elem::U8,
        "<u2" => Elem::U16,
        "<u4" => Elem::U32,
        "<u8" => Elem::U64,
        "<i2" => Elem::I16,
        "<i4" => Elem::I32,
        "<i8" => Elem::I64,
        d => {
            bail!("dtype {d:?}: token arrays must be little-endian integers (<u2, <u4, <u8, <i2, <i4, <i8 or |u1)")
        }
    };
    Ok(Header { elem, shape, data_offset: end })
}

#[derive(Debug)]
enum Value {
    Str(String),
    Bool(bool),
    Int(u64),
    Tuple(Vec<Value>),
    Dict(Vec<(String, Value)>),
}

/// The few Python literals a .npy header holds.
struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.i).copied()
    }
    fn expect(&mut self, c: u8) -> Result<()> {
        if self.peek() != Some(c) {
            bail!("expected '{}' at byte {} of the header", c as char, self.i);
        }
        self.i += 1;
        Ok(())
    }
    /// Items up to `close`, separated by commas (a trailing comma allowed).
    fn items<T>(&mut self, close: u8, mut item: impl FnMut(&mut Self) -> Result<T>) -> Result<Vec<T>> {
        let mut out = vec![];
        loop {
            if self.peek() == Some(close) {
                self.i += 1;
                return Ok(out);
            }
            out.push(item(self)?);
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(c) if c == close => {}
                _ => bail!("expected ',' or '{}' at byte {} of the header", close as char, self.i),
            }
        }
    }
    fn value(&mut self) -> Result<Value> {
        match self.peek() {
            Some(b'{') => {
                self.i += 1;
                let items = self.items(b'}', |p| {
                    let Value::Str(k) = p.value()? else { bail!("a dict key that is not a string") };
                    p.expect(b':')?;
                    Ok((k, p.value()?))
                })?;
                Ok(Value::Dict(items))
            }
            Some(b'(') => {
                self.i += 1;
                Ok(Value::Tuple(self.items(b')', |p| p.value())?))
            }
            Some(q @ (b'\'' | b'"')) => {
                let start = self.i + 1;
                let len = self.s[start..].iter().position(|&c| c == q);
                let Some(len) = len else { bail!("unterminated string in the header") };
                self.i = start + len + 1;
                Ok(Value::Str(String::from_utf8_lossy(&self.s[start..start + len]).into_owned()))
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.i;
                while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                    self.i += 1;
                }
                let digits = std::str::from_utf8(&self.s[start..self.i]).expect("ASCII digits");
                // A trailing L (Python 2 longs) is allowed.
                if self.s.get(self.i) == Some(&b'L') {
                    self.i += 1;
                }
                digits.parse().map(Value::Int).map_err(|_| anyhow::anyhow!("integer {digits} too large"))
            }
            Some(_) if self.s[self.i..].starts_with(b"True") => {
                self.i += 4;
                Ok(Value::Bool(true))
            }
            Some(_) if self.s[self.i..].starts_with(b"False") => {
                self.i += 5;
                Ok(Value::Bool(false))
            }
            Some(c) => bail!("unexpected '{}' at byte {} of the header", c as char, self.i),
            None => bail!("the header ends early"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str, major: u8) -> Vec<u8> {
        let mut b = b"\x93NUMPY".to_vec();
        b.extend([major, 0]);
        if major == 1 {
            b.extend((header.len() as u16).to_le_bytes());
        } else {
            b.extend((header.len() as u32).to_le_bytes());
        }
        b.extend(header.as_bytes());
        b
    }

    #[test]
    fn headers() {
        let h = parse_header(&npy("{'descr': '<u2', 'fortran_order': False, 'shape': (3, 4), }  \n", 1)).unwrap();
        assert_eq!((h.elem, h.shape.as_slice(), h.data_offset), (Elem::U16, &[3usize, 4][..], 10 + 62));
        let h = parse_header(&npy("{\"descr\": \"<i8\", \"shape\": (7,), \"fortran_order\": False}", 3)).unwrap();
        assert_eq!((h.elem, h.shape), (Elem::I64, vec![7]));
        let e = |hdr: &str| format!("{:#}", parse_header(&npy(hdr, 1)).err().expect("an error"));
        assert!(e("{'descr': '<u2', 'fortran_order': True, 'shape': (3,)}").contains("fortran_order"));
        assert!(e("{'descr': '>u2', 'fortran_order': False, 'shape': (3,)}").contains("\">u2\""));
        assert!(e("{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}").contains("\"<f4\""));
        assert!(e("{'descr': '<u2', 'shape': (3,)}").contains("lacks"));
        assert!(e("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), 'x': 1}").contains("\"x\""));
        assert!(e("{'descr': '<u2', 'fortran_order': False, 'shape': (3,").contains("ends early"));
        assert!(e("{'descr': '<u2', 'fortran_order': False, 'shape': (-3,)}").contains("unexpected '-'"));
        let mut bad = npy("{}", 1);
        bad[6] = 4;
        assert!(format!("{:#}", parse_header(&bad).err().unwrap()).contains("version 4"));
        let mut short = npy("{'descr': '<u2', 'fortran_order': False, 'shape': (3,)}", 1);
        short.truncate(30);
        assert!(format!("{:#}", parse_header(&short).err().unwrap()).contains("more than the file holds"));
        assert!(parse_header(b"PK\x03\x04 not npy").is_err());
    }
}
