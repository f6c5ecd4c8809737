//! Against real PostgreSQL servers: the shared one, and clusters of the tests' own.

use std::io::{BufRead, BufReader};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use turnstile_test_postgres::Server;

/// Whether `psql` can run `SELECT 1` against `url` (without panicking).
fn reachable(url: &str) -> bool {
    Command::new("psql")
        .args(["-X", "-At", "-d", url, "-c", "SELECT 1"])
        .env("PGCONNECT_TIMEOUT", "2")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Polls `done` every 50 ms until it holds or `timeout` passes.
fn eventually(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether process `pid` runs (a zombie, exited but not yet reaped, does not).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // "pid (comm) S ...": the state follows the last ')'.
        stat.rsplit(')')
            .next()
            .and_then(|rest| rest.trim_start().chars().next())
            != Some('Z')
    })
}

fn database_of(url: &str) -> &str {
    url.rsplit('/').next().expect("a path")
}

#[test]
fn shared_is_one_server() {
    let first = Server::shared();
    let second = Server::shared();
    assert_eq!(first.url(), second.url());
    assert!(std::ptr::eq(first, second));
    assert_eq!(first.psql("postgres", "SELECT 1 + 1"), "2");
    let from_threads: Vec<String> = (0..4)
        .map(|_| std::thread::spawn(|| Server::shared().url()))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|thread| thread.join().expect("no panic"))
        .collect();
    assert!(from_threads.iter().all(|url| *url == first.url()));
}

#[test]
fn the_shared_throwaway_server_is_fast_and_loopback_only() {
    let server = Server::shared();
    if std::env::var("TURNSTILE_TEST_POSTGRES_URL").is_ok_and(|url| !url.trim().is_empty()) {
        return; // someone else's server: its settings are its own
    }
    let settings = server.psql(
        "postgres",
        "SELECT current_setting('listen_addresses'), current_setting('fsync'), \
         current_setting('full_page_writes'), current_setting('max_connections'), \
         current_setting('server_version_num')::int / 10000, current_user, \
         pg_encoding_to_char(encoding) FROM pg_database WHERE datname = 'postgres'",
    );
    assert_eq!(settings, "127.0.0.1|off|off|300|15|turnstile|UTF8");
    assert!(server.url().starts_with("postgres://turnstile@127.0.0.1:"));
}

#[test]
fn fresh_databases_are_distinct_and_usable() {
    let server = Server::shared();
    let (first_name, first_url) = server.fresh_database_named();
    let second_url = server.fresh_database();
    let second_name = database_of(&second_url);
    assert_ne!(first_name, second_name);
    assert_eq!(database_of(&first_url), first_name);
    let prefix = format!("turnstile_test_{}_", std::process::id());
    assert!(first_name.starts_with(&prefix), "{first_name}");
    assert!(second_name.starts_with(&prefix), "{second_name}");

    // Each is empty, and what one holds the other does not.
    for name in [first_name.as_str(), second_name] {
        let tables = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'";
        assert_eq!(server.psql(name, tables), "0");
    }
    server.psql(&first_name, "CREATE TABLE t (x int)");
    server.psql(&first_name, "INSERT INTO t VALUES (1), (2)");
    assert_eq!(server.psql(&first_name, "SELECT count(*) FROM t"), "2");
    let missing = catch_unwind(AssertUnwindSafe(|| {
        server.psql(second_name, "SELECT count(*) FROM t")
    }));
    assert!(missing.is_err(), "table t leaked into {second_name}");

    // The URL it returned is one a client can use as is.
    assert!(reachable(&first_url), "{first_url}");
    assert_eq!(
        server.psql(&first_name, "SELECT current_database()"),
        first_name
    );
}

#[test]
fn an_own_cluster_survives_a_crash() {
    let server = Server::start_own();
    assert_ne!(server.url(), Server::shared().url());
    assert_eq!(server.psql("postgres", "SHOW fsync"), "on");
    server.psql("postgres", "CREATE TABLE kept (x int)");
    server.psql("postgres", "INSERT INTO kept VALUES (42)");

    server.stop_immediate();
    assert!(!reachable(&server.url()), "still up after stop_immediate");
    let down = catch_unwind(AssertUnwindSafe(|| server.psql("postgres", "SELECT 1")));
    assert!(down.is_err(), "psql succeeded against a stopped server");

    server.restart();
    assert!(reachable(&server.url()));
    assert_eq!(server.psql("postgres", "SELECT x FROM kept"), "42");
}

#[test]
fn dropping_an_own_cluster_stops_it_and_removes_its_directory() {
    let server = Server::start_own();
    let url = server.url();
    let data = server.psql("postgres", "SHOW data_directory");
    assert!(Path::new(&data).is_dir(), "{data}");
    drop(server);
    assert!(!reachable(&url), "still up after drop");
    let dir = Path::new(&data).parent().expect("the cluster dir");
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
#[should_panic(expected = "Server::stop_immediate is for a cluster of the test's own")]
fn the_shared_server_cannot_be_stopped() {
    Server::shared().stop_immediate();
}

#[test]
fn terminate_backends_ends_a_live_query() {
    let server = Server::shared();
    let (name, url) = server.fresh_database_named();
    let mut sleeper: Child = Command::new("psql")
        .args(["-X", "-At", "-d", &url, "-c", "SELECT pg_sleep(30)"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn psql");
    let active = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = '{name}' AND query LIKE '%pg_sleep%' AND state = 'active'"
    );
    assert!(
        eventually(Duration::from_secs(10), || server.psql("postgres", &active)
            == "1"),
        "the sleeping query never showed up"
    );

    let started = Instant::now();
    let terminated = server.terminate_backends(&name);
    assert!(terminated >= 1, "terminated {terminated}");
    let mut status = None;
    assert!(
        eventually(Duration::from_secs(5), || {
            status = sleeper.try_wait().expect("try_wait");
            status.is_some()
        }),
        "psql still running after terminate_backends"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!status.expect("exited").success(), "psql should fail");
    assert_eq!(server.psql("postgres", &active), "0");
    // Nothing else is connected now, and the caller's own connection is spared.
    assert_eq!(server.terminate_backends(&name), 0);
    assert_eq!(server.terminate_backends("postgres"), 0);
}

/// Run by [`a_killed_test_process_leaves_no_server_behind`] in a child process
/// (a no-op otherwise): starts the shared and an own cluster, reports where, then
/// waits to be killed.
#[test]
fn killed_child_process() {
    if std::env::var_os("TURNSTILE_TEST_POSTGRES_KILLED_CHILD").is_none() {
        return;
    }
    let own = Server::start_own();
    for server in [Server::shared(), &own] {
        let data = server.psql("postgres", "SHOW data_directory");
        let pid_file = std::fs::read_to_string(Path::new(&data).join("postmaster.pid"))
            .expect("postmaster.pid");
        let pid = pid_file.lines().next().expect("the postmaster's pid");
        println!("CLUSTER {} {data} {pid}", server.url());
    }
    println!("READY");
    std::thread::sleep(Duration::from_secs(60));
}

/// A child process, killed when dropped (a failing test must not leave it running).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_killed_test_process_leaves_no_server_behind() {
    let child = Command::new(std::env::current_exe().expect("current exe"))
        .args([
            "--exact",
            "killed_child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TURNSTILE_TEST_POSTGRES_KILLED_CHILD", "1")
        .env_remove("TURNSTILE_TEST_POSTGRES_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child test process");
    let mut child = KillOnDrop(child);
    let mut clusters = Vec::new();
    for line in BufReader::new(child.0.stdout.take().expect("stdout")).lines() {
        let line = line.expect("child stdout");
        // libtest's "test killed_child_process ... " may precede the first line.
        if let Some((_, rest)) = line.split_once("CLUSTER ") {
            let fields: Vec<String> = rest.split(' ').map(str::to_owned).collect();
            clusters.push(fields);
        }
        if line.ends_with("READY") {
            break;
        }
    }
    assert_eq!(clusters.len(), 2, "the child did not report its clusters");
    for cluster in &clusters {
        assert!(reachable(&cluster[0]), "{cluster:?} not up in the child");
    }
    child.0.kill().expect("SIGKILL the child");
    child.0.wait().expect("reap the child");

    for cluster in &clusters {
        let (url, data, pid) = (&cluster[0], &cluster[1], &cluster[2]);
        let dir = Path::new(data)
            .parent()
            .expect("the cluster dir")
            .to_owned();
        let gone = eventually(Duration::from_secs(15), || !dir.exists() && !alive(pid));
        assert!(
            gone,
            "{} (postmaster {pid}) outlived its process",
            dir.display()
        );
        assert!(!reachable(url), "{url} still answers");
    }
}
