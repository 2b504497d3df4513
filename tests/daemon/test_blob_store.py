"""The sessions' image copies (``agentsd.attachments`` Rules 2 and 4): written
under temp names of their own, a full disk reported as ``storage_unavailable``, and
a per-session quota."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from pathlib import Path

import pytest

from agentsd.attachments import BlobStore
from agentsd_protocol.errors import AttachmentRefused, StorageUnavailable


def image(data: bytes) -> dict[str, bytes]:
    return {hashlib.sha256(data).hexdigest(): data}


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def test_two_keeps_of_one_image_at_once_both_succeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both writers hold their temp file at the same moment (each waits in fsync for
    the other): neither truncates nor renames away the other's. Two stores on one
    root, so that nothing but the temp names keeps them apart."""
    barrier = threading.Barrier(2, timeout=30)
    real_fsync = os.fsync
    calls = 0

    def fsync_together(fd: int) -> None:
        nonlocal calls
        calls += 1
        if calls <= 2:  # the two image files, before either is renamed
            barrier.wait()
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_together)
    data = b"\x89PNG\r\n\x1a\n" + b"pixels" * 100
    errors: list[BaseException] = []

    def keep(store: BlobStore) -> None:
        try:
            store.keep("s1", image(data))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=keep, args=(BlobStore(tmp_path),)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    digest = hashlib.sha256(data).hexdigest()
    assert files(tmp_path / "s1") == [digest]
    assert (tmp_path / "s1" / digest).read_bytes() == data


def test_a_full_disk_is_storage_unavailable_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", no_space)
    store = BlobStore(tmp_path)
    with pytest.raises(StorageUnavailable) as raised:
        store.keep("s1", image(b"GIF89a one"))
    assert raised.value.kind == "storage_unavailable"
    assert "No space left" in raised.value.message
    assert files(tmp_path / "s1") == []  # no temp file left behind


def test_an_unwritable_store_is_storage_unavailable(tmp_path: Path) -> None:
    (tmp_path / "blobs").write_text("a file where the directory should be")
    with pytest.raises(StorageUnavailable):
        BlobStore(tmp_path / "blobs").keep("s1", image(b"GIF89a one"))


def test_a_session_keeps_at_most_its_quota(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, quota_bytes=100)
    first = image(b"GIF89a" + b"1" * 54)  # 60 bytes
    store.keep("s1", first)
    store.keep("s1", first)  # already kept: costs nothing more
    second = image(b"GIF89a" + b"2" * 54)
    with pytest.raises(AttachmentRefused) as refused:
        store.keep("s1", second)
    assert refused.value.kind == "attachment_refused"
    assert refused.value.details == {"reason": "quota", "limit": 100}
    assert files(tmp_path / "s1") == sorted(first)
    # Another session has its own quota; deleting a session frees its share.
    store.keep("s2", second)
    store.drop("s1")
    store.keep("s1", second)
    assert files(tmp_path / "s1") == sorted(second)


def test_one_prompts_images_together_past_the_quota_keep_none(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, quota_bytes=100)
    both = {**image(b"GIF89a" + b"1" * 54), **image(b"GIF89a" + b"2" * 54)}
    with pytest.raises(AttachmentRefused):
        store.keep("s1", both)
    assert files(tmp_path / "s1") == []
