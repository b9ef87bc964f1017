-- PostgreSQL statements of retrysafe.stores.postgres, shared by asyncpg and psycopg.
--
-- Placeholders are :name; retrysafe.stores.postgres._sql rewrites them to $1, $2... once at load
-- time, so both drivers run the same text (psycopg through its raw cursor). {table} is the
-- validated, quoted table name and {index} the name of its expiry index.
-- state: 0 = in progress (token holds the lease), 1 = completed (response stored),
--        2 = in progress with its side effects committed (mark_committed): never taken over;
--            once its lease lapses without completion its outcome is unknown.
-- Every time comes from the server's clock (clock_timestamp(), never the app host's), so any
-- number of app hosts agree on leases and expiry whatever their clocks say.
-- Write statements read a "cfg" CTE ({cfg}, the fragment below, filled in at load time) that
-- sets synchronous_commit for their own transaction only (set_config(..., true)); with the
-- option unset it re-sets the current value: a no-op.

-- name: cfg
cfg AS (
    SELECT set_config(
        'synchronous_commit',
        COALESCE(:synchronous_commit::text, current_setting('synchronous_commit')),
        true
    )
)

-- name: lock_schema
-- Serialises concurrent CREATE TABLE IF NOT EXISTS from many processes (it can otherwise fail
-- with a unique violation in pg_type); released when the transaction ends.
SELECT pg_advisory_xact_lock(hashtext('retrysafe:' || :table_name::text));

-- name: table_exists
SELECT to_regclass(:table_name::text) IS NOT NULL;

-- name: create_table
CREATE TABLE IF NOT EXISTS {table} (
    id text PRIMARY KEY,
    fingerprint text NOT NULL,
    state smallint NOT NULL,
    token text,
    lease_expires_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    response bytea
);

-- name: create_index
CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);

-- name: reserve
-- One round trip. "existing" reads a live record (not expired, lease not lapsed) from the
-- statement's snapshot; only when there is none does "ins" insert, or take over a record whose
-- retention ended or whose lease lapsed (ON CONFLICT ... WHERE, re-checked on the latest row
-- version under its row lock). A duplicate of a live key therefore costs a plain read: no row
-- lock, no transaction id, no commit flush.
-- Rows: (won, fingerprint, state, lease_remaining, response, holder token). won is true when this call holds
-- the key (inserted, took over, or - on a retry after a lost connection - already held it with
-- this token). NO ROW comes back when another transaction committed the key after this
-- statement's snapshot was taken (the insert conflicts, the snapshot cannot see the row): the
-- caller runs the statement again with a fresh snapshot.
WITH {cfg},
existing AS (
    SELECT r.fingerprint, r.state, r.token, r.lease_expires_at, r.response
    FROM {table} AS r
    WHERE r.id = :id::text
      AND r.expires_at > clock_timestamp()
      AND (r.state <> 0 OR r.lease_expires_at > clock_timestamp())
),
ins AS (
    INSERT INTO {table} AS r (id, fingerprint, state, token, lease_expires_at, expires_at, response)
    SELECT :id::text, :fingerprint::text, 0, :token::text,
           clock_timestamp() + make_interval(secs => :lease::float8),
           clock_timestamp() + make_interval(secs => :ttl::float8),
           NULL
    FROM cfg
    WHERE NOT EXISTS (SELECT 1 FROM existing)
    ON CONFLICT (id) DO UPDATE SET
        fingerprint = excluded.fingerprint,
        state = 0,
        token = excluded.token,
        lease_expires_at = excluded.lease_expires_at,
        expires_at = excluded.expires_at,
        response = NULL
    WHERE r.expires_at <= clock_timestamp()
       OR (r.state = 0 AND r.lease_expires_at <= clock_timestamp())
    RETURNING true
)
SELECT true, NULL::text, NULL::smallint, NULL::float8, NULL::bytea, NULL::text FROM ins
UNION ALL
SELECT e.token IS NOT DISTINCT FROM :token::text AND e.state = 0,
       e.fingerprint,
       e.state,
       extract(epoch FROM e.lease_expires_at - clock_timestamp())::float8,
       e.response,
       e.token
FROM existing AS e;

-- name: get
-- Lazy expiry: a record past its retention is not returned even before purge deletes it.
SELECT fingerprint, state,
       extract(epoch FROM lease_expires_at - clock_timestamp())::float8,
       response
FROM {table}
WHERE id = :id::text AND expires_at > clock_timestamp();

-- name: renew
WITH {cfg}
UPDATE {table} AS r
SET lease_expires_at = clock_timestamp() + make_interval(secs => :lease::float8)
FROM cfg
WHERE r.id = :id::text AND r.token = :token::text AND r.state IN (0, 2)
RETURNING true;

-- name: mark_committed
WITH {cfg}
UPDATE {table} AS r
SET state = 2, lease_expires_at = clock_timestamp() + make_interval(secs => :lease::float8)
FROM cfg
WHERE r.id = :id::text AND r.token = :token::text AND r.state IN (0, 2)
RETURNING true;

-- name: delete
DELETE FROM {table} WHERE id = :id::text RETURNING true;

-- name: complete
-- The token stays on the completed row so that a complete retried after a lost connection can
-- tell its own earlier success (completed_by) from being fenced out.
WITH {cfg}
UPDATE {table} AS r
SET state = 1,
    response = :response::bytea,
    expires_at = clock_timestamp() + make_interval(secs => :ttl::float8)
FROM cfg
WHERE r.id = :id::text AND r.token = :token::text AND r.state IN (0, 2)
RETURNING true;

-- name: completed_by
SELECT true FROM {table} WHERE id = :id::text AND token = :token::text AND state = 1;

-- name: release
WITH {cfg}
DELETE FROM {table} AS r
USING cfg
WHERE r.id = :id::text AND r.token = :token::text AND r.state IN (0, 2)
RETURNING true;

-- name: purge
-- One batch. SKIP LOCKED: rows a concurrent reserve is taking over (or another purge is
-- deleting) are left alone instead of waited for. now() (stable, unlike clock_timestamp())
-- lets the planner use the expires_at index.
WITH doomed AS (
    SELECT id FROM {table}
    WHERE expires_at <= now()
    LIMIT :batch::int
    FOR UPDATE SKIP LOCKED
),
deleted AS (
    DELETE FROM {table} WHERE id IN (SELECT id FROM doomed) RETURNING 1
)
SELECT count(*) FROM deleted;

-- Owner liveness. Each process holds a session-level SHARED advisory lock named by its instance
-- id on one dedicated connection of its own (shared: several stores of one process may hold it
-- side by side). The server drops the lock the moment that session ends, so when the process
-- dies (its socket closes) the lock is free.

-- name: owner_lock
SELECT pg_advisory_lock_shared(:owner_class::int, :owner_key::int);

-- name: take_over
-- Run only when a reserve met an in-progress record of another process. The exclusive try-lock
-- succeeds only if no session holds the owner's shared lock: the owner is gone. It is a
-- transaction-level lock, released when this statement ends. Then, and only then, the very
-- reservation that was found is replaced (fenced on its token, never a committed one).
-- Row: (owner dead, taken over).
WITH {cfg},
gone AS (
    SELECT pg_try_advisory_xact_lock(:owner_class::int, :owner_key::int) AS dead
),
took AS (
    UPDATE {table} AS r
    SET fingerprint = :fingerprint::text,
        state = 0,
        token = :token::text,
        lease_expires_at = clock_timestamp() + make_interval(secs => :lease::float8),
        expires_at = clock_timestamp() + make_interval(secs => :ttl::float8),
        response = NULL
    FROM gone, cfg
    WHERE r.id = :id::text AND r.token = :holder::text AND r.state = 0 AND gone.dead
    RETURNING true
)
SELECT gone.dead, EXISTS (SELECT 1 FROM took) FROM gone;

-- name: stats
-- Read-only, for `retrysafe stats` and `retrysafe purge --dry-run`. Columns: completed, in
-- progress (lease live), committed and in progress (lease live), outcome unknown (committed,
-- lease lapsed), lapsed (in progress, lease lapsed: the next request takes it over), seconds of
-- retention left on the oldest live in-progress record, expired.
SELECT
    count(*) FILTER (WHERE state = 1 AND expires_at > now()),
    count(*) FILTER (WHERE state = 0 AND expires_at > now() AND lease_expires_at > now()),
    count(*) FILTER (WHERE state = 2 AND expires_at > now() AND lease_expires_at > now()),
    count(*) FILTER (WHERE state = 2 AND expires_at > now() AND lease_expires_at <= now()),
    count(*) FILTER (WHERE state = 0 AND expires_at > now() AND lease_expires_at <= now()),
    EXTRACT(EPOCH FROM min(expires_at) FILTER (
        WHERE state IN (0, 2) AND expires_at > now() AND lease_expires_at > now()) - now()),
    count(*) FILTER (WHERE expires_at <= now())
FROM {table};
