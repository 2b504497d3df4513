"""The agentsd daemon."""
