//! The process around a command: signals, the allocator, the settings read
//! from the environment at the program's edge (the library reads none), and
//! the exit code.

use std::process::ExitCode;

use crate::interp;

/// The interpreter's settings, read from the environment once as a command
/// starts (the library reads none): `ANE_EXPORT_SHORTCUTS=0` turns its
/// exact shortcuts off, `ANE_EXPORT_PROFILE=1` profiles each of its runs
/// (printed on stderr).
pub fn interp_settings() -> interp::Settings {
    interp::Settings {
        shortcuts: std::env::var_os("ANE_EXPORT_SHORTCUTS").is_none_or(|v| v != "0"),
        profile: std::env::var_os("ANE_EXPORT_PROFILE").is_some_and(|v| v == "1"),
    }
}

/// Open the matrix products' library ([`crate::blas::init`]), printing its
/// warning if it has one; a setting it refuses (`ANE_EXPORT_CPU`) is printed
/// and gives exit code 2, before any work.
///
/// # Safety
/// As [`crate::blas::init`]: no other thread may be running.
pub unsafe fn open_blas() -> Result<(), ExitCode> {
    // SAFETY: forwarded from the caller.
    match unsafe { crate::blas::init() } {
        Ok(warning) => {
            if let Some(w) = warning {
                eprintln!("{w}");
            }
            Ok(())
        }
        Err(e) => {
            eprintln!("{e}");
            Err(ExitCode::from(2))
        }
    }
}

/// Restore the default SIGPIPE action, so that `ane-export inspect | head`
/// ends quietly instead of failing on a closed pipe (Rust ignores SIGPIPE).
pub fn reset_sigpipe() {
    #[cfg(unix)]
    // SAFETY: setting a signal disposition to its default before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Ctrl-C (SIGINT) ends the process at once with exit code 130 and one
/// line, whatever it is doing: a build's temporary directory and lock are
/// removed by the next build ([`crate::builder`]), and nothing else is
/// written before the final renames. Called first thing by the binaries;
/// the library leaves signals alone (and keeps this handler when it starts
/// Python).
pub fn exit_on_interrupt() {
    extern "C" fn on_interrupt(_: libc::c_int) {
        const MSG: &[u8] = b"\ninterrupted\n";
        // SAFETY: write(2) and _exit(2) are async-signal-safe.
        unsafe {
            libc::write(2, MSG.as_ptr().cast(), MSG.len());
            libc::_exit(130);
        }
    }
    // SAFETY: installs a handler that only calls async-signal-safe functions.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
}

/// Keep freed memory in the process (glibc's malloc): buffers of any size
/// come from the heap, and what is freed is not returned to the kernel. The
/// interpreter frees and allocates tensors of up to 64 MB at every op; with
/// glibc's defaults each of those is a fresh mapping whose pages the kernel
/// must fault in and clear. Measured on the 2B-shaped tower: page faults of
/// one b4096 exec 3.07 M -> 0.62 M, peak RSS +1.4%; see BENCHMARKS.md for the
/// gate. One arena serves every thread: the interpreter runs on a thread of
/// rayon's pool and the reference on the main thread, and with an arena
/// each, what one freed and kept could not serve the other (the 2B gate's
/// peak RSS went from 2.9x to 3.8x the fp16 weights). Called first thing by
/// the binaries, before any thread starts; the library leaves the allocator
/// alone.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; no thread is running yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Map a command's outcome to the process exit code, printing errors: on
/// stderr, and with `json` also as one JSON object on stdout, `{"error":
/// message, "exit_code": 2}`, for callers that parse the output.
pub fn finish(r: anyhow::Result<ExitCode>, json: bool) -> ExitCode {
    match r {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("{e:#}");
            eprintln!("error: {msg}");
            if json {
                println!("{}", serde_json::json!({"error": msg, "exit_code": 2}));
            }
            ExitCode::from(2)
        }
    }
}

/// Peak resident memory of this process in MiB (Linux `VmHWM`), if known.
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
