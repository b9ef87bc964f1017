"""Driver-independent half of the Redis stores: the URL, the scripts, each operation's script
call and how to read its reply, the conflict handling, the record counts.

Nothing here talks to Redis or imports a client: the drivers (``_lean.py``, ``_client.py``) run
what is built here.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Generic, NamedTuple, TypeVar

from ..._core.errors import ConfigurationError, StoreError, StoreUnavailableError
from ..._core.records import Record, Reservation, instance_id, lease_token, other_owner
from .._base import StoreStats
from .._registry import parse_store_url
from .._url import StoreURL, non_negative, positive, text, whole

__all__ = [
    "DEFAULT_HEARTBEAT",
    "DEFAULT_PREFIX",
    "DEFAULT_REPLICAS_TIMEOUT",
    "REDIS_PY_OPTIONS",
    "SCRIPTS",
    "URL_OPTIONS",
    "Call",
    "ClusterURL",
    "Commands",
    "LostReplies",
    "RedisURL",
    "Tally",
    "Wait",
    "check_replicas",
    "conflict_op",
    "ms",
    "now_ms",
    "parse_cluster_url",
    "parse_redis_url",
    "reply_error",
]

STORE = "redis"
DEFAULT_PREFIX = "retrysafe:"
#: Seconds a process's heartbeat key lives without renewal: how soon a dead owner's keys are
#: taken over, and how long a paused (SIGSTOP, VM stall) process keeps them.
DEFAULT_HEARTBEAT = 5.0
#: A reserve that meets a record changing hands this often in a row gives up.
_RESERVE_ATTEMPTS = 50
#: Seconds a write waits for its replicas (``?replicas_timeout=``) when ``?replicas=`` is set.
DEFAULT_REPLICAS_TIMEOUT = 0.5
T = TypeVar("T")

# Error replies that mean "the server cannot serve right now", not "the command is wrong".
_UNAVAILABLE_REPLIES = ("LOADING", "BUSY", "MASTERDOWN", "READONLY", "CLUSTERDOWN", "TRYAGAIN")


# -- the URL -------------------------------------------------------------------------------------


def _heartbeat(value: str) -> float:
    seconds = non_negative(value)
    if 0 < seconds < 0.5:
        raise ValueError("0 (off) or at least 0.5 seconds")
    return seconds


#: The store's own query options: constructor keyword -> converter.
URL_OPTIONS = {
    "prefix": text,
    "timeout": positive,
    "connect_timeout": positive,
    "heartbeat": _heartbeat,
    "replicas": whole,
    "replicas_timeout": positive,
}

#: redis-py's own URL options, left in the URL for it (the sync stores; the async store's lean
#: connection reads ``db`` and ``ssl_ca_certs`` only). Its timeouts and retries are not among
#: them: the store sets those (``timeout``, ``connect_timeout``; retries off).
REDIS_PY_OPTIONS = frozenset(
    {
        "db",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_cert_reqs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_password",
        "ssl_check_hostname",
        "client_name",
        "health_check_interval",
        "socket_keepalive",
        "max_connections",
    }
)


@dataclass(frozen=True, slots=True)
class RedisURL:
    """A parsed store URL: where the server is and the store's own options.

    Attributes:
        client_url: the URL without the store's options (what redis-py understands).
        host: server host.
        port: server port.
        db: database index.
        username: ACL user, if any.
        password: password, if any.
        tls: ``rediss://``.
        prefix: key prefix of every record (``?prefix=``).
        timeout: seconds per command (``?timeout=``).
        connect_timeout: seconds per connection attempt (``?connect_timeout=``).
        heartbeat: TTL in seconds of this process's heartbeat key (``?heartbeat=``; owner
            liveness). 0 turns liveness off: keys of a dead process then wait for the lease.
        ssl_ca_certs: a CA file to verify the server's certificate with (``rediss://``,
            ``?ssl_ca_certs=``; default: the system's CAs). Both faces honour it.
        replicas: how many replicas must have a reservation, a completion or a commit mark
            before it counts as done (``?replicas=``; ``WAIT``); 0, the default, waits for none.
        replicas_timeout: seconds such a write waits for them (``?replicas_timeout=``); less
            than ``timeout``.
    """

    client_url: str
    host: str
    port: int
    db: int
    username: str | None
    password: str | None
    tls: bool
    prefix: str = DEFAULT_PREFIX
    timeout: float = 2.0
    connect_timeout: float = 2.0
    heartbeat: float = DEFAULT_HEARTBEAT
    ssl_ca_certs: str | None = None
    replicas: int = 0
    replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT

    def __post_init__(self) -> None:
        check_replicas(self.replicas, self.replicas_timeout, self.timeout)


def check_replicas(replicas: Any, replicas_timeout: Any, timeout: float) -> None:
    """Refuse a bad ``replicas`` / ``replicas_timeout`` (a URL's or a store keyword's).

    Raises:
        ConfigurationError: naming the option: ``replicas`` not a whole number 0 or more, or
            ``replicas_timeout`` not a number of seconds above 0, and with replicas, below
            ``timeout`` (a wait that the connection's own timeout cuts off would read as a lost
            connection).
    """
    if type(replicas) is not int or replicas < 0:
        raise ConfigurationError(
            f"Redis store option replicas={replicas!r}: a whole number of replicas, 0 or more"
        )
    if (
        isinstance(replicas_timeout, bool)
        or not isinstance(replicas_timeout, int | float)
        or not replicas_timeout > 0
        or (replicas and replicas_timeout >= timeout)
    ):
        raise ConfigurationError(
            f"Redis store option replicas_timeout={replicas_timeout!r}: seconds, more than 0 "
            f"and less than the command timeout ({timeout:g} s, ?timeout=)"
        )


def _redis_url(url: StoreURL, *, tls: bool, client_url: str, db: int = 0) -> RedisURL:
    host, port = url.hosts[0] if url.hosts else ("", None)
    return RedisURL(
        client_url=client_url,
        host=host or "127.0.0.1",
        port=port or 6379,
        db=db,
        username=url.username,
        password=url.password,
        tls=tls,
        ssl_ca_certs=url.passed_option("ssl_ca_certs"),
        **url.options,
    )


def parse_redis_url(url: str | StoreURL) -> RedisURL:
    """Parse ``redis://[user:password@]host[:port][/db][?prefix=...&timeout=...]``.

    ``rediss://`` means TLS. redis-py's own options (:data:`REDIS_PY_OPTIONS`) are left for it
    (the sync store) and ignored by the async store's lean connection, but ``db`` and
    ``ssl_ca_certs``.

    Raises:
        ConfigurationError: not a redis URL, an unknown option, or an option with a bad value.
    """
    parsed = parse_store_url(url) if isinstance(url, str) else url
    if parsed.scheme not in ("redis", "rediss"):
        raise ConfigurationError(f"not a redis:// or rediss:// URL: {parsed.scheme}://...")
    if len(parsed.hosts) > 1:
        raise ConfigurationError("a redis:// URL names one server; use redis+cluster:// for more")
    raw_db = parsed.path.strip("/") or parsed.passed_option("db") or "0"
    try:
        db = int(raw_db)
    except ValueError:
        raise ConfigurationError(f"redis store URL: bad database number {raw_db!r}") from None
    return _redis_url(parsed, tls=parsed.scheme == "rediss", client_url=parsed.driver_url(), db=db)


_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


@dataclass(frozen=True, slots=True)
class ClusterURL:
    """A parsed ``redis+cluster://`` URL.

    Attributes:
        nodes: the seed nodes as (host, port).
        options: credentials, TLS and the store's options, as for one server.
    """

    nodes: tuple[tuple[str, int], ...]
    options: RedisURL


def parse_cluster_url(url: str | StoreURL) -> ClusterURL:
    """Parse ``redis+cluster://[user:password@]host:port[,host:port...][?options]``.

    Raises:
        ConfigurationError: not a cluster URL, no node, or a bad port or option.
    """
    parsed = parse_store_url(url) if isinstance(url, str) else url
    single = _CLUSTER_SCHEMES.get(parsed.scheme)
    if single is None:
        raise ConfigurationError(
            f"not a redis+cluster:// or rediss+cluster:// URL: {parsed.scheme}://..."
        )
    nodes = tuple((host or "127.0.0.1", port or 6379) for host, port in parsed.hosts)
    if not nodes:
        raise ConfigurationError("redis+cluster URL names no node (host:port,host:port...)")
    options = _redis_url(parsed, tls=single == "rediss", client_url=parsed.driver_url(single))
    return ClusterURL(nodes, options)


# -- scripts -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script of ``lua/`` and its SHA-1 (for ``EVALSHA``)."""

    name: str
    source: bytes
    sha: str


def _load_script(name: str) -> Script:
    source = resources.files("retrysafe.stores.redis").joinpath("lua", f"{name}.lua").read_bytes()
    return Script(name, source, hashlib.sha1(source).hexdigest())


RESERVE = _load_script("reserve")
_RENEW = _load_script("renew")
_COMPLETE = _load_script("complete")
_RELEASE = _load_script("release")
_GET = _load_script("get")
_MARK_COMMITTED = _load_script("mark_committed")
_DELETE = _load_script("delete")
_TAKE_OVER = _load_script("take_over")
_OWNER_ALIVE = _load_script("owner_alive")
SCRIPTS = (
    RESERVE,
    _RENEW,
    _COMPLETE,
    _RELEASE,
    _GET,
    _MARK_COMMITTED,
    _DELETE,
    _TAKE_OVER,
    _OWNER_ALIVE,
)


# -- the operations, once, sans I/O --------------------------------------------------------------


class Call(NamedTuple, Generic[T]):
    """One script call: run ``script`` with ``args`` (key first), read the reply with ``parse``;
    with ``wait``, a write it made counts only once replicas have it."""

    script: Script
    args: tuple[Any, ...]
    parse: Any  # Callable[[Any, Call[T]], T]; Any keeps the NamedTuple generic simple
    token: str | None = None
    wait: Wait | None = None


class Wait:
    """``WAIT replicas timeout`` after a script, on the same connection and in the same round
    trip (pipelined): Redis answers how many replicas have every write that connection made so
    far, the script's included. A write that fewer than ``replicas`` acknowledged in time is
    answered as not done (:class:`StoreUnavailableError`: ``503``, retry later), never as
    durable: the master may crash before they get it, and the promoted replica would not know
    the record.

    Args:
        replicas: how many replicas must acknowledge.
        timeout: seconds to wait for them.
        wrote: from the script's reply, whether it wrote (a reserve that only read another
            request's record, a fenced-out completion: nothing to wait for).
    """

    __slots__ = ("command", "replicas", "timeout", "wrote")

    def __init__(self, replicas: int, timeout: float, wrote: Callable[[Any], bool]) -> None:
        self.replicas = replicas
        self.timeout = timeout
        self.command: tuple[Any, ...] = ("WAIT", replicas, ms(timeout))
        self.wrote = wrote

    def check(self, reply: Any, acked: Any, what: str) -> None:
        """Raise unless the script's write (if any) reached enough replicas.

        Args:
            reply: the script's reply.
            acked: the ``WAIT`` reply (a count), or the error it failed with.
            what: the operation, for the message.

        Raises:
            StoreUnavailableError: it wrote, and fewer replicas than asked have it.
        """
        if not self.wrote(reply):
            return
        if isinstance(acked, Exception):
            raise StoreUnavailableError(
                f"Redis {what}: WAIT for {self.replicas} replica(s) failed: {acked}", store=STORE
            )
        if acked < self.replicas:
            raise StoreUnavailableError(
                f"Redis {what}: {acked} of the {self.replicas} replica(s) asked for (replicas=) "
                f"acknowledged the write within {self.timeout:g} s (replicas_timeout=); "
                "not counted as done",
                store=STORE,
            )


def _won(reply: Any) -> bool:
    return bool(reply[0] == 1)


def _one(reply: Any) -> bool:
    return bool(reply == 1)


class LostReplies:
    """Reservations of this store whose reply never came (a timeout, a dropped connection, a
    failover, a cancelled caller): the reservation may be on the server, under a token only
    this process knows. A retry of the same operation from this process (same key, fingerprint
    and kind of claim) sends that token again, and ``reserve.lua`` recognises its own token:
    the owner resumes its reservation instead of meeting it as "in progress" until the lease
    lapses. Taken once (a second retry in flight at the same time meets the first as in
    progress, as it should); bounded (the oldest is forgotten: its key then waits for the
    lease, as without this); never inherited across ``fork`` (a child's tokens name the child).
    """

    __slots__ = ("_lock", "_tokens")

    LIMIT = 1024

    def __init__(self) -> None:
        self._tokens: dict[str, tuple[str, bool, str]] = {}
        self._lock = threading.Lock()

    def keep(self, record_id: str, fingerprint: str, committed: bool, token: str) -> None:
        """The reservation with ``token`` may exist; its caller never learnt."""
        with self._lock:
            tokens = self._tokens
            if len(tokens) >= self.LIMIT and record_id not in tokens:
                del tokens[next(iter(tokens))]
            tokens[record_id] = (fingerprint, committed, token)

    def take(self, record_id: str, fingerprint: str, committed: bool) -> str | None:
        """The token to claim ``record_id`` with again, if this process lost a reply for it."""
        if not self._tokens:  # the common case: one truth test
            return None
        with self._lock:
            found = self._tokens.get(record_id)
            if found is None or found[:2] != (fingerprint, committed):
                return None  # another request with this key (mismatch or another kind)
            del self._tokens[record_id]
        token = found[2]
        return token if token.startswith(instance_id()) else None


def ms(seconds: float) -> int:
    """Whole milliseconds, at least 1: PEXPIRE needs a positive integer, and a sub-millisecond
    lease would delete the key at once."""
    return max(1, round(seconds * 1000))


def _record(reply: Any) -> Record:
    kind, fingerprint, payload = reply[:3]
    if kind == 2:
        return Record(fingerprint.decode(), "completed", payload)
    # kind 0: in progress (payload: the key's PTTL); 3: committed (payload: ms left on lease).
    return Record(
        fingerprint.decode(),
        "in_progress",
        lease_remaining=max(0, payload) / 1000,
        committed=kind == 3,
    )


def _parse_claim(reply: Any, call: Call[Any]) -> tuple[Reservation, str | None]:
    if reply[0] == 1:
        return Reservation(token=call.token), None
    holder = reply[3].decode() if len(reply) > 3 and reply[3] is not None else None
    return Reservation(record=_record(reply)), holder


def _parse_flag(reply: Any, call: Call[bool]) -> bool:
    return bool(reply == 1)


def _parse_get(reply: Any, call: Call[Record | None]) -> Record | None:
    return None if reply is None else _record(reply)


class Commands:
    """Builds each operation's script call; shared by every driver and both faces.

    Args:
        prefix: the key prefix of every record.
        replicas: how many replicas must acknowledge a reservation, a completion or a commit
            mark (0: none, no ``WAIT``).
        replicas_timeout: seconds those writes wait for them.
    """

    __slots__ = ("_claimed", "_flagged", "lost", "prefix")

    def __init__(
        self,
        prefix: str,
        replicas: int = 0,
        replicas_timeout: float = DEFAULT_REPLICAS_TIMEOUT,
    ) -> None:
        self.prefix = prefix
        self.lost = LostReplies()
        self._claimed: Wait | None = None
        self._flagged: Wait | None = None
        if replicas:
            self._claimed = Wait(replicas, replicas_timeout, _won)
            self._flagged = Wait(replicas, replicas_timeout, _one)

    def claim(
        self,
        record_id: str,
        fingerprint: str,
        lease: float,
        ttl: float,
        owned: bool,
        committed: bool = False,
    ) -> Call[tuple[Reservation, str | None]]:
        """The reserve-or-read script; its reply also names the holder of a record it met.
        ``committed``: a won reservation is created committed (as :meth:`mark_committed`
        leaves it, with the same lease)."""
        token = self.lost.take(record_id, fingerprint, committed) or lease_token(owned)
        args: tuple[Any, ...] = (
            self.prefix + record_id,
            fingerprint,
            token,
            ms(min(lease, ttl)),
            ms(ttl),
        )
        if committed:
            args += (max(0, round(lease * 1000)),)
        return Call(RESERVE, args, _parse_claim, token, self._claimed)

    def lost_claim(self, record_id: str, fingerprint: str, claim: Call[Any]) -> None:
        """``claim`` (or the takeover after it) failed without an answer: remember its token
        for a retry from this process (:class:`LostReplies`)."""
        self.lost.keep(record_id, fingerprint, len(claim.args) > 5, claim.token or "")

    def owner_key(self, instance: str) -> str:
        """The heartbeat key of ``instance``."""
        # Outside the records' prefix: whatever scans ``<prefix>*`` (stats, an operator's
        # cleanup) sees records only. Every process with this prefix names the same key.
        return f"retrysafe-owner:{self.prefix}{instance}"

    def owner_alive(self, instance: str) -> Call[bool]:
        """Whether the heartbeat key of ``instance`` exists."""
        return Call(_OWNER_ALIVE, (self.owner_key(instance),), _parse_flag)

    def take_over(
        self, record_id: str, holder: str, fingerprint: str, token: str, lease: float, ttl: float
    ) -> Call[bool]:
        """Replace ``holder``'s in-progress record (fenced on ``holder``)."""
        args = (
            self.prefix + record_id,
            holder,
            fingerprint,
            token,
            ms(min(lease, ttl)),
            ms(ttl),
        )
        return Call(_TAKE_OVER, args, _parse_flag, wait=self._flagged)

    def renew(self, record_id: str, token: str, lease: float) -> Call[bool]:
        """See :meth:`retrysafe.stores.AsyncStore.renew`."""
        return Call(_RENEW, (self.prefix + record_id, token, ms(lease)), _parse_flag)

    def mark_committed(self, record_id: str, token: str, lease: float) -> Call[bool]:
        """See :meth:`retrysafe.stores.AsyncStore.mark_committed`."""
        # Only a hash field (no PEXPIRE): a lease of 0 must stay 0, so the outcome is unknown at
        # once (the flow's "declare unknown"), not 1 ms later.
        lease_ms = max(0, round(lease * 1000))
        args = (self.prefix + record_id, token, lease_ms)
        return Call(_MARK_COMMITTED, args, _parse_flag, wait=self._flagged)

    def delete(self, record_id: str) -> Call[bool]:
        """See :meth:`retrysafe.stores.AsyncStore.delete`."""
        return Call(_DELETE, (self.prefix + record_id,), _parse_flag)

    def complete(self, record_id: str, token: str, response: bytes, ttl: float) -> Call[bool]:
        """See :meth:`retrysafe.stores.AsyncStore.complete`."""
        args = (self.prefix + record_id, token, response, ms(ttl))
        return Call(_COMPLETE, args, _parse_flag, wait=self._flagged)

    def release(self, record_id: str, token: str) -> Call[bool]:
        """See :meth:`retrysafe.stores.AsyncStore.release`."""
        return Call(_RELEASE, (self.prefix + record_id, token), _parse_flag)

    def get(self, record_id: str) -> Call[Record | None]:
        """See :meth:`retrysafe.stores.AsyncStore.get`."""
        return Call(_GET, (self.prefix + record_id,), _parse_get)

    def pattern(self) -> str:
        """The ``SCAN MATCH`` pattern of every record of this prefix (glob characters escaped)."""
        return "".join("\\" + c if c in "*?[]\\" else c for c in self.prefix) + "*"


def conflict_op(
    commands: Commands,
    claim: Call[Any],
    first: tuple[Reservation, str | None],
    record_id: str,
    fingerprint: str,
    lease: float,
    ttl: float,
) -> Generator[Call[Any], Any, Reservation]:
    """After ``reserve`` met another process's in-progress record (``first``): take it over if
    that process is dead. Both faces drive this generator; the non-conflict path never enters.

    Costs one ``owner_alive`` call (the heartbeat key exists?), plus one ``take_over`` when the
    heartbeat has lapsed.
    """
    reservation, holder = first
    for _ in range(_RESERVE_ATTEMPTS):
        record = reservation.record
        owner = other_owner(holder)
        if record is None or owner is None:
            return reservation
        if (yield commands.owner_alive(owner)):
            return reservation
        if record.committed:
            # Effects happened and no one will store the answer: outcome unknown at once.
            return Reservation(record=Record(record.fingerprint, "in_progress", committed=True))
        token = claim.token or ""
        if (yield commands.take_over(record_id, holder or "", fingerprint, token, lease, ttl)):
            return Reservation(token=token)
        # The record changed hands in between: read it again.
        reservation, holder = yield claim
    raise StoreError(
        f"reserve met a changing record {_RESERVE_ATTEMPTS} times in a row", store=STORE
    )


def reply_error(exc: Exception, what: str) -> StoreError:
    """An error reply of Redis as a store error (``503`` for "cannot serve right now")."""
    message = f"Redis {what} failed: {exc}"
    if str(exc).startswith(_UNAVAILABLE_REPLIES):
        return StoreUnavailableError(message, store=STORE)
    return StoreError(message, store=STORE)


# -- statistics ----------------------------------------------------------------------------------


class Tally:
    """Counts records by state from their ``HMGET s l x`` replies (state, end of lease once
    committed, end of retention), at the server's time ``now_ms``.

    Args:
        now_ms: the server's time in milliseconds.
    """

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self.counts = dict.fromkeys(("completed", "in_progress", "committed", "outcome_unknown"), 0)
        self.oldest: float | None = None

    def add(self, replies: Iterable[Sequence[bytes | None]]) -> None:
        """Count one batch of replies (a record gone since the scan saw it has no state)."""
        counts = self.counts
        for state, lease_end, retention_end in replies:
            if state is None:
                continue  # expired or released since the scan saw it
            if state == b"1":
                counts["completed"] += 1
                continue
            if state == b"2" and lease_end is not None and int(lease_end) <= self.now_ms:
                counts["outcome_unknown"] += 1
                continue
            # A state-0 record lives only while its lease does (its TTL is the lease).
            counts["committed" if state == b"2" else "in_progress"] += 1
            if retention_end is not None:
                left = (int(retention_end) - self.now_ms) / 1000
                self.oldest = left if self.oldest is None else min(self.oldest, left)

    def stats(self) -> StoreStats:
        """The counts (Redis expires records by itself: nothing lapsed or expired is kept)."""
        return StoreStats(
            lapsed=0, oldest_in_progress_retention_left=self.oldest, expired=0, **self.counts
        )


def now_ms(reply: Any) -> int:
    """Milliseconds from a ``TIME`` reply (seconds, microseconds)."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000
