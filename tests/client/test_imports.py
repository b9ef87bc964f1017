"""The client's core (policy, journal, errors) needs neither httpx nor requests; a missing one
is a clear ImportError naming the extra, raised only when its transport is asked for."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )


def test_client_core_works_without_httpx_and_requests() -> None:
    result = run(
        """
        import sys
        sys.modules["httpx"] = None      # import httpx now raises ImportError
        sys.modules["requests"] = None
        import retrysafe.client as c
        call = c.RetryPolicy().start("POST")
        call.attempt()
        assert call.on_error(c.Failure.LOST).action == "retry"
        for name in ("RetryingTransport", "AsyncRetryingTransport", "RetryingAdapter"):
            try:
                getattr(c, name)
            except ImportError as exc:
                print(exc)
            else:
                raise SystemExit(name + " imported without its library")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "retrysafe.client.RetryingTransport needs httpx: pip install 'retrysafe[httpx]'",
        "retrysafe.client.AsyncRetryingTransport needs httpx: pip install 'retrysafe[httpx]'",
        "retrysafe.client.RetryingAdapter needs requests: pip install 'retrysafe[requests]'",
    ]


def test_importing_retrysafe_or_its_client_loads_no_http_library() -> None:
    result = run(
        """
        import sys
        import retrysafe
        assert "retrysafe.client" not in sys.modules
        import retrysafe.client
        print(sorted(m for m in ("httpx", "requests", "urllib3") if m in sys.modules))
        retrysafe.client.RetryingAdapter
        print("requests" in sys.modules)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "True"]


def test_unknown_attributes_are_attribute_errors() -> None:
    import retrysafe.client

    with pytest.raises(AttributeError, match="NoSuchThing"):
        retrysafe.client.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
