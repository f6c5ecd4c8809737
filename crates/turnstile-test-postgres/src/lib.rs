//! Test support: a real PostgreSQL 15 server for tests, started from the
//! Debian package's binaries (`/usr/lib/postgresql/15/bin`) into a fresh
//! temp dir, on loopback only. Nothing is downloaded.
//!
//! ```no_run
//! use turnstile_test_postgres::Server;
//!
//! let url = Server::shared().fresh_database(); // an empty database of this test's own
//! // ... connect to `url` ...
//! ```
//!
//! [`Server::shared`] is one server per test process (or the one named by
//! `TURNSTILE_TEST_POSTGRES_URL`); [`Server::start_own`] is a cluster a test
//! may stop, crash and restart. A throwaway cluster never outlives the test
//! process: a detached watchdog stops it and removes its directory once the
//! process is gone, however it ended.
//!
//! PostgreSQL refuses to run as root: when the tests run as root, the server
//! binaries run as the user `postgres` (via `runuser`), which owns every
//! directory the server uses. Clients (`psql`) run as the calling user and
//! connect over TCP to 127.0.0.1.

use std::fs;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Where the Debian package `postgresql-15` installs the server binaries.
const BIN_DIR: &str = "/usr/lib/postgresql/15/bin";
/// A server to use instead of a throwaway one (used as is, never stopped).
const URL_ENV: &str = "TURNSTILE_TEST_POSTGRES_URL";
/// The superuser `initdb` creates (trust authentication, no password).
const SUPERUSER: &str = "turnstile";
/// Start attempts, each on a new free port, before giving up.
const START_ATTEMPTS: usize = 5;
/// Lines of the server log quoted when the server fails to start.
const LOG_TAIL_LINES: usize = 30;

/// A PostgreSQL server for tests.
#[derive(Debug)]
pub struct Server {
    url: String,
    /// The throwaway cluster behind `url`; `None` for the env URL's server.
    cluster: Option<Cluster>,
    /// The process-wide one, which tests must not stop.
    shared: bool,
}

impl Server {
    /// The process-wide shared server: the URL in env `TURNSTILE_TEST_POSTGRES_URL`
    /// when set and not empty (used as is, never stopped), else a throwaway cluster
    /// started on first use (`initdb --no-sync --auth=trust -U turnstile` into a fresh
    /// temp dir, `pg_ctl start -w` on 127.0.0.1 and a free port, its unix socket in the
    /// cluster's own dir; for speed it runs with `fsync=off`, `full_page_writes=off`,
    /// and allows 300 connections).
    ///
    /// Thread-safe and synchronous: safe to call from many `#[tokio::test]`s that each
    /// have their own runtime. Tests share it, so each should work in a
    /// [`fresh_database`](Self::fresh_database) of its own.
    ///
    /// # Panics
    ///
    /// If the PostgreSQL 15 binaries are missing (one line naming the package to
    /// install), or if the server fails to start (with its log's tail).
    pub fn shared() -> &'static Server {
        static SHARED: OnceLock<Server> = OnceLock::new();
        SHARED.get_or_init(|| match std::env::var(URL_ENV) {
            Ok(url) if !url.trim().is_empty() => Server {
                url: url.trim().to_owned(),
                cluster: None,
                shared: true,
            },
            _ => Server::from_cluster(Cluster::start_new(Profile::Shared), true),
        })
    }

    /// A cluster of this test's own (default durability settings: `fsync` on), for
    /// tests that stop, kill or restart the server. Always a throwaway cluster, even
    /// when `TURNSTILE_TEST_POSTGRES_URL` is set. Dropping it stops it
    /// (`-m immediate`) and removes its directory.
    ///
    /// # Panics
    ///
    /// Like [`shared`](Self::shared), if the binaries are missing or the server fails
    /// to start.
    pub fn start_own() -> Server {
        Server::from_cluster(Cluster::start_new(Profile::Own), false)
    }

    fn from_cluster(cluster: Cluster, shared: bool) -> Server {
        Server {
            url: format!("postgres://{SUPERUSER}@127.0.0.1:{}/postgres", cluster.port),
            cluster: Some(cluster),
            shared,
        }
    }

    /// `postgres://turnstile@127.0.0.1:PORT/postgres` (or the env URL as is).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Creates a new empty database with a unique name (`turnstile_test_<pid>_<counter>`)
    /// and returns its URL. Uses psql.
    pub fn fresh_database(&self) -> String {
        self.fresh_database_named().1
    }

    /// Same as [`fresh_database`](Self::fresh_database), but returns `(name, url)`.
    pub fn fresh_database_named(&self) -> (String, String) {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        loop {
            let name = format!(
                "turnstile_test_{pid}_{}",
                COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            let sql = format!("CREATE DATABASE {}", quote_identifier(&name));
            match run_psql(&self.url, &sql) {
                Ok(_) => {
                    let url = url_with_database(&self.url, &name);
                    return (name, url);
                }
                // A long-lived env server may keep one of an earlier process of
                // the same pid: take the next name.
                Err(error) if error.contains("already exists") => continue,
                Err(error) => panic!("creating database {name} on {}: {error}", self.url),
            }
        }
    }

    /// Own clusters only (panics on the shared or env one): stops the server now, like a
    /// crash (`pg_ctl stop -m immediate`). Connections fail until [`restart`](Self::restart).
    pub fn stop_immediate(&self) {
        let cluster = self.own_cluster("stop_immediate");
        if let Err(error) = cluster.stop_immediate() {
            panic!("stopping the PostgreSQL server at {}: {error}", self.url);
        }
    }

    /// Own clusters only (panics on the shared or env one): starts the server again on
    /// the same port and directory, returning once it accepts connections (after crash
    /// recovery, following [`stop_immediate`](Self::stop_immediate)).
    pub fn restart(&self) {
        let cluster = self.own_cluster("restart");
        if let Err(error) = cluster.pg_ctl_start() {
            panic!(
                "restarting the PostgreSQL server at {}: {error}\n{}",
                self.url,
                cluster.log_report(&cluster.log())
            );
        }
    }

    /// Terminates every client backend connected to database `database` except the
    /// caller's (`pg_terminate_backend` over `pg_stat_activity`, waiting up to 5 s for
    /// each to exit) and returns how many were terminated. Background workers
    /// (autovacuum) are left alone.
    pub fn terminate_backends(&self, database: &str) -> u64 {
        let sql = format!(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) \
             FROM pg_stat_activity \
             WHERE datname = {} AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
            quote_literal(database)
        );
        let out = self.psql_admin(&sql);
        out.parse()
            .unwrap_or_else(|_| panic!("terminate_backends: unexpected psql output {out:?}"))
    }

    /// Runs one SQL statement with psql (`psql -X -q -At -v ON_ERROR_STOP=1`) against
    /// database `database` of this server and returns its stdout trimmed: rows one a
    /// line, columns separated by `|`, no command tags. For test assertions.
    ///
    /// # Panics
    ///
    /// If psql fails (the statement fails, or the server is down), with psql's stderr.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let url = url_with_database(&self.url, database);
        run_psql(&url, sql).unwrap_or_else(|error| panic!("psql on {url}: {sql}: {error}"))
    }

    /// The schema of database `database` as `pg_dump --schema-only` writes it
    /// (no owners, no privileges, sqlx's migration table left out), with
    /// the lines that name the server's or pg_dump's version and pg_dump's
    /// per-dump random key removed, so that two dumps of the same schema
    /// compare equal.
    ///
    /// # Panics
    ///
    /// If pg_dump fails, with its stderr.
    pub fn schema_dump(&self, database: &str) -> String {
        let url = url_with_database(&self.url, database);
        let bundled = Path::new(BIN_DIR).join("pg_dump");
        let program = if bundled.is_file() {
            bundled
        } else {
            PathBuf::from("pg_dump")
        };
        let output = Command::new(&program)
            .args([
                "--schema-only",
                "--no-owner",
                "--no-privileges",
                "--exclude-table=_sqlx_migrations",
                "-d",
                &url,
            ])
            .env("PGCONNECT_TIMEOUT", "10")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|error| panic!("running {}: {error}", program.display()));
        assert!(
            output.status.success(),
            "pg_dump of {url} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            // pg_dump's version, and the random key of its `\restrict`
            // guard (new in each dump).
            .filter(|line| {
                !line.starts_with("-- Dumped ")
                    && !line.starts_with("\\restrict ")
                    && !line.starts_with("\\unrestrict ")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `psql` against the server's own database (`postgres`, or the env URL's).
    fn psql_admin(&self, sql: &str) -> String {
        run_psql(&self.url, sql)
            .unwrap_or_else(|error| panic!("psql on {}: {sql}: {error}", self.url))
    }

    fn own_cluster(&self, what: &str) -> &Cluster {
        match &self.cluster {
            Some(cluster) if !self.shared => cluster,
            _ => panic!(
                "Server::{what} is for a cluster of the test's own (Server::start_own), \
                 not the shared server"
            ),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only own clusters are ever dropped: the shared one lives in a static,
        // and its watchdog removes it when the process exits.
        if let Some(cluster) = &self.cluster {
            let _ = cluster.stop_immediate();
            let _ = fs::remove_dir_all(&cluster.dir);
        }
    }
}

/// The settings a cluster runs with beyond its port and addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profile {
    /// Fast and not crash-safe: fine, since nothing outlives the process.
    Shared,
    /// PostgreSQL's defaults: crash-safe, for tests that crash the server.
    Own,
}

/// The user the server runs as when the tests run as root.
#[derive(Clone, Copy, Debug)]
struct Owner {
    uid: u32,
    gid: u32,
}

/// A throwaway cluster: `dir` holds `data/` (PGDATA), `server.log`, and the unix socket.
#[derive(Debug)]
struct Cluster {
    dir: PathBuf,
    port: u16,
    owner: Option<Owner>,
}

impl Cluster {
    /// Creates, starts and guards (watchdog) a new cluster.
    fn start_new(profile: Profile) -> Cluster {
        let bin = bin_dir();
        let owner = server_owner();
        let dir = create_cluster_dir(owner);
        spawn_watchdog(&dir, owner, bin);
        let mut cluster = Cluster {
            dir,
            port: 0,
            owner,
        };
        cluster.initdb();
        let mut error = String::new();
        for _ in 0..START_ATTEMPTS {
            cluster.port = free_port();
            cluster.write_settings(profile);
            match cluster.pg_ctl_start() {
                Ok(()) => return cluster,
                Err(failure) => error = failure,
            }
        }
        cluster.fail(&format!(
            "the PostgreSQL server did not start ({START_ATTEMPTS} attempts on free ports): {error}"
        ))
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// A server binary, run as `postgres` when we are root.
    fn command(&self, program: &str) -> Command {
        let path = bin_dir().join(program);
        let mut command = match self.owner {
            Some(_) => {
                let mut command = Command::new("runuser");
                command.args(["-u", "postgres", "--"]).arg(path);
                command
            }
            None => Command::new(path),
        };
        command.current_dir(&self.dir).stdin(Stdio::null());
        command
    }

    fn initdb(&self) {
        let mut command = self.command("initdb");
        command
            .args(["--no-sync", "--auth=trust", "-U", SUPERUSER])
            .args(["--encoding=UTF8", "--locale=C", "--no-instructions"])
            .arg("-D")
            .arg(self.data());
        if let Err(error) = run(&mut command) {
            self.fail(&format!("initdb failed: {error}"));
        }
        // Our settings, rewritten before each start attempt, override the defaults.
        let conf = self.data().join("postgresql.conf");
        let appended = fs::read_to_string(&conf).and_then(|text| {
            fs::write(
                &conf,
                format!("{text}\n# turnstile-test-postgres\ninclude = 'turnstile.conf'\n"),
            )
        });
        if let Err(error) = appended {
            self.fail(&format!("appending to {}: {error}", conf.display()));
        }
    }

    fn write_settings(&self, profile: Profile) {
        let mut settings = format!(
            "listen_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = {}\n",
            self.port,
            quote_literal(&self.dir.to_string_lossy())
        );
        if profile == Profile::Shared {
            settings.push_str("fsync = off\nfull_page_writes = off\nmax_connections = 300\n");
        }
        let path = self.data().join("turnstile.conf");
        let written = fs::write(&path, settings).and_then(|()| chown(&path, self.owner));
        if let Err(error) = written {
            self.fail(&format!("writing {}: {error}", path.display()));
        }
    }

    /// `pg_ctl start -w`: returns once the server accepts connections.
    fn pg_ctl_start(&self) -> Result<(), String> {
        let mut command = self.command("pg_ctl");
        command
            .args(["start", "-w", "-t", "60", "-s", "-D"])
            .arg(self.data())
            .arg("-l")
            .arg(self.log());
        run(&mut command).map(drop)
    }

    fn stop_immediate(&self) -> Result<(), String> {
        let mut command = self.command("pg_ctl");
        command
            .args(["stop", "-w", "-s", "-m", "immediate", "-D"])
            .arg(self.data());
        run(&mut command).map(drop)
    }

    /// Panics with `message` and the server log's tail, after removing the cluster
    /// (a copy of the log is kept next to where it was).
    fn fail(&self, message: &str) -> ! {
        let _ = self.stop_immediate();
        let kept = PathBuf::from(format!("{}-server.log", self.dir.display()));
        let report = match fs::copy(self.log(), &kept) {
            Ok(_) => self.log_report(&kept),
            Err(_) => format!("(no server log: {} does not exist)", self.log().display()),
        };
        let _ = fs::remove_dir_all(&self.dir);
        panic!("{message}\n{report}");
    }

    fn log_report(&self, log: &Path) -> String {
        let text = fs::read(log)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        format!("server log {}, its end:\n{tail}", log.display())
    }
}

/// The server binaries' directory, checked once.
fn bin_dir() -> &'static Path {
    static CHECKED: OnceLock<()> = OnceLock::new();
    CHECKED.get_or_init(|| {
        for program in ["initdb", "pg_ctl", "postgres"] {
            let path = Path::new(BIN_DIR).join(program);
            if !path.is_file() {
                panic!(
                    "PostgreSQL 15 server not found ({}): install the Debian package \
                     postgresql-15, or set {URL_ENV}",
                    path.display()
                );
            }
        }
    });
    Path::new(BIN_DIR)
}

/// `Some(postgres)` when we run as root (the server refuses to), else `None`.
fn server_owner() -> Option<Owner> {
    static OWNER: OnceLock<Option<Owner>> = OnceLock::new();
    *OWNER.get_or_init(|| {
        let id = |args: &[&str]| -> Option<u32> {
            let output = Command::new("id").args(args).output().ok()?;
            if !output.status.success() {
                return None;
            }
            String::from_utf8_lossy(&output.stdout).trim().parse().ok()
        };
        if id(&["-u"]).expect("`id -u` reports the current uid") != 0 {
            return None;
        }
        match (id(&["-u", "postgres"]), id(&["-g", "postgres"])) {
            (Some(uid), Some(gid)) => Some(Owner { uid, gid }),
            _ => panic!(
                "running as root, and the PostgreSQL server refuses to: it runs as the user \
                 postgres, which does not exist (install the Debian package postgresql-15, \
                 or set {URL_ENV})"
            ),
        }
    })
}

fn chown(path: &Path, owner: Option<Owner>) -> std::io::Result<()> {
    match owner {
        Some(owner) => std::os::unix::fs::chown(path, Some(owner.uid), Some(owner.gid)),
        None => Ok(()),
    }
}

/// A new empty directory `turnstile-test-postgres-<pid>-<n>` under the temp dir,
/// owned by the server's user.
fn create_cluster_dir(owner: Option<Owner>) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let root = temp_root(owner);
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = root.join(format!(
            "turnstile-test-postgres-{}-{n}",
            std::process::id()
        ));
        match fs::create_dir(&dir) {
            Ok(()) => {
                if let Err(error) = chown(&dir, owner) {
                    let _ = fs::remove_dir(&dir);
                    panic!("chown of {} to postgres: {error}", dir.display());
                }
                return dir;
            }
            // Left by an earlier process with our pid (killed before its watchdog ran).
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(error) => panic!("creating {}: {error}", dir.display()),
        }
    }
}

/// The temp dir, or `/tmp` when we are root and `postgres` could not reach it.
fn temp_root(owner: Option<Owner>) -> PathBuf {
    let root = std::env::temp_dir();
    let reachable = root.ancestors().all(|dir| {
        fs::metadata(dir)
            .map(|meta| meta.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    });
    if owner.is_some() && !reachable {
        PathBuf::from("/tmp")
    } else {
        root
    }
}

/// Starts, detached (its own process group, reparented to init), a shell loop that
/// waits for this process to end and then stops the cluster in `dir` and removes
/// `dir`. It ends by itself once `dir` is gone (an own cluster that was dropped).
fn spawn_watchdog(dir: &Path, owner: Option<Owner>, bin: &Path) {
    let dir = sh_quote(&dir.to_string_lossy());
    let pg_ctl = sh_quote(&bin.join("pg_ctl").to_string_lossy());
    let run_as = if owner.is_some() {
        "runuser -u postgres -- "
    } else {
        ""
    };
    let script = format!(
        "while kill -0 {pid} 2>/dev/null && [ -d {dir} ]; do sleep 0.5; done\n\
         if [ -d {dir} ]; then\n\
         {run_as}{pg_ctl} stop -w -s -m immediate -D {dir}/data ||\n\
         {{ [ -f {dir}/data/postmaster.pid ] && kill -9 \"$(head -n 1 {dir}/data/postmaster.pid)\"; }}\n\
         rm -rf {dir}\n\
         fi",
        pid = std::process::id()
    );
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("( {script} ) </dev/null >/dev/null 2>&1 &"))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Out of the terminal's process group: a ^C to the tests must not kill it.
        .process_group(0)
        .status();
    match status {
        Ok(status) if status.success() => {}
        other => panic!("starting the watchdog shell (sh -c) for {dir}: {other:?}"),
    }
}

/// A port that was free on 127.0.0.1 a moment ago.
fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .unwrap_or_else(|error| panic!("binding a free port on 127.0.0.1: {error}"))
}

/// Runs `command`, returning its stdout, or a description with its stderr.
fn run(command: &mut Command) -> Result<String, String> {
    let output: Output = command
        .output()
        .map_err(|error| format!("running {command:?}: {error}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(format!(
            "{command:?} failed ({}): {}{}",
            output.status,
            stderr.trim(),
            if stdout.trim().is_empty() {
                String::new()
            } else {
                format!("\nstdout: {}", stdout.trim())
            }
        ))
    }
}

/// The psql of the server binaries, else the one on PATH (an env URL's machine
/// may have only the client).
fn psql_program() -> PathBuf {
    let bundled = Path::new(BIN_DIR).join("psql");
    if bundled.is_file() {
        bundled
    } else {
        PathBuf::from("psql")
    }
}

/// One statement with psql against `url`; its stdout trimmed, or psql's complaint.
fn run_psql(url: &str, sql: &str) -> Result<String, String> {
    let mut command = Command::new(psql_program());
    command
        .args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-c",
            sql,
        ])
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null());
    let output = command
        .output()
        .map_err(|error| format!("running psql ({}): {error}", psql_program().display()))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(format!(
            "psql failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// `url` with its database (the path) replaced by `database`, query kept.
fn url_with_database(url: &str, database: &str) -> String {
    let (head, query) = url.split_at(url.find('?').unwrap_or(url.len()));
    let authority = head.find("://").map_or(0, |i| i + 3);
    let path = head[authority..]
        .find('/')
        .map_or(head.len(), |i| authority + i);
    format!("{}/{}{query}", &head[..path], percent_encode(database))
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_with_database_replaces_only_the_path() {
        let cases = [
            (
                "postgres://u@127.0.0.1:5/postgres",
                "postgres://u@127.0.0.1:5/db",
            ),
            ("postgres://u@127.0.0.1:5", "postgres://u@127.0.0.1:5/db"),
            (
                "postgres://u:p@h:5/x?sslmode=disable",
                "postgres://u:p@h:5/db?sslmode=disable",
            ),
            ("postgresql://h/x/y", "postgresql://h/db"),
        ];
        for (url, expected) in cases {
            assert_eq!(url_with_database(url, "db"), expected, "{url}");
        }
        assert_eq!(
            url_with_database("postgres://h/x", "a b/c"),
            "postgres://h/a%20b%2Fc"
        );
    }

    #[test]
    fn quoting() {
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_identifier("a\"b"), "\"a\"\"b\"");
        assert_eq!(sh_quote("a'b"), "'a'\\''b'");
    }
}
