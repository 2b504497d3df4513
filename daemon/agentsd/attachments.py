"""The images and file references of a prompt: read within bounds, kept by digest.

Rule 1 (refused before journaled): a prompt's blocks are checked, and its images
read and kept, before anything of it is journaled; whatever is wrong with one
(``AttachmentRefused``) leaves the journal as it was.

Rule 2 (the bytes live with the session): an image's bytes are written to
``<state>/blobs/<session id>/<sha256>`` (0600, in 0700 directories) and fsynced
before the prompt naming them is journaled; the journal keeps the digest, media
type, length and source path, never the bytes. The agent gets them from there when
the prompt is delivered, also after a queue or a daemon restart; a copy that is gone
or no longer matches its digest makes that delivery ``rejected``, never a different
image. Deleting the session removes its copies.

Rule 3 (what a path may name): the daemon reads a path as the user, and the
client asking may be one of its own agents (``agentsd.caller`` lets an agent send to
its own session). So only a regular file is read (never a FIFO, device, socket or
directory; opened without blocking), at most ``MAX_IMAGE_BYTES`` of it, and never
one under ``/proc``, ``/sys`` or ``/dev`` (``/proc/self`` is the daemon's own memory
and environment), nor one on the file systems of ``/proc`` or ``/sys`` mounted
elsewhere, nor one under the daemon's private directories. The place is checked on
the resolved path before opening and again on the opened file's own path, so a
symlink swapped in between does not lead elsewhere. File references are checked
the same way but never read: the agent reads them with its own tools.

Rule 4 (bounded on disk): a session keeps at most ``MAX_SESSION_BLOB_BYTES`` of
image copies; an image past that is refused (``quota``) before anything is
journaled. Copies are not removed while the session lives: a queued prompt, or the
retry of a prompt whose delivery is unknown, may still name any of them.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

from agentsd.providers.base import FileInput, ImageInput
from agentsd_protocol.api.conversation import (
    Attachment,
    Content,
    FileBlock,
    ImageBlock,
    TextBlock,
)
from agentsd_protocol.errors import AttachmentRefused, InvalidParams, StorageUnavailable

# The Anthropic API's bound per image (Codex takes larger ones): one bound for every
# provider, so a prompt that works with one agent works with the others.
MAX_IMAGE_BYTES = 5 * 1024 * 1024
# Base64 of the largest image, with padding: longer inline data is refused undecoded.
MAX_INLINE_CHARS = 4 * ((MAX_IMAGE_BYTES + 2) // 3)
MAX_ATTACHMENTS = 16  # images and files per prompt: what a person attaches, not a bulk upload
# A session's kept images (Rule 4): hundreds of screenshots, yet a bound on what an
# agent sending to its own session, or a runaway client, can put on the disk.
MAX_SESSION_BLOB_BYTES = 256 * 1024 * 1024
FORBIDDEN_ROOTS = ("/proc", "/sys", "/dev")  # kernel and device files: never the user's data

_MAGIC: tuple[tuple[bytes, int, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
)


@attrs.frozen
class Prepared:
    """A prompt ready to journal: its ``text``, what the journal keeps of its
    images and files (``attachments``, in order) and the images' bytes by digest."""

    text: str
    attachments: list[Attachment]
    images: dict[str, bytes]


def block_types(content: Sequence[Content]) -> set[str]:
    """The types of a prompt's blocks other than text."""
    return {str(type(block).__struct_config__.tag) for block in content} - {"text"}


def sniff(data: bytes) -> str | None:
    """The image type of ``data`` from its first bytes, or None if not one we know."""
    for magic, offset, media_type in _MAGIC:
        if data[offset : offset + len(magic)] == magic:
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def prepare(text: str, content: Sequence[Content], cwd: str, private: Iterable[Path]) -> Prepared:
    """Check and read a prompt's blocks (Rules 1 and 3); relative paths are taken
    from ``cwd``. Blocking: run in a worker thread. Raises ``AttachmentRefused``."""
    texts = [text] if text else []
    attachments: list[Attachment] = []
    images: dict[str, bytes] = {}
    private_roots = [os.path.realpath(p) for p in private]
    if sum(not isinstance(b, TextBlock) for b in content) > MAX_ATTACHMENTS:
        raise AttachmentRefused(
            f"a prompt takes at most {MAX_ATTACHMENTS} images and files",
            reason="too_many",
            limit=MAX_ATTACHMENTS,
        )
    for block in content:
        match block:
            case TextBlock():
                if block.text:
                    texts.append(block.text)
            case ImageBlock():
                attachment, data = _image(block, cwd, private_roots)
                attachments.append(attachment)
                images[attachment.sha256 or ""] = data
            case FileBlock():
                attachments.append(_file(block.path, cwd, private_roots))
    return Prepared(text="\n\n".join(texts), attachments=attachments, images=images)


def _image(block: ImageBlock, cwd: str, private: list[str]) -> tuple[Attachment, bytes]:
    if (block.path is None) == (block.data is None):
        raise InvalidParams("Invalid params: an image block takes either path or data")
    path = None
    if block.path is not None:
        path = _absolute(block.path, cwd)
        data = _read_bounded(path, private)
    else:
        data = _decode(block.data or "", block.media_type)
    media_type = sniff(data)
    if media_type is None:
        where = path or "the inline data"
        raise AttachmentRefused(
            f"{where} is not a PNG, JPEG, GIF or WebP image", reason="not_an_image", path=path
        )
    if block.media_type is not None and block.media_type != media_type:
        raise AttachmentRefused(
            f"the image is {media_type}, not {block.media_type}", reason="not_an_image", path=path
        )
    attachment = Attachment(
        type="image",
        sha256=hashlib.sha256(data).hexdigest(),
        byte_length=len(data),
        media_type=media_type,
        path=path,
    )
    return attachment, data


def _decode(data: str, media_type: str | None) -> bytes:
    if media_type is None:
        raise InvalidParams("Invalid params: inline image data needs its mediaType")
    if len(data) > MAX_INLINE_CHARS:
        raise _too_large("the inline image")
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise AttachmentRefused(
            "the inline image data is not base64", reason="bad_base64"
        ) from None
    if len(decoded) > MAX_IMAGE_BYTES:
        raise _too_large("the inline image")
    return decoded


def _too_large(what: str) -> AttachmentRefused:
    return AttachmentRefused(
        f"{what} is larger than {MAX_IMAGE_BYTES} bytes", reason="too_large", limit=MAX_IMAGE_BYTES
    )


def _absolute(path: str, cwd: str) -> str:
    if not path or "\0" in path:
        raise InvalidParams("Invalid params: a path must be non-empty and without NUL")
    return os.path.normpath(os.path.join(cwd, path))


def _check_place(real: str, shown: str, private: list[str]) -> None:
    """Refuse a resolved path under the kernel's trees or the daemon's own (Rule 3)."""
    for root in (*FORBIDDEN_ROOTS, *private):
        if real == root or real.startswith(root.rstrip("/") + "/"):
            raise AttachmentRefused(
                f"{shown} resolves into {root}, which the daemon does not read for a prompt",
                reason="forbidden_path",
                path=shown,
            )


def _kernel_devices() -> set[int]:
    """The devices of the kernel's own file systems (``/proc``, ``/sys``), wherever
    else they are mounted."""
    devices = set()
    for root in ("/proc", "/sys"):
        with contextlib.suppress(OSError):
            devices.add(os.stat(root).st_dev)
    return devices


def _read_bounded(path: str, private: list[str]) -> bytes:
    """At most ``MAX_IMAGE_BYTES`` of the regular file ``path`` (Rule 3)."""
    _check_place(os.path.realpath(path), path, private)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(os.path.realpath(path), flags | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise AttachmentRefused(f"{path} does not exist", reason="not_found", path=path) from None
    except OSError as exc:
        raise AttachmentRefused(
            f"{path} cannot be read: {exc.strerror}", reason="unreadable", path=path
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise AttachmentRefused(
                f"{path} is not a regular file", reason="not_regular", path=path
            )
        if st.st_dev in _kernel_devices():  # /proc or /sys mounted elsewhere too
            raise AttachmentRefused(
                f"{path} is a kernel file, which the daemon does not read for a prompt",
                reason="forbidden_path",
                path=path,
            )
        try:
            opened = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            opened = None  # no /proc: the check before opening stands alone
        if opened is not None:
            _check_place(opened, path, private)
        if st.st_size > MAX_IMAGE_BYTES:
            raise _too_large(path)
        chunks = []
        left = MAX_IMAGE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise AttachmentRefused(
            f"{path} cannot be read: {exc.strerror}", reason="unreadable", path=path
        ) from None
    finally:
        os.close(fd)
    if len(data) > MAX_IMAGE_BYTES:  # it grew after the fstat
        raise _too_large(path)
    return data


def _file(path: str, cwd: str, private: list[str]) -> Attachment:
    shown = _absolute(path, cwd)
    real = os.path.realpath(shown)
    _check_place(real, shown, private)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise AttachmentRefused(f"{shown} does not exist", reason="not_found", path=shown) from None
    except OSError as exc:
        raise AttachmentRefused(
            f"{shown} cannot be used: {exc.strerror}", reason="unreadable", path=shown
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise AttachmentRefused(f"{shown} is not a regular file", reason="not_regular", path=shown)
    return Attachment(type="file", byte_length=st.st_size, path=shown)


class BlobStore:
    """The sessions' copies of their prompts' images (Rule 2). Blocking methods:
    run them in a worker thread."""

    def __init__(self, root: Path, quota_bytes: int = MAX_SESSION_BLOB_BYTES) -> None:
        self.root = root
        self.quota_bytes = quota_bytes
        # One keep at a time per session, so that two sends cannot both pass the
        # quota; sessions do not wait for each other.
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _dir(self, session_id: str) -> Path:
        return self.root / session_id

    def _lock(self, session_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(session_id, threading.Lock())

    def keep(self, session_id: str, images: dict[str, bytes]) -> None:
        """Write each image under its digest, durably, unless already kept. Raises
        ``AttachmentRefused`` (``quota``) when the new ones would take the session's
        copies past ``quota_bytes``, ``StorageUnavailable`` when they cannot be
        written (a full disk): nothing of the prompt is journaled then (Rule 1)."""
        if not images:
            return
        directory = self._dir(session_id)
        with self._lock(session_id):
            try:
                self.root.mkdir(mode=0o700, exist_ok=True)
                directory.mkdir(mode=0o700, exist_ok=True)
                new = {d: data for d, data in images.items() if not (directory / d).exists()}
                if not new:
                    return
                self._check_quota(directory, sum(len(data) for data in new.values()))
                for digest, data in new.items():
                    _write_durably(directory, digest, data)
                _fsync_dir(directory)
            except OSError as exc:
                raise StorageUnavailable(
                    f"the daemon cannot keep the prompt's images: {exc.strerror}"
                ) from None

    def _check_quota(self, directory: Path, adding: int) -> None:
        kept = 0
        with os.scandir(directory) as entries:
            for entry in entries:
                if not entry.name.startswith("."):  # a temp file is another keep's
                    kept += entry.stat(follow_symlinks=False).st_size
        if kept + adding > self.quota_bytes:
            raise AttachmentRefused(
                f"the session already keeps {kept} bytes of images; the daemon keeps at "
                f"most {self.quota_bytes} bytes of images per session (delete the session "
                "or start a new one to send more)",
                reason="quota",
                limit=self.quota_bytes,
            )

    def inputs(
        self, session_id: str, attachments: Sequence[Attachment]
    ) -> tuple[ImageInput | FileInput, ...]:
        """What the agent gets for ``attachments``: images read back and checked
        against their digests. Raises ``AttachmentRefused`` when a copy is gone."""
        out: list[ImageInput | FileInput] = []
        for attachment in attachments:
            if attachment.type == "file":
                out.append(FileInput(path=attachment.path or ""))
                continue
            digest = attachment.sha256 or ""
            try:
                data = (self._dir(session_id) / digest).read_bytes()
            except OSError:
                data = b""
            if hashlib.sha256(data).hexdigest() != digest:
                raise AttachmentRefused(
                    f"the daemon's copy of image {digest[:12]} is gone or damaged",
                    reason="not_found",
                )
            out.append(ImageInput(media_type=attachment.media_type or "", data=data))
        return tuple(out)

    def drop(self, session_id: str) -> None:
        shutil.rmtree(self._dir(session_id), ignore_errors=True)
        with self._locks_guard:
            self._locks.pop(session_id, None)


def _write_durably(directory: Path, digest: str, data: bytes) -> None:
    """``directory/digest`` holds ``data``, fsynced, or is as it was: written under
    a temp name of its own (a concurrent keep of the same image in another session's
    thread, or a daemon's leftover, never shares it), then renamed."""
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{digest}.", suffix=".tmp")
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, directory / digest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
