"""The sans-IO client core every agentsd client is built on: ``core`` (requests,
replies and notifications of one connection) and ``cursor`` (following one session's
journal exactly once, in order)."""
