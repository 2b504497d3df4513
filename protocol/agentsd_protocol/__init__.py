"""agentsd wire protocol: JSON-RPC 2.0, framing, errors and the method registry (msgspec + stdlib only)."""
