//! A fault-injecting SQLite VFS for power-loss tests, after SQLite's own crash tests (`test6.c`,
//! `crashsql`) and LazyFS.
//!
//! **What it does.** [`Disk::register`] registers a VFS that wraps SQLite's default one (`unix`).
//! Every file operation goes through to the real file (so reads, locks and the WAL's shared memory
//! behave exactly as in production), and the VFS remembers, per file, every write and truncate made
//! since that file's last successful `xSync`, with the bytes it overwrote (its pre-image). It also
//! remembers the directory operations (file creations and deletions) made since the directory was
//! last synced.
//!
//! **Cutting the power.** [`Disk::cut_after`] arms a countdown of mutating operations (write,
//! truncate, sync, delete, creation); when it runs out, that operation and every later one fails
//! with an I/O error, as on a machine that has stopped: nothing more reaches the disk, reads fail,
//! opening fails. The process under test goes on (it answers its clients with errors, which a real
//! client of a dead machine would never receive: the harness treats them as "no answer").
//!
//! **The power loss** ([`Disk::power_loss`], once every file is closed): for each file, the
//! unsynced operations are undone in reverse order (which gives the content as of its last sync)
//! and then some of them are applied again, by 512-byte sectors, as the [`Tear`] says: none
//! (`Drop`), a random prefix of them in order (`Prefix`: the disk wrote back in order and stopped),
//! or each sector independently kept, lost or scrambled into random bytes (`Scatter`: the page cache
//! and the drive reordered and tore the writes). A sync is a barrier: what was written before a
//! file's last sync always survives, and no byte outside a written range ever changes (SQLite's
//! unix VFS declares `SQLITE_IOCAP_POWERSAFE_OVERWRITE`). The `-shm` files are memory that a power
//! loss wipes: they are overwritten with random bytes (SQLite rebuilds them from the WAL).
//!
//! **Directories, strictly as POSIX says.** A created file's directory entry, and a deletion, are
//! durable only once the directory is synced, which SQLite's unix VFS does on the first sync of a
//! WAL or rollback journal it opened with `SQLITE_OPEN_CREATE`, and in `xDelete` when asked
//! (`syncDir`); fsyncing a file does not make its name durable (ext4 and xfs happen to, POSIX does
//! not promise it). At a power loss a random prefix of the unsynced directory operations survives
//! (none under `Drop`): a creation undone removes the file, a deletion undone brings the file back
//! with its content as of its last sync. The model has one directory: a store's files live side by
//! side.
//!
//! All `unsafe` code (the C callbacks) is in the `ffi` module at the end; the model above it is
//! safe Rust.

#![allow(dead_code)]

use rand::Rng;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicPtr;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The unit of a torn write.
pub const SECTOR: u64 = 512;

/// How a power loss treats the writes not yet synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tear {
    /// None of them reaches the disk.
    Drop,
    /// A random prefix of them (by sectors, in order) reaches the disk.
    Prefix,
    /// Each sector independently reaches the disk, is lost, or is left holding random bytes.
    Scatter,
}

/// One change to a file not yet synced.
#[derive(Clone, Debug)]
enum Op {
    /// `data` written at `offset` over `pre` (shorter than `data` where the write extended the
    /// file), the file `old_len` bytes long before.
    Write { offset: u64, data: Vec<u8>, pre: Vec<u8>, old_len: u64 },
    /// The file cut (or extended) to `len` from `old_len`; `tail` is what was cut off.
    Truncate { len: u64, old_len: u64, tail: Vec<u8> },
}

/// A directory operation not yet made durable by a sync of the directory.
#[derive(Clone, Debug)]
enum MetaOp {
    Create(PathBuf),
    /// The file deleted, with its content as of its last sync.
    Delete {
        path: PathBuf,
        synced: Vec<u8>,
    },
}

/// Counts of what went through the VFS since it was registered.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiskStats {
    pub writes: u64,
    pub syncs: u64,
    pub dir_syncs: u64,
    pub truncates: u64,
    pub creates: u64,
    pub deletes: u64,
    pub power_losses: u64,
}

/// What one power loss did.
#[derive(Clone, Copy, Debug, Default)]
pub struct LossReport {
    /// Files with unsynced writes.
    pub files: usize,
    pub sectors_kept: u64,
    pub sectors_lost: u64,
    pub sectors_scrambled: u64,
    /// Directory operations undone.
    pub dir_ops_undone: usize,
}

#[derive(Debug, Default)]
struct State {
    unsynced: HashMap<PathBuf, Vec<Op>>,
    meta: Vec<MetaOp>,
    /// Main database files (their `-shm` files are wiped at a power loss).
    databases: HashSet<PathBuf>,
    /// Files whose next sync also syncs their directory (the unix VFS's `UNIXFILE_DIRSYNC`).
    dirsync_pending: HashSet<PathBuf>,
    /// Mutating operations left before the power fails.
    countdown: Option<u64>,
    /// Once the countdown ran out, the power fails on the next sync only (in the middle of an
    /// `fsync`: what it was flushing may be on disk or not).
    on_sync: bool,
    dead: bool,
    /// The operation the power failed on.
    cut_on: Option<&'static str>,
    open_files: usize,
    stats: DiskStats,
}

impl State {
    /// Counts down one mutating operation: false once the power is off (the operation must fail).
    fn tick(&mut self, what: &'static str) -> bool {
        if self.dead {
            return false;
        }
        if let Some(left) = &mut self.countdown {
            if *left == 0 && (!self.on_sync || what == "sync") {
                self.dead = true;
                self.cut_on = Some(what);
                return false;
            }
            *left = left.saturating_sub(1);
        }
        true
    }

    fn record(&mut self, path: &Path, op: Op) {
        self.unsynced.entry(path.to_owned()).or_default().push(op);
    }

    fn synced(&mut self, path: &Path) {
        self.stats.syncs += 1;
        self.unsynced.remove(path);
        if self.dirsync_pending.remove(path) {
            // One directory: its sync makes every earlier creation and deletion durable.
            self.stats.dir_syncs += 1;
            self.meta.clear();
        }
    }

    /// `path`'s content as of its last sync (read while no one writes it: SQLite deletes a file
    /// after closing it).
    fn synced_content(&self, path: &Path) -> Vec<u8> {
        let mut content = std::fs::read(path).unwrap_or_default();
        for op in self.unsynced.get(path).map(Vec::as_slice).unwrap_or_default().iter().rev() {
            undo(&mut content, op);
        }
        content
    }
}

/// Takes `op` back from `content` (ops are taken back newest first).
fn undo(content: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Write { offset, pre, old_len, .. } => {
            let at = *offset as usize;
            if content.len() < at + pre.len() {
                content.resize(at + pre.len(), 0);
            }
            content[at..at + pre.len()].copy_from_slice(pre);
            content.resize(*old_len as usize, 0);
        }
        Op::Truncate { len, old_len, tail } => {
            content.resize(*len as usize, 0);
            if old_len > len {
                content.extend_from_slice(tail);
            }
            content.resize(*old_len as usize, 0);
        }
    }
}

/// One piece of an unsynced operation, as a power loss may keep it or not.
enum Piece<'a> {
    Bytes { offset: u64, bytes: &'a [u8] },
    SetLen(u64),
}

/// The operations cut into sectors (aligned on the file's sector boundaries), in order.
fn pieces(ops: &[Op]) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    for op in ops {
        match op {
            Op::Write { offset, data, .. } => {
                let mut at = 0usize;
                while at < data.len() {
                    let start = offset + at as u64;
                    let end = ((start / SECTOR + 1) * SECTOR).min(offset + data.len() as u64);
                    let len = (end - start) as usize;
                    pieces.push(Piece::Bytes { offset: start, bytes: &data[at..at + len] });
                    at += len;
                }
            }
            Op::Truncate { len, .. } => pieces.push(Piece::SetLen(*len)),
        }
    }
    pieces
}

/// A simulated disk under one registered VFS. Lives as long as the process (SQLite keeps a pointer
/// to it in the VFS).
#[derive(Debug)]
pub struct Disk {
    name: String,
    state: Mutex<State>,
    /// The VFS ours wraps (SQLite's default), set once at registration.
    real: AtomicPtr<libsqlite3_sys::sqlite3_vfs>,
}

impl Disk {
    /// Registers a VFS named `name` over SQLite's default one (not as the default). Open a
    /// database with it by naming it (`SqliteOptions::vfs`).
    pub fn register(name: &str) -> &'static Disk {
        let disk: &'static Disk = Box::leak(Box::new(Disk {
            name: name.to_owned(),
            state: Mutex::default(),
            real: AtomicPtr::new(std::ptr::null_mut()),
        }));
        ffi::register(disk);
        disk
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere must not turn every later file operation into one.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The power fails on the `(n + 1)`-th mutating operation from now, or with `on_sync` on the
    /// first sync from then on.
    pub fn cut_after(&self, n: u64, on_sync: bool) {
        let mut state = self.lock();
        state.countdown = Some(n);
        state.on_sync = on_sync;
    }

    /// The power fails now.
    pub fn cut_now(&self) {
        let mut state = self.lock();
        if !state.dead {
            state.dead = true;
            state.cut_on = Some("idle");
        }
    }

    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// The operation the power failed on (`write`, `sync`, ...), once it has.
    pub fn cut_on(&self) -> Option<&'static str> {
        self.lock().cut_on
    }

    pub fn stats(&self) -> DiskStats {
        self.lock().stats
    }

    /// Files of this VFS open now.
    pub fn open_files(&self) -> usize {
        self.lock().open_files
    }

    /// Loses what was not synced, as `tear` says (see the module documentation), and powers the
    /// disk back on. Every file of the VFS must be closed: the process that had them open is gone.
    pub fn power_loss(&self, tear: Tear, rng: &mut impl Rng) -> std::io::Result<LossReport> {
        let mut state = self.lock();
        if state.open_files > 0 {
            return Err(std::io::Error::other(format!("{} files still open", state.open_files)));
        }
        let mut report = LossReport::default();
        let unsynced = std::mem::take(&mut state.unsynced);
        let mut paths: Vec<&PathBuf> = unsynced.keys().collect();
        paths.sort();
        for path in paths {
            let ops = &unsynced[path];
            if ops.is_empty() || !path.exists() {
                continue;
            }
            report.files += 1;
            let mut content = std::fs::read(path)?;
            for op in ops.iter().rev() {
                undo(&mut content, op);
            }
            let pieces = pieces(ops);
            let prefix = match tear {
                Tear::Prefix => rng.random_range(0..=pieces.len()),
                _ => 0,
            };
            for (k, piece) in pieces.iter().enumerate() {
                // 0: lost, 1: kept, 2: scrambled.
                let fate = match tear {
                    Tear::Drop => 0,
                    Tear::Prefix => u8::from(k < prefix),
                    Tear::Scatter => match rng.random_range(0..8) {
                        0..=3 => 1,
                        4..=6 => 0,
                        _ => 2,
                    },
                };
                match piece {
                    Piece::SetLen(len) if fate == 1 => content.resize(*len as usize, 0),
                    Piece::SetLen(_) => {}
                    Piece::Bytes { offset, bytes } => {
                        let (at, end) = (*offset as usize, *offset as usize + bytes.len());
                        match fate {
                            0 => {
                                report.sectors_lost += 1;
                                continue;
                            }
                            1 => report.sectors_kept += 1,
                            _ => report.sectors_scrambled += 1,
                        }
                        if content.len() < end {
                            content.resize(end, 0);
                        }
                        if fate == 1 {
                            content[at..end].copy_from_slice(bytes);
                        } else {
                            rng.fill(&mut content[at..end]);
                        }
                    }
                }
            }
            std::fs::write(path, &content)?;
        }
        let meta = std::mem::take(&mut state.meta);
        let survive = match tear {
            Tear::Drop => 0,
            _ => rng.random_range(0..=meta.len()),
        };
        for op in meta[survive..].iter().rev() {
            report.dir_ops_undone += 1;
            match op {
                MetaOp::Create(path) => match std::fs::remove_file(path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                },
                MetaOp::Delete { path, synced } => std::fs::write(path, synced)?,
            }
        }
        for db in &state.databases {
            let mut shm = db.clone().into_os_string();
            shm.push("-shm");
            if let Ok(len) = std::fs::metadata(&shm).map(|m| m.len()) {
                let mut garbage = vec![0u8; len as usize];
                rng.fill(&mut garbage[..]);
                std::fs::write(&shm, garbage)?;
            }
        }
        state.dirsync_pending.clear();
        state.countdown = None;
        state.dead = false;
        state.cut_on = None;
        state.stats.power_losses += 1;
        Ok(report)
    }
}

/// The C side: the VFS and file callbacks SQLite calls. Each forwards to the real VFS and tells the
/// [`Disk`] what it did.
///
/// Why this is sound, in one place:
/// - every `*mut sqlite3_file` SQLite hands to a file callback was allocated by SQLite with our
///   `szOsFile` bytes (8-byte aligned) and passed to our `x_open` first, which laid a [`ShimFile`]
///   at its start (`#[repr(C)]`, `sqlite3_file` first, as SQLite requires) and the real VFS's file
///   right after it, at `REAL_OFFSET`; the file callbacks are only reachable through `METHODS`,
///   which `x_open` installs only after it succeeded, so they always see a fully initialised
///   `ShimFile`;
/// - `pAppData` of our VFS is the `&'static Disk` leaked in [`Disk::register`], and the real VFS
///   is SQLite's own registration, which lives as long as the process: both outlive every call;
/// - SQLite passes buffers of at least `iAmt` bytes to `xRead`/`xWrite`, and NUL-terminated names;
/// - the `Disk`'s state is behind a mutex, so the callbacks may run on any thread; no callback
///   unwinds into C (Rust aborts a panic at an `extern "C"` boundary, which fails the test).
mod ffi {
    use super::{Disk, Op};
    use libsqlite3_sys as sql;
    use std::ffi::{c_char, c_int, c_void, CStr, CString, OsStr};
    use std::os::unix::ffi::OsStrExt;
    use std::path::PathBuf;
    use std::ptr;
    use std::sync::atomic::Ordering;

    /// Our part of an open file; the real VFS's file follows at `REAL_OFFSET`.
    #[repr(C)]
    struct ShimFile {
        base: sql::sqlite3_file,
        disk: *const Disk,
        real: *mut sql::sqlite3_file,
        /// Leaked `Box<PathBuf>`, freed in `x_close`; null for SQLite's anonymous temporary files,
        /// which a power loss does not concern.
        path: *mut PathBuf,
    }

    /// Where the real file starts: after `ShimFile`, 16-byte aligned.
    const REAL_OFFSET: usize = std::mem::size_of::<ShimFile>().div_ceil(16) * 16;

    static METHODS: sql::sqlite3_io_methods = sql::sqlite3_io_methods {
        // Version 2: shared memory (WAL), no memory-mapped I/O, so that every read and write of
        // the files goes through `x_read` and `x_write`.
        iVersion: 2,
        xClose: Some(x_close),
        xRead: Some(x_read),
        xWrite: Some(x_write),
        xTruncate: Some(x_truncate),
        xSync: Some(x_sync),
        xFileSize: Some(x_file_size),
        xLock: Some(x_lock),
        xUnlock: Some(x_unlock),
        xCheckReservedLock: Some(x_check_reserved_lock),
        xFileControl: Some(x_file_control),
        xSectorSize: Some(x_sector_size),
        xDeviceCharacteristics: Some(x_device_characteristics),
        xShmMap: Some(x_shm_map),
        xShmLock: Some(x_shm_lock),
        xShmBarrier: Some(x_shm_barrier),
        xShmUnmap: Some(x_shm_unmap),
        xFetch: None,
        xUnfetch: None,
    };

    /// Registers a VFS over the default one, with `disk` as its state. Both are leaked: SQLite
    /// keeps pointers to them for the life of the process.
    pub(super) fn register(disk: &'static Disk) {
        // SAFETY: `sqlite3_vfs_find(NULL)` initialises SQLite if needed and returns the default
        // VFS, which SQLite keeps registered for the life of the process.
        let real = unsafe { sql::sqlite3_vfs_find(ptr::null()) };
        assert!(!real.is_null(), "SQLite has no default VFS");
        // SAFETY: `real` is a valid, immutable VFS (above).
        let (real_size, max_path) = unsafe { ((*real).szOsFile, (*real).mxPathname) };
        let name = CString::new(disk.name.as_str()).expect("a VFS name without NUL").into_raw();
        let vfs = Box::leak(Box::new(sql::sqlite3_vfs {
            iVersion: 2,
            szOsFile: REAL_OFFSET as c_int + real_size,
            mxPathname: max_path,
            pNext: ptr::null_mut(),
            zName: name,
            pAppData: disk as *const Disk as *mut c_void,
            xOpen: Some(x_open),
            xDelete: Some(x_delete),
            xAccess: Some(x_access),
            xFullPathname: Some(x_full_pathname),
            xDlOpen: Some(x_dl_open),
            xDlError: Some(x_dl_error),
            xDlSym: Some(x_dl_sym),
            xDlClose: Some(x_dl_close),
            xRandomness: Some(x_randomness),
            xSleep: Some(x_sleep),
            xCurrentTime: Some(x_current_time),
            xGetLastError: Some(x_get_last_error),
            xCurrentTimeInt64: Some(x_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        }));
        disk.real.store(real, Ordering::Release);
        // SAFETY: `vfs` is fully initialised and leaked, so it outlives its registration.
        let rc = unsafe { sql::sqlite3_vfs_register(vfs, 0) };
        assert_eq!(rc, sql::SQLITE_OK, "registering the VFS {}", disk.name);
    }

    /// The VFS ours wraps. SAFETY: as `disk_of`.
    unsafe fn real_of(vfs: *mut sql::sqlite3_vfs) -> *mut sql::sqlite3_vfs {
        disk_of(vfs).real.load(Ordering::Acquire)
    }

    /// SAFETY: `vfs` is one of ours (SQLite only calls our callbacks with it).
    unsafe fn disk_of(vfs: *mut sql::sqlite3_vfs) -> &'static Disk {
        &*((*vfs).pAppData as *const Disk)
    }

    /// SAFETY: `file` was opened by `x_open` (see the module comment).
    unsafe fn shim<'a>(file: *mut sql::sqlite3_file) -> &'a ShimFile {
        &*(file as *const ShimFile)
    }

    /// SAFETY: as `shim`.
    unsafe fn real_methods(file: &ShimFile) -> &sql::sqlite3_io_methods {
        &*(*file.real).pMethods
    }

    /// SAFETY: as `shim`.
    unsafe fn path_of(file: &ShimFile) -> Option<&PathBuf> {
        file.path.as_ref()
    }

    /// Forwards a call to the real file's method, or answers `missing` when it has none.
    macro_rules! forward {
        ($file:expr, $method:ident, $missing:expr $(, $arg:expr)*) => {{
            let file = $file;
            match real_methods(file).$method {
                Some(method) => method(file.real $(, $arg)*),
                None => $missing,
            }
        }};
    }

    unsafe extern "C" fn x_open(
        vfs: *mut sql::sqlite3_vfs,
        name: sql::sqlite3_filename,
        file: *mut sql::sqlite3_file,
        flags: c_int,
        out_flags: *mut c_int,
    ) -> c_int {
        let disk = disk_of(vfs);
        let real_vfs = real_of(vfs);
        // Until it succeeds, SQLite must not call our methods (nor `xClose`) on this file.
        (*file).pMethods = ptr::null();
        if real_vfs.is_null() {
            return sql::SQLITE_CANTOPEN;
        }
        let path = (!name.is_null()).then(|| PathBuf::from(OsStr::from_bytes(CStr::from_ptr(name).to_bytes())));
        let create = flags & sql::SQLITE_OPEN_CREATE != 0;
        let created = path.as_ref().is_some_and(|path| create && !path.exists());
        {
            let mut state = disk.lock();
            if state.dead || (created && !state.tick("create")) {
                return sql::SQLITE_CANTOPEN;
            }
        }
        let real = (file as *mut u8).add(REAL_OFFSET) as *mut sql::sqlite3_file;
        (*real).pMethods = ptr::null();
        let Some(open) = (*real_vfs).xOpen else { return sql::SQLITE_CANTOPEN };
        let rc = open(real_vfs, name, real, flags, out_flags);
        if rc != sql::SQLITE_OK {
            // A VFS that set its methods even though it failed expects `xClose`.
            if let Some(close) = (*real).pMethods.as_ref().and_then(|m| m.xClose) {
                close(real);
            }
            return rc;
        }
        let mut state = disk.lock();
        state.open_files += 1;
        if let Some(path) = &path {
            if created {
                state.stats.creates += 1;
                state.meta.push(super::MetaOp::Create(path.clone()));
            }
            let journal = sql::SQLITE_OPEN_WAL | sql::SQLITE_OPEN_MAIN_JOURNAL | sql::SQLITE_OPEN_SUPER_JOURNAL;
            if create && flags & journal != 0 {
                state.dirsync_pending.insert(path.clone());
            }
            if flags & sql::SQLITE_OPEN_MAIN_DB != 0 {
                state.databases.insert(path.clone());
            }
        }
        drop(state);
        let shim = file as *mut ShimFile;
        (*shim).disk = disk;
        (*shim).real = real;
        (*shim).path = path.map_or(ptr::null_mut(), |path| Box::into_raw(Box::new(path)));
        (*file).pMethods = &METHODS;
        sql::SQLITE_OK
    }

    unsafe extern "C" fn x_close(file: *mut sql::sqlite3_file) -> c_int {
        let shim = &mut *(file as *mut ShimFile);
        let rc = forward!(&*shim, xClose, sql::SQLITE_OK);
        if !shim.path.is_null() {
            drop(Box::from_raw(shim.path));
            shim.path = ptr::null_mut();
        }
        let mut state = (*shim.disk).lock();
        state.open_files = state.open_files.saturating_sub(1);
        rc
    }

    unsafe extern "C" fn x_read(file: *mut sql::sqlite3_file, buf: *mut c_void, amount: c_int, offset: i64) -> c_int {
        let file = shim(file);
        if (*file.disk).lock().dead {
            return sql::SQLITE_IOERR_READ;
        }
        forward!(file, xRead, sql::SQLITE_IOERR_READ, buf, amount, offset)
    }

    /// Reads `len` bytes at `offset` from the real file (all of them within its size).
    unsafe fn read_real(file: &ShimFile, offset: u64, len: usize) -> Result<Vec<u8>, c_int> {
        let mut bytes = vec![0u8; len];
        if len > 0 {
            let rc =
                forward!(file, xRead, sql::SQLITE_IOERR_READ, bytes.as_mut_ptr().cast(), len as c_int, offset as i64);
            if rc != sql::SQLITE_OK {
                return Err(rc);
            }
        }
        Ok(bytes)
    }

    unsafe fn real_size(file: &ShimFile) -> Result<u64, c_int> {
        let mut size: i64 = 0;
        let rc = forward!(file, xFileSize, sql::SQLITE_IOERR_FSTAT, &mut size);
        if rc == sql::SQLITE_OK {
            Ok(size.max(0) as u64)
        } else {
            Err(rc)
        }
    }

    unsafe extern "C" fn x_write(
        file: *mut sql::sqlite3_file,
        buf: *const c_void,
        amount: c_int,
        offset: i64,
    ) -> c_int {
        let file = shim(file);
        let Some(path) = path_of(file) else {
            return forward!(file, xWrite, sql::SQLITE_IOERR_WRITE, buf, amount, offset);
        };
        let mut state = (*file.disk).lock();
        if !state.tick("write") {
            return sql::SQLITE_IOERR_WRITE;
        }
        let (at, len) = (offset.max(0) as u64, amount.max(0) as usize);
        let old_len = match real_size(file) {
            Ok(size) => size,
            Err(rc) => return rc,
        };
        let pre = match read_real(file, at, old_len.saturating_sub(at).min(len as u64) as usize) {
            Ok(pre) => pre,
            Err(rc) => return rc,
        };
        let rc = forward!(file, xWrite, sql::SQLITE_IOERR_WRITE, buf, amount, offset);
        if rc == sql::SQLITE_OK {
            let data = std::slice::from_raw_parts(buf.cast::<u8>(), len).to_vec();
            state.stats.writes += 1;
            state.record(path, Op::Write { offset: at, data, pre, old_len });
        }
        rc
    }

    unsafe extern "C" fn x_truncate(file: *mut sql::sqlite3_file, size: i64) -> c_int {
        let file = shim(file);
        let Some(path) = path_of(file) else { return forward!(file, xTruncate, sql::SQLITE_IOERR_TRUNCATE, size) };
        let mut state = (*file.disk).lock();
        if !state.tick("truncate") {
            return sql::SQLITE_IOERR_TRUNCATE;
        }
        let len = size.max(0) as u64;
        let old_len = match real_size(file) {
            Ok(size) => size,
            Err(rc) => return rc,
        };
        let tail = match read_real(file, len, old_len.saturating_sub(len) as usize) {
            Ok(tail) => tail,
            Err(rc) => return rc,
        };
        let rc = forward!(file, xTruncate, sql::SQLITE_IOERR_TRUNCATE, size);
        if rc == sql::SQLITE_OK {
            state.stats.truncates += 1;
            state.record(path, Op::Truncate { len, old_len, tail });
        }
        rc
    }

    unsafe extern "C" fn x_sync(file: *mut sql::sqlite3_file, flags: c_int) -> c_int {
        let file = shim(file);
        let Some(path) = path_of(file) else { return forward!(file, xSync, sql::SQLITE_IOERR_FSYNC, flags) };
        let mut state = (*file.disk).lock();
        if !state.tick("sync") {
            return sql::SQLITE_IOERR_FSYNC;
        }
        let rc = forward!(file, xSync, sql::SQLITE_IOERR_FSYNC, flags);
        if rc == sql::SQLITE_OK {
            state.synced(path);
        }
        rc
    }

    unsafe extern "C" fn x_file_size(file: *mut sql::sqlite3_file, size: *mut i64) -> c_int {
        let file = shim(file);
        if (*file.disk).lock().dead {
            return sql::SQLITE_IOERR_FSTAT;
        }
        forward!(file, xFileSize, sql::SQLITE_IOERR_FSTAT, size)
    }

    // Locks and shared memory are the process's, not the disk's: they go straight through (a
    // dead machine's process still releases its locks as it exits).
    unsafe extern "C" fn x_lock(file: *mut sql::sqlite3_file, level: c_int) -> c_int {
        forward!(shim(file), xLock, sql::SQLITE_IOERR_LOCK, level)
    }

    unsafe extern "C" fn x_unlock(file: *mut sql::sqlite3_file, level: c_int) -> c_int {
        forward!(shim(file), xUnlock, sql::SQLITE_IOERR_UNLOCK, level)
    }

    unsafe extern "C" fn x_check_reserved_lock(file: *mut sql::sqlite3_file, out: *mut c_int) -> c_int {
        forward!(shim(file), xCheckReservedLock, sql::SQLITE_IOERR_CHECKRESERVEDLOCK, out)
    }

    unsafe extern "C" fn x_file_control(file: *mut sql::sqlite3_file, op: c_int, arg: *mut c_void) -> c_int {
        forward!(shim(file), xFileControl, sql::SQLITE_NOTFOUND, op, arg)
    }

    unsafe extern "C" fn x_sector_size(file: *mut sql::sqlite3_file) -> c_int {
        forward!(shim(file), xSectorSize, 4096)
    }

    unsafe extern "C" fn x_device_characteristics(file: *mut sql::sqlite3_file) -> c_int {
        forward!(shim(file), xDeviceCharacteristics, 0)
    }

    unsafe extern "C" fn x_shm_map(
        file: *mut sql::sqlite3_file,
        page: c_int,
        page_size: c_int,
        extend: c_int,
        out: *mut *mut c_void,
    ) -> c_int {
        forward!(shim(file), xShmMap, sql::SQLITE_IOERR_SHMMAP, page, page_size, extend, out)
    }

    unsafe extern "C" fn x_shm_lock(file: *mut sql::sqlite3_file, offset: c_int, n: c_int, flags: c_int) -> c_int {
        forward!(shim(file), xShmLock, sql::SQLITE_IOERR_SHMLOCK, offset, n, flags)
    }

    unsafe extern "C" fn x_shm_barrier(file: *mut sql::sqlite3_file) {
        let file = shim(file);
        if let Some(barrier) = real_methods(file).xShmBarrier {
            barrier(file.real);
        }
    }

    unsafe extern "C" fn x_shm_unmap(file: *mut sql::sqlite3_file, delete: c_int) -> c_int {
        let file = shim(file);
        // A dead machine deletes nothing.
        let delete = if (*file.disk).lock().dead { 0 } else { delete };
        forward!(file, xShmUnmap, sql::SQLITE_OK, delete)
    }

    unsafe extern "C" fn x_delete(vfs: *mut sql::sqlite3_vfs, name: *const c_char, sync_dir: c_int) -> c_int {
        let disk = disk_of(vfs);
        let real_vfs = real_of(vfs);
        let path = PathBuf::from(OsStr::from_bytes(CStr::from_ptr(name).to_bytes()));
        let mut state = disk.lock();
        if real_vfs.is_null() || !state.tick("delete") {
            return sql::SQLITE_IOERR_DELETE;
        }
        let existed = path.exists();
        let synced = state.synced_content(&path);
        let Some(delete) = (*real_vfs).xDelete else { return sql::SQLITE_IOERR_DELETE };
        let rc = delete(real_vfs, name, sync_dir);
        if rc == sql::SQLITE_OK && existed {
            state.stats.deletes += 1;
            state.unsynced.remove(&path);
            state.dirsync_pending.remove(&path);
            state.meta.push(super::MetaOp::Delete { path, synced });
            if sync_dir != 0 {
                state.stats.dir_syncs += 1;
                state.meta.clear();
            }
        }
        rc
    }

    unsafe extern "C" fn x_access(
        vfs: *mut sql::sqlite3_vfs,
        name: *const c_char,
        flags: c_int,
        out: *mut c_int,
    ) -> c_int {
        let real = real_of(vfs);
        if real.is_null() || disk_of(vfs).lock().dead {
            return sql::SQLITE_IOERR_ACCESS;
        }
        match (*real).xAccess {
            Some(access) => access(real, name, flags, out),
            None => sql::SQLITE_IOERR_ACCESS,
        }
    }

    unsafe extern "C" fn x_full_pathname(
        vfs: *mut sql::sqlite3_vfs,
        name: *const c_char,
        n: c_int,
        out: *mut c_char,
    ) -> c_int {
        let real = real_of(vfs);
        match real.as_ref().and_then(|r| r.xFullPathname) {
            Some(full) => full(real, name, n, out),
            None => sql::SQLITE_CANTOPEN,
        }
    }

    // The rest is the real VFS's, called with the real VFS.
    unsafe extern "C" fn x_dl_open(vfs: *mut sql::sqlite3_vfs, name: *const c_char) -> *mut c_void {
        let real = real_of(vfs);
        match real.as_ref().and_then(|r| r.xDlOpen) {
            Some(f) => f(real, name),
            None => ptr::null_mut(),
        }
    }

    unsafe extern "C" fn x_dl_error(vfs: *mut sql::sqlite3_vfs, n: c_int, out: *mut c_char) {
        let real = real_of(vfs);
        if let Some(f) = real.as_ref().and_then(|r| r.xDlError) {
            f(real, n, out);
        }
    }

    type DlSym = Option<unsafe extern "C" fn(*mut sql::sqlite3_vfs, *mut c_void, *const c_char)>;

    unsafe extern "C" fn x_dl_sym(vfs: *mut sql::sqlite3_vfs, handle: *mut c_void, symbol: *const c_char) -> DlSym {
        let real = real_of(vfs);
        match real.as_ref().and_then(|r| r.xDlSym) {
            Some(f) => f(real, handle, symbol),
            None => None,
        }
    }

    unsafe extern "C" fn x_dl_close(vfs: *mut sql::sqlite3_vfs, handle: *mut c_void) {
        let real = real_of(vfs);
        if let Some(f) = real.as_ref().and_then(|r| r.xDlClose) {
            f(real, handle);
        }
    }

    unsafe extern "C" fn x_randomness(vfs: *mut sql::sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
        let real = real_of(vfs);
        match real.as_ref().and_then(|r| r.xRandomness) {
            Some(f) => f(real, n, out),
            None => 0,
        }
    }

    unsafe extern "C" fn x_sleep(vfs: *mut sql::sqlite3_vfs, micros: c_int) -> c_int {
        let real = real_of(vfs);
        match real.as_ref().and_then(|r| r.xSleep) {
            Some(f) => f(real, micros),
            None => 0,
        }
    }

    unsafe extern "C" fn x_current_time(vfs: *mut sql::sqlite3_vfs, out: *mut f64) -> c_int {
        let real = real_of(vfs);
        match real.as_ref().and_then(|r| r.xCurrentTime) {
            Some(f) => f(real, out),
            None => sql::SQLITE_ERROR,
        }
    }

    unsafe extern "C" fn x_get_last_error(vfs: *mut sql::sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
        let real = real_of(vfs);
        match real.as_ref().and_then(|r| r.xGetLastError) {
            Some(f) => f(real, n, out),
            None => 0,
        }
    }

    unsafe extern "C" fn x_current_time_int64(vfs: *mut sql::sqlite3_vfs, out: *mut i64) -> c_int {
        let real = real_of(vfs);
        match real.as_ref().and_then(|r| r.xCurrentTimeInt64) {
            Some(f) => f(real, out),
            None => sql::SQLITE_ERROR,
        }
    }
}
