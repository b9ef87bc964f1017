"""Framework integrations: ``retrysafe.contrib.fastapi`` and others (each behind an extra)."""
