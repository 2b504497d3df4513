"""agentsctl: the agentsd CLI and client libraries.

``from agentsctl import Client`` gives the synchronous client. The import is lazy
(PEP 562) because every ``agentsctl`` command imports this package first and the
client pulls in msgspec, which the CLI's hot path avoids (see ``agentsctl.cli``).
"""

from __future__ import annotations

# typing costs a few ms of cold start and is needed by the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from agentsctl.client import Client, DaemonDisconnected, DaemonUnreachable

__all__ = ["Client", "DaemonDisconnected", "DaemonUnreachable"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from agentsctl import client

        return getattr(client, name)
    raise AttributeError(f"module 'agentsctl' has no attribute {name!r}")
