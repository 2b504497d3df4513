"""Live fuzzing: Hypothesis-generated frames against a running daemon over its socket.

Three generators, each in both framings: random bytes; malformed frames (truncated,
oversized, bad headers, arbitrary JSON, bad envelopes); and well-framed JSON-RPC
envelopes, one Hypothesis run per method in ``agentsd_protocol.methods.METHODS``,
whose params are derived from the method's params Struct through ``msgspec.inspect``
(right types, wrong types, unknown fields, missing required fields; single, batched
and as notifications), mutations included, on sessions that exist and sessions that
do not. Beside them a deterministic sweep puts every field of every method at each
of its edge values (``edge_values``), one field at a time.

After every example: every reply is well-formed JSON-RPC (an error has an integer
code, a message and ``data.kind``/``data.retryable``; nothing is an internal error),
bad params get exactly ``invalid_params``, the daemon is up, and a control connection
(``PingProbe``) has had every ``daemon.ping`` answered all along (counted: one sent
after the example is answered too; its timeout is only a hang guard). After every test the daemon's log holds no traceback.

The CI form runs modest example counts with a fixed seed (``derandomize``); ``python
-m tests.e2e.reliability`` runs the long form with random seeds. The fuzzer never
sends a valid ``daemon.shutdown`` or ``daemon.restart``, never names a program to
run (``command`` points at a path that does not exist) and never sets the mock's
misbehaviour options.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentsd_protocol.framing import Framing, encode_frame
from agentsd_protocol.methods import METHODS
from tests.daemon_process import IO_TIMEOUT_S, DaemonProcess, WireClient, make_temp_dir
from tests.daemon_process import running_daemon as start_daemon
from tests.e2e.reliability import (
    LONG,
    PingProbe,
    replies_until_closed,
    report,
    sized,
    wait_until,
)

MAX_FRAME_BYTES = 64 * 1024  # small, so oversized frames are cheap to send
FRAME_TIMEOUT_S = 2.0
CONFIG = f"""\
max_frame_bytes = {MAX_FRAME_BYTES}
frame_timeout_s = {FRAME_TIMEOUT_S}
idle_timeout_s = 3.0
handshake_timeout_s = 5.0
[ladder]
eof_grace_s = 0.5
term_grace_s = 0.5
kill_wait_s = 1.0
"""
# Sessions the envelope fuzzer may name; past this many it deletes the oldest, so
# agents started by fuzzed creates do not pile up.
MAX_POOL = 8
INVALID_PARAMS = -32602
INVALID_REQUEST = -32600
# Codes a request with well-formed, right-typed params must never get.
NEVER_FOR_VALID = {-32700, -32600, -32601, -32603}


def fuzz_settings(ci: int, long: int) -> settings:
    return settings(
        max_examples=sized(ci, long),
        deadline=None,
        derandomize=not LONG,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ---- reply checks -------------------------------------------------------------------


def check_reply(reply: Any) -> None:
    """One JSON-RPC response object, well-formed; an error carries a code, a message
    and ``data.kind``/``data.retryable``, and is never an internal error."""
    assert isinstance(reply, dict), reply
    assert reply.get("jsonrpc") == "2.0", reply
    assert "id" in reply, reply
    assert ("result" in reply) != ("error" in reply), reply
    if "error" in reply:
        error = reply["error"]
        assert isinstance(error.get("code"), int), reply
        assert isinstance(error.get("message"), str) and error["message"], reply
        assert "Traceback" not in error["message"], reply
        assert isinstance(error.get("data"), dict), reply
        assert isinstance(error["data"].get("kind"), str), reply
        assert isinstance(error["data"].get("retryable"), bool), reply
        assert error["code"] != -32603, f"internal error: {reply}"


def check_message(message: Any) -> None:
    """A reply (or a batch of replies) from the daemon."""
    if isinstance(message, list):
        assert message, "an empty batch reply"
        for reply in message:
            check_reply(reply)
    else:
        check_reply(message)


# ---- the daemon under test ------------------------------------------------------------


@dataclass
class Fuzz:
    daemon: DaemonProcess
    probe: PingProbe
    cwd: Path
    admin: WireClient
    ids: Iterator[int] = field(default_factory=itertools.count)
    outcomes: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # method, mode, kind
    envelope_sends: int = 0
    slowest: tuple[str, float] = ("-", 0.0)
    log_checked: int = 0  # how much of the daemon's log check_log has seen

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(IO_TIMEOUT_S)
        sock.connect(str(self.daemon.socket))
        return sock

    def session_ids(self) -> list[str]:
        """The live sessions, after topping the pool up to two and down to MAX_POOL."""
        sessions = self.admin.call("agentSession.list", {})["result"]["sessions"]
        ids = [s["sessionId"] for s in sorted(sessions, key=lambda s: s["createdAt"])]
        while len(ids) < 2:
            created = self.admin.call(
                "agentSession.create", {"provider": "mock", "cwd": str(self.cwd), "start": False}
            )
            ids.append(created["result"]["sessionId"])
        for old in ids[: max(0, len(ids) - MAX_POOL)]:
            check_reply(self.admin.call("agentSession.delete", {"sessionId": old}))
        return ids[-MAX_POOL:]

    def check_alive(self) -> None:
        code = self.daemon.process.poll()
        assert code is None, f"the daemon exited with {code}:\n{self.daemon.log()}"
        self.probe.check()

    def check_log(self) -> None:
        """No traceback in what the daemon logged since the last check (so each test
        answers for its own)."""
        log = self.daemon.log()
        new, self.log_checked = log[self.log_checked :], len(log)
        assert "Traceback" not in new, new[max(0, new.index("Traceback") - 2000) :][:6000]


@pytest.fixture(scope="module")
def fuzz() -> Iterator[Fuzz]:
    base = make_temp_dir()
    config = base / "fuzz.toml"
    config.write_text(CONFIG)
    cwd = base / "work"
    cwd.mkdir()
    try:
        with (
            start_daemon(extra_args=["--config", str(config)]) as daemon,
            PingProbe(daemon.socket) as probe,
            WireClient(daemon.socket) as admin,
        ):
            state = Fuzz(daemon, probe, cwd, admin)
            yield state
            state.check_alive()
            state.check_log()
            report("fuzz", probe.summary())
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(autouse=True)
def own_log_window(fuzz: Fuzz) -> Iterator[None]:
    """Whatever a test leaves in the log (it failed before its own check) is not the
    next test's to answer for."""
    yield
    fuzz.log_checked = len(fuzz.daemon.log())


# ---- 1. random bytes -------------------------------------------------------------------

# What a connection's first bytes are: nothing (the bytes choose), or a framing's
# start so the bytes land inside it.
PREFIXES = [b"", b"{", b"[", b"Content-Length: ", b"Content-Length: 12\r\n\r\n", b"\r\n "]


def send_and_collect(fuzz: Fuzz, data: bytes) -> list[Any]:
    """Send ``data`` on a fresh connection, half-close, and return every reply."""
    with contextlib.closing(fuzz.connect()) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        return replies_until_closed(sock)


def test_random_bytes_get_only_well_formed_errors(fuzz: Fuzz) -> None:
    examples = replies = 0

    @fuzz_settings(ci=300, long=5000)
    @given(prefix=st.sampled_from(PREFIXES), data=st.binary(max_size=2048))
    def run(prefix: bytes, data: bytes) -> None:
        nonlocal examples, replies
        for message in send_and_collect(fuzz, prefix + data):
            check_message(message)
            replies += 1
        examples += 1
        fuzz.check_alive()

    run()
    fuzz.check_log()
    report("fuzz", f"random bytes: {examples} connections, {replies} replies checked")


# ---- 2. malformed frames -----------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def to_json(value: Any) -> bytes:
    """The stdlib encoder: it writes any int (msgspec refuses those past 64 bits)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


PING_BODY = b'{"jsonrpc":"2.0","id":"after","method":"daemon.ping"}'


@st.composite
def malformed_streams(draw: st.DrawFn) -> bytes:
    """One connection's worth of bytes: a bad frame, maybe followed by a good one."""
    framing = draw(st.sampled_from(list(Framing)))
    kind = draw(
        st.sampled_from(
            ["truncated", "oversized", "bad-header", "any-json", "bad-envelope", "stray-bytes"]
        )
    )
    good = encode_frame(framing, PING_BODY)
    if kind == "truncated":
        frame = encode_frame(framing, to_json(draw(json_values)))
        return frame[: draw(st.integers(min_value=1, max_value=max(1, len(frame) - 1)))]
    if kind == "oversized":
        size = draw(st.integers(min_value=MAX_FRAME_BYTES + 1, max_value=2 * MAX_FRAME_BYTES))
        if framing is Framing.CONTENT_LENGTH and draw(st.booleans()):
            return b"Content-Length: %d\r\n\r\n{" % size  # refused before the body
        return encode_frame(framing, b'{"pad":"' + b"x" * size + b'"}')
    if kind == "bad-header":
        headers = draw(
            st.lists(
                st.sampled_from(
                    [
                        b"Content-Length: -1",
                        b"Content-Length: abc",
                        b"Content-Length: 99999999999999",
                        b"Content-Length:",
                        b"Content-Type: application/vscode-jsonrpc; charset=utf-8",
                        b"X-Unknown: 1",
                        b"no colon here",
                        b"Content-Length: 2",
                    ]
                )
                | st.binary(max_size=40).filter(lambda b: b"\r\n" not in b),
                min_size=1,
                max_size=4,
            )
        )
        if draw(st.booleans()):
            headers.append(b"x" * 5000)  # a header block past MAX_HEADER_BYTES
        return b"Content-Length: 2\r\n\r\n{}" + b"\r\n".join(headers) + b"\r\n\r\n{}" + good
    if kind == "any-json":
        return encode_frame(framing, to_json(draw(json_values))) + good
    if kind == "bad-envelope":
        envelope: dict[str, Any] = {
            "jsonrpc": draw(st.sampled_from(["2.0", "1.0", 2.0, None])),
            "method": draw(st.sampled_from([*METHODS, "no.such.method"]) | json_scalars),
            "id": draw(json_values),
        }
        if draw(st.booleans()):
            envelope["params"] = draw(json_values)
        if draw(st.booleans()):
            envelope[draw(st.text(min_size=1, max_size=8))] = draw(json_scalars)
        # Never a shutdown or restart that could pass (it would end the experiment).
        body = (
            to_json(envelope)
            .replace(b"daemon.shutdown", b"daemon.shutdowN")
            .replace(b"daemon.restart", b"daemon.restarT")
        )
        if draw(st.booleans()):
            body = b"[" + body + b"," + body + b"]"
        return encode_frame(framing, body) + good
    # stray bytes between two good frames
    return good + draw(st.binary(min_size=1, max_size=64)) + good


def test_malformed_frames_get_only_well_formed_errors(fuzz: Fuzz) -> None:
    examples = replies = 0

    @fuzz_settings(ci=300, long=5000)
    @given(stream=malformed_streams())
    def run(stream: bytes) -> None:
        nonlocal examples, replies
        for message in send_and_collect(fuzz, stream):
            check_message(message)
            replies += 1
        examples += 1
        fuzz.check_alive()

    run()
    fuzz.check_log()
    report("fuzz", f"malformed frames: {examples} connections, {replies} replies checked")


# ---- 3. envelopes with params derived from the Structs ------------------------------------

JSON_KINDS = ("null", "bool", "int", "float", "str", "list", "object")


def accepted_kinds(t: mi.Type) -> set[str]:
    """The JSON kinds a value of msgspec type ``t`` may have."""
    match t:
        case mi.StrType():
            return {"str"}
        case mi.IntType():
            return {"int"}
        case mi.FloatType():
            return {"int", "float"}
        case mi.BoolType():
            return {"bool"}
        case mi.NoneType():
            return {"null"}
        case mi.ListType():
            return {"list"}
        case mi.DictType():
            return {"object"}
        case mi.LiteralType():
            return set()  # only its values; any other string is wrong too
        case mi.UnionType(types=types):
            return set().union(*(accepted_kinds(member) for member in types))
        case _:
            return set(JSON_KINDS)  # Any: nothing is wrong


def of_kind(kind: str) -> st.SearchStrategy[Any]:
    return {
        "null": st.none(),
        "bool": st.booleans(),
        "int": st.integers(min_value=-(2**70), max_value=2**70),
        "float": st.floats(allow_nan=False, allow_infinity=False).filter(
            lambda f: not f.is_integer()
        ),
        "str": st.text(max_size=20),
        "list": st.lists(json_scalars, max_size=3),
        "object": st.dictionaries(st.text(max_size=8), json_scalars, max_size=3),
    }[kind]


# Values at the edges, where the daemon's own checks end and the OS's or SQLite's
# begin (a NUL in a path, an int past SQLite's INTEGER): drawn as often as random
# ones, and each tried in every field by the sweep below.
EDGE_TEXT = ["", "\x00", "/tmp/\x00x", "..", "../../..", "x" * 5000, "\u202e", "\U0001f642"]
# msgspec takes ints of any size; SQLite's INTEGER ends at 2**63 - 1.
EDGE_INTS = [2**63, 2**64, 2**70, -(2**63) - 1, 0, 1, -1, 2**31 - 1, 2**53 + 1, 2**63 - 1]


def edge_values(t: mi.Type) -> list[Any]:
    """A few right-typed values of ``t`` at its edges."""
    match t:
        case mi.StrType():
            return list(EDGE_TEXT)
        case mi.IntType():
            return list(EDGE_INTS)
        case mi.FloatType():
            return [0.0, -0.0, 1e308, 5e-324]
        case mi.BoolType():
            return [True, False]
        case mi.NoneType():
            return [None]
        case mi.LiteralType(values=values):
            return list(values)
        case mi.ListType(item_type=item):
            return [[], *([value] for value in edge_values(item))]
        case mi.DictType(key_type=key, value_type=value):
            keys, vals = edge_values(key), edge_values(value)
            return [{}, *({k: vals[i % len(vals)]} for i, k in enumerate(keys))]
        case mi.UnionType(types=types):
            return [value for member in types for value in edge_values(member)]
        case _:
            return [None, 2**70, -(2**70), 1e308, "\x00", [[[[[]]]]], {"": {"": None}}]


def right_value(t: mi.Type) -> st.SearchStrategy[Any]:
    """Any value msgspec accepts for ``t``."""
    match t:
        case mi.StrType():
            return st.text(max_size=60) | st.sampled_from(EDGE_TEXT)
        case mi.IntType():
            edges = st.sampled_from(EDGE_INTS)
            return st.one_of(edges, edges, st.integers(min_value=-(2**70), max_value=2**70))
        case mi.FloatType():
            return st.floats(allow_nan=False, allow_infinity=False)
        case mi.BoolType():
            return st.booleans()
        case mi.NoneType():
            return st.none()
        case mi.LiteralType(values=values):
            return st.sampled_from(values)
        case mi.ListType(item_type=item):
            return st.lists(right_value(item), max_size=4)
        case mi.DictType(key_type=key, value_type=value):
            return st.dictionaries(right_value(key), right_value(value), max_size=4)
        case mi.UnionType(types=types):
            # ``X | None``: X twice as often as None, which is only the default.
            some = [right_value(m) for m in types if not isinstance(m, mi.NoneType)]
            return st.one_of(some * 2 + [st.none()] * (len(some) < len(types)))
        case _:
            return json_values


def wrong_value(t: mi.Type) -> st.SearchStrategy[Any] | None:
    """A value msgspec refuses for ``t``; None when every value fits (Any)."""
    wrong = [kind for kind in JSON_KINDS if kind not in accepted_kinds(t)]
    options = [of_kind(kind) for kind in wrong]
    if isinstance(t, mi.LiteralType):
        options.append(st.text(max_size=12).filter(lambda s: s not in t.values))
    return st.one_of(options) if options else None


def safe_values(fuzz: Fuzz, sessions: list[str]) -> dict[str, st.SearchStrategy[Any]]:
    """Right-typed values for fields whose generic values would mostly miss (a
    random session id never exists) or would reach outside the daemon (a random
    ``command`` runs a program; random mock ``options`` could flood on purpose)."""
    state = fuzz.daemon.state_dir
    return {
        # An index, not the ids themselves: the pool changes between examples, and
        # Hypothesis needs each example to draw the same way when replayed. Nine in
        # ten name a session that exists (Hypothesis favours the small indexes).
        "sessionId": st.integers(min_value=0, max_value=9).map(
            lambda i: sessions[i % len(sessions)] if i < 9 else "no-such-session"
        ),
        # A usable directory half the time; random text is never an absolute path.
        "cwd": st.sampled_from(
            [
                *[str(fuzz.cwd)] * 6,
                "/nonexistent/dir",
                "relative/dir",
                str(state),
                f"{fuzz.cwd}/../{fuzz.cwd.name}",
                "/etc/hostname",
                "/tmp/\x00x",
            ]
        ),
        "provider": st.sampled_from(["mock", "mock", "nope"]),
        "command": st.none()
        | st.lists(st.text(max_size=10), max_size=3).map(
            lambda rest: ["/nonexistent/agentsd-fuzz-agent", *rest]
        ),
        "env": st.dictionaries(
            st.from_regex(r"FUZZ_[A-Z]{1,6}", fullmatch=True), st.text(max_size=20), max_size=3
        ),
        "options": st.dictionaries(
            st.from_regex(r"fuzz[a-z]{0,6}", fullmatch=True), json_values, max_size=3
        )
        | st.just({"chunks": "many"}),  # the mock refuses it at start
        "subscriptionId": st.sampled_from(["sub-1", "sub-999999"]),
        "limit": st.integers(min_value=-2, max_value=1002),
        # Mostly no agent: starting one costs a Python start-up (an omitted ``start``
        # means true, so the generic value would start three creates in four).
        "start": st.sampled_from([False, False, False, True]),
    }


# Fields whose generic value is never sent, because it could act outside the daemon
# (or, for ``cwd``, would only ever be refused); ``start`` is always sent (its
# default would start an agent).
SAFE_ONLY = {"command", "cwd", "env", "options", "provider", "start"}
# Half the envelopes have valid params: past decoding is where the handlers' own
# checks end and the OS's and SQLite's begin.
MODES = ("valid",) * 4 + ("wrong-type", "unknown-field", "missing-required", "not-an-object")


NO_REPLY = object()


@dataclass(frozen=True)
class Envelope:
    body: dict[str, Any]
    mode: str
    notification: bool

    @property
    def reply_id(self) -> Any:
        """The id its reply carries, or ``NO_REPLY``. A message without an id whose
        params are a scalar is no notification but an invalid Request: the
        specification answers it, with id null."""
        if not self.notification:
            return self.body["id"]
        params = self.body.get("params")
        return None if params is not None and not isinstance(params, list | dict) else NO_REPLY


STOPPING_METHODS = frozenset({"daemon.shutdown", "daemon.restart"})
"""Valid, either would end the daemon under test: the fuzzer sends them invalid only."""


@st.composite
def envelopes(
    draw: st.DrawFn, name: str, fuzz: Fuzz, sessions: list[str], ids: Iterator[int]
) -> Envelope:
    fields = mi.type_info(METHODS[name].params).fields  # type: ignore[attr-defined]
    mode = draw(st.sampled_from(MODES))
    if name in STOPPING_METHODS and mode == "valid":
        mode = "unknown-field"  # a valid shutdown or restart would end the experiment
    wrongable = [f for f in fields if wrong_value(f.type) is not None]
    required = [f for f in fields if f.required]
    if (mode == "wrong-type" and not wrongable) or (mode == "missing-required" and not required):
        mode = "unknown-field"
    safe = safe_values(fuzz, sessions)
    params: Any = {}
    for f in fields:
        if not f.required and f.encode_name != "start" and not draw(st.booleans()):
            continue
        if f.encode_name in SAFE_ONLY:
            params[f.encode_name] = draw(safe[f.encode_name])
        elif f.encode_name in safe:
            params[f.encode_name] = draw(safe[f.encode_name] | right_value(f.type))
        else:
            params[f.encode_name] = draw(right_value(f.type))
    if mode == "wrong-type":
        target = draw(st.sampled_from(wrongable))
        strategy = wrong_value(target.type)
        assert strategy is not None
        params[target.encode_name] = draw(strategy)
    elif mode == "unknown-field":
        names = {f.encode_name for f in fields}
        unknown = draw(st.text(min_size=1, max_size=12).filter(lambda s: s not in names))
        params[unknown] = draw(json_scalars)
    elif mode == "missing-required":
        params.pop(draw(st.sampled_from(required)).encode_name, None)
    elif mode == "not-an-object":
        params = draw(
            st.lists(json_scalars, max_size=3) | json_scalars.filter(lambda v: v is not None)
        )
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": name}
    if params != {} or draw(st.booleans()):
        body["params"] = params
    # A notification of a valid shutdown would stop the daemon too; the mode guard
    # above already made it invalid.
    notification = draw(st.integers(min_value=0, max_value=9)) == 0
    if not notification:
        request_id = next(ids)
        body["id"] = draw(st.sampled_from([request_id, f"fuzz-{request_id}"]))
    return Envelope(body, mode, notification)


def check_outcome(envelope: Envelope, reply: dict[str, Any]) -> None:
    check_reply(reply)
    error = reply.get("error")
    match envelope.mode:
        case "wrong-type" | "unknown-field" | "missing-required":
            assert error is not None and error["code"] == INVALID_PARAMS, (envelope, reply)
        case "not-an-object":
            assert error is not None and error["code"] in (INVALID_PARAMS, INVALID_REQUEST), (
                envelope,
                reply,
            )
        case _:
            assert error is None or error["code"] not in NEVER_FOR_VALID, (envelope, reply)


def await_replies(client: WireClient, sent: list[Envelope]) -> list[tuple[Envelope, Any]]:
    """Read until every envelope of ``sent`` that gets a reply has it (skipping
    notifications from fuzzed subscriptions and watches); each reply paired with its
    envelope. A batch reply answers several at once."""
    waiting = [e for e in sent if e.reply_id is not NO_REPLY]
    out: list[tuple[Envelope, Any]] = []
    while waiting:
        message = client.recv()
        for reply in message if isinstance(message, list) else [message]:
            if isinstance(reply, dict) and "method" in reply and "id" not in reply:
                continue
            check_reply(reply)
            match = next((e for e in waiting if e.reply_id == reply["id"]), None)
            assert match is not None, (reply, [e.body for e in waiting])
            waiting.remove(match)
            out.append((match, reply))
    return out


@pytest.mark.parametrize("method", sorted(METHODS))
def test_envelopes_with_params_from_the_structs(fuzz: Fuzz, method: str) -> None:
    """One Hypothesis run per method, so each gets its share of examples."""

    @fuzz_settings(ci=100, long=600)
    @given(data=st.data(), framing=st.sampled_from(list(Framing)), batch=st.integers(0, 9))
    def run(data: st.DataObject, framing: Framing, batch: int) -> None:
        sessions = fuzz.session_ids()
        count = data.draw(st.integers(min_value=2, max_value=4)) if batch == 0 else 1
        drawn = [data.draw(envelopes(method, fuzz, sessions, fuzz.ids)) for _ in range(count)]
        bodies = [e.body for e in drawn]
        # A connection per example: a failed example leaves no stale reply behind
        # for the next one (Hypothesis replays examples while it shrinks).
        with WireClient(fuzz.daemon.socket, framing) as client:
            started = time.monotonic()
            client.send(bodies if batch == 0 else bodies[0])
            fuzz.envelope_sends += 1
            for envelope, reply in await_replies(client, drawn):
                check_outcome(envelope, reply)
                kind = reply["error"]["data"]["kind"] if "error" in reply else "ok"
                fuzz.outcomes[method, envelope.mode, kind] += 1
            took = time.monotonic() - started
            if took > fuzz.slowest[1]:
                fuzz.slowest = (method, took)
            # Whatever the notifications among them did, the connection still answers
            # (a fuzzed subscription may go on notifying: those are skipped).
            ping = Envelope(
                body={"jsonrpc": "2.0", "id": "alive", "method": "daemon.ping"},
                mode="valid",
                notification=False,
            )
            client.send(ping.body)
            [(_, pong)] = await_replies(client, [ping])
            assert pong.get("result") == {"pong": True}, pong
        fuzz.check_alive()

    run()
    fuzz.check_log()


# Methods that succeed with some valid params and no preparation (``respond`` needs a
# pending approval, ``unsubscribe`` a subscription of the same connection, ...): the
# fuzzer must have seen each succeed, or it tested only refusals.
SUCCEED_UNPREPARED = {
    "daemon.ping",
    "daemon.status",
    "rpc.discover",
    "agentSession.create",
    "agentSession.get",
    "agentSession.list",
    "agentSession.history",
    "agentSession.setOptions",
    "agentSession.subscribe",
    "agentSession.watch",
}


def test_the_envelope_fuzzing_reached_past_the_refusals(fuzz: Fuzz) -> None:
    succeeded = {method for method, mode, kind in fuzz.outcomes if (mode, kind) == ("valid", "ok")}
    if len({method for method, _, _ in fuzz.outcomes}) < len(METHODS):
        pytest.skip("runs after the envelope fuzzing of every method")
    assert succeeded >= SUCCEED_UNPREPARED, SUCCEED_UNPREPARED - succeeded
    valid = sum(n for (_, mode, _), n in fuzz.outcomes.items() if mode == "valid")
    ok = sum(n for (_, mode, kind), n in fuzz.outcomes.items() if (mode, kind) == ("valid", "ok"))
    method, took = fuzz.slowest
    report(
        "fuzz",
        f"envelopes: {fuzz.envelope_sends} sends over {len(METHODS)} methods, "
        f"{sum(fuzz.outcomes.values())} replies checked ({valid} with valid params, {ok} of "
        f"them succeeded); slowest reply {took * 1000:.0f} ms ({method})",
    )


def baseline(fuzz: Fuzz, method: str, session_id: str) -> dict[str, Any]:
    """Params that pass every check of ``method``'s handler (as far as they can
    without preparation), for the sweep to change one field at a time."""
    good = {
        "sessionId": session_id,
        "provider": "mock",
        "cwd": str(fuzz.cwd),
        "start": False,
        "text": "echo edge",
        "approvalId": "ap-0-r1",
        "decision": "accept",
        "subscriptionId": "sub-1",
        "seq": 1,
        "title": "edge",
        "name": "greet",  # the mock's own command
    }
    fields = mi.type_info(METHODS[method].params).fields  # type: ignore[attr-defined]
    return {
        f.encode_name: good[f.encode_name] for f in fields if f.required or f.encode_name == "start"
    }


# What the sweep never sends: a valid shutdown or restart; a program to run (``command`` with
# ``start`` true) and mock options that misbehave on purpose are left to the fuzzer's
# safe values.
SWEEP_SKIPS = {("agentSession.create", "command"), ("agentSession.create", "options")}


def test_every_field_of_every_method_at_its_edges(fuzz: Fuzz) -> None:
    """Deterministic, beside the fuzzing: each field of each method's params Struct,
    one at a time, at each of its edge values (``edge_values``), on a session that
    exists. Whatever the handler makes of it, the reply is well-formed and no
    internal error."""
    sent = 0
    with WireClient(fuzz.daemon.socket) as client:
        for method in sorted(set(METHODS) - STOPPING_METHODS):
            fields = mi.type_info(METHODS[method].params).fields  # type: ignore[attr-defined]
            for f in fields:
                if (method, f.encode_name) in SWEEP_SKIPS:
                    continue
                for value in edge_values(f.type):
                    session_id = fuzz.session_ids()[-1]
                    params = {**baseline(fuzz, method, session_id), f.encode_name: value}
                    client.send_body(
                        to_json({"jsonrpc": "2.0", "id": sent, "method": method, "params": params})
                    )
                    (reply,) = [r for _, r in await_replies(client, [edge_envelope(sent, params)])]
                    assert reply["id"] == sent
                    check_reply(reply)
                    sent += 1
    fuzz.check_alive()
    fuzz.check_log()
    report("fuzz", f"edge sweep: {sent} requests, one field at a time, every method")


def edge_envelope(request_id: int, params: dict[str, Any]) -> Envelope:
    return Envelope({"id": request_id, "params": params}, "valid", notification=False)


# ---- liveness across the fuzzing, from outside -------------------------------------------


def test_the_daemon_still_serves_a_whole_session_after_the_fuzzing(fuzz: Fuzz) -> None:
    """Runs last in this module: after every generator above, a session still goes
    create, send, history, delete."""
    with fuzz.daemon.connect() as client:
        created = client.call("agentSession.create", {"provider": "mock", "cwd": str(fuzz.cwd)})
        session_id = created["result"]["sessionId"]
        sent = client.call("agentSession.send", {"sessionId": session_id, "text": "echo hello"})
        assert sent["result"]["dispatch"] == "accepted", sent

        def completed() -> bool:
            page = client.call("agentSession.history", {"sessionId": session_id, "limit": 1000})
            return any(e["kind"] == "turn.completed" for e in page["result"]["events"])

        wait_until(completed, IO_TIMEOUT_S, "the turn completes")
        assert "result" in client.call("agentSession.delete", {"sessionId": session_id})
    fuzz.check_alive()
    fuzz.check_log()
