//! Where the bench database lives: by default a fresh directory under the
//! system temp directory, removed when the bench ends (even on an error or
//! Ctrl-C); with `--db`, a new file that is kept. An existing file is never
//! written to: a bench on someone's data would measure, and change, the
//! wrong thing.

use std::path::{Path, PathBuf};

use crate::cli::exit::CliError;

pub(super) struct Location {
    /// Empty for an in-memory database.
    db: PathBuf,
    /// The temp directory (removed when dropped), when the database is not
    /// kept.
    temp_dir: Option<tempfile::TempDir>,
    in_memory: bool,
}

impl Location {
    /// A new database file in a new directory under `std::env::temp_dir()`.
    /// Owner-only (`tempfile` makes it 0700).
    pub(super) fn temp() -> Result<Self, CliError> {
        let dir = tempfile::Builder::new()
            .prefix("turnstile-bench-")
            .tempdir()
            .map_err(CliError::io("create the bench's temp directory"))?;
        Ok(Self {
            db: dir.path().join("bench.db"),
            temp_dir: Some(dir),
            in_memory: false,
        })
    }

    /// No file: the workload runs on `SqliteStore::in_memory()`.
    pub(super) fn memory() -> Self {
        Self {
            db: PathBuf::new(),
            temp_dir: None,
            in_memory: true,
        }
    }

    pub(super) fn in_memory(&self) -> bool {
        self.in_memory
    }

    /// `path`, which must not exist yet (nor its `-wal` or `-shm` files,
    /// whose pages SQLite would take as part of the new database). The
    /// file is created here, atomically, so nothing can slip in between the
    /// check and the bench; owner-only, like the store creates its files.
    pub(super) fn new_file(path: PathBuf) -> Result<Self, CliError> {
        for suffix in ["-wal", "-shm"] {
            let mut side = path.as_os_str().to_owned();
            side.push(suffix);
            refuse_existing(Path::new(&side))?;
        }
        let mut open = std::fs::OpenOptions::new();
        open.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
        match open.open(&path) {
            Ok(_) => Ok(Self {
                db: path,
                temp_dir: None,
                in_memory: false,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(exists(&path)),
            Err(e) => Err(CliError::io(format!("create {}", path.display()))(e)),
        }
    }

    pub(super) fn db(&self) -> &Path {
        &self.db
    }

    /// The database file stays after the bench (`--db`).
    pub(super) fn kept(&self) -> bool {
        self.temp_dir.is_none() && !self.in_memory
    }
}

impl Drop for Location {
    fn drop(&mut self) {
        if let Some(dir) = self.temp_dir.take() {
            let path = dir.path().to_owned();
            if let Err(e) = dir.close() {
                tracing::warn!(dir = %path.display(), error = %e, "could not remove the bench directory");
            }
        }
    }
}

fn refuse_existing(path: &Path) -> Result<(), CliError> {
    // `symlink_metadata`: a dangling symlink exists too.
    match std::fs::symlink_metadata(path) {
        Ok(_) => Err(exists(path)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(CliError::io(format!("check {}", path.display()))(e)),
    }
}

fn exists(path: &Path) -> CliError {
    CliError::Usage(format!(
        "{} already exists: the bench writes only to a new database file",
        path.display()
    ))
}
