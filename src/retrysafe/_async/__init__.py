"""The async runner of the request flow (the source of the generated ``_sync`` twin)."""
