"""The Neovim plugin (clients/nvim) end to end: a real headless ``nvim`` against a
real ``agentsd`` with the mock provider.

The test drives Neovim over its own msgpack-RPC socket (``--listen``): each step is
one ``nvim_exec_lua`` call into the harness ``tests/clients/nvim/lua/agents_test``,
whose waits are ``vim.wait`` with a deadline, so the plugin keeps streaming while a
step waits. A second client (``agentsctl.Client``) watches the same session.

Without ``nvim`` these tests are skipped, except under CI (``$CI`` set), where a
missing ``nvim`` is a failure: CI installs it (``apt-get install neovim``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentsctl import Client
from agentsd_protocol import methods
from agentsd_protocol.errors import AlreadyResolved, SessionNotFound
from tests.daemon_process import make_temp_dir, running_daemon
from tests.peers.agents import CODEX_RELEASES
from tests.peers.fake_openai import API_KEY_ENV, ShellCall, TextReply, running_fake_openai
from tests.peers.test_claude_prompts import tiny_png

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "clients" / "nvim"
HARNESS_DIR = Path(__file__).resolve().parent / "nvim"
NVIM = shutil.which("nvim")

WAIT_MS = 15_000  # one step inside Neovim: a mock turn takes well under a second
RPC_MARGIN_S = 10.0  # on top of the step's own wait, before the driver gives up
START_TIMEOUT_S = 10.0  # Neovim starts in ~50 ms; the machine is shared
EVENT_TIMEOUT_S = 15.0  # the watching Python client waiting for an event

pytestmark = pytest.mark.skipif(
    NVIM is None and not os.environ.get("CI"),
    reason="nvim is not installed (apt-get install neovim); under CI this fails",
)


class NvimError(Exception):
    """A Lua error raised inside Neovim (the message carries the harness's detail)."""


class Nvim:
    """A headless Neovim with the plugin and the harness on its runtimepath, driven
    over msgpack-RPC. Requests are strictly sequential; every receive has a deadline."""

    def __init__(self, base: Path) -> None:
        if NVIM is None:
            pytest.fail("nvim is not installed but $CI is set: CI must `apt-get install neovim`")
        self.address = base / "nvim.sock"
        self.log_path = base / "nvim.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSD_")}
        env.update(
            XDG_CONFIG_HOME=str(base / "nvim-config"),
            XDG_DATA_HOME=str(base / "nvim-data"),
            XDG_STATE_HOME=str(base / "nvim-state"),
            XDG_RUNTIME_DIR=str(base / "nvim-run"),
        )
        command = [
            NVIM,
            "--headless",
            "-u",
            "NONE",
            "-i",
            "NONE",
            "-n",
            "--listen",
            str(self.address),
            "--cmd",
            f"set runtimepath^={PLUGIN_DIR} runtimepath+={HARNESS_DIR}",
        ]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._next_id = 0
        self._buf = b""
        try:
            self._connect()
        except BaseException:
            self.close()
            raise

    def _connect(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"nvim exited while starting: {self.log()}")
            try:
                self.sock.connect(str(self.address))
                return
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"nvim did not listen within {START_TIMEOUT_S} s"
                    ) from None
                time.sleep(0.01)  # polling for the socket to appear, under the deadline

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(self, method: str, *args: Any, timeout_s: float) -> Any:
        self._next_id += 1
        msgid = self._next_id
        self.sock.settimeout(timeout_s)
        self.sock.sendall(msgspec.msgpack.encode([0, msgid, method, list(args)]))
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                message = msgspec.msgpack.decode(self._buf)
            except msgspec.DecodeError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"nvim did not answer {method} in {timeout_s} s") from None
                self.sock.settimeout(remaining)
                data = self.sock.recv(1 << 20)
                if not data:
                    raise AssertionError(
                        f"nvim closed its socket; its log:\n{self.log()}"
                    ) from None
                self._buf += data
                continue
            self._buf = b""
            kind, reply_id, error, result = message
            assert kind == 1 and reply_id == msgid, message
            if error is not None:
                raise NvimError(error[1] if isinstance(error, list) else str(error))
            return result

    def lua(self, code: str, *args: Any, timeout_s: float = RPC_MARGIN_S) -> Any:
        return self.request("nvim_exec_lua", code, list(args), timeout_s=timeout_s)

    def h(self, function: str, *args: Any) -> Any:
        """Call ``require('agents_test').<function>(...)``; steps that wait get
        ``WAIT_MS`` in their arguments, and the driver waits that long plus a margin."""
        return self.lua(
            f"return require('agents_test').{function}(...)",
            *args,
            timeout_s=WAIT_MS / 1000 + RPC_MARGIN_S,
        )

    def close(self) -> None:
        """Quit Neovim. The socket stays open until Neovim closes it: a notification
        still unread when its channel closes is dropped, and Neovim would not quit."""
        with contextlib.suppress(OSError):
            self.sock.settimeout(START_TIMEOUT_S)
            self.sock.sendall(msgspec.msgpack.encode([2, "nvim_command", ["qa!"]]))
            while self.sock.recv(65536):
                pass
        self.sock.close()
        try:
            self.process.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=START_TIMEOUT_S)
            raise AssertionError(f"nvim did not quit; its log:\n{self.log()}") from None


@pytest.fixture
def base() -> Iterator[Path]:
    path = make_temp_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def nvim(base: Path) -> Iterator[Nvim]:
    instance = Nvim(base)
    try:
        yield instance
    except BaseException as exc:
        exc.add_note(f"nvim log:\n{instance.log()}")
        raise
    finally:
        instance.close()


Event = dict[str, Any]


def watch(client: Client, session_id: str, *, live_only: bool = False) -> None:
    """Subscribe the Python client to the journal of ``session_id``: all of it, or
    (``live_only``) what comes after its current head."""
    params: dict[str, Any] = {"sessionId": session_id}
    if not live_only:
        params["afterSeq"] = 0
    client.call("agentSession.subscribe", params)


def events_until(client: Client, done: Callable[[Event], bool]) -> list[Event]:
    """Journal events the client receives, up to and including the first ``done`` one."""
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    events: list[Event] = []
    while True:
        remaining = deadline - time.monotonic()
        notification = client.next_notification(max(0.0, remaining))
        if notification is None:
            kinds = [e["kind"] for e in events]
            raise AssertionError(f"no matching event within {EVENT_TIMEOUT_S} s; saw {kinds}")
        if notification.method == "agentSession.event":
            event = notification.decode(dict[str, Any])["event"]
            events.append(event)
            if done(event):
                return events


def turn_completed(event: Event) -> bool:
    return bool(event["kind"] == "turn.completed")


def agent_texts(events: list[Event]) -> list[str]:
    return [
        e["body"]["text"]
        for e in events
        if e["kind"] == "item.completed" and e["body"].get("type") == "agentMessage"
    ]


def test_nvim_streams_a_session_and_answers_its_approval(nvim: Nvim) -> None:
    with running_daemon() as daemon, Client(daemon.socket) as watcher:
        nvim.h("setup", str(daemon.socket))
        # Slow chunks, so the stream is seen growing in the buffer.
        options = {"chunks": 8, "chunkDelayS": 0.04}
        session_id = nvim.h("new_session", "mock", options, WAIT_MS)
        watch(watcher, session_id)

        nvim.h("record_stream", session_id)
        reply = "streamed from the mock agent into a Neovim buffer"
        nvim.h("cmd", f"AgentsSend echo {reply}")
        nvim.h("wait_line", session_id, reply, WAIT_MS)
        partial = [s for s in nvim.h("seen_lines", session_id) if s and reply.startswith(s)]
        assert any(s != reply for s in partial), f"the reply never showed partly: {partial}"
        first_turn = events_until(watcher, turn_completed)
        assert agent_texts(first_turn) == [reply]

        nvim.h("cmd", "AgentsSend please approve the command")
        approval_id = nvim.h("wait_approval", session_id, WAIT_MS)
        nvim.h("press", session_id, "a")  # the buffer-local keymap
        nvim.h("wait_line", session_id, "  -> accept (by client)", WAIT_MS)
        nvim.h("wait_line", session_id, "Command approved.", WAIT_MS)
        nvim.h("wait_line", session_id, "[tool] shell: ls -la (completed)", WAIT_MS)
        nvim.h("wait_idle", session_id, WAIT_MS)

        # The second client saw the same approval, resolved by Neovim, and the same text.
        second_turn = events_until(watcher, turn_completed)
        requested = [e["body"] for e in second_turn if e["kind"] == "approval.requested"]
        resolved = [e["body"] for e in second_turn if e["kind"] == "approval.resolved"]
        assert [r["approvalId"] for r in requested] == [approval_id]
        assert resolved == [{"approvalId": approval_id, "decision": "accept", "by": "client"}]
        assert agent_texts(second_turn) == ["Command approved."]
        assert nvim.h("messages", session_id) == [reply, "Command approved."]
        with pytest.raises(AlreadyResolved):
            watcher.call(
                "agentSession.respond",
                {"sessionId": session_id, "approvalId": approval_id, "decision": "decline"},
            )


def test_nvim_catches_up_after_the_daemon_restarts(nvim: Nvim, base: Path) -> None:
    state_dir = base / "state"
    socket_path = base / "run" / "agentsd.sock"
    with running_daemon(state_dir=state_dir, socket_path=socket_path):
        nvim.h("setup", str(socket_path))
        session_id = nvim.h("new_session", "mock", None, WAIT_MS)
        nvim.h("cmd", "AgentsSend echo before the restart")
        nvim.h("wait_line", session_id, "before the restart", WAIT_MS)
        nvim.h("wait_idle", session_id, WAIT_MS)
    nvim.h("wait_follow_state", session_id, "idle", WAIT_MS)

    # While Neovim cannot reach it (another socket), the session moves on.
    with running_daemon(state_dir=state_dir) as elsewhere, Client(elsewhere.socket) as other:
        watch(other, session_id, live_only=True)  # the turn before the restart is over
        other.call("agentSession.send", {"sessionId": session_id, "text": "echo while away"})
        events_until(other, turn_completed)

    # Back on the socket Neovim knows: it reconnects, resubscribes after its last
    # seq, and the buffer catches up from the journal, then follows live.
    with running_daemon(state_dir=state_dir, socket_path=socket_path) as daemon:
        nvim.h("wait_line", session_id, "while away", WAIT_MS)
        nvim.h("wait_follow_state", session_id, "live", WAIT_MS)
        with Client(daemon.socket) as other:
            other.call("agentSession.send", {"sessionId": session_id, "text": "echo after"})
        nvim.h("wait_line", session_id, "after", WAIT_MS)
        nvim.h("wait_idle", session_id, WAIT_MS)
        # Nothing was shown twice.
        nvim.h("wait_text", session_id, "> echo before the restart", WAIT_MS, 1)
        nvim.h("wait_text", session_id, "> echo while away", WAIT_MS, 1)
        assert nvim.h("messages", session_id) == ["before the restart", "while away", "after"]
        lines = nvim.h("lines", session_id)
        assert any(line.startswith("[agent exited: ") for line in lines), lines


def test_nvim_resubscribes_after_lagging(nvim: Nvim) -> None:
    flood = 12_000  # one-character deltas: twice what the daemon and the kernel buffer for nvim
    with running_daemon() as daemon, Client(daemon.socket) as watcher:
        nvim.h("setup", str(daemon.socket))
        session_id = nvim.h("new_session", "mock", {"floodStdout": flood}, WAIT_MS)
        nvim.h("count_lagged", session_id)
        watch(watcher, session_id)
        nvim.h("pause_reading")  # a stuck editor: the daemon's queue for it overflows
        watcher.call("agentSession.send", {"sessionId": session_id, "text": "echo flooded"})
        events = events_until(watcher, turn_completed)
        nvim.h("resume_reading")
        final = agent_texts(events)
        assert final == ["." * flood + "flooded"]
        nvim.h("wait_seq", session_id, events[-1]["seq"], WAIT_MS)
        assert nvim.h("messages", session_id) == final
        state = nvim.h("follow_state", session_id)
        # Caught up through agentSession.lagged and a resubscribe (not a reconnect:
        # the daemon must tell a slow subscriber, not drop its connection).
        assert state["lagged"] >= 1, f"the daemon sent no agentSession.lagged: {state}"
        assert state["disconnects"] == 0, f"nvim lost its connection instead: {state}"
        assert state["state"] == "live", state


def test_nvim_ends_the_buffer_when_the_session_is_deleted(nvim: Nvim) -> None:
    with running_daemon() as daemon:
        nvim.h("setup", str(daemon.socket))
        session_id = nvim.h("new_session", "mock", None, WAIT_MS)
        nvim.h("cmd", "AgentsSend echo before the deletion")
        nvim.h("wait_line", session_id, "before the deletion", WAIT_MS)
        nvim.h("wait_idle", session_id, WAIT_MS)
        with Client(daemon.socket) as other:
            other.call("agentSession.delete", {"sessionId": session_id})
        nvim.h("wait_line", session_id, "[session deleted (reason: deleted)]", WAIT_MS)
        state = nvim.h("follow_state", session_id)
        assert state["state"] == "stopped", state
        assert state["ended"] is True and state["ended_reason"] == "deleted", state
        assert state["status"] == "session deleted", state
        assert not state["held"], f"the client still reconnects for the session: {state}"
        # Attaching again shows the ended buffer; it does not follow a deleted session.
        nvim.h("cmd", f"AgentsAttach {session_id}")
        assert nvim.h("current_buffer_session") == session_id
        assert nvim.h("follow_state", session_id)["state"] == "stopped"
        # The title (taken from the first prompt), the prompt and the reply.
        nvim.h("wait_text", session_id, "before the deletion", WAIT_MS, 3)
        nvim.h("wait_text", session_id, "[session deleted", WAIT_MS, 1)


def test_nvim_ends_the_buffer_of_a_session_deleted_while_away(nvim: Nvim) -> None:
    with running_daemon() as daemon:
        nvim.h("setup", str(daemon.socket))
        session_id = nvim.h("new_session", "mock", None, WAIT_MS)
        nvim.lua("require('agents').disconnect()")
        with Client(daemon.socket) as other:
            other.call("agentSession.delete", {"sessionId": session_id})
        nvim.h("cmd", f"AgentsAttach {session_id}")  # resubscribes: session_not_found
        nvim.h("wait_line", session_id, "[the session no longer exists]", WAIT_MS)
        state = nvim.h("follow_state", session_id)
        assert state["state"] == "stopped" and not state["held"], state
        assert state["ended"] is True and state["ended_reason"] == "session_not_found", state


def test_checkhealth_reports_the_socket_and_the_daemon(nvim: Nvim, base: Path) -> None:
    missing = base / "missing.sock"
    nvim.h("setup", str(missing))
    report = "\n".join(nvim.h("checkhealth"))
    assert str(missing) in report
    assert "ERROR" in report and "does not exist" in report, report

    with running_daemon() as daemon, Client(daemon.socket) as client:
        version = client.call(methods.STATUS).version
        nvim.h("setup", str(daemon.socket))
        report = "\n".join(nvim.h("checkhealth"))
    assert f"socket: {daemon.socket}" in report, report
    assert "the socket exists" in report, report
    assert f"agentsd {version} is running" in report, report
    assert "ERROR" not in report, report


def test_nvim_commands_list_interrupt_close_and_errors(nvim: Nvim, base: Path) -> None:
    globals_before = nvim.h("globals")
    with running_daemon() as daemon:
        nvim.h("setup", str(daemon.socket))
        session_id = nvim.h("new_session", None, None, WAIT_MS)  # :AgentsNew, default provider
        assert nvim.h("follow_state", session_id)["state"] == "live"

        # :AgentsList shows the sessions with vim.ui.select; picking one attaches.
        nvim.lua("vim.cmd('enew')")
        nvim.h("stub_select", session_id)
        nvim.h("cmd", "AgentsList")
        nvim.lua(
            "assert(vim.wait(...,function() return vim.b.agents_session_id ~= nil end, 10))",
            WAIT_MS,
        )
        assert nvim.h("current_buffer_session") == session_id
        shown = nvim.lua("return require('agents_test').selected")
        assert len(shown) == 1 and shown[0].startswith(session_id) and "mock" in shown[0], shown

        # An approval keeps the turn running; :AgentsInterrupt ends it.
        nvim.h("stub_input", "please approve")
        nvim.h("press", session_id, "i")  # the send keymap asks with vim.ui.input
        nvim.h("wait_approval", session_id, WAIT_MS)
        nvim.h("cmd", "AgentsInterrupt")
        nvim.h("wait_line", session_id, "[turn interrupted]", WAIT_MS)
        nvim.h("wait_idle", session_id, WAIT_MS)

        nvim.h("cmd", "AgentsClose")
        nvim.h("wait_line", session_id, "[agent exited: requested]", WAIT_MS)
        nvim.h("wait_notification", f"closed session {session_id}", WAIT_MS)

        # Errors are notified with the daemon's data.kind.
        nvim.h("cmd", "AgentsNew no-such-provider")
        nvim.h("wait_notification", "[unknown_provider]", WAIT_MS)
        nvim.h("cmd", "AgentsSend hello")  # the closed session starts again on send
        nvim.h("wait_line", session_id, "Hello from the mock agent.", WAIT_MS)
        nvim.lua("require('agents').send('hi', 'no-such-session')")
        nvim.h("wait_notification", "[session_not_found]", WAIT_MS)

        # After a deliberate disconnect, attaching resumes the buffer where it was.
        nvim.lua("require('agents').disconnect()")
        nvim.h("cmd", f"AgentsAttach {session_id}")
        nvim.h("wait_follow_state", session_id, "live", WAIT_MS)
        nvim.h("cmd", "AgentsSend echo once more")
        nvim.h("wait_line", session_id, "once more", WAIT_MS)
        nvim.h("wait_text", session_id, "Hello from the mock agent.", WAIT_MS, 1)

    # The daemon is gone: a new request fails at once, saying so.
    nvim.lua("require('agents').send('hi', 'whatever')")
    nvim.h("wait_notification", "[daemon_unreachable]", WAIT_MS)
    leaked = set(nvim.h("globals")) - set(globals_before)
    assert not leaked, f"globals leaked: {sorted(leaked)}"


def test_nvim_plugin_units(nvim: Nvim) -> None:
    failures = nvim.lua("return require('agents_test.unit').run()")
    assert failures == [], "\n".join(failures)


def test_nvim_answers_a_question_with_one_of_its_labels(nvim: Nvim) -> None:
    """A question's options are the agent's labels: the accept key opens the chooser
    on them, and the decline key answers ``decline``, never a label like ``No``."""
    with running_daemon() as daemon, Client(daemon.socket) as watcher:
        nvim.h("setup", str(daemon.socket))
        session_id = nvim.h("new_session", "mock", {}, WAIT_MS)
        watch(watcher, session_id)

        nvim.h("cmd", "AgentsSend please ask me")
        nvim.h("wait_approval", session_id, WAIT_MS)
        nvim.h("stub_select", "Blue")
        nvim.h("press", session_id, "a")
        assert nvim.lua("return require('agents_test').selected") == ["Red", "Blue", "decline"]
        nvim.h("wait_line", session_id, "You chose Blue.", WAIT_MS)
        nvim.h("wait_idle", session_id, WAIT_MS)

        nvim.h("cmd", "AgentsSend ask again")
        approval_id = nvim.h("wait_approval", session_id, WAIT_MS)
        nvim.h("press", session_id, "d")
        nvim.h("wait_line", session_id, "You declined to answer.", WAIT_MS)
        turns = events_until(watcher, turn_completed) + events_until(watcher, turn_completed)
        resolved = [e["body"] for e in turns if e["kind"] == "approval.resolved"]
        assert [r["decision"] for r in resolved] == ["Blue", "decline"]
        assert resolved[1]["approvalId"] == approval_id


# -- editing prompts, reviewing, picking (issue: editors see the whole conversation) --


def submissions(events: list[Event]) -> list[str]:
    return [e["body"]["text"] for e in events if e["kind"] == "submission"]


def test_nvim_attaching_an_unknown_id_is_an_error_not_a_buffer(nvim: Nvim) -> None:
    with running_daemon() as daemon:
        nvim.h("setup", str(daemon.socket))
        nvim.h("cmd", "AgentsAttach no-such-session")
        nvim.h("wait_notification", "[session_not_found]", WAIT_MS)
        assert nvim.h("buffers_named", "agents://") == []


def test_nvim_offers_the_providers_the_daemon_knows(nvim: Nvim) -> None:
    with running_daemon() as daemon:
        nvim.h("setup", str(daemon.socket))
        offered = nvim.h("completions", "AgentsNew ")
        assert {"mock", "codex", "claude"} <= set(offered), offered
        assert "acp" not in offered, "no provider of that name exists"
        assert nvim.h("completions", "AgentsNew co") == ["codex"] + [
            p for p in offered if p.startswith("co") and p != "codex"
        ]


def test_nvim_help_works_without_running_helptags(nvim: Nvim, base: Path) -> None:
    nvim.h("cmd", "help agents")
    assert nvim.lua("return vim.fn.expand('%:t')") == "agents.txt"
    assert nvim.lua("return vim.bo.filetype") == "help"
    nvim.h("cmd", "help :AgentsPrompt")
    assert "*:AgentsPrompt*" in nvim.lua("return vim.api.nvim_get_current_line()")
    # The shipped tags are what :helptags makes of the shipped doc (not stale).
    fresh = base / "doc"
    shutil.copytree(PLUGIN_DIR / "doc", fresh)
    (fresh / "tags").unlink()
    nvim.lua("vim.cmd('helptags ' .. vim.fn.fnameescape(...))", str(fresh))
    assert (fresh / "tags").read_text() == (PLUGIN_DIR / "doc" / "tags").read_text()


def test_nvim_sends_a_range_and_a_multiline_prompt_with_context(nvim: Nvim, base: Path) -> None:
    with running_daemon() as daemon, Client(daemon.socket) as watcher:
        nvim.h("setup", str(daemon.socket))
        session_id = nvim.h("new_session", "mock", {}, WAIT_MS)
        watch(watcher, session_id)
        notes = base / "notes.py"
        nvim.h("edit_file", str(notes), ["a = 1", "b = 2", "c = 3"])

        nvim.h("cmd", "2,3AgentsSend echo look")
        block = f'<context uri="file://{notes}" lines="2-3">\nb = 2\nc = 3\n</context>'
        assert submissions(events_until(watcher, turn_completed)) == [f"echo look\n\n{block}"]
        nvim.h("wait_line", session_id, "look", WAIT_MS)

        # The prompt buffer: several lines, #buffer names the file it was opened from.
        nvim.h("cmd", "AgentsPrompt")
        assert nvim.lua("return vim.fn.expand('%')") == f"agents-prompt://{session_id}"
        nvim.h("set_lines", ["echo two lines", "and #buffer"])
        nvim.h("cmd", "write")
        whole = f'<context uri="file://{notes}">\na = 1\nb = 2\nc = 3\n</context>'
        sent = submissions(events_until(watcher, turn_completed))
        assert sent == [f"echo two lines\nand the buffer {notes}\n\n{whole}"]
        assert nvim.h("current_lines") == [""], "the prompt buffer is emptied once sent"
        nvim.h("wait_line", session_id, "> and the buffer " + str(notes), WAIT_MS)


def test_nvim_shows_a_reply_after_a_prompt_sent_mid_turn(nvim: Nvim) -> None:
    with running_daemon() as daemon, Client(daemon.socket) as watcher:
        nvim.h("setup", str(daemon.socket))
        session_id = nvim.h("new_session", "mock", {"chunks": 30, "chunkDelayS": 0.05}, WAIT_MS)
        watch(watcher, session_id)
        words = " ".join(f"w{i}" for i in range(30))
        nvim.h("cmd", f"AgentsSend echo {words}")
        nvim.h("wait_streaming", session_id, WAIT_MS)
        nvim.h("cmd", "AgentsSend echo second")
        nvim.h("wait_idle", session_id, WAIT_MS)
        [reply] = agent_texts(events_until(watcher, turn_completed))
        assert reply == f"{words} second", "the mock answers a steering prompt in its turn"
        first, rest = nvim.h("messages", session_id)
        assert first + rest == reply and first and rest.endswith("second")
        lines = nvim.h("wait_line", session_id, rest.split("\n")[-1], WAIT_MS)
        prompt = nvim.h("line_index", session_id, "> echo second")
        assert prompt < lines.index(rest.split("\n")[-1]), "the rest comes after the prompt"
        assert lines.index(first.split("\n")[0]) < prompt


def test_nvim_deletes_a_session(nvim: Nvim) -> None:
    with running_daemon() as daemon, Client(daemon.socket) as other:
        nvim.h("setup", str(daemon.socket))
        session_id = nvim.h("new_session", "mock", {}, WAIT_MS)
        nvim.h("stub_select", "Keep")
        nvim.h("cmd", "AgentsDelete")
        assert nvim.lua("return require('agents_test').selected") == ["Delete", "Keep"]
        assert other.call("agentSession.get", {"sessionId": session_id})["session"]
        nvim.h("stub_select", "Delete")
        nvim.h("cmd", "AgentsDelete")
        nvim.h("wait_notification", f"deleted session {session_id}", WAIT_MS)
        with pytest.raises(SessionNotFound):
            other.call("agentSession.get", {"sessionId": session_id})
        nvim.h("wait_line", session_id, "[session deleted (reason: deleted)]", WAIT_MS)


def test_nvim_statusline_and_sessions_picker_show_the_summaries(nvim: Nvim) -> None:
    with running_daemon() as daemon, Client(daemon.socket) as other:
        nvim.h("setup", str(daemon.socket))
        calm = nvim.h("new_session", "mock", {}, WAIT_MS)
        asking = nvim.h("new_session", "mock", {}, WAIT_MS)
        nvim.h("cmd", "AgentsSend please approve the command")
        nvim.h("wait_approval", asking, WAIT_MS)
        nvim.h("cmd", f"AgentsAttach {calm}")
        assert nvim.h("wait_statusline", "1 needs you", WAIT_MS).startswith("agents: ")
        # The other client sees the same: one session waits on an approval.
        states = {s["sessionId"]: s for s in other.call("agentSession.watch", {})["sessions"]}
        assert states[asking]["state"] == "attention" and states[calm]["state"] == "idle"

        nvim.h("stub_select", asking)
        nvim.h("cmd", "AgentsSessions")
        shown = nvim.lua("return require('agents_test').selected")
        assert asking in shown[0] and "[approve: Run `ls -la`]" in shown[0], shown
        assert calm in shown[1]
        nvim.h("wait_current_session", asking, WAIT_MS)
        assert nvim.h("wait_statusline", "^agents: approve: Run", WAIT_MS)

        approval_id = states[asking]["approvals"][0]["approvalId"]
        answer = {"sessionId": asking, "approvalId": approval_id, "decision": "accept"}
        other.call("agentSession.respond", answer)
        nvim.h("wait_statusline", "^agents: idle", WAIT_MS)


def test_nvim_reviews_a_codex_edit_in_a_diff(nvim: Nvim, base: Path) -> None:
    """The real codex edits a file (against the fake model server); ``gd`` on its
    tool line opens the edit's old and new text side by side in diff mode."""
    work = base / "work"
    work.mkdir()
    (work / "a.py").write_text("one\ntwo\nthree\nfour\n")
    patch = (
        "apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: a.py\n@@\n two\n-three\n"
        "+THREE\n four\n*** End Patch\nEOF"
    )
    with running_fake_openai(ShellCall(patch, escalate=False), TextReply("Edited.")) as fake:
        codex_home = fake.write_codex_home(base / "codex-home")
        env = {"CODEX_HOME": str(codex_home), API_KEY_ENV: "dummy"}
        config = base / "config.toml"
        codex = next(r for r in CODEX_RELEASES if r.newest).command()
        config.write_text(
            f'agent_env = "inherit"\n[providers.codex]\ncommand = {json.dumps(codex)}\n'
        )
        with (
            running_daemon(extra_args=["--config", str(config)], env=env) as daemon,
            Client(daemon.socket) as watcher,
        ):
            nvim.h("setup", str(daemon.socket))
            nvim.lua("vim.cmd('cd ' .. vim.fn.fnameescape(...))", str(work))
            session_id = nvim.h("new_session", "codex", {}, WAIT_MS)
            watch(watcher, session_id)
            nvim.h("cmd", "AgentsSend Edit a.py")
            events = events_until(watcher, turn_completed)
            [edit] = [
                e["body"]
                for e in events
                if e["kind"] == "item.completed" and e["body"]["type"] == "fileChange"
            ]
            nvim.h("wait_line", session_id, f"[edit] {work / 'a.py'} (completed)", WAIT_MS)
            nvim.h("press_on", session_id, "[edit]", "gd")
            before, after = nvim.h("tab_windows")
            assert before["diff"] and after["diff"]
            assert before["lines"] == ["two", "three", "four"]
            assert after["lines"] == ["two", "THREE", "four"]
            assert before["name"].endswith(f"{edit['itemId']}/before")
            assert (work / "a.py").read_text() == "one\ntwo\nTHREE\nfour\n"


def test_nvim_marks_seen_what_a_window_shows(nvim: Nvim) -> None:
    """A session finishing a turn in a window is seen; one finishing hidden stays
    unseen (for every client) until its buffer is shown."""
    with running_daemon() as daemon, Client(daemon.socket) as other:
        nvim.h("setup", str(daemon.socket))
        hidden = nvim.h("new_session", "mock", {}, WAIT_MS)
        shown = nvim.h("new_session", "mock", {}, WAIT_MS)  # replaces hidden in the window
        watch(other, hidden)
        watch(other, shown)
        for session_id in (hidden, shown):
            other.call("agentSession.send", {"sessionId": session_id, "text": "echo done"})
        events_until(other, turn_completed)
        events_until(other, turn_completed)
        nvim.h("wait_unseen", hidden, True, WAIT_MS)
        nvim.h("wait_unseen", shown, False, WAIT_MS)
        assert nvim.h("wait_statusline", "^agents: idle | 1 unseen$", WAIT_MS)
        states = {s["sessionId"]: s for s in other.call("agentSession.watch", {})["sessions"]}
        assert states[hidden]["unseen"] is True
        assert states[shown]["unseen"] is False
        nvim.h("cmd", f"AgentsAttach {hidden}")
        nvim.h("wait_statusline", "^agents: idle$", WAIT_MS)
        states = {s["sessionId"]: s for s in other.call("agentSession.watch", {})["sessions"]}
        assert not states[hidden]["unseen"] and not states[shown]["unseen"]


def test_nvim_picks_a_model_runs_commands_and_sends_an_image(nvim: Nvim, base: Path) -> None:
    """``:AgentsModel`` and ``:AgentsCommand`` pick from what the daemon lists;
    ``:AgentsCompact`` compacts; ``@shot.png`` goes as an image. The Python client
    sees each reach the same session."""
    shot = base / "shot.png"
    shot.write_bytes(tiny_png(3, 3))
    with running_daemon() as daemon, Client(daemon.socket) as watcher:
        nvim.h("setup", str(daemon.socket))
        session_id = nvim.h("new_session", "mock", {}, WAIT_MS)
        watch(watcher, session_id, live_only=True)

        nvim.h("stub_select", "mock-deep")
        nvim.h("cmd", "AgentsModel")
        assert nvim.h("wait_selected", WAIT_MS) == ["* mock-fast", "  mock-deep"]
        nvim.h("wait_notification", "model mock-deep (model: ", WAIT_MS)
        options = watcher.call("agentSession.get", {"sessionId": session_id})["session"]["options"]
        assert options["model"] == "mock-deep"
        nvim.h("cmd", "AgentsSend which model")
        assert agent_texts(events_until(watcher, turn_completed)) == ["I am mock-deep."]

        # The command picker lists agentsd's commands and the agent's; a hint asks for args.
        nvim.h("stub_select", "/greet")
        nvim.h("stub_input", "Ada")
        nvim.h("cmd", "AgentsCommand")
        shown = nvim.h("wait_selected", WAIT_MS)
        assert [line.split()[0] for line in shown] == ["/compact", "/clear", "/greet"]
        events = events_until(watcher, turn_completed)
        assert [
            (e["body"]["name"], e["body"].get("args")) for e in events if e["kind"] == "command.run"
        ] == [("greet", "Ada")]
        assert agent_texts(events) == ["Hello, Ada!"]
        nvim.h("wait_line", session_id, "[/greet Ada]", WAIT_MS)

        nvim.h("cmd", "AgentsCompact")
        events = events_until(watcher, turn_completed)
        assert [e["body"]["name"] for e in events if e["kind"] == "command.run"] == ["compact"]
        assert not submissions(events), "a command is not a prompt"
        nvim.h("cmd", "AgentsCommand /nosuch")
        nvim.h("wait_notification", "[unknown_command]", WAIT_MS)

        # An image by its path: the daemon reads the bytes, the mock records them.
        nvim.lua("vim.cmd('cd ' .. vim.fn.fnameescape(...))", str(base))
        nvim.h("cmd", "AgentsSend echo see @shot.png")
        events = events_until(watcher, turn_completed)
        [submission] = [e["body"] for e in events if e["kind"] == "submission"]
        assert submission["text"] == "echo see shot.png"
        assert [a["type"] for a in submission["attachments"]] == ["image"]
        digest = hashlib.sha256(tiny_png(3, 3)).hexdigest()
        assert f"[image image/png {digest}" in agent_texts(events)[0]


def test_nvim_picks_a_codex_mode_preset(nvim: Nvim, base: Path) -> None:
    """``:AgentsMode`` offers Codex's presets with the current one marked; the
    choice sets approvalPolicy and sandbox, as another client sees."""
    config = base / "config.toml"
    codex = next(r for r in CODEX_RELEASES if r.newest).command()
    config.write_text(f"[providers.codex]\ncommand = {json.dumps(codex)}\n")
    with (
        running_daemon(extra_args=["--config", str(config)]) as daemon,
        Client(daemon.socket) as other,
    ):
        session_id = other.call("agentSession.create", {"provider": "codex", "cwd": str(base)})[
            "sessionId"
        ]
        nvim.h("setup", str(daemon.socket))
        nvim.h("cmd", f"AgentsAttach {session_id}")
        nvim.h("wait_current_session", session_id, WAIT_MS)
        nvim.h("stub_select", "full-access")
        nvim.h("cmd", "AgentsMode")
        shown = nvim.h("wait_selected", WAIT_MS)
        assert shown == ["  read-only", "* auto", "  full-access"]
        nvim.h("wait_notification", "mode full-access", WAIT_MS)
        options = other.call("agentSession.get", {"sessionId": session_id})["session"]["options"]
        assert (options["approvalPolicy"], options["sandbox"]) == ("never", "danger-full-access")
        nvim.h("stub_select", "read-only")
        nvim.h("cmd", "AgentsMode")
        assert nvim.h("wait_selected", WAIT_MS)[2] == "* full-access"
        nvim.h("cmd", "AgentsMode nosuch")
        nvim.h("wait_notification", "no mode nosuch", WAIT_MS)


def test_nvim_shows_imported_history_a_continuation_and_the_context(nvim: Nvim) -> None:
    """Rendering (unit): imported messages as the conversation, the daemon's
    continuation as a note rather than a prompt of the user's; the statusline's
    context part from a session's token counts."""
    lines = nvim.lua(
        """
        local T = require('agents.transcript').new('s1', {})
        local n = 0
        local function ev(kind, body)
          n = n + 1
          T:apply({ seq = n, kind = kind, body = body })
        end
        ev('message.imported', { role = 'user', text = 'fix the bug' })
        ev('message.imported', { role = 'assistant', text = 'Fixed it.' })
        ev('submission', { clientMessageId = 'm1', text = 'Continue.', continuesSeq = 7 })
        return T:lines()
        """
    )
    status = "require('agents.status').context(...)"
    assert (
        nvim.lua(f"return {status}", {"tokens": {"contextWindow": 1000, "contextTokens": 420}})
        == "ctx 42%"
    )
    assert nvim.lua(f"return {status}", {"tokens": {"turnTokens": 77}}) == "77 tok"
    assert nvim.lua(f"return {status}", {}) is None
    text = "\n".join(lines)
    assert "> fix the bug" in lines and "Fixed it." in lines, lines
    assert "> Continue." not in lines and "cut off at #7" in text, lines
