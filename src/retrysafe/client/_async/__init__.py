"""The client's async shells; ``../_sync/`` is generated from them by ``scripts/unasync.py``."""
