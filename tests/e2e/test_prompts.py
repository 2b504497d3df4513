"""Rich prompts over the real socket, with real mock agents and a real daemon:
images (by path and inline) and file references reach the agent; the journal keeps
a digest, never the bytes; whatever cannot be used is refused before anything is
journaled; a queued image survives a daemon SIGKILL. Every test runs under an outer
``trio.fail_after``."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from agentsd.attachments import sniff
from tests.daemon_process import DaemonProcess, running_daemon
from tests.e2e.test_conversation import SLOW_TURN, conversation_file, get, user_texts, wait_journal
from tests.e2e.test_sessions import (
    DATABASE_NAME,
    SHORT_LADDER,
    TEST_TIMEOUT_S,
    CallFailed,
    Rpc,
    create,
    db_rows,
    history,
    kill_carriers,
    ladder_config,
    open_rpc,
    temp_dir,
)

MAX_IMAGE_BYTES = 5 * 1024 * 1024  # agentsd.attachments.MAX_IMAGE_BYTES, as documented
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
GIF = b"GIF89a" + b"\x01\x02\x03" * 50


def image_line(media_type: str, data: bytes) -> str:
    """What the mock agent records for an image it received."""
    return f"[image {media_type} {hashlib.sha256(data).hexdigest()} {len(data)}]"


async def send(rpc: Rpc, sid: str, text: str, *content: dict[str, Any], **more: Any) -> Any:
    return await rpc.call(
        "agentSession.send", {"sessionId": sid, "text": text, "content": list(content), **more}
    )


async def refused(rpc: Rpc, sid: str, *content: dict[str, Any]) -> CallFailed:
    with pytest.raises(CallFailed) as caught:
        await send(rpc, sid, "echo look", *content)
    return caught.value


async def test_images_by_path_and_inline_and_files_reach_the_agent_the_journal_keeps_digests(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    (tmp_path / "shot.png").write_bytes(PNG)
    (tmp_path / "notes.txt").write_text("read me\n")
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            info = await create(rpc, tmp_path)
            sid = info["sessionId"]
            sent = await send(
                rpc,
                sid,
                "echo look",
                {"type": "image", "path": "shot.png"},  # relative to the session's cwd
                {"type": "text", "text": "and this"},
                {"type": "image", "data": base64.b64encode(GIF).decode(), "mediaType": "image/gif"},
                {"type": "file", "path": str(tmp_path / "notes.txt")},
            )
            assert sent["dispatch"] == "accepted"
            events = await wait_journal(rpc, sid, "turn.completed")
            await rpc.call("agentSession.close", {"sessionId": sid})

    expected = "\n".join(
        [
            "echo look",
            "",
            "and this",
            image_line("image/png", PNG),
            image_line("image/gif", GIF),
            f"[file {tmp_path / 'notes.txt'}]",
        ]
    )
    assert user_texts(conversation_file(daemon.state_dir, info["providerHandle"])) == [expected]
    (submission,) = [e for e in events if e["kind"] == "submission"]
    assert submission["body"]["text"] == "echo look\n\nand this"
    assert submission["body"]["attachments"] == [
        {
            "type": "image",
            "sha256": hashlib.sha256(PNG).hexdigest(),
            "byteLength": len(PNG),
            "mediaType": "image/png",
            "path": str(tmp_path / "shot.png"),
        },
        {
            "type": "image",
            "sha256": hashlib.sha256(GIF).hexdigest(),
            "byteLength": len(GIF),
            "mediaType": "image/gif",
        },
        {"type": "file", "byteLength": 8, "path": str(tmp_path / "notes.txt")},
    ]
    # The bytes live in the state directory, private, under their digests.
    kept = daemon.state_dir / "blobs" / sid / hashlib.sha256(PNG).hexdigest()
    assert kept.read_bytes() == PNG
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    rows = db_rows(
        daemon.state_dir / DATABASE_NAME,
        "SELECT length(body) FROM events WHERE session_id = ? AND kind = 'submission'",
        sid,
    )
    assert rows[0][0] < 1024  # a digest, not the bytes

    async with open_rpc(daemon.socket) as rpc:
        await rpc.call("agentSession.delete", {"sessionId": sid})
    assert not kept.parent.exists()


async def test_an_oversized_image_is_refused_before_anything_is_journaled(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    big = tmp_path / "big.png"
    big.write_bytes(PNG + b"\0" * (MAX_IMAGE_BYTES + 1 - len(PNG)))
    inline = base64.b64encode(big.read_bytes()).decode()
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            sid = (await create(rpc, tmp_path))["sessionId"]
            before = await history(rpc, sid)
            for block in (
                {"type": "image", "path": str(big)},
                {"type": "image", "data": inline, "mediaType": "image/png"},
            ):
                error = await refused(rpc, sid, block)
                assert error.kind == "attachment_refused"
                assert error.data["reason"] == "too_large"
                assert error.data["limit"] == MAX_IMAGE_BYTES
            assert await history(rpc, sid) == before
            assert (await get(rpc, sid))["title"] is None
            assert not (daemon.state_dir / "blobs" / sid).exists()
            # One byte less is taken.
            big.write_bytes(big.read_bytes()[:MAX_IMAGE_BYTES])
            sent = await send(rpc, sid, "echo fits", {"type": "image", "path": str(big)})
            assert sent["dispatch"] == "accepted"


async def test_what_the_daemon_will_not_read_for_a_prompt_is_refused_with_its_reason(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)  # opening it for reading would block a careless reader forever
    (tmp_path / "proc-link.png").symlink_to("/proc/self/environ")
    (tmp_path / "text.png").write_text("not an image")
    (tmp_path / "shot.png").write_bytes(PNG)
    state_file = daemon.state_dir / DATABASE_NAME
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"type": "image", "path": "/proc/self/environ"}, "attachment_refused", "forbidden_path"),
        ({"type": "image", "path": "proc-link.png"}, "attachment_refused", "forbidden_path"),
        ({"type": "image", "path": str(state_file)}, "attachment_refused", "forbidden_path"),
        ({"type": "file", "path": str(state_file)}, "attachment_refused", "forbidden_path"),
        ({"type": "image", "path": "/dev/zero"}, "attachment_refused", "forbidden_path"),
        ({"type": "image", "path": str(fifo)}, "attachment_refused", "not_regular"),
        ({"type": "image", "path": str(tmp_path)}, "attachment_refused", "not_regular"),
        ({"type": "file", "path": str(fifo)}, "attachment_refused", "not_regular"),
        ({"type": "image", "path": "missing.png"}, "attachment_refused", "not_found"),
        ({"type": "file", "path": "missing.txt"}, "attachment_refused", "not_found"),
        ({"type": "image", "path": "text.png"}, "attachment_refused", "not_an_image"),
        (
            {"type": "image", "path": "shot.png", "mediaType": "image/jpeg"},
            "attachment_refused",
            "not_an_image",
        ),
        (
            {"type": "image", "data": "not base64!", "mediaType": "image/png"},
            "attachment_refused",
            "bad_base64",
        ),
        ({"type": "image", "data": base64.b64encode(PNG).decode()}, "invalid_params", ""),
        ({"type": "image"}, "invalid_params", ""),
        ({"type": "audio", "path": "x"}, "invalid_params", ""),
    ]
    empty: list[dict[str, Any]] = [{}, {"text": ""}, {"content": [{"type": "text", "text": ""}]}]
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            sid = (await create(rpc, tmp_path))["sessionId"]
            before = await history(rpc, sid)
            for block, kind, reason in cases:
                error = await refused(rpc, sid, block)
                assert (error.kind, error.data.get("reason", "")) == (kind, reason), block
            for params in empty:
                with pytest.raises(CallFailed) as caught:
                    await rpc.call("agentSession.send", {"sessionId": sid, **params})
                assert caught.value.kind == "invalid_params", params
            too_many = [{"type": "image", "path": "shot.png"}] * 17
            error = await refused(rpc, sid, *too_many)
            assert (error.kind, error.data["reason"]) == ("attachment_refused", "too_many")
            assert await history(rpc, sid) == before


async def test_a_queued_image_survives_a_daemon_sigkill_and_reaches_the_agent_from_its_copy(
    tmp_path: Path,
) -> None:
    """Without the holder (``holder = false``): the SIGKILL ends the agent, so the
    next daemon keeps the queue paused until the user resumes it."""
    tokens: list[str] = []
    shot = tmp_path / "shot.png"
    shot.write_bytes(PNG)
    no_holder = ladder_config(*SHORT_LADDER, holder=False)
    with trio.fail_after(120), temp_dir() as base, no_holder as config:
        state = base / "state"
        args = ["--config", str(config)]
        try:
            with running_daemon(state_dir=state, extra_args=args) as first:
                async with open_rpc(first.socket) as rpc:
                    info = await create(rpc, tmp_path, options=SLOW_TURN)
                    sid, handle = info["sessionId"], info["providerHandle"]
                    await rpc.call("agentSession.send", {"sessionId": sid, "text": "go"})
                    queued = await send(
                        rpc,
                        sid,
                        "echo later",
                        {"type": "image", "path": str(shot)},
                        delivery="queue",
                    )
                    assert queued["queued"]
                    tokens = [
                        r[0] for r in db_rows(state / DATABASE_NAME, "SELECT token FROM leases")
                    ]
                    first.process.send_signal(signal.SIGKILL)
                    assert first.wait() == -signal.SIGKILL

            shot.write_bytes(GIF)  # the file changed: the agent gets what was sent
            with running_daemon(state_dir=state, extra_args=args) as second:
                async with open_rpc(second.socket) as rpc:
                    listed = await rpc.call("agentSession.queue", {"sessionId": sid})
                    assert listed["paused"] == "daemon-restart"
                    (prompt,) = listed["prompts"]
                    assert prompt["text"] == "echo later"
                    (attached,) = prompt["attachments"]
                    assert attached["sha256"] == hashlib.sha256(PNG).hexdigest()
                    await rpc.call("agentSession.setOptions", {"sessionId": sid, "options": {}})
                    resumed = await rpc.call(
                        "agentSession.queue", {"sessionId": sid, "action": "resume"}
                    )
                    assert resumed["sent"]["dispatch"] == "accepted"
                    await wait_journal(rpc, sid, "turn.completed", 2)
                    await rpc.call("agentSession.close", {"sessionId": sid})
                    texts = user_texts(conversation_file(state, handle))
                    assert texts[-1] == "echo later\n" + image_line("image/png", PNG)
        finally:
            kill_carriers(tokens)


async def test_a_kept_image_that_was_damaged_is_never_replaced_by_other_bytes(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """A queued image whose kept copy no longer matches its digest is not sent: its
    delivery is rejected, saying why, and the agent gets nothing else in its place.
    The running turn waits on an approval, so the copy is damaged before the turn can
    end (a timed stream would have to outlast a loaded machine)."""
    (tmp_path / "shot.png").write_bytes(PNG)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            info = await create(rpc, tmp_path)
            sid = info["sessionId"]
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "approve go"})
            (requested,) = [
                e["body"]
                for e in await wait_journal(rpc, sid, "approval.requested")
                if e["kind"] == "approval.requested"
            ]
            queued = await send(
                rpc, sid, "echo later", {"type": "image", "path": "shot.png"}, delivery="queue"
            )
            kept = daemon.state_dir / "blobs" / sid / hashlib.sha256(PNG).hexdigest()
            kept.write_bytes(GIF)
            await rpc.call(
                "agentSession.respond",
                {"sessionId": sid, "approvalId": requested["approvalId"], "decision": "accept"},
            )
            events = await wait_journal(rpc, sid, "submission.dispatched", 2)
            (dispatched,) = [
                e["body"]
                for e in events
                if e["kind"] == "submission.dispatched"
                and e["body"]["clientMessageId"] == queued["clientMessageId"]
            ]
            assert dispatched["outcome"] == "rejected"
            assert "attachment_refused" in dispatched["reason"]
            await rpc.call("agentSession.close", {"sessionId": sid})
    assert user_texts(conversation_file(daemon.state_dir, info["providerHandle"])) == ["approve go"]


def test_image_types_are_read_from_their_bytes() -> None:
    assert sniff(PNG) == "image/png"
    assert sniff(b"\xff\xd8\xff\xe0" + b"\0" * 10) == "image/jpeg"
    assert sniff(GIF) == "image/gif"
    assert sniff(b"GIF87a...") == "image/gif"
    assert sniff(b"RIFF\0\0\0\0WEBPVP8 ") == "image/webp"
    assert sniff(b"RIFF\0\0\0\0WAVEfmt ") is None
    assert sniff(b"%PDF-1.7") is None
    assert sniff(b"") is None
