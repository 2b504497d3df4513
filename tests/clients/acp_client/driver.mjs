// Drives `agentsctl acp` with the official ACP TypeScript SDK's client side, the way
// an editor does. Run by tests/clients/test_acp.py:
//
//   node driver.mjs '{"scenario": "conversation" | "kill" | "permission" | "review", "python": ..., "socket": ..., "cwd": ...}'
//
// "review" also takes "provider" (codex, claude or testacp): what an editor reviews of
// that agent's turns (test_acp_review.py scripts the fake model servers first).
//
// Each scenario asserts as it goes (node:assert) and prints one JSON report line on
// stdout; any failure exits 1 with the reason on stderr. Every wait is bounded by
// STEP_TIMEOUT_MS; nothing sleeps for a fixed time.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import net from "node:net";
import { Readable, Writable } from "node:stream";

import { PROTOCOL_VERSION, client, methods, ndJsonStream } from "@agentclientprotocol/sdk";

const STEP_TIMEOUT_MS = 20_000; // one step against a local daemon takes milliseconds
const config = JSON.parse(process.argv[2]);

// The SDK reports protocol problems (invalid params, unknown responses) through
// console.error; any such report fails the run.
const sdkErrors = [];
const consoleError = console.error;
console.error = (...args) => {
  sdkErrors.push(args.map(String).join(" "));
  consoleError(...args);
};

function withTimeout(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out: ${what}`)), STEP_TIMEOUT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// -- the daemon, spoken to directly (as "another client") ------------------------

async function daemonCall(method, params) {
  const socket = net.createConnection(config.socket);
  try {
    await withTimeout(new Promise((resolve, reject) => {
      socket.once("connect", resolve);
      socket.once("error", reject);
    }), `connect to ${config.socket}`);
    socket.write(JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }) + "\n");
    let buffer = "";
    const reply = await withTimeout(new Promise((resolve, reject) => {
      socket.on("data", (data) => {
        buffer += data.toString("utf8");
        const newline = buffer.indexOf("\n");
        if (newline >= 0) resolve(JSON.parse(buffer.slice(0, newline)));
      });
      socket.once("error", reject);
    }), `${method} on the daemon`);
    if (reply.error) throw new Error(`${method}: ${JSON.stringify(reply.error)}`);
    return reply.result;
  } finally {
    socket.destroy();
  }
}

// -- one bridge process and its ACP connection -------------------------------------

const bridges = [];

class Bridge {
  constructor(name, extraArgs = []) {
    bridges.push(this);
    this.name = name;
    this.updates = []; // every session/update params, in arrival order
    this.announced = new Set(); // toolCallIds seen in tool_call updates
    this.waiters = [];
    this.onPermission = async () => ({ outcome: { outcome: "cancelled" } });
    this.stderr = "";
    this.process = spawn(
      config.python,
      ["-m", "agentsctl.cli", "--socket", config.socket, "--no-start", "acp", ...extraArgs],
      { stdio: ["pipe", "pipe", "pipe"] },
    );
    this.process.stderr.on("data", (data) => { this.stderr += data.toString("utf8"); });
    this.exited = new Promise((resolve) => this.process.once("exit", (code, signal) => resolve({ code, signal })));
    const app = client({ name: `driver-${name}` })
      .onNotification(methods.client.session.update, ({ params }) => this.#update(params))
      .onRequest(methods.client.session.requestPermission, (context) => this.onPermission(context));
    const stream = ndJsonStream(Writable.toWeb(this.process.stdin), Readable.toWeb(this.process.stdout));
    this.connection = app.connect(stream);
    this.agent = this.connection.agent;
  }

  #update(params) {
    const { update } = params;
    assert.equal(typeof params.sessionId, "string");
    switch (update.sessionUpdate) {
      case "user_message_chunk":
      case "agent_message_chunk":
      case "agent_thought_chunk":
        assert.equal(update.content.type, "text", "chunks carry text");
        assert.equal(typeof update.content.text, "string");
        assert.ok(update.content.text.length > 0, "no empty chunks");
        break;
      case "tool_call":
        assert.equal(typeof update.title, "string");
        assert.ok(!this.announced.has(update.toolCallId), `tool call ${update.toolCallId} announced twice`);
        this.announced.add(update.toolCallId);
        break;
      case "tool_call_update":
        assert.ok(this.announced.has(update.toolCallId), `update of unannounced tool call ${update.toolCallId}`);
        break;
      case "plan":
        assert.ok(Array.isArray(update.entries), "a plan has entries");
        for (const entry of update.entries) {
          assert.ok(["high", "medium", "low"].includes(entry.priority), "each entry has a priority");
          assert.ok(["pending", "in_progress", "completed"].includes(entry.status));
        }
        break;
      case "usage_update":
        assert.ok(Number.isInteger(update.used) && Number.isInteger(update.size));
        break;
      case "session_info_update":
        break;
      case "available_commands_update":
        for (const command of update.availableCommands) {
          assert.equal(typeof command.name, "string");
          assert.equal(typeof command.description, "string");
        }
        break;
      case "current_mode_update":
        assert.equal(typeof update.currentModeId, "string");
        break;
      case "config_option_update":
        for (const option of update.configOptions) {
          assert.ok(option.options.some((o) => o.value === option.currentValue), "the current value is a choice");
        }
        break;
      default:
        assert.fail(`unexpected session update ${update.sessionUpdate}`);
    }
    this.updates.push(params);
    this.waiters = this.waiters.filter(({ predicate, resolve }) => !(predicate() && (resolve(), true)));
  }

  /** Resolves once predicate() holds, checked after each update. */
  until(predicate, what) {
    if (predicate()) return Promise.resolve();
    return withTimeout(new Promise((resolve) => this.waiters.push({ predicate, resolve })), `${this.name}: ${what}`);
  }

  mark() {
    return this.updates.length;
  }

  since(mark) {
    return this.updates.slice(mark).map((p) => p.update);
  }

  async initialize() {
    const result = await withTimeout(this.agent.request(methods.agent.initialize, {
      protocolVersion: PROTOCOL_VERSION,
      clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
      clientInfo: { name: "acp-driver", version: "1" },
    }), `${this.name}: initialize`);
    assert.equal(result.protocolVersion, 1);
    assert.equal(result.agentCapabilities.loadSession, true, "loadSession is advertised");
    return result;
  }

  prompt(sessionId, text) {
    return this.agent.request(methods.agent.session.prompt, { sessionId, prompt: [{ type: "text", text }] });
  }

  async close() {
    this.connection.close();
    this.process.stdin.end();
    const exit = await withTimeout(this.exited, `${this.name}: exit after stdin closed`);
    assert.deepEqual(exit, { code: 0, signal: null }, `${this.name} exits 0 when the editor leaves:\n${this.stderr}`);
  }
}

// What a replay repeats: not the editor's own prompts (it had them), nor the
// session's state (modes, config options, commands), sent as it is when it changes.
const STATE_UPDATES = new Set(["available_commands_update", "current_mode_update", "config_option_update"]);
const historical = (u) => u.sessionUpdate !== "user_message_chunk" && !STATE_UPDATES.has(u.sessionUpdate);

const textOf = (updates, kind) => updates
  .filter((u) => u.sessionUpdate === kind)
  .map((u) => u.content.text);

function messages(updates) {
  // Agent message text by messageId, in first-seen order.
  const byId = new Map();
  for (const u of updates) {
    if (u.sessionUpdate !== "agent_message_chunk") continue;
    byId.set(u.messageId, (byId.get(u.messageId) ?? "") + u.content.text);
  }
  return byId;
}

function toolCalls(updates) {
  // Each tool call the editor was shown, by toolCallId in first-seen order: its kind
  // and every status it went through.
  const byId = new Map();
  for (const u of updates) {
    if (u.sessionUpdate === "tool_call") {
      byId.set(u.toolCallId, { kind: u.kind, statuses: [u.status ?? "pending"] });
    } else if (u.sessionUpdate === "tool_call_update" && u.status) {
      byId.get(u.toolCallId)?.statuses.push(u.status);
    }
  }
  return byId;
}

const finalStatuses = (tools) => [...tools].map(([id, tool]) => [id, tool.statuses.at(-1)]);

function waitAborted(signal) {
  return new Promise((_, reject) => {
    const abort = () => reject(new DOMException("withdrawn by the agent", "AbortError"));
    if (signal.aborted) abort();
    else signal.addEventListener("abort", abort, { once: true });
  });
}

// -- scenarios ----------------------------------------------------------------------

const LONG_TEXT = Array.from({ length: 40 }, (_, i) => `word${i}`).join(" ");

async function conversation() {
  const report = {};
  // Turns of ~1 s: long enough for session/cancel to land mid-turn on a loaded machine.
  const a = new Bridge("bridge-1", ["--option", "chunkDelayS=0.05", "--option", "chunks=24"]);
  await a.initialize();

  // session/new creates a daemon session whose id is the ACP session id.
  const { sessionId } = await withTimeout(a.agent.request(methods.agent.session.new, { cwd: config.cwd, mcpServers: [] }), "session/new");
  report.sessionId = sessionId;

  // A prompt streams agent_message_chunk updates, then ends end_turn.
  let mark = a.mark();
  let result = await withTimeout(a.prompt(sessionId, "hello"), "prompt hello");
  assert.equal(result.stopReason, "end_turn");
  let updates = a.since(mark);
  const hello = textOf(updates, "agent_message_chunk");
  assert.ok(hello.length >= 2, `streamed in several chunks, got ${JSON.stringify(hello)}`);
  assert.equal(hello.join(""), "Hello from the mock agent.");
  assert.deepEqual(textOf(updates, "user_message_chunk"), [], "the editor's own prompt is not echoed");
  report.helloChunks = hello.length;

  // An approval becomes session/request_permission; the editor's choice is applied.
  let asked = null;
  a.onPermission = async ({ params }) => {
    asked = params;
    return { outcome: { outcome: "selected", optionId: "accept" } };
  };
  mark = a.mark();
  result = await withTimeout(a.prompt(sessionId, "please approve this"), "prompt with approval");
  assert.equal(result.stopReason, "end_turn");
  assert.ok(asked, "a permission request arrived");
  assert.equal(asked.sessionId, sessionId);
  assert.deepEqual(asked.options.map((o) => [o.optionId, o.kind]), [["accept", "allow_once"], ["decline", "reject_once"]]);
  assert.ok(a.announced.has(asked.toolCall.toolCallId), "the permission's tool call was announced first");
  updates = a.since(mark);
  // The permission's tool call is the shell command the agent then ran.
  const shell = toolCalls(updates).get(asked.toolCall.toolCallId);
  assert.equal(shell?.kind, "execute");
  assert.equal(shell?.statuses.at(-1), "completed");
  assert.equal(textOf(updates, "agent_message_chunk").join(""), "Command approved.");
  report.toolCallId = asked.toolCall.toolCallId;

  // session/cancel mid-turn ends the prompt `cancelled`.
  mark = a.mark();
  const cancelled = a.prompt(sessionId, `echo ${LONG_TEXT}`);
  await a.until(() => textOf(a.since(mark), "agent_message_chunk").length > 0, "first chunk of the long reply");
  await a.agent.notify(methods.agent.session.cancel, { sessionId });
  result = await withTimeout(cancelled, "cancelled prompt");
  assert.equal(result.stopReason, "cancelled");
  const partial = textOf(a.since(mark), "agent_message_chunk").join("");
  assert.ok(partial.length > 0 && partial.length < LONG_TEXT.length, `interrupted part-way: ${partial.length} chars`);
  assert.ok(LONG_TEXT.startsWith(partial), "what streamed is a prefix of the reply");
  report.cancelledChars = partial.length;

  // Another client answers first: the editor's request is withdrawn ($/cancel_request)
  // and the prompt goes on with that client's decision.
  let withdrawn = false;
  let elsewhere = null;
  a.onPermission = async ({ params, signal }) => {
    const approvalId = params._meta.agentsd.approvalId;
    elsewhere = daemonCall("agentSession.respond", { sessionId, approvalId, decision: "decline" });
    try {
      await waitAborted(signal);
    } finally {
      withdrawn = signal.aborted;
    }
  };
  mark = a.mark();
  result = await withTimeout(a.prompt(sessionId, "approve this one elsewhere"), "prompt answered elsewhere");
  assert.equal(result.stopReason, "end_turn");
  await withTimeout(elsewhere, "the other client's answer");
  assert.ok(withdrawn, "the editor's permission request was cancelled");
  updates = a.since(mark);
  assert.equal(textOf(updates, "agent_message_chunk").join(""), "Command declined.");
  const declined = updates.filter((u) => u.sessionUpdate === "tool_call_update" && u.status === "failed");
  assert.ok(declined.length >= 1, "the declined approval ends failed");
  const live = messages(a.since(0));

  // A second bridge loads the session: the whole history, before the load reply.
  const b = new Bridge("bridge-2");
  await b.initialize();
  const loaded = await withTimeout(b.agent.request(methods.agent.session.load, { sessionId, cwd: config.cwd, mcpServers: [] }), "session/load");
  assert.ok(loaded !== undefined);
  const replay = b.since(0);
  assert.ok(b.updates.every((p) => p.sessionId === sessionId));
  assert.deepEqual(textOf(replay, "user_message_chunk"), [
    "hello", "please approve this", `echo ${LONG_TEXT}`, "approve this one elsewhere",
  ]);
  assert.deepEqual([...messages(replay)], [...live], "the replay shows what was streamed live");
  const replayedTools = replay.filter((u) => u.sessionUpdate === "tool_call").map((u) => u.toolCallId);
  assert.ok(replayedTools.includes(report.toolCallId), "approved tool calls are replayed");
  report.replayed = replay.length;

  // The loaded session takes prompts on the new bridge.
  mark = b.mark();
  result = await withTimeout(b.prompt(sessionId, "hello again"), "prompt after load");
  assert.equal(result.stopReason, "end_turn");
  assert.equal(textOf(b.since(mark), "agent_message_chunk").join(""), "Hello from the mock agent.");
  // The first bridge, still attached, sees the other editor's prompt as a user message.
  await a.until(() => textOf(a.since(0), "user_message_chunk").includes("hello again"), "bridge-1 sees bridge-2's prompt");

  const list = await withTimeout(b.agent.request(methods.agent.session.list, { cwd: config.cwd }), "session/list");
  assert.ok(list.sessions.some((s) => s.sessionId === sessionId));

  await a.close();
  await b.close();
  return report;
}

async function kill() {
  const report = {};
  const a = new Bridge("bridge-1", ["--option", "chunkDelayS=0.04", "--option", "chunks=60"]);
  await a.initialize();
  const { sessionId } = await withTimeout(a.agent.request(methods.agent.session.new, { cwd: config.cwd, mcpServers: [] }), "session/new");
  report.sessionId = sessionId;

  // Kill the bridge mid-turn.
  const orphaned = a.prompt(sessionId, `echo ${LONG_TEXT}`);
  orphaned.catch(() => {}); // rejected when the connection dies
  await a.until(() => textOf(a.since(0), "agent_message_chunk").length >= 2, "the reply streams");
  a.process.kill("SIGKILL");
  assert.equal((await withTimeout(a.exited, "bridge-1 killed")).signal, "SIGKILL");
  report.charsBeforeKill = textOf(a.since(0), "agent_message_chunk").join("").length;

  // The daemon still runs the agent (and, unless the machine is slow, the turn).
  const info = (await daemonCall("agentSession.get", { sessionId })).session;
  assert.equal(info.phase, "running", "the agent still runs");
  report.statusAfterKill = info.status;

  // A new bridge loads the session and sees the turn through to its end.
  const b = new Bridge("bridge-2");
  await b.initialize();
  await withTimeout(b.agent.request(methods.agent.session.load, { sessionId, cwd: config.cwd, mcpServers: [] }), "session/load");
  report.replayed = b.updates.length;
  report.charsReplayed = textOf(b.since(0), "agent_message_chunk").join("").length;
  assert.deepEqual(textOf(b.since(0), "user_message_chunk"), [`echo ${LONG_TEXT}`]);
  await b.until(() => textOf(b.since(0), "agent_message_chunk").join("") === LONG_TEXT, "the whole reply, replayed then live");

  const result = await withTimeout(b.prompt(sessionId, "hello"), "prompt on the new bridge");
  assert.equal(result.stopReason, "end_turn");
  await b.close();
  return report;
}

async function permission() {
  const report = {};
  const a = new Bridge("bridge-1");
  await a.initialize();
  const { sessionId } = await withTimeout(a.agent.request(methods.agent.session.new, { cwd: config.cwd, mcpServers: [] }), "session/new");
  report.sessionId = sessionId;

  // The permission request names the agent's tool call, and that same tool call
  // then runs: one toolCallId, pending -> ... -> completed.
  const asked = [];
  a.onPermission = async ({ params }) => {
    assert.ok(a.announced.has(params.toolCall.toolCallId), "the permission's tool call was announced first");
    asked.push(params);
    return { outcome: { outcome: "selected", optionId: "accept" } };
  };
  let mark = a.mark();
  let result = await withTimeout(a.prompt(sessionId, "please approve this"), "prompt with an approval");
  assert.equal(result.stopReason, "end_turn");
  assert.equal(asked.length, 1, "one permission request");
  const approvedId = asked[0].toolCall.toolCallId;
  let tools = toolCalls(a.since(mark));
  assert.deepEqual([...tools.keys()], [approvedId], "one tool call: the one the permission asked about");
  const approved = tools.get(approvedId);
  assert.equal(approved.kind, "execute");
  assert.equal(approved.statuses[0], "pending", "asked about before it ran");
  assert.equal(approved.statuses.at(-1), "completed");
  assert.equal(textOf(a.since(mark), "agent_message_chunk").join(""), "Command approved.");
  report.approvedId = approvedId;
  report.approvalIds = [asked[0]._meta.agentsd.approvalId];

  // Denied: the same single tool call ends failed, not pending.
  asked.length = 0;
  a.onPermission = async ({ params }) => {
    asked.push(params);
    return { outcome: { outcome: "selected", optionId: "decline" } };
  };
  mark = a.mark();
  result = await withTimeout(a.prompt(sessionId, "approve this one too"), "prompt with a denial");
  assert.equal(result.stopReason, "end_turn");
  assert.equal(asked.length, 1, "one permission request");
  const deniedId = asked[0].toolCall.toolCallId;
  tools = toolCalls(a.since(mark));
  assert.deepEqual(finalStatuses(tools), [[deniedId, "failed"]], "the denied tool call ends failed");
  assert.equal(textOf(a.since(mark), "agent_message_chunk").join(""), "Command declined.");
  report.deniedId = deniedId;
  report.approvalIds.push(asked[0]._meta.agentsd.approvalId);
  const live = finalStatuses(toolCalls(a.since(0)));

  // session/load replays the same single tool calls, settled: nothing is asked again.
  const b = new Bridge("bridge-2");
  b.onPermission = async ({ params }) => assert.fail(`asked again about ${params.toolCall.toolCallId}`);
  await b.initialize();
  await withTimeout(b.agent.request(methods.agent.session.load, { sessionId, cwd: config.cwd, mcpServers: [] }), "session/load");
  const replayed = toolCalls(b.since(0));
  assert.deepEqual(finalStatuses(replayed), live, "the replay shows the tool calls seen live");
  assert.deepEqual(live, [[approvedId, "completed"], [deniedId, "failed"]]);
  assert.equal(replayed.get(approvedId).statuses[0], "pending");

  await a.close();
  await b.close();
  return report;
}

function runCli(...args) {
  return new Promise((resolve, reject) => {
    const child = spawn(config.python, ["-m", "agentsctl.cli", "--socket", config.socket, "--no-start", ...args], { stdio: "ignore" });
    child.once("error", reject);
    child.once("exit", (code) => (code === 0 ? resolve() : reject(new Error(`agentsctl ${args.join(" ")} exited ${code}`))));
  });
}

function toolHistory(updates) {
  // Each tool call's updates by id, the announcement first.
  const byId = new Map();
  for (const u of updates) {
    if (u.sessionUpdate === "tool_call") byId.set(u.toolCallId, [u]);
    else if (u.sessionUpdate === "tool_call_update") byId.get(u.toolCallId).push(u);
  }
  return byId;
}

const last = (history, field) => history.findLast((u) => field in u)?.[field];

function merged(updates) {
  // Consecutive chunks of one message as one: deltas cut text anywhere.
  const out = [];
  for (const u of updates) {
    const prev = out.at(-1);
    if (u.sessionUpdate.endsWith("_chunk") && prev?.sessionUpdate === u.sessionUpdate && prev.messageId === u.messageId) {
      prev.content = { ...prev.content, text: prev.content.text + u.content.text };
    } else {
      out.push(structuredClone(u));
    }
  }
  return out;
}

async function approveElsewhere(a, sessionId) {
  // The editor's dialog stays open until the tool call's update closes it (or the
  // SDK's $/cancel_request handling aborts it); the answer comes from the CLI.
  let closedBy = null;
  let handled;
  const closed = new Promise((resolve) => { handled = resolve; });
  a.onPermission = async ({ params, signal }) => {
    const toolCallId = params.toolCall.toolCallId;
    const mark = a.mark();
    const decision = params.options.some((o) => o.optionId === "accept") ? "accept" : "allow";
    await runCli("approve", "--decision", decision, sessionId, params._meta.agentsd.approvalId);
    const updated = a.until(() => a.since(mark).some((u) => u.toolCallId === toolCallId && u.status && u.status !== "pending"), "the tool call's update");
    await Promise.race([updated.then(() => { closedBy ??= "update"; }), waitAborted(signal).catch(() => { closedBy ??= "cancel_request"; })]);
    await updated;
    handled();
    return { outcome: { outcome: "cancelled" } };
  };
  const result = await withTimeout(a.prompt(sessionId, "Do it"), "prompt answered from the CLI");
  assert.equal(result.stopReason, "end_turn");
  // The turn may end before the CLI's process does: the dialog closes when the
  // update reaches the editor, whenever that is.
  await withTimeout(closed, "the editor's dialog closed");
  assert.ok(closedBy, "the editor's dialog was closed");
  return closedBy;
}

async function review() {
  const report = {};
  const a = new Bridge("bridge-1", ["--provider", config.provider]);
  const initialized = await withTimeout(a.agent.request(methods.agent.initialize, { protocolVersion: 0, clientCapabilities: {} }), "initialize 0");
  assert.equal(initialized.protocolVersion, 1, "an unknown version is answered with the newest spoken");
  const { sessionId } = await withTimeout(a.agent.request(methods.agent.session.new, { cwd: config.cwd, mcpServers: [] }), "session/new");
  report.session = sessionId;
  let mark = a.mark();
  if (config.provider === "codex") {
    assert.equal((await withTimeout(a.prompt(sessionId, "Edit a.py"), "edit")).stopReason, "end_turn");
    const [edit] = [...toolHistory(a.since(mark)).values()].filter((h) => h[0].kind === "edit");
    assert.equal(edit[0].title, "Edit a.py");
    assert.deepEqual(edit[0].content.filter((c) => c.type === "diff"), [
      { type: "diff", path: `${config.cwd}/a.py`, oldText: "two\nthree\nfour\n", newText: "two\nTHREE\nfour\n" },
    ]);
    assert.deepEqual(edit[0].locations, [{ path: `${config.cwd}/a.py`, line: 2 }]);
    assert.equal(last(edit, "status"), "completed");
    report.closedBy = await approveElsewhere(a, sessionId);
  } else if (config.provider === "claude") {
    assert.equal((await withTimeout(a.prompt(sessionId, "Say it"), "command")).stopReason, "end_turn");
    const [bash] = [...toolHistory(a.since(mark)).values()].filter((h) => h[0].kind === "execute");
    assert.equal(bash[0].title, "echo claude-out");
    assert.equal(last(bash, "status"), "completed");
    assert.deepEqual(last(bash, "content"), [{ type: "content", content: { type: "text", text: "claude-out" } }]);
    let asked = null;
    a.onPermission = async ({ params }) => {
      asked = params;
      return { outcome: { outcome: "selected", optionId: "Blue" } };
    };
    mark = a.mark();
    assert.equal((await withTimeout(a.prompt(sessionId, "Ask me"), "question")).stopReason, "end_turn");
    assert.deepEqual(asked.options.map((o) => [o.optionId, o.kind]), [["Red", "allow_once"], ["Blue", "allow_once"], ["decline", "reject_once"]]);
    const question = toolHistory(a.since(mark)).get(asked.toolCall.toolCallId);
    const statuses = question.filter((u) => u.status).map((u) => u.status);
    assert.equal(statuses.at(-1), "completed", "an answered question is a success");
    assert.ok(!statuses.includes("failed"));
    report.closedBy = await approveElsewhere(a, sessionId);
  } else {
    assert.equal((await withTimeout(a.prompt(sessionId, "hello"), "plan")).stopReason, "end_turn");
    const plans = a.since(mark).filter((u) => u.sessionUpdate === "plan");
    assert.deepEqual(plans, [{ sessionUpdate: "plan", entries: [{ content: "echo", priority: "medium", status: "in_progress" }] }]);
  }
  const live = merged(a.since(0).filter(historical));
  await a.close();

  // session/load replays what was shown live.
  const b = new Bridge("bridge-2");
  await b.initialize();
  await withTimeout(b.agent.request(methods.agent.session.load, { sessionId, cwd: config.cwd, mcpServers: [] }), "session/load");
  assert.deepEqual(merged(b.since(0).filter(historical)), live, "the replay shows what was shown live");
  await b.close();
  return report;
}

async function controls() {
  // A mode switch, a model switch, a slash command and an image prompt; the test
  // checks what reached the model server (test_acp_sdks.py).
  const a = new Bridge("bridge-1", ["--provider", config.provider]);
  const initialized = await a.initialize();
  assert.equal(initialized.agentCapabilities.promptCapabilities.image, true, "image prompts are advertised");
  const created = await withTimeout(a.agent.request(methods.agent.session.new, { cwd: config.cwd, mcpServers: [] }), "session/new");
  const { sessionId } = created;
  assert.ok(created.modes.availableModes.some((m) => m.id === config.mode), "the mode is offered");
  const byId = Object.fromEntries(created.configOptions.map((o) => [o.id, o]));
  assert.equal(byId.mode.currentValue, created.modes.currentModeId);
  assert.equal(byId.model.category, "model");
  const commandNames = () => {
    const lists = a.since(0).filter((u) => u.sessionUpdate === "available_commands_update");
    return lists.length ? lists.at(-1).availableCommands.map((c) => c.name) : [];
  };
  await a.until(() => commandNames().includes("compact"), "available commands");
  const prompt = (blocks, what) => withTimeout(a.agent.request(methods.agent.session.prompt, { sessionId, prompt: blocks }), what);
  assert.equal((await prompt([{ type: "text", text: "Before the switch" }], "prompt before")).stopReason, "end_turn");
  let mark = a.mark();
  await withTimeout(a.agent.request(methods.agent.session.setMode, { sessionId, modeId: config.mode }), "session/set_mode");
  await a.until(() => a.since(mark).some((u) => u.sessionUpdate === "current_mode_update" && u.currentModeId === config.mode), "current_mode_update");
  const answer = await withTimeout(a.agent.request(methods.agent.session.setConfigOption, { sessionId, configId: "model", value: config.model }), "session/set_config_option");
  const current = Object.fromEntries(answer.configOptions.map((o) => [o.id, o.currentValue]));
  assert.equal(current.mode, config.mode);
  assert.equal(current.model, config.model);
  assert.equal((await prompt([{ type: "text", text: "Use the new settings" }], "prompt")).stopReason, "end_turn");
  assert.equal((await prompt([{ type: "text", text: "/compact" }], "/compact")).stopReason, "end_turn");
  const image = { type: "image", data: config.png, mimeType: "image/png" };
  assert.equal((await prompt([{ type: "text", text: "What is this?" }, image], "image prompt")).stopReason, "end_turn");
  await a.close();
  return { session: sessionId };
}

const scenarios = { conversation, kill, permission, review, controls };

try {
  const report = await scenarios[config.scenario]();
  assert.deepEqual(sdkErrors, [], "the SDK reported no protocol errors");
  process.stdout.write(JSON.stringify(report) + "\n");
  process.exit(0);
} catch (error) {
  process.stderr.write(`driver (${config.scenario}) failed: ${error?.stack ?? error}\n`);
  for (const bridge of bridges) {
    process.stderr.write(`--- ${bridge.name} stderr:\n${bridge.stderr}\n`);
  }
  process.exit(1);
}
