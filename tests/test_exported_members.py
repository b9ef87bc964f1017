"""Every public name of ``retrysafe``, ``retrysafe.stores`` and ``retrysafe.client`` is in a
sorted ``__all__``."""

from __future__ import annotations
import __future__

import re
import types

import retrysafe
import retrysafe.client
import retrysafe.stores


def _isort_key(name: str) -> tuple[int, list[object]]:
    # ruff RUF022 "isort-style": SCREAMING_SNAKE_CASE, then CamelCase, then the rest; natural
    # order inside each group.
    if len(name) > 1 and name.isupper():
        group = 0
    elif name[:1].isupper():
        group = 1
    else:
        group = 2
    parts = [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
    return group, parts


def _public_names(module: types.ModuleType) -> list[str]:
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and not isinstance(value, __future__._Feature)
    ]


def test_retrysafe_all_is_complete() -> None:
    assert sorted(retrysafe.__all__) == sorted(_public_names(retrysafe))


def test_retrysafe_all_is_sorted() -> None:
    assert retrysafe.__all__ == sorted(retrysafe.__all__, key=_isort_key)


def test_retrysafe_all_names_exist() -> None:
    for name in retrysafe.__all__:
        assert hasattr(retrysafe, name), name


def test_stores_all_is_complete() -> None:
    assert sorted(retrysafe.stores.__all__) == sorted(_public_names(retrysafe.stores))


def test_stores_all_is_sorted() -> None:
    assert retrysafe.stores.__all__ == sorted(retrysafe.stores.__all__, key=_isort_key)


def test_stores_all_names_exist() -> None:
    for name in retrysafe.stores.__all__:
        assert hasattr(retrysafe.stores, name), name


def test_client_all_is_complete() -> None:
    # The transports load lazily (PEP 562): touch every name so they are in vars() too.
    for name in retrysafe.client.__all__:
        getattr(retrysafe.client, name)
    assert sorted(retrysafe.client.__all__) == sorted(_public_names(retrysafe.client))


def test_client_all_is_sorted() -> None:
    assert retrysafe.client.__all__ == sorted(retrysafe.client.__all__, key=_isort_key)


def test_client_dir_lists_the_lazy_names() -> None:
    assert set(retrysafe.client.__all__) <= set(dir(retrysafe.client))
