"""A minimal ACP agent for the tests, that misbehaves on request (stdlib only, so it
starts in milliseconds).

Started as ``python acp_test_agent.py [--hang-init] [--no-load] [--auth] [--forget]
[--images]`` (``--auth``: ``session/new`` needs a login first; ``--forget``:
``session/load`` knows no session; ``--images``: its prompts take images, which it
echoes as ``[image MIME SHA256 LENGTH]``, as it echoes a ``resource_link`` as
``[link URI]``). A prompt's text
chooses what the turn does:

- ``permission``: asks for permission and reports the outcome it got;
- ``slow``: streams words until cancelled, then ends ``cancelled``;
- ``late-permission``: like ``slow``, and after the cancel streams words, then asks
  for permission (in that order: everything late is written before the request
  whose refusal a test waits for, so none of it can land in the next turn);
- ``malformed``: sends malformed updates, then a good chunk;
- ``exit``: streams a chunk and exits mid-turn;
- ``requests``: asks ``fs/read_text_file`` and ``x/unknown`` and reports the answers;
- ``capabilities``: reports the ``clientCapabilities`` its ``initialize`` carried;
- ``tool``: a tool call with a diff and text content, completed;
- ``switch``: switches itself to mode ``code``; ``whatmode``: says its mode;
- anything else: echoes the prompt, with a thought and a plan first."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

SESSIONS: dict[str, list[str]] = {}
CLIENT_CAPABILITIES: list[Any] = []  # as the client's initialize offered them
MODES: dict[str, str] = {}
NEXT_ID = [100]


def write(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def read() -> dict[str, Any]:
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    message: dict[str, Any] = json.loads(line)
    return message


def update(session_id: str, body: dict[str, Any]) -> None:
    write({"method": "session/update", "params": {"sessionId": session_id, "update": body}})


def chunk(session_id: str, text: str, kind: str = "agent_message_chunk") -> None:
    update(session_id, {"sessionUpdate": kind, "content": {"type": "text", "text": text}})


def request(method: str, params: dict[str, Any], cancelled: list[bool]) -> dict[str, Any]:
    """Send a request and read until its response; a cancel on the way is noted."""
    NEXT_ID[0] += 1
    request_id = NEXT_ID[0]
    write({"id": request_id, "method": method, "params": params})
    while True:
        message = read()
        if message.get("method") == "session/cancel":
            cancelled[0] = True
        elif message.get("id") == request_id and "method" not in message:
            return message


def ask_permission(session_id: str, cancelled: list[bool]) -> dict[str, Any]:
    return request(
        "session/request_permission",
        {
            "sessionId": session_id,
            "toolCall": {"toolCallId": "call-1", "title": "Run ls", "kind": "execute"},
            "options": [
                {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                {"optionId": "no", "name": "Reject", "kind": "reject_once"},
            ],
        },
        cancelled,
    )


def stream_until_cancelled(session_id: str, cancelled: list[bool]) -> None:
    """Words every 20 ms until a ``session/cancel`` arrives."""
    import select

    while not cancelled[0]:
        chunk(session_id, "word ")
        ready, _, _ = select.select([sys.stdin], [], [], 0.02)
        if ready:
            message = read()
            if message.get("method") == "session/cancel":
                cancelled[0] = True


def prompt(request_id: Any, params: dict[str, Any]) -> None:
    session_id = params["sessionId"]
    text = "".join(b.get("text", "") for b in params["prompt"])
    SESSIONS.setdefault(session_id, []).append(text)
    cancelled = [False]
    stop = "end_turn"
    if text == "permission":
        answer = ask_permission(session_id, cancelled)
        chunk(session_id, f"outcome: {json.dumps(answer['result']['outcome'])}")
    elif text == "slow":
        stream_until_cancelled(session_id, cancelled)
        stop = "cancelled"
    elif text == "late-permission":
        stream_until_cancelled(session_id, cancelled)
        write({"id": request_id, "result": {"stopReason": "cancelled"}})
        chunk(session_id, "late outcome: words after the turn ended")
        ask_permission(session_id, cancelled)
        return
    elif text == "malformed":
        write({"method": "session/update", "params": {"sessionId": session_id, "update": 7}})
        update(session_id, {"sessionUpdate": "agent_message_chunk", "content": {"type": 3}})
        update(session_id, {"sessionUpdate": "tool_call"})
        sys.stdout.write("this is not json\n")
        chunk(session_id, "still here")
    elif text == "exit":
        chunk(session_id, "going away")
        time.sleep(0.05)
        os._exit(3)
    elif text == "requests":
        read_answer = request(
            "fs/read_text_file", {"sessionId": session_id, "path": "/x"}, cancelled
        )
        unknown = request("x/unknown", {}, cancelled)
        chunk(session_id, json.dumps([read_answer["error"]["code"], unknown["error"]["code"]]))
    elif text == "capabilities":
        chunk(session_id, json.dumps(CLIENT_CAPABILITIES[0], sort_keys=True))
    elif text == "switch":
        MODES[session_id] = "code"
        update(session_id, {"sessionUpdate": "current_mode_update", "currentModeId": "code"})
    elif text == "whatmode":
        chunk(session_id, f"mode: {MODES[session_id]}")
    elif text == "tool":
        update(
            session_id,
            {
                "sessionUpdate": "tool_call",
                "toolCallId": "t1",
                "title": "Edit a.txt",
                "kind": "edit",
                "status": "pending",
                "locations": [{"path": "/w/a.txt", "line": 1}],
                "rawInput": {"path": "/w/a.txt"},
            },
        )
        update(
            session_id,
            {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "in_progress"},
        )
        update(
            session_id,
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": "t1",
                "status": "completed",
                "content": [
                    {"type": "diff", "path": "/w/a.txt", "oldText": "a\n", "newText": "b\n"},
                    {"type": "content", "content": {"type": "text", "text": "edited"}},
                ],
            },
        )
    else:
        chunk(session_id, "thinking", "agent_thought_chunk")
        update(
            session_id,
            {
                "sessionUpdate": "plan",
                "entries": [{"content": "echo", "priority": "high", "status": "in_progress"}],
            },
        )
        chunk(session_id, "echo: ")
        chunk(session_id, text + "".join(describe(b) for b in params["prompt"]))
    write({"id": request_id, "result": {"stopReason": "cancelled" if cancelled[0] else stop}})


def describe(block: dict[str, Any]) -> str:
    """What the echo says of a prompt block other than text."""
    if block.get("type") == "image":
        import base64
        import hashlib

        data = base64.b64decode(block.get("data", ""))
        return f" [image {block.get('mimeType')} {hashlib.sha256(data).hexdigest()} {len(data)}]"
    if block.get("type") == "resource_link":
        return f" [link {block.get('uri')}]"
    return ""


def main() -> None:
    hang_init = "--hang-init" in sys.argv
    can_load = "--no-load" not in sys.argv
    needs_auth = "--auth" in sys.argv
    forgets = "--forget" in sys.argv
    while True:
        message = read()
        method, request_id = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if method == "initialize":
            if hang_init:
                continue
            CLIENT_CAPABILITIES.append(params.get("clientCapabilities"))
            write(
                {
                    "id": request_id,
                    "result": {
                        "protocolVersion": 1,
                        "agentCapabilities": {
                            "loadSession": can_load,
                            "promptCapabilities": {"image": "--images" in sys.argv},
                        },
                        "authMethods": [{"id": "login", "name": "Log in with Test"}],
                        "agentInfo": {"name": "acp-test-agent", "version": "1.2.3"},
                    },
                }
            )
        elif method == "session/new" and needs_auth:
            error = {"code": -32000, "message": "Authentication required"}
            write({"id": request_id, "error": error})
        elif method == "session/new":
            session_id = f"s-{os.getpid()}-{len(SESSIONS)}"
            SESSIONS[session_id] = []
            MODES[session_id] = "ask"
            modes = {
                "currentModeId": "ask",
                "availableModes": [{"id": "ask", "name": "Ask"}, {"id": "code", "name": "Code"}],
            }
            write({"id": request_id, "result": {"sessionId": session_id, "modes": modes}})
            update(
                session_id,
                {
                    "sessionUpdate": "available_commands_update",
                    "availableCommands": [
                        {"name": "review", "description": "Review the changes"},
                        {"name": "ask", "description": "Ask", "input": {"hint": "question"}},
                    ],
                },
            )
        elif method == "session/load" and forgets:
            # What went wrong in ``data.details``, as the ACP SDKs put it.
            error = {
                "code": -32002,
                "message": "Resource not found",
                "data": {"details": f"no session {params['sessionId']} here"},
            }
            write({"id": request_id, "error": error})
        elif method == "session/load":
            # Replays the conversation as updates, as ACP asks, before answering.
            SESSIONS.setdefault(params["sessionId"], [])
            MODES[params["sessionId"]] = "ask"
            chunk(params["sessionId"], "replayed history")
            modes = {"currentModeId": "ask", "availableModes": []}
            write({"id": request_id, "result": {"modes": modes}})
        elif method == "session/set_mode":
            MODES[params["sessionId"]] = params["modeId"]
            write({"id": request_id, "result": {}})
            update(
                params["sessionId"],
                {"sessionUpdate": "current_mode_update", "currentModeId": params["modeId"]},
            )
        elif method == "session/prompt":
            prompt(request_id, params)
        elif request_id is not None and method is not None:
            write({"id": request_id, "error": {"code": -32601, "message": "Method not found"}})


if __name__ == "__main__":
    main()
