//! The page in a real headless Chromium, driven through WebDriver
//! (Debian's `chromium` and `chromedriver`, which `.ci/run` installs): a
//! message sent, its answer streaming in, a reload in the middle of it
//! with no event or message shown twice, a model's `<script>` shown as
//! text, and a gated tool call approved with a click.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use turnstile::agent::{Model, ModelRequest, ModelResponse};
use turnstile::{async_trait, Agent, Message, ModelError, ToolCall};
use turnstile_testkit::session::{last_input, usage};
use turnstile_testkit::tools::CountingTool;

use crate::support::{start, store_in};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
const HOSTILE: &str = "<script>document.title = 'pwned'</script><img src=x onerror=\"document.title = 'pwned'\"> is shown as text";

/// A model that streams its answers a piece every 250 ms: `deploy` asks
/// for the gated tool, then answers; `script` answers with markup; anything
/// else with a greeting.
struct SlowModel;

#[async_trait]
impl Model for SlowModel {
    fn name(&self) -> &str {
        "slow"
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let input = last_input(request.messages).unwrap_or_default();
        let answered_tool = matches!(request.messages.last(), Some(Message::Tool { .. }));
        let text = match () {
            _ if input.contains("deploy") && !answered_tool => {
                return Ok(ModelResponse {
                    tool_calls: vec![ToolCall::new("d1", "deploy", json!({"env": "prod"}))],
                    usage: usage(1, 1),
                    ..ModelResponse::default()
                });
            }
            _ if input.contains("deploy") => "deployed".to_owned(),
            _ if input.contains("script") => HOSTILE.to_owned(),
            _ => "hello there, this answer streams in slowly".to_owned(),
        };
        if let Some(deltas) = request.deltas {
            for piece in text.split_inclusive(' ') {
                deltas(piece);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        Ok(ModelResponse {
            content: text.into(),
            usage: usage(1, 1),
            ..ModelResponse::default()
        })
    }
}

/// chromedriver on a free port, and a headless Chromium session of it.
struct Browser {
    client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Option<Self> {
        if !Path::new(CHROMEDRIVER).exists() || !Path::new(CHROMIUM).exists() {
            let missing = format!(
                "no {CHROMIUM} and {CHROMEDRIVER} (apt-get install chromium chromium-driver)"
            );
            // `.ci/run` installs them and says so: there it is a failure.
            assert!(
                std::env::var_os("TURNSTILE_REQUIRE_BROWSER").is_none(),
                "{missing}"
            );
            eprintln!("the page test did not run: {missing}");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let profile = tempfile::tempdir().unwrap();
        // Chromium's own connections (updates, sync) would be refused by a
        // closed network: they are turned off.
        let capabilities = json!({
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!("an object")
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            let attempt = ClientBuilder::new(connector.clone())
                .capabilities(capabilities.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await;
            match attempt {
                Ok(client) => break client,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("a Chromium session: {e}"),
            }
        };
        Some(Self {
            client,
            driver,
            _profile: profile,
        })
    }

    /// The value of a JavaScript expression on the page.
    async fn eval(&self, expression: &str) -> Value {
        self.client
            .execute(&format!("return {expression};"), vec![])
            .await
            .expect("run a script on the page")
    }

    /// Waits up to 20 s for `expression` to be true on the page.
    async fn until(&self, expression: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.eval(expression).await != Value::Bool(true) {
            assert!(Instant::now() < deadline, "within 20 s: {expression}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn send(&self, text: &str) {
        let input = self.client.find(Locator::Id("input")).await.unwrap();
        input.send_keys(text).await.unwrap();
        self.client
            .find(Locator::Id("send"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    async fn stop(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    /// chromedriver goes with the test, however it ends.
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

const COMMITTED: &str = "document.querySelectorAll('#events li[data-kind=committed]').length";
const EVENTS: &str =
    "[...document.querySelectorAll('#events li')].map(li => Number(li.dataset.seq))";
const MESSAGES: &str =
    "[...document.querySelectorAll('#messages .message')].map(m => m.lastChild.textContent)";

#[tokio::test]
async fn the_page_streams_an_answer_survives_a_reload_shows_markup_as_text_and_approves() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let deploy = CountingTool::new("deploy");
    let agent = Agent::new(Arc::new(SlowModel)).with_tool_requiring_approval(deploy.clone());
    let server = start(store, agent).await;
    browser.client.goto(&server.url("/")).await.unwrap();
    browser
        .client
        .find(Locator::Id("new-conversation"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .until("document.getElementById('conversation-id').textContent.length === 36")
        .await;

    // The answer streams in; the page is reloaded in the middle of it.
    browser.send("say hello").await;
    browser
        .until("document.getElementById('live').textContent.length > 0")
        .await;
    let partial = browser
        .eval("document.getElementById('live').textContent")
        .await;
    let answer = "hello there, this answer streams in slowly";
    let partial = partial.as_str().unwrap().to_owned();
    assert!(
        answer.starts_with(&partial) && partial.len() < answer.len(),
        "{partial:?}"
    );
    browser.client.refresh().await.unwrap();
    browser.until(&format!("{COMMITTED} === 1")).await;
    browser.until(&format!("{MESSAGES}.length === 2")).await;
    assert_eq!(browser.eval(EVENTS).await, json!([1, 2]), "each event once");
    assert_eq!(browser.eval(MESSAGES).await, json!(["say hello", answer]));
    assert_eq!(
        browser
            .eval("document.getElementById('live').textContent")
            .await,
        ""
    );

    // A model's markup is text: nothing of it runs or renders.
    browser.send("show me a script").await;
    browser.until(&format!("{COMMITTED} === 2")).await;
    browser.until(&format!("{MESSAGES}.length === 4")).await;
    let messages = browser.eval(MESSAGES).await;
    assert_eq!(messages[3], HOSTILE, "{messages}");
    assert_eq!(browser.eval("document.title").await, "turnstile");
    assert_eq!(
        browser
            .eval("document.querySelectorAll('#messages script, #messages img').length")
            .await,
        0
    );

    // A gated call waits for a click.
    browser.send("deploy it").await;
    browser
        .until("document.querySelector('.approval button.approve') !== null")
        .await;
    assert_eq!(deploy.calls(), 0);
    browser
        .client
        .find(Locator::Css(".approval button.approve"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser.until(&format!("{COMMITTED} === 3")).await;
    // The question, the call, its result, the answer.
    browser.until(&format!("{MESSAGES}.length === 8")).await;
    assert_eq!(deploy.calls(), 1);
    let messages = browser.eval(MESSAGES).await;
    assert_eq!(messages.as_array().unwrap().last().unwrap(), "deployed");
    let seqs = browser.eval(EVENTS).await;
    let count = seqs.as_array().unwrap().len() as u64;
    assert_eq!(
        seqs,
        json!((1..=count).collect::<Vec<_>>()),
        "each event once"
    );
    browser.stop().await;
}
