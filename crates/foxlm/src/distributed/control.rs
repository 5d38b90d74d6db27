//! The watchdog: after the rendezvous its connections carry `fail RANK MESSAGE` and `done`
//! between rank 0 and the others (rank 0 relays a failure to every rank). A rank stops, with the
//! failing rank's message, when
//! - a rank reports a failure (its error, or the watchdog of a rank that stopped),
//! - a connection closes without `done` (the rank exited or was killed),
//! - no step finished within the collective timeout (a collective is stuck: NCCL itself waits
//!   forever for a rank that hangs).
//!
//! A stuck NCCL kernel cannot be interrupted from the host, so stopping means ending the process
//! (`std::process::exit`), which tears down its CUDA context.

use super::rendezvous::{read_line, write_line, Links};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the watchdog does when the run must stop: by default print the reason, write it to
/// FOXLM_ERROR_FILE (for the launcher) and exit with status 1.
pub type OnStop = Arc<dyn Fn(String) + Send + Sync>;

pub fn exit_on_stop(rank: usize) -> OnStop {
    Arc::new(move |reason: String| {
        let msg = format!("rank {rank}: stopping: {reason}");
        eprintln!("error: {msg}");
        write_error_file(&format!("stopped {msg}"));
        std::process::exit(1);
    })
}

/// Leaves `msg` where the launcher of `--gpus` reads why a rank ended (FOXLM_ERROR_FILE).
pub fn write_error_file(msg: &str) {
    if let Some(p) = std::env::var_os(super::launch::ERROR_FILE_ENV) {
        let _ = std::fs::write(p, msg);
    }
}

struct Inner {
    rank: usize,
    /// Connections for writing (clones of the ones the readers hold).
    out: Mutex<Vec<(usize, TcpStream)>>,
    /// This rank has finished (or failed and said so): closed connections are expected now.
    finished: AtomicBool,
    /// Ranks that said `done`.
    done: Mutex<Vec<usize>>,
    on_stop: OnStop,
}

/// A rank's end of the control channel.
#[derive(Clone)]
pub struct Control {
    inner: Arc<Inner>,
}

impl Control {
    /// Starts the watchdog threads over the rendezvous connections. `timeout`: the longest a
    /// rank may go without [`super::heartbeat`] before it stops the run.
    pub fn start(rank: usize, links: Links, timeout: Duration, on_stop: OnStop) -> std::io::Result<Control> {
        let mut out = Vec::new();
        let mut readers = Vec::new();
        for (r, s) in links.peers {
            out.push((r, s.try_clone()?));
            readers.push((r, s));
        }
        let inner = Arc::new(Inner {
            rank,
            out: Mutex::new(out),
            finished: AtomicBool::new(false),
            done: Mutex::default(),
            on_stop,
        });
        for (peer, s) in readers {
            let inner = inner.clone();
            std::thread::spawn(move || watch(inner, peer, s));
        }
        super::heartbeat();
        let t = inner.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            if t.finished.load(Ordering::SeqCst) {
                return;
            }
            let idle = super::since_progress_s();
            if idle > timeout.as_secs_f64() {
                let msg = format!(
                    "no progress for {idle:.0}s: a collective is stuck (another rank hung, or a GPU stalled); \
                     --collective-timeout sets the limit"
                );
                Control { inner: t.clone() }.fail(&msg);
                (t.on_stop)(msg);
                return;
            }
        });
        Ok(Control { inner })
    }

    /// Tells the other ranks that this rank failed with `msg` (they stop with it).
    pub fn fail(&self, msg: &str) {
        self.inner.finished.store(true, Ordering::SeqCst);
        send_all(&self.inner, &format!("fail {} {msg}", self.inner.rank), None);
    }

    /// Tells the other ranks that this rank finished normally.
    pub fn done(&self) {
        self.inner.finished.store(true, Ordering::SeqCst);
        send_all(&self.inner, "done", None);
    }
}

fn send_all(inner: &Inner, line: &str, except: Option<usize>) {
    if let Ok(mut out) = inner.out.lock() {
        for (r, s) in out.iter_mut() {
            if Some(*r) != except {
                let _ = write_line(s, line);
            }
        }
    }
}

/// Reads one connection until it closes.
fn watch(inner: Arc<Inner>, peer: usize, mut s: TcpStream) {
    loop {
        let line = read_line(&mut s);
        let stop = match line {
            Ok(Some(l)) if l == "done" => {
                if let Ok(mut d) = inner.done.lock() {
                    d.push(peer);
                }
                None
            }
            Ok(Some(l)) => match l.strip_prefix("fail ") {
                Some(rest) => {
                    let (who, msg) = rest.split_once(' ').unwrap_or((rest, ""));
                    let who = who.parse::<usize>().unwrap_or(peer);
                    // Rank 0 passes a failure on to every other rank.
                    if inner.rank == 0 {
                        send_all(&inner, &format!("fail {who} {msg}"), Some(peer));
                    }
                    Some(format!("rank {who} failed: {msg}"))
                }
                None => None,
            },
            Ok(None) | Err(_) => {
                let said_done = inner.done.lock().map(|d| d.contains(&peer)).unwrap_or(false);
                if said_done || inner.finished.load(Ordering::SeqCst) {
                    return;
                }
                let msg = format!("rank {peer} exited or was killed without a message");
                if inner.rank == 0 {
                    send_all(&inner, &format!("fail {peer} {msg}"), Some(peer));
                }
                Some(if peer == 0 { "lost the connection to rank 0 (it exited or was killed)".into() } else { msg })
            }
        };
        if let Some(reason) = stop {
            if !inner.finished.swap(true, Ordering::SeqCst) {
                (inner.on_stop)(reason);
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{rendezvous::rendezvous, World};
    use super::*;
    use std::sync::mpsc;

    fn start_world(size: usize, timeout: Duration) -> (Vec<Control>, mpsc::Receiver<(usize, String)>) {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (tx, rx) = mpsc::channel();
        let controls = std::thread::scope(|s| {
            let hs: Vec<_> = (0..size)
                .map(|r| {
                    let tx = tx.clone();
                    s.spawn(move || {
                        let w =
                            World { rank: r, local_rank: r, size, master_addr: "127.0.0.1".into(), master_port: port };
                        let (_, links) = rendezvous(&w, Duration::from_secs(20), || Ok(vec![0; 4])).unwrap();
                        let tx = Mutex::new(tx);
                        let on_stop: OnStop = Arc::new(move |m| {
                            let _ = tx.lock().unwrap().send((r, m));
                        });
                        Control::start(r, links, timeout, on_stop).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        (controls, rx)
    }

    fn stops(rx: &mpsc::Receiver<(usize, String)>, n: usize) -> Vec<(usize, String)> {
        let mut v: Vec<_> = (0..n).map(|_| rx.recv_timeout(Duration::from_secs(20)).expect("a stop")).collect();
        v.sort();
        v
    }

    #[test]
    fn a_failure_on_one_rank_stops_the_others_with_its_message() {
        let (c, rx) = start_world(3, Duration::from_secs(600));
        c[2].fail("CUDA out of memory on GPU 2");
        let got = stops(&rx, 2);
        assert_eq!(got[0], (0, "rank 2 failed: CUDA out of memory on GPU 2".to_string()));
        assert_eq!(got[1], (1, "rank 2 failed: CUDA out of memory on GPU 2".to_string()));
    }

    #[test]
    fn a_vanished_rank_stops_the_others_but_done_does_not() {
        let (c, rx) = start_world(3, Duration::from_secs(600));
        // Rank 1 finishes normally and closes its connection: nobody stops.
        c[1].done();
        drop(c);
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
        let (c, rx) = start_world(2, Duration::from_secs(600));
        // Rank 1's connections close without `done` (as when the process is killed).
        let inner = c[1].inner.clone();
        inner.out.lock().unwrap().iter().for_each(|(_, s)| s.shutdown(std::net::Shutdown::Both).unwrap());
        // Rank 1 loses rank 0 too; rank 0 names rank 1.
        let got = stops(&rx, 2);
        assert_eq!(got[0].0, 0);
        assert!(got[0].1.contains("rank 1 exited or was killed"), "{}", got[0].1);
    }
}
