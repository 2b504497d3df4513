"""agentsctl: the agentsd CLI and client libraries."""
