"""The client's sync shells, generated from ``../_async/`` by ``scripts/unasync.py``."""
