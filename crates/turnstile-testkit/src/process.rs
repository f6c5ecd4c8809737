//! Worker processes: the calling test binary, re-run to execute one ignored
//! test (the worker's body), and signals to it.
//!
//! A worker is named by its full libtest name, which depends on where the
//! test file sits: `torture_worker` in a binary of its own,
//! `crash_torture::torture_worker` as a module of a crate's one test binary.
//! [`worker_test!`](crate::worker_test) derives it from the calling module,
//! so a test file can move without its workers silently running nothing.

use std::process::{Child, Command};

/// The libtest name of the test `test` in the module `module_path` (as
/// `module_path!()` spells it there): the path without its crate, as
/// `--exact` wants it.
pub fn test_name(module_path: &str, test: &str) -> String {
    match module_path.split_once("::") {
        Some((_crate, module)) => format!("{module}::{test}"),
        None => test.to_owned(),
    }
}

/// The exact libtest name of the test function `$test` of the calling
/// module (a compile error if there is none).
#[macro_export]
macro_rules! worker_test {
    ($test:ident) => {{
        let _ = $test;
        $crate::process::test_name(module_path!(), stringify!($test))
    }};
}

/// This test binary, set to run only the ignored test `test` (a name from
/// [`worker_test!`](crate::worker_test)), one thread, its output not
/// captured. The caller adds the environment and the pipes.
pub fn worker(test: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command.args([
        "--ignored",
        "--exact",
        test,
        "--nocapture",
        "--test-threads=1",
    ]);
    command
}

/// Sends `signal` (as `kill` takes it: `-STOP`, `-CONT`, …) to `child`.
pub fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} failed");
}
