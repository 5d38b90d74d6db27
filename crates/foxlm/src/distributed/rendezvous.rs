//! The rendezvous: rank 0 listens on MASTER_PORT, the other ranks connect to
//! MASTER_ADDR:MASTER_PORT and say who they are; once all are in, rank 0 sends each the NCCL
//! unique id (or the reason it could not make one). The connections stay open afterwards as the
//! control channel of [`super::control`]. Every wait has a deadline.
//!
//! The protocol is lines of text: a rank sends `foxlm-rendezvous 1 rank R world W`; rank 0
//! answers `id HEX`, or `error MESSAGE` (the run cannot start: every rank stops with it).

use super::World;
use crate::hex::{hex, unhex};
use anyhow::{anyhow, bail, Context, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const HELLO: &str = "foxlm-rendezvous 1";
/// Longest line accepted (an id is 256 hex digits; error messages are cut).
const MAX_LINE: usize = 16 << 10;

/// The connections of a finished rendezvous: on rank 0 one per other rank (with its rank), on
/// the others the one to rank 0.
pub struct Links {
    pub peers: Vec<(usize, TcpStream)>,
}

/// Reads one line (without its newline) before the stream's read timeout.
pub fn read_line(s: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match s.read(&mut byte)? {
            0 if line.is_empty() => return Ok(None),
            0 => break,
            _ if byte[0] == b'\n' => break,
            _ if line.len() < MAX_LINE => line.push(byte[0]),
            _ => {}
        }
    }
    Ok(Some(String::from_utf8_lossy(&line).into_owned()))
}

pub fn write_line(s: &mut TcpStream, line: &str) -> std::io::Result<()> {
    let one_line: String = line.chars().map(|c| if c == '\n' { ' ' } else { c }).take(MAX_LINE - 64).collect();
    s.write_all(format!("{one_line}\n").as_bytes())
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10))
}

/// Meets the other ranks of `w` within `timeout` and returns the NCCL id that rank 0 made with
/// `make_id` (called on rank 0 once every rank has arrived), with the connections.
pub fn rendezvous(w: &World, timeout: Duration, make_id: impl FnOnce() -> Result<Vec<u8>>) -> Result<(Vec<u8>, Links)> {
    w.check()?;
    let deadline = Instant::now() + timeout;
    if w.rank == 0 {
        serve(w, deadline, timeout, make_id)
    } else {
        join(w, deadline, timeout)
    }
}

fn serve(
    w: &World,
    deadline: Instant,
    timeout: Duration,
    make_id: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<(Vec<u8>, Links)> {
    let listener = TcpListener::bind(("0.0.0.0", w.master_port)).with_context(|| {
        format!(
            "rank 0 cannot listen on MASTER_PORT {} (is another run using it? choose another MASTER_PORT / \
             --master-port)",
            w.master_port
        )
    })?;
    listener.set_nonblocking(true).context("rendezvous socket")?;
    let mut peers: Vec<(usize, TcpStream)> = Vec::new();
    while peers.len() + 1 < w.size {
        match listener.accept() {
            Ok((mut s, from)) => {
                s.set_nonblocking(false).context("rendezvous socket")?;
                s.set_read_timeout(Some(left(deadline).min(Duration::from_secs(10)))).context("rendezvous socket")?;
                let hello = read_line(&mut s).ok().flatten().unwrap_or_default();
                let mut f = hello.strip_prefix(HELLO).unwrap_or("").split_whitespace();
                let (rank, world) = match (f.next(), f.next(), f.next(), f.next()) {
                    (Some("rank"), Some(r), Some("world"), Some(n)) => {
                        (r.parse::<usize>().ok(), n.parse::<usize>().ok())
                    }
                    _ => (None, None),
                };
                let (Some(rank), Some(world)) = (rank, world) else {
                    // Not one of ours (a port scan, another program): ignore it.
                    let _ = write_line(&mut s, "error not a foxlm rendezvous message");
                    continue;
                };
                let problem = if world != w.size {
                    Some(format!("rank {rank} (from {from}) has WORLD_SIZE {world}, rank 0 has {}", w.size))
                } else if rank == 0 || rank >= w.size {
                    Some(format!("a rank from {from} calls itself rank {rank}, outside 1..{}", w.size))
                } else if peers.iter().any(|(r, _)| *r == rank) {
                    Some(format!("two processes call themselves rank {rank} (the second from {from})"))
                } else {
                    None
                };
                if let Some(p) = problem {
                    let msg = format!("rendezvous on port {}: {p}; check RANK and WORLD_SIZE", w.master_port);
                    let _ = write_line(&mut s, &format!("error {msg}"));
                    for (_, s) in &mut peers {
                        let _ = write_line(s, &format!("error {msg}"));
                    }
                    bail!(msg);
                }
                peers.push((rank, s));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let mut missing: Vec<String> =
                        (1..w.size).filter(|r| !peers.iter().any(|(p, _)| p == r)).map(|r| r.to_string()).collect();
                    missing.truncate(16);
                    let msg = format!(
                        "rendezvous: rank 0 waited {}s on port {} for rank(s) {} of WORLD_SIZE {} and they did not \
                         come (are they started, with MASTER_ADDR pointing at this machine and the same \
                         MASTER_PORT? --rendezvous-timeout sets the wait)",
                        timeout.as_secs(),
                        w.master_port,
                        missing.join(", "),
                        w.size
                    );
                    for (_, s) in &mut peers {
                        let _ = write_line(s, &format!("error {msg}"));
                    }
                    bail!(msg);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(anyhow!("rendezvous: accepting a connection on port {}: {e}", w.master_port)),
        }
    }
    let id = match make_id() {
        Ok(id) => id,
        Err(e) => {
            let msg = format!("rank 0 could not start the run: {e:#}");
            for (_, s) in &mut peers {
                let _ = write_line(s, &format!("error {msg}"));
            }
            return Err(e);
        }
    };
    for (r, s) in &mut peers {
        write_line(s, &format!("id {}", hex(&id)))
            .with_context(|| format!("rendezvous: sending the id to rank {r}"))?;
        s.set_read_timeout(None).context("rendezvous socket")?;
    }
    peers.sort_by_key(|p| p.0);
    Ok((id, Links { peers }))
}

fn join(w: &World, deadline: Instant, timeout: Duration) -> Result<(Vec<u8>, Links)> {
    let target = format!("{}:{}", w.master_addr, w.master_port);
    let mut last_err = String::from("no attempt");
    let mut s = loop {
        let addrs: Vec<SocketAddr> = match target.to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                last_err = format!("cannot resolve MASTER_ADDR {}: {e}", w.master_addr);
                Vec::new()
            }
        };
        let conn = addrs.iter().find_map(|a| match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
            Ok(s) => Some(s),
            Err(e) => {
                last_err = e.to_string();
                None
            }
        });
        if let Some(s) = conn {
            break s;
        }
        if Instant::now() >= deadline {
            bail!(
                "rendezvous: rank {} could not reach rank 0 at {target} within {}s ({last_err}); is rank 0 \
                 started, and are MASTER_ADDR / MASTER_PORT right? --rendezvous-timeout sets the wait",
                w.rank,
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    s.set_nodelay(true).ok();
    write_line(&mut s, &format!("{HELLO} rank {} world {}", w.rank, w.size))
        .with_context(|| format!("rendezvous: rank {} writing to rank 0 at {target}", w.rank))?;
    s.set_read_timeout(Some(left(deadline))).context("rendezvous socket")?;
    let reply = read_line(&mut s);
    let line = match reply {
        Ok(Some(l)) => l,
        Ok(None) => bail!("rendezvous: rank 0 at {target} closed the connection before the run started"),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => bail!(
            "rendezvous: rank {} reached rank 0 at {target} but the other ranks did not all arrive within {}s \
             (--rendezvous-timeout sets the wait)",
            w.rank,
            timeout.as_secs()
        ),
        Err(e) => bail!("rendezvous: reading from rank 0 at {target}: {e}"),
    };
    if let Some(msg) = line.strip_prefix("error ") {
        bail!("{msg}");
    }
    let id = line
        .strip_prefix("id ")
        .and_then(unhex)
        .ok_or_else(|| anyhow!("rendezvous: rank 0 at {target} sent something unexpected: {line:.80}"))?;
    s.set_read_timeout(None).context("rendezvous socket")?;
    Ok((id, Links { peers: vec![(0, s)] }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world(rank: usize, size: usize, port: u16) -> World {
        World { rank, local_rank: rank, size, master_addr: "127.0.0.1".into(), master_port: port }
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    #[test]
    fn three_ranks_get_rank_0s_id() {
        let port = free_port();
        let t = Duration::from_secs(20);
        let ids: Vec<Vec<u8>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| s.spawn(move || rendezvous(&world(r, 3, port), t, || Ok(vec![7, 0, 255, 1])).unwrap().0))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(ids.iter().all(|id| id == &[7, 0, 255, 1]), "{ids:?}");
    }

    #[test]
    fn rank_0s_failure_reaches_the_others() {
        let port = free_port();
        let t = Duration::from_secs(20);
        let errs: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    s.spawn(move || {
                        let e = rendezvous(&world(r, 2, port), t, || bail!("no NCCL here")).err().unwrap();
                        format!("{e:#}")
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(errs[0].contains("no NCCL here"), "{}", errs[0]);
        assert!(errs[1].contains("rank 0 could not start the run: no NCCL here"), "{}", errs[1]);
    }

    #[test]
    fn a_missing_rank_times_out_with_its_number() {
        let port = free_port();
        let e = rendezvous(&world(0, 3, port), Duration::from_millis(300), || Ok(vec![1])).err().unwrap();
        let msg = format!("{e:#}");
        assert!(msg.contains("rank(s) 1, 2 of WORLD_SIZE 3") && msg.contains("--rendezvous-timeout"), "{msg}");
        let e = rendezvous(&world(1, 2, free_port()), Duration::from_millis(300), || Ok(vec![1])).err().unwrap();
        assert!(format!("{e:#}").contains("could not reach rank 0 at 127.0.0.1"), "{e:#}");
    }
}
