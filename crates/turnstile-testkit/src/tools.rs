//! The tool doubles of the tests: an echo, tools that count their
//! executions (so "ran exactly once" can be asserted), block, stall, cancel,
//! fail or panic, and an effect tool whose side effect is a line in a synced
//! log file, counted outside the database (and across processes).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use turnstile::{Reconciliation, Tool, ToolContext, ToolError, ToolSpec};

use crate::session::PATIENCE;

fn spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: format!("test tool {name}"),
        parameters: json!({ "type": "object" }),
    }
}

/// How often a tool ran and with which idempotency keys.
#[derive(Default)]
pub struct Tally {
    calls: AtomicUsize,
    keys: Mutex<Vec<String>>,
}

impl Tally {
    /// Records one execution; returns its 1-based number.
    fn record(&self, context: &ToolContext) -> usize {
        self.keys
            .lock()
            .unwrap()
            .push(context.idempotency_key.clone());
        self.calls.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn keys(&self) -> Vec<String> {
        self.keys.lock().unwrap().clone()
    }
}

/// Answers `"{name} call {n}"`, counting its executions.
pub struct CountingTool {
    name: String,
    pub tally: Tally,
}

impl CountingTool {
    pub fn new(name: &str) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            tally: Tally::default(),
        })
    }

    pub fn calls(&self) -> usize {
        self.tally.calls()
    }

    pub fn keys(&self) -> Vec<String> {
        self.tally.keys()
    }
}

#[async_trait]
impl Tool for CountingTool {
    fn spec(&self) -> ToolSpec {
        spec(&self.name)
    }

    async fn call(
        &self,
        _arguments: Value,
        context: ToolContext,
    ) -> Result<turnstile::Content, ToolError> {
        let n = self.tally.record(&context);
        Ok(format!("{} call {n}", self.name).into())
    }
}

/// Its first `blocking_calls` executions announce themselves on `entered`
/// and wait for a [`BlockingTool::release`]; later ones answer at once.
pub struct BlockingTool {
    name: String,
    blocking_calls: usize,
    pub tally: Tally,
    entered: Notify,
    release: Notify,
}

impl BlockingTool {
    pub fn new(name: &str, blocking_calls: usize) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            blocking_calls,
            tally: Tally::default(),
            entered: Notify::new(),
            release: Notify::new(),
        })
    }

    /// Waits until a blocking execution has started.
    pub async fn entered(&self) {
        tokio::time::timeout(PATIENCE, self.entered.notified())
            .await
            .expect("the blocking tool was never entered");
    }

    /// Lets one blocked execution (or the next one to block) go on.
    pub fn release(&self) {
        self.release.notify_one();
    }

    pub fn calls(&self) -> usize {
        self.tally.calls()
    }

    pub fn keys(&self) -> Vec<String> {
        self.tally.keys()
    }
}

#[async_trait]
impl Tool for BlockingTool {
    fn spec(&self) -> ToolSpec {
        spec(&self.name)
    }

    async fn call(
        &self,
        _arguments: Value,
        context: ToolContext,
    ) -> Result<turnstile::Content, ToolError> {
        let n = self.tally.record(&context);
        if n <= self.blocking_calls {
            self.entered.notify_one();
            self.release.notified().await;
        }
        Ok(format!("{} call {n}", self.name).into())
    }
}

/// Stalls (for an hour) on its first execution, so a deadline interrupts
/// the run inside the tool; later executions answer at once.
pub struct StallingTool {
    name: String,
    pub tally: Tally,
}

impl StallingTool {
    pub fn new(name: &str) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            tally: Tally::default(),
        })
    }

    pub fn calls(&self) -> usize {
        self.tally.calls()
    }

    pub fn keys(&self) -> Vec<String> {
        self.tally.keys()
    }
}

#[async_trait]
impl Tool for StallingTool {
    fn spec(&self) -> ToolSpec {
        spec(&self.name)
    }

    async fn call(
        &self,
        _arguments: Value,
        context: ToolContext,
    ) -> Result<turnstile::Content, ToolError> {
        let n = self.tally.record(&context);
        if n == 1 {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Ok(format!("{} call {n}", self.name).into())
    }
}

/// Cancels `token` on its first execution (from inside the tool round), then
/// answers normally.
pub struct CancellingTool {
    name: String,
    token: CancellationToken,
    pub tally: Tally,
}

impl CancellingTool {
    pub fn new(name: &str, token: CancellationToken) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            token,
            tally: Tally::default(),
        })
    }

    pub fn calls(&self) -> usize {
        self.tally.calls()
    }

    pub fn keys(&self) -> Vec<String> {
        self.tally.keys()
    }
}

#[async_trait]
impl Tool for CancellingTool {
    fn spec(&self) -> ToolSpec {
        spec(&self.name)
    }

    async fn call(
        &self,
        _arguments: Value,
        context: ToolContext,
    ) -> Result<turnstile::Content, ToolError> {
        let n = self.tally.record(&context);
        if n == 1 {
            self.token.cancel();
        }
        Ok(format!("{} call {n}", self.name).into())
    }
}

/// Always fails with a [`ToolError`].
pub struct FailingTool;

#[async_trait]
impl Tool for FailingTool {
    fn spec(&self) -> ToolSpec {
        spec("failing")
    }

    async fn call(
        &self,
        _arguments: Value,
        _context: ToolContext,
    ) -> Result<turnstile::Content, ToolError> {
        Err(ToolError::new("disk on fire"))
    }
}

/// Always panics.
pub struct PanickingTool;

#[async_trait]
impl Tool for PanickingTool {
    fn spec(&self) -> ToolSpec {
        spec("panicking")
    }

    async fn call(
        &self,
        _arguments: Value,
        _context: ToolContext,
    ) -> Result<turnstile::Content, ToolError> {
        panic!("the panicking tool panicked on purpose");
    }
}

/// Sleeps far longer than any tool timeout of the tests.
pub struct SleepingTool;

#[async_trait]
impl Tool for SleepingTool {
    fn spec(&self) -> ToolSpec {
        spec("sleeping")
    }

    async fn call(
        &self,
        _arguments: Value,
        _context: ToolContext,
    ) -> Result<turnstile::Content, ToolError> {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok("woke up".into())
    }
}

/// Answers with its `text` argument, `repeat` times (once by default; a
/// large output from small arguments), counting its executions. A call
/// without `text` fails.
#[derive(Default)]
pub struct Echo {
    calls: AtomicUsize,
}

impl Echo {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// How often it ran.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Tool for Echo {
    fn spec(&self) -> ToolSpec {
        // The spec a stored fixture's agent was written with: a resumed
        // run must present the same fingerprint.
        ToolSpec {
            name: "echo".into(),
            description: "Echoes its text".into(),
            parameters: json!({ "type": "object" }),
        }
    }

    async fn call(&self, args: Value, _: ToolContext) -> Result<turnstile::Content, ToolError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        echo(&args).map(turnstile::Content::from)
    }
}

fn echo(args: &Value) -> Result<String, ToolError> {
    let text = args
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::new("echo needs a text argument"))?;
    let repeat = args["repeat"].as_u64().unwrap_or(1);
    Ok(text.repeat(usize::try_from(repeat).unwrap_or(1)))
}

/// An [`Echo`] named `stall` whose first execution signals
/// [`Stall::started`] and never ends: the process "dies" there. Later
/// executions echo.
#[derive(Default)]
pub struct Stall {
    started: Notify,
    calls: AtomicUsize,
}

impl Stall {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Waits until the first execution has started.
    pub async fn started(&self) {
        tokio::time::timeout(PATIENCE, self.started.notified())
            .await
            .expect("the stalling tool was never called");
    }

    /// How often it ran.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Tool for Stall {
    fn spec(&self) -> ToolSpec {
        spec("stall")
    }

    async fn call(&self, args: Value, _: ToolContext) -> Result<turnstile::Content, ToolError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            self.started.notify_one();
            std::future::pending::<()>().await;
        }
        echo(&args).map(turnstile::Content::from)
    }
}

/// Appends `line` to `log` in one `write` (O_APPEND) and fsyncs it.
pub fn append_line(log: &Path, line: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    file.write_all(format!("{line}\n").as_bytes())?;
    file.sync_all()
}

/// How many lines of the effect log `log` are `line`.
pub fn effects(log: &Path, line: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == line)
        .count()
}

/// How [`Effect`] holds a call after announcing it.
#[derive(Clone, Copy, Debug)]
pub enum Hold {
    /// Sleeps this long, then answers.
    For(Duration),
    /// Never answers: the process is meant to die (or freeze) there.
    Forever,
}

/// Its side effect is appending the call id (or, [`Effect::logging_keys`],
/// its idempotency key) to a log file (synced), so "ran once" is counted
/// outside the database. The call [`Effect::holding`] names then prints
/// `IN TOOL <call id>` and is held ([`Effect::holding_before`]: before its
/// effect); every call then sleeps [`Effect::sleeping`] (not at all by
/// default). Answers `"<name> done"`. [`Effect::reconciling`] makes it
/// answer `reconcile` from its log; [`Effect::idempotent`] declares it
/// idempotent.
pub struct Effect {
    name: String,
    log: PathBuf,
    held: Option<(String, Hold)>,
    hold_before: bool,
    sleep: Duration,
    keys: bool,
    reconciles: bool,
    idempotent: bool,
}

impl Effect {
    pub fn new(name: &str, log: &Path) -> Self {
        Self {
            name: name.to_owned(),
            log: log.to_owned(),
            held: None,
            hold_before: false,
            sleep: Duration::ZERO,
            keys: false,
            reconciles: false,
            idempotent: false,
        }
    }

    /// Announces and holds the call `call_id` (none if `None`).
    pub fn holding(self, call_id: Option<&str>, hold: Hold) -> Self {
        Self {
            held: call_id.map(|id| (id.to_owned(), hold)),
            ..self
        }
    }

    /// Announces and holds the call `call_id` before its effect.
    pub fn holding_before(self, call_id: Option<&str>, hold: Hold) -> Self {
        Self {
            hold_before: true,
            ..self.holding(call_id, hold)
        }
    }

    /// Sleeps `sleep` after every effect.
    pub fn sleeping(self, sleep: Duration) -> Self {
        Self { sleep, ..self }
    }

    /// Logs each call's idempotency key instead of its id.
    pub fn logging_keys(self) -> Self {
        Self { keys: true, ..self }
    }

    /// Reconciles a call in doubt from the log: done (answering as the
    /// call would have) when its line is there, not done otherwise.
    pub fn reconciling(self) -> Self {
        Self {
            reconciles: true,
            ..self
        }
    }

    /// Declares the tool idempotent ([`Tool::idempotent`]).
    pub fn idempotent(self) -> Self {
        Self {
            idempotent: true,
            ..self
        }
    }

    fn line<'a>(&self, ctx: &'a ToolContext) -> &'a str {
        match self.keys {
            true => &ctx.idempotency_key,
            false => &ctx.call_id,
        }
    }

    async fn hold(&self, ctx: &ToolContext, before: bool) {
        if let Some((call_id, hold)) = &self.held {
            if *call_id == ctx.call_id && self.hold_before == before {
                println!("IN TOOL {}", ctx.call_id);
                match hold {
                    Hold::For(pause) => tokio::time::sleep(*pause).await,
                    Hold::Forever => std::future::pending::<()>().await,
                }
            }
        }
    }
}

#[async_trait]
impl Tool for Effect {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: "has an effect".into(),
            parameters: json!({"type": "object"}),
        }
    }

    async fn call(&self, _args: Value, ctx: ToolContext) -> Result<turnstile::Content, ToolError> {
        self.hold(&ctx, true).await;
        append_line(&self.log, self.line(&ctx)).map_err(|e| ToolError::new(e.to_string()))?;
        self.hold(&ctx, false).await;
        if !self.sleep.is_zero() {
            tokio::time::sleep(self.sleep).await;
        }
        Ok(format!("{} done", self.name).into())
    }

    fn idempotent(&self) -> bool {
        self.idempotent
    }

    async fn reconcile(&self, _args: Value, ctx: ToolContext) -> Reconciliation {
        match (self.reconciles, effects(&self.log, self.line(&ctx))) {
            (false, _) => Reconciliation::Unknown,
            (true, 0) => Reconciliation::NotDone,
            (true, _) => Reconciliation::Done(Ok(format!("{} done", self.name).into())),
        }
    }
}
