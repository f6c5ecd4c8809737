// The page of `turnstile serve`: pick a conversation, send a message,
// watch its durable events and live text, decide the tool calls that wait
// for approval. Everything a model or a tool wrote is shown with
// textContent, never parsed as HTML. The event stream is read with fetch
// rather than EventSource, which cannot send an access token.
"use strict";

const $ = (id) => document.getElementById(id);

const state = {
  token: sessionStorage.getItem("turnstile-token") || "",
  conversation: null,
  // The number of the last durable event shown: a reconnect asks for the
  // ones after it, and an event at or below it is never shown again.
  lastSeq: 0,
  // The tool call shown as running, until its result or the round's end.
  runningCall: null,
  // Committed transcript entries shown.
  shown: 0,
  following: null,
};

function uuid4() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function headers(extra) {
  const all = Object.assign({}, extra);
  if (state.token) all.Authorization = `Bearer ${state.token}`;
  return all;
}

async function api(method, path, body, extra) {
  const init = { method, headers: headers(extra) };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  let json = null;
  try {
    json = await response.json();
  } catch (_) {
    json = null;
  }
  return { status: response.status, json };
}

function say(text) {
  $("status").textContent = text;
}

function sayError(json) {
  const error = json && json.error;
  say(error ? `${error.message}: ${error.next}` : "the server did not answer");
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function contentText(content) {
  if (typeof content === "string") return content;
  return (content || [])
    .map((part) => (part.type === "text" ? part.text : `[${part.type}]`))
    .join("");
}

function renderMessage(entry) {
  const message = entry.message;
  const node = element("div", `message ${message.role}`);
  node.dataset.seq = entry.seq;
  node.append(element("span", "role", message.role));
  let text = contentText(message.content);
  for (const call of message.tool_calls || []) {
    text += `${text ? "\n" : ""}→ ${call.name}(${JSON.stringify(call.arguments)})`;
  }
  node.append(document.createTextNode(text));
  $("messages").append(node);
}

async function loadTranscript() {
  const conversation = state.conversation;
  let from = state.shown;
  for (;;) {
    const { status, json } = await api("GET", `/v1/conversations/${conversation}/transcript?from=${from}`);
    if (conversation !== state.conversation || status !== 200) return;
    for (const entry of json.entries) {
      if (entry.seq >= state.shown) {
        renderMessage(entry);
        state.shown = entry.seq + 1;
      }
    }
    if (json.next === null) return;
    from = json.next;
  }
}

async function loadApprovals() {
  const conversation = state.conversation;
  const { status, json } = await api("GET", `/v1/conversations/${conversation}/approvals`);
  if (conversation !== state.conversation) return;
  const list = $("approvals");
  list.replaceChildren();
  if (status !== 200) return;
  for (const pending of json.approvals) {
    const node = element("div", "approval");
    node.dataset.call = pending.call_id;
    node.append(element("strong", "", pending.tool));
    node.append(element("code", "", pending.arguments));
    for (const decision of ["approve", "reject"]) {
      const button = element("button", decision, decision === "approve" ? "Approve" : "Reject");
      button.type = "button";
      button.addEventListener("click", () => decide(pending, decision));
      node.append(button);
    }
    list.append(node);
  }
}

async function decide(pending, decision) {
  const { status, json } = await api("POST", `/v1/conversations/${state.conversation}/approvals`, {
    request_id: pending.request_id,
    call_id: pending.call_id,
    revision: pending.revision,
    decision,
  });
  if (status !== 200) sayError(json);
  await loadApprovals();
}

function onEvent(kind, id, data) {
  if (kind === "delta") {
    $("live").textContent += data.text;
    return;
  }
  if (kind === "tool_started") {
    // Its own line: the answer that made the call may be read after it.
    state.runningCall = data.call_id;
    $("running").textContent = `running ${data.name}…`;
    return;
  }
  if (kind === "error") {
    sayError(data);
    return;
  }
  if (id === null) return;
  const seq = Number(id);
  if (seq <= state.lastSeq) return;
  state.lastSeq = seq;
  const item = element("li", "", `${seq} ${kind}`);
  item.dataset.seq = seq;
  item.dataset.kind = kind;
  $("events").append(item);
  if (["answered", "committed", "abandoned", "stopped", "run_started"].includes(kind)) {
    $("live").textContent = "";
  }
  const roundOver = ["checkpoint_saved", "committed", "abandoned", "stopped"].includes(kind);
  if (roundOver || (kind === "tool_finished" && data.call_id === state.runningCall)) {
    state.runningCall = null;
    $("running").textContent = "";
  }
  if (kind === "committed" || kind === "abandoned") loadTranscript();
  if (kind.startsWith("approval_") || kind === "stopped" || kind === "committed") loadApprovals();
}

function onBlock(block) {
  let id = null;
  let kind = "message";
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("id:")) id = line.slice(3).trim();
    else if (line.startsWith("event:")) kind = line.slice(6).trim();
    else if (line.startsWith("data:")) data += line.slice(5).trim();
  }
  if (data) onEvent(kind, id, JSON.parse(data));
}

// Follows the conversation's events until `signal` aborts, reconnecting
// after the last one shown whenever the stream ends.
async function follow(conversation, signal) {
  while (!signal.aborted) {
    try {
      const response = await fetch(`/v1/conversations/${conversation}/events`, {
        headers: headers({ "Last-Event-ID": String(state.lastSeq) }),
        signal,
      });
      if (response.ok) {
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            onBlock(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
          }
        }
      } else if (response.status !== 404) {
        sayError(await response.json().catch(() => null));
      }
    } catch (_) {
      if (signal.aborted) return;
    }
    await sleep(1000);
  }
}

async function open(conversation) {
  if (state.following) state.following.abort();
  Object.assign(state, {
    conversation,
    lastSeq: 0,
    shown: 0,
    runningCall: null,
    following: new AbortController(),
  });
  history.replaceState(null, "", `/?conversation=${conversation}`);
  $("conversation-id").textContent = conversation;
  for (const id of ["messages", "live", "running", "events", "approvals", "status"]) {
    $(id).replaceChildren();
  }
  for (const button of document.querySelectorAll("#conversations button")) {
    if (button.dataset.id === conversation) button.setAttribute("aria-current", "true");
    else button.removeAttribute("aria-current");
  }
  await loadTranscript();
  await loadApprovals();
  follow(conversation, state.following.signal);
}

async function loadConversations() {
  const { status, json } = await api("GET", "/v1/conversations?limit=100");
  if (status !== 200) {
    sayError(json);
    return;
  }
  const list = $("conversations");
  list.replaceChildren();
  for (const conversation of json.conversations) {
    const button = element("button", "", conversation.meta.title || conversation.conversation_id);
    button.type = "button";
    button.dataset.id = conversation.conversation_id;
    button.addEventListener("click", () => open(conversation.conversation_id));
    const item = element("li");
    item.append(button);
    list.append(item);
  }
}

async function newConversation() {
  const conversation = uuid4();
  // Created with its metadata, so that its event stream opens before its
  // first request.
  const { status, json } = await api("PUT", `/v1/conversations/${conversation}/metadata`, { meta_version: 0 });
  if (status !== 200) {
    sayError(json);
    return;
  }
  await loadConversations();
  await open(conversation);
}

async function send(event) {
  event.preventDefault();
  const input = $("input").value;
  if (!input.trim() || !state.conversation) return;
  $("input").value = "";
  say("");
  const { status, json } = await api(
    "POST",
    `/v1/conversations/${state.conversation}/requests`,
    { input },
    { "Idempotency-Key": uuid4() },
  );
  if (status !== 200 && !(json && json.error && json.error.kind === "awaiting_approval")) sayError(json);
}

$("compose").addEventListener("submit", send);
$("new-conversation").addEventListener("click", newConversation);
$("token").value = state.token;
$("save-token").addEventListener("click", () => {
  state.token = $("token").value.trim();
  sessionStorage.setItem("turnstile-token", state.token);
  loadConversations();
});

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

loadConversations().then(() => {
  const wanted = new URLSearchParams(location.search).get("conversation");
  if (wanted && UUID.test(wanted)) open(wanted);
});
