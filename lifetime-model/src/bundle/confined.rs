//! Reading a bundle's files defensively: regular files only, within a size limit, never resolving
//! outside the confinement directory; and the SHA-256 form of the manifest's checksums.

use super::*;

/// Lowercase hex SHA-256 of `bytes`, the form of the manifest's checksums.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

pub(super) fn io_error(path: &Path, source: std::io::Error) -> BundleError {
    BundleError::Io { path: path.to_owned(), source }
}

fn file_kind(file_type: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_file() {
        "regular file"
    } else if file_type.is_dir() {
        "directory"
    } else if file_type.is_symlink() {
        "symbolic link"
    } else if file_type.is_fifo() {
        "FIFO"
    } else if file_type.is_char_device() {
        "character device"
    } else if file_type.is_block_device() {
        "block device"
    } else if file_type.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// Canonical form of a confinement directory, for [`read_confined`].
pub fn canonical_root(root: &Path) -> Result<PathBuf, BundleError> {
    std::fs::canonicalize(root).map_err(|source| io_error(root, source))
}

/// Reads `path` whole, refusing anything but a regular file of at most `limit` bytes that resolves
/// inside `root` (canonical, see [`canonical_root`]).
///
/// Symlinks are resolved first and the target must stay inside `root`; the resolved path is then
/// opened without following a symlink again (`O_NOFOLLOW`) and without blocking (`O_NONBLOCK`, so a
/// FIFO swapped in after the check is refused instead of waiting for a writer), and the opened file's
/// own metadata decides. Reading stops one byte past the limit, so a file that grows meanwhile is
/// refused too.
pub fn read_confined(path: &Path, root: &Path, limit: u64) -> Result<Vec<u8>, BundleError> {
    let resolved = std::fs::canonicalize(path).map_err(|source| io_error(path, source))?;
    if !resolved.starts_with(root) {
        return Err(BundleError::OutsideRoot { path: path.to_owned(), resolved, root: root.to_owned() });
    }
    // Look before opening: opening some devices has effects of its own.
    let metadata = std::fs::metadata(&resolved).map_err(|source| io_error(path, source))?;
    check_regular(path, &metadata, limit)?;
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW);
    }
    let file = options.open(&resolved).map_err(|source| io_error(path, source))?;
    let metadata = file.metadata().map_err(|source| io_error(path, source))?;
    check_regular(path, &metadata, limit)?;
    let capacity = usize::try_from(metadata.len()).unwrap_or(0);
    let mut contents = Vec::with_capacity(capacity);
    file.take(limit.saturating_add(1)).read_to_end(&mut contents).map_err(|source| io_error(path, source))?;
    if contents.len() as u64 > limit {
        return Err(BundleError::TooLarge { path: path.to_owned(), limit });
    }
    Ok(contents)
}

fn check_regular(path: &Path, metadata: &std::fs::Metadata, limit: u64) -> Result<(), BundleError> {
    if !metadata.file_type().is_file() {
        return Err(BundleError::NotRegularFile { path: path.to_owned(), kind: file_kind(&metadata.file_type()) });
    }
    if metadata.len() > limit {
        return Err(BundleError::TooLarge { path: path.to_owned(), limit });
    }
    Ok(())
}
