"""A client process for the crash test: one journal operation per id, sequentially.

    python -m tests.client.crash_client URL JOURNAL DELAY_MS OP_ID...

Prints ``sending <id>`` right before each send and one JSON line per answer.
"""

from __future__ import annotations

import json
import sys

import httpx

from retrysafe.client import RetryingTransport, RetryPolicy, SQLiteJournal, retry_info


def main(argv: list[str]) -> int:
    url, journal_path, delay_ms, *operation_ids = argv
    journal = SQLiteJournal(journal_path)
    policy = RetryPolicy(max_attempts=8, backoff_initial=0.05, backoff_max=0.5)
    with httpx.Client(transport=RetryingTransport(policy=policy), timeout=10) as client:
        for operation_id in operation_ids:
            with journal.operation(operation_id) as operation:
                print(f"sending {operation_id}", flush=True)
                response = client.post(
                    f"{url}/orders?delay_ms={delay_ms}",
                    json={"item": operation_id, "quantity": 1},
                )
                info = retry_info(response)
                assert info is not None
                line = {
                    "operation": operation_id,
                    "status": response.status_code,
                    "replayed": info.replayed,
                    "key": info.key,
                    "journal_key": operation.key,
                }
                print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
