"""Redis store: one service across many app instances (``redis://``, ``rediss://``).

Each record is a hash under ``<prefix><record id>`` (fingerprint, token, state, response, end
of retention, end of lease once committed; see ``lua/reserve.lua``). Every operation is ONE
round trip: a Lua script from ``retrysafe/stores/lua/`` run with ``EVALSHA`` (the script is sent
with ``EVAL`` once when the server answers ``NOSCRIPT``, which also caches it again).
``reserve`` creates the record, takes over a lapsed lease or returns the record that holds the
key, atomically; ``renew``, ``mark_committed``, ``complete`` and ``release`` compare the token
first (fencing). Expiry is Redis's own: the key's TTL is the lease while the request runs, and
the retention once completed or once its effects are marked committed (such a record is never
taken over), so a crashed owner's reservation disappears when its lease lapses and
``purge_expired`` has nothing to do.

Cluster and Valkey: every script touches exactly one key, passed in ``KEYS``, so a cluster
client routes it; put a hash tag in the prefix (``?prefix={retrysafe}:``) to pin every record to
one slot if you want that. Pass a ``redis.asyncio.RedisCluster`` (or any redis-py client) as
``client=``; the store never closes a client it did not create.

Sync and async, one implementation: each operation is defined once, sans I/O, by
:class:`_Commands` (which script, which arguments, how to read the reply). The two classes only
carry a call over the wire: :class:`AsyncRedisStore` through :mod:`._redis_lean` (a lean
pipelined asyncio connection, measured 6-8x less client CPU per command than redis-py's asyncio
client) or a user's redis-py async client; :class:`RedisStore` through redis-py's sync client.
Their public methods are one-line delegations, so there is no logic to keep in step and no
generator to run.

Errors: connection refused, lost or timed out become :class:`StoreUnavailableError`, anything
else :class:`StoreError`; no redis-py or hiredis exception leaves the store. A command whose
connection failed mid-flight is never resent (its effect is unknown; a resent ``reserve`` could
find its own reservation and answer 409), so the store's own redis-py client has retries off.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl as ssl_module
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from importlib import resources
from typing import Any, Generic, NamedTuple, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis as redis_py
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from .._core.errors import ConfigurationError, StoreError, StoreUnavailableError
from .._core.records import (
    Record,
    Reservation,
    instance_id,
    new_owned_token,
    new_token,
    token_owner,
)
from ._redis_lean import LeanRedis, ReplyError, pack_command

__all__ = ["AsyncRedisStore", "RedisStore", "parse_redis_url"]

_STORE = "redis"
DEFAULT_PREFIX = "retrysafe:"
#: Seconds a process's heartbeat key lives without renewal: how soon a dead owner's keys are
#: taken over, and how long a paused (SIGSTOP, VM stall) process keeps them.
DEFAULT_HEARTBEAT = 5.0
#: Renewals per heartbeat TTL (one SET every TTL / 5 = 1 s by default).
_BEATS_PER_TTL = 5
#: A reserve that meets a record changing hands this often in a row gives up.
_RESERVE_ATTEMPTS = 50
T = TypeVar("T")
logger = logging.getLogger("retrysafe.stores.redis")

# What redis-py raises: its errors, socket errors, and the cluster client's own (which is not a
# RedisError: "cannot be connected", no slot map...).
_CLIENT_ERRORS = (RedisError, OSError, RedisClusterException)

# Error replies that mean "the server cannot serve right now", not "the command is wrong".
_UNAVAILABLE_REPLIES = ("LOADING", "BUSY", "MASTERDOWN", "READONLY", "CLUSTERDOWN", "TRYAGAIN")


# -- scripts -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Script:
    name: str
    source: bytes
    sha: str


def _load_script(name: str) -> _Script:
    source = resources.files("retrysafe.stores").joinpath("lua", f"{name}.lua").read_bytes()
    return _Script(name, source, hashlib.sha1(source).hexdigest())


_RESERVE = _load_script("reserve")
_RENEW = _load_script("renew")
_COMPLETE = _load_script("complete")
_RELEASE = _load_script("release")
_GET = _load_script("get")
_MARK_COMMITTED = _load_script("mark_committed")
_DELETE = _load_script("delete")
_TAKE_OVER = _load_script("take_over")
_OWNER_ALIVE = _load_script("owner_alive")
SCRIPTS = (
    _RESERVE,
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


class _Call(NamedTuple, Generic[T]):
    """One script call: run ``script`` with ``args`` (key first), read the reply with ``parse``."""

    script: _Script
    args: tuple[Any, ...]
    parse: Any  # Callable[[Any, _Call[T]], T]; Any keeps the NamedTuple generic simple
    token: str | None = None


def _ms(seconds: float) -> int:
    # PEXPIRE needs a positive integer; a sub-millisecond lease would delete the key at once.
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


def _parse_claim(reply: Any, call: _Call[Any]) -> tuple[Reservation, str | None]:
    if reply[0] == 1:
        return Reservation(token=call.token), None
    holder = reply[3].decode() if len(reply) > 3 and reply[3] is not None else None
    return Reservation(record=_record(reply)), holder


def _parse_flag(reply: Any, call: _Call[bool]) -> bool:
    return bool(reply == 1)


def _parse_get(reply: Any, call: _Call[Record | None]) -> Record | None:
    return None if reply is None else _record(reply)


class _Commands:
    """Builds each operation's script call; shared by the async and the sync store."""

    __slots__ = ("prefix",)

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def claim(
        self, record_id: str, fingerprint: str, lease: float, ttl: float, owned: bool
    ) -> _Call[tuple[Reservation, str | None]]:
        token = new_owned_token() if owned else new_token()
        args = (self.prefix + record_id, fingerprint, token, _ms(min(lease, ttl)), _ms(ttl))
        return _Call(_RESERVE, args, _parse_claim, token)

    def owner_key(self, instance: str) -> str:
        # Outside the records' prefix: whatever scans ``<prefix>*`` (stats, an operator's
        # cleanup) sees records only. Every process with this prefix names the same key.
        return f"retrysafe-owner:{self.prefix}{instance}"

    def owner_alive(self, instance: str) -> _Call[bool]:
        return _Call(_OWNER_ALIVE, (self.owner_key(instance),), _parse_flag)

    def take_over(
        self, record_id: str, holder: str, fingerprint: str, token: str, lease: float, ttl: float
    ) -> _Call[bool]:
        args = (
            self.prefix + record_id,
            holder,
            fingerprint,
            token,
            _ms(min(lease, ttl)),
            _ms(ttl),
        )
        return _Call(_TAKE_OVER, args, _parse_flag)

    def renew(self, record_id: str, token: str, lease: float) -> _Call[bool]:
        return _Call(_RENEW, (self.prefix + record_id, token, _ms(lease)), _parse_flag)

    def mark_committed(self, record_id: str, token: str, lease: float) -> _Call[bool]:
        # Only a hash field (no PEXPIRE): a lease of 0 must stay 0, so the outcome is unknown at
        # once (the flow's "declare unknown"), not 1 ms later.
        lease_ms = max(0, round(lease * 1000))
        return _Call(_MARK_COMMITTED, (self.prefix + record_id, token, lease_ms), _parse_flag)

    def delete(self, record_id: str) -> _Call[bool]:
        return _Call(_DELETE, (self.prefix + record_id,), _parse_flag)

    def complete(self, record_id: str, token: str, response: bytes, ttl: float) -> _Call[bool]:
        args = (self.prefix + record_id, token, response, _ms(ttl))
        return _Call(_COMPLETE, args, _parse_flag)

    def release(self, record_id: str, token: str) -> _Call[bool]:
        return _Call(_RELEASE, (self.prefix + record_id, token), _parse_flag)

    def get(self, record_id: str) -> _Call[Record | None]:
        return _Call(_GET, (self.prefix + record_id,), _parse_get)


def _conflict_op(
    commands: _Commands,
    claim: _Call[Any],
    first: tuple[Reservation, str | None],
    record_id: str,
    fingerprint: str,
    lease: float,
    ttl: float,
) -> Generator[_Call[Any], Any, Reservation]:
    """After ``reserve`` met another process's in-progress record (``first``): take it over if
    that process is dead. Both faces drive this generator; the non-conflict path never enters.

    Costs one ``owner_alive`` call (the heartbeat key exists?), plus one ``take_over`` when the
    heartbeat has lapsed.
    """
    reservation, holder = first
    for _ in range(_RESERVE_ATTEMPTS):
        record = reservation.record
        owner = token_owner(holder)
        if record is None or owner is None or owner == instance_id():
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
        f"reserve met a changing record {_RESERVE_ATTEMPTS} times in a row", store=_STORE
    )


class _Heartbeat:
    """This process's heartbeat key on one Redis, renewed by a daemon thread.

    A thread, not the event loop: a loop stalled by CPU-bound work in a live process keeps
    beating (the thread gets the GIL at every switch interval). The key is
    ``retrysafe-owner:<prefix><instance id>`` with a TTL of ``ttl`` seconds, set again every
    ``ttl / 5`` seconds. Tokens name this process only while the last successful beat is recent
    enough that the key surely exists. After ``fork`` the child (new instance id, no thread)
    starts its own.

    Args:
        make_client: builds the thread's own synchronous redis-py client.
        key_of: the heartbeat key of an instance id.
        ttl: the key's TTL in seconds.
    """

    def __init__(
        self,
        make_client: Callable[[], Any],
        key_of: Callable[[str], str],
        ttl: float,
        *,
        close_client: bool = True,
    ):
        self._make_client = make_client
        self._close_client = close_client
        #: Monotonic time before which a failed start is not tried again.
        self.retry_at = 0.0
        self._key_of = key_of
        self.ttl = ttl
        self.instance = ""
        self._beat_at = float("-inf")
        self._stop = threading.Event()
        self._lock = threading.Lock()
        #: Successful renewals since start (the measured cost: beats per second).
        self.beats = 0

    def fresh(self) -> bool:
        """Whether tokens may name this process now (its heartbeat key exists)."""
        return (
            self.instance == instance_id()
            and time.monotonic() - self._beat_at < self.ttl * 0.6
            and not self._stop.is_set()
        )

    def first_beat(self) -> tuple[str, int]:
        """(key, TTL in ms) of the SET that starts this process's heartbeat."""
        return self._key_of(instance_id()), _ms(self.ttl)

    def started(self, instance: str, at: float) -> None:
        """A SET by the caller (sent at monotonic time ``at``) succeeded: run the thread."""
        with self._lock:
            if self._stop.is_set() or instance != instance_id():
                return
            if self.instance == instance:
                self._beat_at = max(self._beat_at, at)
                return
            self.instance = instance
            self._beat_at = at
            thread = threading.Thread(
                target=self._run, args=(instance,), name="retrysafe-heartbeat", daemon=True
            )
            thread.start()

    def start_sync(self, client: Any) -> bool:
        """Start the heartbeat with a blocking first SET on ``client`` (the sync store)."""
        instance = instance_id()
        key, ttl_ms = self.first_beat()
        at = time.monotonic()
        if at < self.retry_at:
            return False
        try:
            client.set(key, b"1", px=ttl_ms)
        except _CLIENT_ERRORS as exc:
            self.retry_at = at + 5.0
            logger.warning("owner liveness off for now (heartbeat failed): %s", exc)
            return False
        self.started(instance, at)
        return self.fresh()

    def _run(self, instance: str) -> None:
        client = self._make_client()
        key = self._key_of(instance)
        interval = self.ttl / _BEATS_PER_TTL
        try:
            while not self._stop.wait(interval) and self.instance == instance:
                at = time.monotonic()
                try:
                    client.set(key, b"1", px=_ms(self.ttl))
                except _CLIENT_ERRORS as exc:
                    logger.warning("Redis heartbeat failed: %s", exc)
                    continue
                if self.instance == instance:
                    self._beat_at = at
                    self.beats += 1
        finally:
            if self._close_client:
                client.close()

    def stop(self) -> None:
        """Stop renewing (the key lapses within its TTL; it is never deleted here, since
        another store of this process may share it)."""
        self._stop.set()


def _reply_error(exc: Exception, call: _Call[Any]) -> StoreError:
    message = f"Redis {call.script.name} failed: {exc}"
    if str(exc).startswith(_UNAVAILABLE_REPLIES):
        return StoreUnavailableError(message, store=_STORE)
    return StoreError(message, store=_STORE)


def _redis_py_error(exc: Exception, call: _Call[Any]) -> StoreError:
    message = f"Redis {call.script.name} failed: {type(exc).__name__}: {exc}"
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError | RedisClusterException):
        return StoreUnavailableError(message, store=_STORE)
    return _reply_error(exc, call)


# -- configuration -------------------------------------------------------------------------------


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


_STORE_OPTIONS = ("prefix", "timeout", "connect_timeout", "heartbeat")


def parse_redis_url(url: str) -> RedisURL:
    """Parse ``redis://[user:password@]host[:port][/db][?prefix=...&timeout=...]``.

    ``rediss://`` means TLS. Options other than ``prefix``, ``timeout`` and ``connect_timeout``
    are left for redis-py (the sync store) and ignored by the async store's lean connection.

    Raises:
        ConfigurationError: not a redis URL, or an option has a bad value.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ConfigurationError(f"not a redis:// or rediss:// URL: {parts.scheme}://...")
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _STORE_OPTIONS}
    theirs = [(k, v) for k, v in query if k not in _STORE_OPTIONS]
    try:
        port = parts.port or 6379
        path = parts.path.strip("/")
        db = int(path) if path else int(dict(theirs).get("db", 0))
        timeout = float(ours.get("timeout", 2.0))
        connect_timeout = float(ours.get("connect_timeout", 2.0))
        heartbeat = float(ours.get("heartbeat", DEFAULT_HEARTBEAT))
    except ValueError as exc:
        raise ConfigurationError(f"bad redis store URL option: {exc}") from exc
    if timeout <= 0 or connect_timeout <= 0:
        raise ConfigurationError("redis store timeouts must be positive")
    if heartbeat < 0 or 0 < heartbeat < 0.5:
        raise ConfigurationError("redis store heartbeat: 0 (off) or at least 0.5 seconds")
    return RedisURL(
        client_url=urlunsplit(parts._replace(query=urlencode(theirs))),
        host=parts.hostname or "127.0.0.1",
        port=port,
        db=db,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        tls=parts.scheme == "rediss",
        prefix=ours.get("prefix", DEFAULT_PREFIX),
        timeout=timeout,
        connect_timeout=connect_timeout,
        heartbeat=heartbeat,
        ssl_ca_certs=dict(theirs).get("ssl_ca_certs"),
    )


def _check_client(client: Any) -> None:
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    if kwargs.get("decode_responses"):
        raise ConfigurationError(
            "the Redis client must be created with decode_responses=False "
            "(stored responses are bytes)"
        )


def _own_options(url: str | None, client: Any, prefix: str | None) -> tuple[RedisURL | None, str]:
    if (url is None) == (client is None):
        raise ConfigurationError("pass either a redis:// URL or a client, not both or neither")
    parsed = parse_redis_url(url) if url is not None else None
    if client is not None:
        _check_client(client)
    if prefix is None:
        prefix = parsed.prefix if parsed is not None else DEFAULT_PREFIX
    return parsed, prefix


def _sync_client_factory(parsed: RedisURL) -> Callable[[], Any]:
    """A maker of the store's own redis-py client for ``parsed`` (retries off: see above)."""

    def make() -> Any:
        return redis_py.Redis.from_url(
            parsed.client_url,
            socket_timeout=parsed.timeout,
            socket_connect_timeout=parsed.connect_timeout,
            retry=Retry(NoBackoff(), 0),
        )

    return make


# -- async ---------------------------------------------------------------------------------------


class AsyncRedisStore:
    """Keeps records in Redis; asynchronous (ASGI).

    Args:
        url: ``redis://`` / ``rediss://`` URL; the store opens its own lean connection.
        client: instead of a URL, a redis-py async client you own (``redis.asyncio.Redis`` or
            ``RedisCluster``, created with ``decode_responses=False``); never closed here.
        prefix: key prefix of every record (default: the URL's ``?prefix=``, else
            ``"retrysafe:"``).

    Raises:
        ConfigurationError: neither or both of ``url`` and ``client``, a bad URL, or a client
            that decodes responses.
    """

    def __init__(
        self, url: str | None = None, *, client: Any = None, prefix: str | None = None
    ) -> None:
        parsed, self.prefix = _own_options(url, client, prefix)
        self._commands = _Commands(self.prefix)
        self._client = client
        self._lean: LeanRedis | None = None
        # Owner liveness needs a synchronous client for the heartbeat thread: built from the
        # URL; a user's async client gets none (its keys wait for the lease).
        self._heartbeat: _Heartbeat | None = None
        self._heartbeat_starting: asyncio.Lock | None = None
        if parsed is not None and parsed.heartbeat:
            self._heartbeat = _Heartbeat(
                _sync_client_factory(parsed), self._commands.owner_key, parsed.heartbeat
            )
        if parsed is not None:
            self._lean = LeanRedis(
                parsed.host,
                parsed.port,
                db=parsed.db,
                username=parsed.username,
                password=parsed.password,
                ssl=(
                    ssl_module.create_default_context(cafile=parsed.ssl_ca_certs)
                    if parsed.tls
                    else None
                ),
                timeout=parsed.timeout,
                connect_timeout=parsed.connect_timeout,
            )

    @classmethod
    def from_url(cls, url: str) -> AsyncRedisStore:
        """Build from ``redis://host:port/db?prefix=retrysafe:&timeout=2``."""
        return cls(url)

    async def _run(self, call: _Call[T]) -> T:
        lean = self._lean
        if lean is None:
            return await self._run_client(call)
        script = call.script
        try:
            try:
                reply = await lean.execute(pack_command(("EVALSHA", script.sha, 1, *call.args)))
            except ReplyError as exc:
                if not str(exc).startswith("NOSCRIPT"):
                    raise
                # The server lost its script cache (restart, SCRIPT FLUSH, failover): EVAL runs
                # the script and caches it again, still one round trip.
                reply = await lean.execute(pack_command(("EVAL", script.source, 1, *call.args)))
        except ReplyError as exc:
            raise _reply_error(exc, call) from exc
        result: T = call.parse(reply, call)
        return result

    async def _run_client(self, call: _Call[T]) -> T:
        script = call.script
        client = self._client
        try:
            try:
                reply = await client.evalsha(script.sha, 1, *call.args)
            except NoScriptError:
                reply = await client.eval(script.source, 1, *call.args)
        except _CLIENT_ERRORS as exc:
            raise _redis_py_error(exc, call) from exc
        result: T = call.parse(reply, call)
        return result

    async def reserve(
        self, record_id: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Reservation:
        """See :meth:`retrysafe.stores.AsyncStore.reserve`."""
        hb = self._heartbeat
        owned = hb is not None and (hb.fresh() or await self._start_heartbeat(hb))
        claim = self._commands.claim(record_id, fingerprint, lease, ttl, owned)
        first = await self._run(claim)
        if first[1] is None:
            return first[0]
        op = _conflict_op(self._commands, claim, first, record_id, fingerprint, lease, ttl)
        try:
            call = next(op)
            while True:
                call = op.send(await self._run(call))
        except StopIteration as stop:
            result: Reservation = stop.value
            return result

    async def _start_heartbeat(self, hb: _Heartbeat) -> bool:
        """Start this process's heartbeat: the first SET on the store's own connection (so the
        loop never blocks), then the thread renews it. Once: concurrent first requests wait for
        it (redis-py's async cluster client fails commands sent while it opens a connection)."""
        if self._heartbeat_starting is None:
            self._heartbeat_starting = asyncio.Lock()
        async with self._heartbeat_starting:
            if hb.fresh():
                return True  # another request started it while this one waited
            return await self._first_beat(hb)

    async def _first_beat(self, hb: _Heartbeat) -> bool:
        instance = instance_id()
        at = time.monotonic()
        if at < hb.retry_at:
            return False
        key, ttl_ms = hb.first_beat()
        try:
            if self._lean is not None:
                await self._lean.execute(pack_command(("SET", key, b"1", "PX", ttl_ms)))
            else:
                await self._client.set(key, b"1", px=ttl_ms)
        except (StoreError, ReplyError, *_CLIENT_ERRORS) as exc:
            hb.retry_at = at + 5.0
            logger.warning("owner liveness off for now (heartbeat failed): %s", exc)
            return False
        hb.started(instance, at)
        return hb.fresh()

    async def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.renew`."""
        return await self._run(self._commands.renew(record_id, token, lease))

    async def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.mark_committed`."""
        return await self._run(self._commands.mark_committed(record_id, token, lease))

    async def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.delete`."""
        return await self._run(self._commands.delete(record_id))

    async def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.complete`."""
        return await self._run(self._commands.complete(record_id, token, response, ttl))

    async def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.AsyncStore.release`."""
        return await self._run(self._commands.release(record_id, token))

    async def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.AsyncStore.get`."""
        return await self._run(self._commands.get(record_id))

    async def purge_expired(self) -> int:
        """Return 0: Redis deletes expired records by itself (key TTLs)."""
        return 0

    async def aclose(self) -> None:
        """Close the store's own connection (a user-owned client is left open)."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._lean is not None:
            await self._lean.aclose()


# -- sync ----------------------------------------------------------------------------------------


class RedisStore:
    """Keeps records in Redis; synchronous (WSGI, Django, scripts), on redis-py.

    Args:
        url: ``redis://`` / ``rediss://`` URL; the store creates its own redis-py client.
        client: instead of a URL, a ``redis.Redis`` (or ``RedisCluster``) you own, created with
            ``decode_responses=False``; never closed here.
        prefix: key prefix of every record (default: the URL's ``?prefix=``, else
            ``"retrysafe:"``).

    Raises:
        ConfigurationError: neither or both of ``url`` and ``client``, a bad URL, or a client
            that decodes responses.
    """

    def __init__(
        self, url: str | None = None, *, client: Any = None, prefix: str | None = None
    ) -> None:
        parsed, self.prefix = _own_options(url, client, prefix)
        self._commands = _Commands(self.prefix)
        self._owned = client is None
        if parsed is not None:
            client = _sync_client_factory(parsed)()
        self._client: Any = client
        self._heartbeat: _Heartbeat | None = None
        heartbeat = parsed.heartbeat if parsed is not None else DEFAULT_HEARTBEAT
        if heartbeat:
            # The thread shares the store's client (redis-py's clients are thread-safe).
            self._heartbeat = _Heartbeat(
                lambda: client, self._commands.owner_key, heartbeat, close_client=False
            )

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        """Build from ``redis://host:port/db?prefix=retrysafe:&timeout=2``."""
        return cls(url)

    def _run(self, call: _Call[T]) -> T:
        script = call.script
        client = self._client
        try:
            try:
                reply = client.evalsha(script.sha, 1, *call.args)
            except NoScriptError:
                reply = client.eval(script.source, 1, *call.args)
        except _CLIENT_ERRORS as exc:
            raise _redis_py_error(exc, call) from exc
        result: T = call.parse(reply, call)
        return result

    def reserve(self, record_id: str, fingerprint: str, *, lease: float, ttl: float) -> Reservation:
        """See :meth:`retrysafe.stores.Store.reserve`."""
        hb = self._heartbeat
        owned = hb is not None and (hb.fresh() or hb.start_sync(self._client))
        claim = self._commands.claim(record_id, fingerprint, lease, ttl, owned)
        first = self._run(claim)
        if first[1] is None:
            return first[0]
        op = _conflict_op(self._commands, claim, first, record_id, fingerprint, lease, ttl)
        try:
            call = next(op)
            while True:
                call = op.send(self._run(call))
        except StopIteration as stop:
            result: Reservation = stop.value
            return result

    def renew(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.renew`."""
        return self._run(self._commands.renew(record_id, token, lease))

    def mark_committed(self, record_id: str, token: str, *, lease: float) -> bool:
        """See :meth:`retrysafe.stores.Store.mark_committed`."""
        return self._run(self._commands.mark_committed(record_id, token, lease))

    def delete(self, record_id: str) -> bool:
        """See :meth:`retrysafe.stores.Store.delete`."""
        return self._run(self._commands.delete(record_id))

    def complete(self, record_id: str, token: str, response: bytes, *, ttl: float) -> bool:
        """See :meth:`retrysafe.stores.Store.complete`."""
        return self._run(self._commands.complete(record_id, token, response, ttl))

    def release(self, record_id: str, token: str) -> bool:
        """See :meth:`retrysafe.stores.Store.release`."""
        return self._run(self._commands.release(record_id, token))

    def get(self, record_id: str) -> Record | None:
        """See :meth:`retrysafe.stores.Store.get`."""
        return self._run(self._commands.get(record_id))

    def purge_expired(self) -> int:
        """Return 0: Redis deletes expired records by itself (key TTLs)."""
        return 0

    def close(self) -> None:
        """Close the store's own client (a user-owned client is left open)."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._owned:
            self._client.close()
