"""Hold a process so that it cannot finish exiting: ``python -m tests.e2e.ptrace_hold PID``.

The holder attaches to PID with ``PTRACE_SEIZE`` and ``PTRACE_O_TRACEEXIT`` and then
never resumes it. Whatever ends the process (stdin EOF, SIGTERM, SIGKILL) leaves it
stopped, not reaped: a signal stops it for its tracer (signal-delivery-stop), and an
exit, even by SIGKILL, stops it at ``PTRACE_EVENT_EXIT`` before it becomes a zombie.
Its parent's ``wait()`` cannot return and its process group stays non-empty: the
kernel's own way of making an exit unprovable.

It prints ``held`` once attached, then waits for its stdin to close; on exit the
kernel detaches it and the process finishes whatever ended it. Needs
``CAP_SYS_PTRACE`` (root) to trace a process it did not start.
"""

from __future__ import annotations

import ctypes
import os
import sys

PTRACE_SEIZE = 0x4206  # <linux/ptrace.h>
PTRACE_O_TRACEEXIT = 0x40


def seize(pid: int) -> None:
    """Attach to ``pid`` without stopping it; ``OSError`` if the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    if libc.ptrace(PTRACE_SEIZE, pid, None, PTRACE_O_TRACEEXIT) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"PTRACE_SEIZE {pid}: {os.strerror(err)}")


def main() -> None:
    seize(int(sys.argv[1]))
    print("held", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
