"""The sync runner of the request flow: ``runner.py`` is generated from ``_async/runner.py``."""
