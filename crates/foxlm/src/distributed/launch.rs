//! `foxlm train --gpus N`: starts N ranks of the same command on this machine (this binary
//! again, with the whole environment passed through and RANK, LOCAL_RANK, WORLD_SIZE,
//! MASTER_ADDR, MASTER_PORT set as torchrun sets them), then waits for them. When one rank ends
//! with an error the others are given a few seconds to stop on their own (their watchdogs see
//! it), then killed; the launcher reports which rank failed and why.

use anyhow::{anyhow, bail, Context, Result};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Where a rank leaves the message it failed with, for the launcher.
pub const ERROR_FILE_ENV: &str = "FOXLM_ERROR_FILE";
/// Set in the ranks the launcher starts (they must not launch again).
pub const LAUNCHED_ENV: &str = "FOXLM_LAUNCHED";
/// What a rank's error file starts with when it stopped because another rank failed.
pub const STOPPED: &str = "stopped ";

/// How the ranks ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    Ok,
    /// Every rank stopped on Ctrl-C after saving a checkpoint (exit status 130).
    Interrupted,
}

/// A free TCP port on this machine for the rendezvous.
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port for the rendezvous")?;
    Ok(l.local_addr()?.port())
}

/// Starts `n` local ranks running this program with `args` (the arguments after the program
/// name) and supervises them.
pub fn launch_local(n: usize, args: &[OsString]) -> Result<Ended> {
    let exe = std::env::current_exe().context("finding this program to start the ranks")?;
    let port = free_port()?;
    let dir = std::env::temp_dir().join(format!("foxlm-ranks-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut ranks = Vec::with_capacity(n);
    for r in 0..n {
        let err_file = dir.join(format!("rank-{r}.err"));
        let _ = std::fs::remove_file(&err_file);
        let mut cmd = Command::new(&exe);
        cmd.args(args)
            .env("RANK", r.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env(LAUNCHED_ENV, "1")
            .env(ERROR_FILE_ENV, &err_file);
        // NVLink multicast stays off on shared hosts (see fox_kernels::cuda::nccl).
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            cmd.env("NCCL_NVLS_ENABLE", "0");
        }
        match cmd.spawn() {
            Ok(child) => ranks.push(Rank { rank: r, child, err_file }),
            Err(e) => {
                for mut k in ranks {
                    let _ = k.child.kill();
                    let _ = k.child.wait();
                }
                bail!("cannot start rank {r} ({}): {e}", exe.display());
            }
        }
    }
    let res = supervise(ranks, Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
    res
}

/// A started rank.
pub struct Rank {
    pub rank: usize,
    pub child: Child,
    pub err_file: PathBuf,
}

/// Waits for every rank. After the first failure the others get `grace` to stop on their own,
/// then are killed. The error names the rank that failed first and its message.
pub fn supervise(mut ranks: Vec<Rank>, grace: Duration) -> Result<Ended> {
    let n = ranks.len();
    let mut status: Vec<Option<std::process::ExitStatus>> = vec![None; n];
    let mut first_failure: Option<usize> = None;
    let mut kill_at: Option<Instant> = None;
    loop {
        for (i, r) in ranks.iter_mut().enumerate() {
            if status[i].is_none() {
                if let Some(s) = r.child.try_wait().with_context(|| format!("waiting for rank {}", r.rank))? {
                    status[i] = Some(s);
                    if !s.success() && s.code() != Some(130) && first_failure.is_none() {
                        first_failure = Some(i);
                        kill_at = Some(Instant::now() + grace);
                    }
                }
            }
        }
        if status.iter().all(Option::is_some) {
            break;
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            for (i, r) in ranks.iter_mut().enumerate() {
                if status[i].is_none() {
                    let _ = r.child.kill();
                    status[i] = r.child.wait().ok();
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let Some(first) = first_failure else {
        if status.iter().any(|s| s.and_then(|s| s.code()) == Some(130)) {
            return Ok(Ended::Interrupted);
        }
        return Ok(Ended::Ok);
    };
    // The cause: a rank that failed by itself (not one that stopped because another failed),
    // else the first to end.
    let messages: Vec<Option<String>> =
        ranks.iter().map(|r| std::fs::read_to_string(&r.err_file).ok().filter(|m| !m.trim().is_empty())).collect();
    let failed = |i: usize| status[i].is_some_and(|s| !s.success() && s.code() != Some(130));
    let stopped = |i: usize| messages[i].as_deref().is_some_and(|m| m.starts_with(STOPPED));
    let cause = (0..n)
        .find(|&i| failed(i) && messages[i].is_some() && !stopped(i))
        .or_else(|| (0..n).find(|&i| failed(i) && !stopped(i)))
        .unwrap_or(first);
    let r = &ranks[cause];
    let why = match (&messages[cause], status[cause]) {
        (Some(m), _) => m.strip_prefix(STOPPED).unwrap_or(m).trim().to_string(),
        (None, Some(s)) => describe_exit(s),
        (None, None) => "it did not exit".into(),
    };
    Err(anyhow!("rank {} of {n} failed: {why}; the other ranks were stopped", r.rank))
}

fn describe_exit(s: std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = s.signal() {
            let name = match sig {
                9 => " (SIGKILL: killed, perhaps by the kernel's out-of-memory killer)",
                11 => " (SIGSEGV)",
                15 => " (SIGTERM)",
                6 => " (SIGABRT)",
                _ => "",
            };
            return format!("it was killed by signal {sig}{name}");
        }
    }
    format!("it exited with {s} (its messages are above)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(rank: usize, script: &str, dir: &std::path::Path) -> Rank {
        let err_file = dir.join(format!("rank-{rank}.err"));
        let child = Command::new("sh").arg("-c").arg(script).env(ERROR_FILE_ENV, &err_file).spawn().unwrap();
        Rank { rank, child, err_file }
    }

    #[test]
    fn a_failed_rank_is_named_and_the_others_are_killed() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let ranks = vec![
            sh(0, "sleep 60", dir.path()),
            sh(1, "echo 'out of GPU memory' > \"$FOXLM_ERROR_FILE\"; exit 1", dir.path()),
        ];
        let e = supervise(ranks, Duration::from_millis(200)).unwrap_err().to_string();
        assert_eq!(e, "rank 1 of 2 failed: out of GPU memory; the other ranks were stopped");
        assert!(t0.elapsed() < Duration::from_secs(10), "the sleeping rank was not killed");
    }

    #[test]
    fn the_cause_wins_over_ranks_that_stopped_because_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let ranks = vec![
            sh(0, "echo 'stopped rank 0: stopping: rank 1 failed: boom' > \"$FOXLM_ERROR_FILE\"; exit 1", dir.path()),
            sh(1, "sleep 0.3; echo 'boom' > \"$FOXLM_ERROR_FILE\"; exit 1", dir.path()),
        ];
        let e = supervise(ranks, Duration::from_secs(5)).unwrap_err().to_string();
        assert!(e.starts_with("rank 1 of 2 failed: boom"), "{e}");
        // A rank killed by a signal, with no message, while the other says it stopped for it.
        let dir = tempfile::tempdir().unwrap();
        let ranks = vec![
            sh(0, "echo 'stopped rank 0: stopping: rank 1 exited' > \"$FOXLM_ERROR_FILE\"; exit 1", dir.path()),
            sh(1, "kill -9 $$", dir.path()),
        ];
        let e = supervise(ranks, Duration::from_secs(5)).unwrap_err().to_string();
        assert!(e.contains("rank 1 of 2 failed: it was killed by signal 9"), "{e}");
        let ranks = vec![sh(0, "true", dir.path()), sh(1, "true", dir.path())];
        assert_eq!(supervise(ranks, Duration::from_secs(5)).unwrap(), Ended::Ok);
    }
}
