"""``python -m retrysafe.client METHOD URL ...`` sends one request with the retry policy."""

from __future__ import annotations

import sys

from ._cli import main

sys.exit(main())
