//! Python venvs the tests run real servers from, installed from PyPI into
//! the target directory on first use (`python/install_venv.py`, once, under
//! a lock), or given by an environment variable.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The venv `name` in the target directory the calling test was built into
/// (so `CARGO_TARGET_DIR` is honoured), holding the packages of
/// `requirements` (a path under this crate), or the venv the environment
/// variable `env_var` names, as it is.
///
/// Checked or installed once per test process: later calls answer from
/// memory.
pub fn venv(name: &str, requirements: &str, env_var: &str) -> PathBuf {
    if let Some(venv) = std::env::var_os(env_var) {
        return PathBuf::from(venv);
    }
    static READY: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    // Held while installing, so two tests of one process wait for one
    // install instead of both taking the file lock in turn.
    let mut ready = READY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(venv) = ready.get(name) {
        return venv.clone();
    }
    let venv = install(name, requirements, env_var);
    ready.insert(name.to_owned(), venv.clone());
    venv
}

/// Installs (or finds installed) the venv `name` in the target directory.
fn install(name: &str, requirements: &str, env_var: &str) -> PathBuf {
    // A test runs from `<target>/<profile>/deps/`.
    let exe = std::env::current_exe().unwrap();
    let target = exe
        .ancestors()
        .nth(3)
        .expect("a test binary lives in <target>/<profile>/deps");
    let venv = target.join(name);
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let installer = here.join("python/install_venv.py");
    let installed = Command::new("python3")
        .arg(&installer)
        .arg(&venv)
        .arg(here.join(requirements))
        .status()
        .unwrap_or_else(|e| panic!("python3 (for {}): {e}", installer.display()));
    assert!(
        installed.success(),
        "installing {requirements} into {} failed (python3 with venv and pip, and PyPI, are \
         needed; or set {env_var} to a venv that has them)",
        venv.display()
    );
    venv
}
