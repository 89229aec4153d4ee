//! Putting an artifact in place: the advisory lock beside `--out`, the
//! atomic exchange of a finished artifact with the one it replaces, and the
//! removal of what killed builds left behind.

use std::path::{Path, PathBuf};

/// An exclusive advisory lock (`flock`) on `.NAME.lock` beside the artifact:
/// released by the kernel however the build ends (a build killed with
/// SIGKILL leaves no stale lock), and the file is removed on a normal end.
pub(super) struct Lock {
    path: PathBuf,
    _file: std::fs::File,
}

impl Lock {
    pub(super) fn acquire(path: PathBuf) -> std::io::Result<Option<Lock>> {
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::io::AsRawFd;
        loop {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)?;
            // SAFETY: flock on a file descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = std::io::Error::last_os_error();
                return if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                    Ok(None)
                } else {
                    Err(e)
                };
            }
            // The holder before us may have removed the file after we opened
            // it: the lock only counts on the file the path names now.
            let (held, now) = (file.metadata()?, std::fs::metadata(&path));
            if let Ok(now) = now
                && now.ino() == held.ino()
                && now.dev() == held.dev()
            {
                return Ok(Some(Lock { path, _file: file }));
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Removed while still held; the descriptor closes after.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Swap two paths atomically where the OS can (Linux `renameat2`, macOS
/// `renamex_np`): the old artifact stays whole until the new one is in place.
pub(super) fn exchange(a: &Path, b: &Path) -> std::io::Result<bool> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let ca = CString::new(a.as_os_str().as_bytes())?;
    let cb = CString::new(b.as_os_str().as_bytes())?;
    #[cfg(target_os = "linux")]
    // SAFETY: two NUL-terminated paths; no memory is shared with the kernel beyond the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    #[cfg(target_os = "macos")]
    // SAFETY: as above.
    let r = unsafe { libc::renamex_np(ca.as_ptr(), cb.as_ptr(), libc::RENAME_SWAP) };
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    let r = {
        let _ = (&ca, &cb);
        return Ok(false);
    };
    if r == 0 {
        Ok(true)
    } else {
        let e = std::io::Error::last_os_error();
        // Filesystems without the exchange fall back to two renames.
        if matches!(
            e.raw_os_error(),
            Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOTSUP)
        ) {
            Ok(false)
        } else {
            Err(e)
        }
    }
}

/// Remove what killed builds left beside the artifact (the lock is held, so
/// no other build is using them).
pub(super) fn clean_stale(parent: &Path, name: &str) {
    let prefixes = [format!(".{name}.building-"), format!(".{name}.replaced-")];
    if let Ok(rd) = std::fs::read_dir(parent) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            if prefixes.iter().any(|p| n.starts_with(p.as_str())) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}
