"""RPC handlers, one module per method family; each exports ``HANDLERS``."""
