"""Prints the install matrix's timings at the end of the run (when it ran)."""

from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from .test_matrix import REPORT

    report = terminalreporter.config.stash.get(REPORT, None)
    if report:
        terminalreporter.write_sep("-", "install matrix")
        terminalreporter.write_line(report)
