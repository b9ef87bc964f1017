"""A reserve and a release on each face of the store a URL names: ``python roundtrip.py URL``.

Run by the install matrix (``projects.md``) with a virtualenv that has one store extra alone.
"""

from __future__ import annotations

import asyncio
import sys

from retrysafe import async_store_from_url, store_from_url


async def _async_face(url: str) -> None:
    store = async_store_from_url(url)
    won = await store.reserve("install-matrix", "fp", lease=5.0, ttl=30.0)
    assert won.token is not None and await store.release("install-matrix", won.token)
    await store.aclose()


def main(url: str) -> None:
    store = store_from_url(url)
    won = store.reserve("install-matrix", "fp", lease=5.0, ttl=30.0)
    assert won.token is not None and store.release("install-matrix", won.token)
    store.close()
    asyncio.run(_async_face(url))


if __name__ == "__main__":
    main(sys.argv[1])
