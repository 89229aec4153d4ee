//! Child processes the library starts (`powermetrics`, the Core ML child):
//! waiting for one to end, with a deadline.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// How a child that was waited for ended.
#[derive(Debug)]
pub(crate) struct Waited {
    /// Its exit status, if it could be read.
    pub status: Option<ExitStatus>,
    /// Whether it was killed for running past the deadline.
    pub killed: bool,
}

/// Wait up to `within` for `c` to exit, then kill it.
pub(crate) fn wait_or_kill(c: &mut Child, within: Duration) -> Waited {
    let t0 = Instant::now();
    loop {
        match c.try_wait() {
            Ok(Some(s)) => {
                return Waited {
                    status: Some(s),
                    killed: false,
                };
            }
            Ok(None) if t0.elapsed() < within => std::thread::sleep(Duration::from_millis(10)),
            running => {
                let _ = c.kill();
                return Waited {
                    status: c.wait().ok(),
                    killed: matches!(running, Ok(None)),
                };
            }
        }
    }
}

/// The last `max_chars` characters of what a child wrote to the file at
/// `path` (its stderr), trimmed; empty if there is none. Only the file's
/// end is read, and bytes that are not UTF-8 are replaced.
pub(crate) fn text_tail(path: &std::path::Path, max_chars: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut bytes = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map_or(0, |m| m.len());
        let keep = 4 * max_chars as u64 + 4;
        let _ = f
            .seek(SeekFrom::Start(len.saturating_sub(keep)))
            .and_then(|_| f.read_to_end(&mut bytes));
    }
    let s = String::from_utf8_lossy(&bytes);
    let s = s.trim();
    let start = s
        .char_indices()
        .rev()
        .nth(max_chars.saturating_sub(1))
        .map_or(0, |(i, _)| i);
    s[start..].to_string()
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn waits_for_an_exit_and_kills_what_does_not_end() {
        let mut quick = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
        let w = wait_or_kill(&mut quick, Duration::from_secs(10));
        assert_eq!((w.status.unwrap().code(), w.killed), (Some(3), false));
        let mut slow = Command::new("sleep").arg("100").spawn().unwrap();
        let t0 = Instant::now();
        let w = wait_or_kill(&mut slow, Duration::from_millis(100));
        assert_eq!(w.status.unwrap().code(), None, "killed by a signal");
        assert!(w.killed);
        assert!(t0.elapsed() < Duration::from_secs(50));
    }

    #[test]
    fn the_tail_of_a_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("err");
        std::fs::write(&p, "  first line\nlast é line\n").unwrap();
        assert_eq!(text_tail(&p, 11), "last é line");
        assert_eq!(text_tail(&p, 1000), "first line\nlast é line");
        assert_eq!(text_tail(&d.path().join("absent"), 10), "");
        // A long file with bytes that are not UTF-8: its end, readable.
        let mut long = vec![b'x'; 100_000];
        long.extend_from_slice(b"\xff the end\n");
        std::fs::write(&p, long).unwrap();
        assert_eq!(text_tail(&p, 9), "\u{fffd} the end");
    }
}
