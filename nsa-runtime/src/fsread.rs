//! Reading files that nsa does not control (cache entries, config files,
//! libraries) without trusting what they are: only regular files are opened
//! (a FIFO would block, a device would never end), and the size is checked
//! against a limit before a byte is read.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` for reading if it is a regular file. With `follow_links` false a
/// symbolic link is refused rather than followed. Opening never blocks (a FIFO is
/// opened non-blocking, then refused).
pub fn open_regular(path: &Path, follow_links: bool) -> io::Result<File> {
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
    if !follow_links {
        flags |= libc::O_NOFOLLOW;
    }
    let file = OpenOptions::new().read(true).custom_flags(flags).open(path).map_err(|e| {
        if !follow_links && e.raw_os_error() == Some(libc::ELOOP) {
            io::Error::new(io::ErrorKind::InvalidInput, "it is a symbolic link, which is not followed here")
        } else {
            e
        }
    })?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{what}: not a regular file")));
    }
    Ok(file)
}

/// The whole of regular file `path`, refused before reading when it is larger
/// than `limit` bytes (and, should it grow while read, after `limit + 1`).
pub fn read_bounded(path: &Path, limit: u64, follow_links: bool) -> io::Result<Vec<u8>> {
    let file = open_regular(path, follow_links)?;
    let size = file.metadata()?.len();
    if size > limit {
        return Err(too_large(size, limit));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64, limit));
    }
    Ok(bytes)
}

/// Takes an exclusive advisory lock (`flock`) on `file` without waiting:
/// `Ok(true)` taken, `Ok(false)` held through another open file (this process's
/// or another's). The OS releases it when the file is closed or its process dies.
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    // SAFETY: flock on a file descriptor this `File` owns for the duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// The UTF-8 names in directory `dir`, sorted; none when it cannot be read.
pub fn dir_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut names: Vec<String> = entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    names.sort();
    names
}

fn too_large(size: u64, limit: u64) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("it has {size} bytes, more than the {limit} allowed"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn refuses_fifos_devices_links_and_large_files_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = Instant::now();
        let err = read_bounded(&fifo, 1 << 20, true).unwrap_err();
        assert!(err.to_string().contains("FIFO"), "{err}");
        assert!(read_bounded(Path::new("/dev/zero"), 1 << 20, true).unwrap_err().to_string().contains("device"));
        assert!(t.elapsed() < Duration::from_secs(1));

        let real = dir.path().join("real");
        std::fs::write(&real, b"0123456789").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(read_bounded(&link, 10, true).unwrap(), b"0123456789");
        assert!(read_bounded(&link, 10, false).unwrap_err().to_string().contains("symbolic link"));
        let err = read_bounded(&real, 9, false).unwrap_err();
        assert!(err.to_string().contains("10 bytes, more than the 9 allowed"), "{err}");

        // A sparse 2 GiB file is refused from its size, not read.
        let sparse = dir.path().join("sparse");
        File::create(&sparse).unwrap().set_len(2 << 30).unwrap();
        let t = Instant::now();
        assert!(read_bounded(&sparse, 1 << 20, false).is_err());
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
