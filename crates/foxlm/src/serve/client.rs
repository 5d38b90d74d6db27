//! A small blocking HTTP/1.1 client (one connection per request) for the tests and the load
//! generator: enough for JSON requests and server-sent event streams, with no extra dependencies.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A response's status, headers (lower-case names) and a reader at the start of its body.
type Head = (u16, Vec<(String, String)>, BufReader<TcpStream>);

/// Sends one request and returns the status, the headers (lower-case names) and a reader
/// positioned at the start of the body.
fn send(addr: SocketAddr, method: &str, path: &str, key: Option<&str>, body: &[u8]) -> Result<Head> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("cannot connect to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(600)))?;
    s.set_nodelay(true)?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(k) = key {
        head.push_str(&format!("Authorization: Bearer {k}\r\n"));
    }
    if method != "GET" {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    // Head and body in one write where the body is small (one segment out, not two behind Nagle).
    if method != "GET" && body.len() <= 1 << 16 {
        let mut all = head.into_bytes();
        all.extend_from_slice(body);
        // The server may answer (413) and close before reading a large body: not an error here.
        let _ = s.write_all(&all);
    } else {
        s.write_all(head.as_bytes())?;
        if method != "GET" {
            let _ = s.write_all(body);
        }
    }
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {line:?}"))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    Ok((status, headers, r))
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// Reads a body, calling `on_bytes` with each piece as it arrives (chunked or not).
fn read_body(
    h: &[(String, String)],
    r: &mut BufReader<TcpStream>,
    mut on_bytes: impl FnMut(&[u8]) -> bool,
) -> Result<()> {
    if header(h, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line)? == 0 {
                bail!("connection closed inside a chunked body");
            }
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| anyhow!("bad chunk size {line:?}"))?;
            if size == 0 {
                return Ok(());
            }
            let mut buf = vec![0; size];
            r.read_exact(&mut buf)?;
            let mut crlf = [0; 2];
            r.read_exact(&mut crlf)?;
            if !on_bytes(&buf) {
                return Ok(());
            }
        }
    } else if let Some(n) = header(h, "content-length").and_then(|v| v.parse::<usize>().ok()) {
        let mut buf = vec![0; n];
        r.read_exact(&mut buf)?;
        on_bytes(&buf);
        Ok(())
    } else {
        let mut buf = Vec::new();
        r.read_to_end(&mut buf)?;
        on_bytes(&buf);
        Ok(())
    }
}

/// Status and JSON body of a request (`body` None: GET).
pub fn json_request(addr: SocketAddr, path: &str, body: Option<&Value>, key: Option<&str>) -> Result<(u16, Value)> {
    let bytes = body.map(|b| b.to_string().into_bytes());
    raw_request(addr, if bytes.is_some() { "POST" } else { "GET" }, path, bytes.as_deref().unwrap_or(&[]), key)
}

/// Status and text body of a GET (e.g. `/metrics`).
pub fn text_request(addr: SocketAddr, path: &str, key: Option<&str>) -> Result<(u16, String)> {
    let (status, h, mut r) = send(addr, "GET", path, key, &[])?;
    let mut out = Vec::new();
    read_body(&h, &mut r, |b| {
        out.extend_from_slice(b);
        true
    })?;
    Ok((status, String::from_utf8_lossy(&out).into_owned()))
}

/// Status and JSON body of a request with a raw body.
pub fn raw_request(addr: SocketAddr, method: &str, path: &str, body: &[u8], key: Option<&str>) -> Result<(u16, Value)> {
    let (status, h, mut r) = send(addr, method, path, key, body)?;
    let mut out = Vec::new();
    read_body(&h, &mut r, |b| {
        out.extend_from_slice(b);
        true
    })?;
    let v = if out.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&out)
            .with_context(|| format!("{path}: status {status}, body is not JSON: {}", String::from_utf8_lossy(&out)))?
    };
    Ok((status, v))
}

/// POSTs a streaming request and calls `on_event` with each server-sent event's data as it
/// arrives (`[DONE]` included); `on_event` returns false to hang up. Returns the status and, when
/// it is not 200, the error body.
pub fn sse_request(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    key: Option<&str>,
    mut on_event: impl FnMut(&str) -> bool,
) -> Result<(u16, Value)> {
    let (status, h, mut r) = send(addr, "POST", path, key, body.to_string().as_bytes())?;
    if status != 200 {
        let mut out = Vec::new();
        read_body(&h, &mut r, |b| {
            out.extend_from_slice(b);
            true
        })?;
        return Ok((status, serde_json::from_slice(&out).unwrap_or(Value::Null)));
    }
    let mut pending = Vec::<u8>::new();
    read_body(&h, &mut r, |b| {
        pending.extend_from_slice(b);
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            for line in text.lines() {
                if let Some(data) = line.strip_prefix("data: ") {
                    if !on_event(data) {
                        return false;
                    }
                }
            }
        }
        true
    })?;
    Ok((status, Value::Null))
}
