-- SQLite statements of retrysafe.stores.sqlite. Times are Unix seconds (REAL).
-- state: 0 = in progress (token holds the lease), 1 = completed (response stored),
--        2 = in progress with its side effects committed (never taken over; once its lease
--            lapses without completion, its outcome is unknown).

-- name: create_table
CREATE TABLE IF NOT EXISTS retrysafe_records (
    id TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    state INTEGER NOT NULL,
    token TEXT,
    lease_expires_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    response BLOB
) WITHOUT ROWID;

-- name: create_index
CREATE INDEX IF NOT EXISTS retrysafe_records_expires_at ON retrysafe_records (expires_at);

-- name: reserve
-- One statement, so one atomic step under SQLite's write lock: insert, or take over a record
-- whose retention ended or whose lease lapsed. RETURNING yields a row only when this call won.
-- :state is 0, or 2 for a reservation written committed (as mark_committed leaves it).
INSERT INTO retrysafe_records (id, fingerprint, state, token, lease_expires_at, expires_at, response)
VALUES (:id, :fingerprint, :state, :token, :lease_expires_at, :expires_at, NULL)
ON CONFLICT (id) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    state = excluded.state,
    token = excluded.token,
    lease_expires_at = excluded.lease_expires_at,
    expires_at = excluded.expires_at,
    response = NULL
WHERE retrysafe_records.expires_at <= :now
   OR (retrysafe_records.state = 0 AND retrysafe_records.lease_expires_at <= :now)
RETURNING token;

-- name: get
SELECT fingerprint, state, lease_expires_at, response
FROM retrysafe_records
WHERE id = :id AND expires_at > :now;

-- name: renew
UPDATE retrysafe_records SET lease_expires_at = :lease_expires_at
WHERE id = :id AND token = :token AND state IN (0, 2);

-- name: mark_committed
UPDATE retrysafe_records SET state = 2, lease_expires_at = :lease_expires_at
WHERE id = :id AND token = :token AND state IN (0, 2);

-- name: delete
DELETE FROM retrysafe_records WHERE id = :id;

-- name: complete
UPDATE retrysafe_records
SET state = 1, response = :response, expires_at = :expires_at, token = NULL
WHERE id = :id AND token = :token AND state IN (0, 2);

-- name: release
DELETE FROM retrysafe_records WHERE id = :id AND token = :token AND state IN (0, 2);

-- name: purge
DELETE FROM retrysafe_records
WHERE id IN (SELECT id FROM retrysafe_records WHERE expires_at <= :now LIMIT :batch);

-- Owner liveness (see retrysafe.stores.sqlite._liveness). One row per process that reserved in this
-- file: its instance id (the first 24 characters of its tokens) and who it is on this host.
-- Written once per process; read only when a reserve meets an in-progress record.

-- name: create_owners
CREATE TABLE IF NOT EXISTS retrysafe_owners (
    instance TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    start INTEGER NOT NULL
) WITHOUT ROWID;

-- name: register_owner
INSERT OR REPLACE INTO retrysafe_owners (instance, host, pid, start)
VALUES (:instance, :host, :pid, :start);

-- name: holder
-- The in-progress record's token and its owner's identity (NULLs when the owner is unknown).
SELECT r.token, o.host, o.pid, o.start
FROM retrysafe_records AS r
LEFT JOIN retrysafe_owners AS o ON o.instance = substr(r.token, 1, 24)
WHERE r.id = :id AND r.expires_at > :now AND r.state IN (0, 2);

-- name: take_over
-- Fenced like a lease takeover: only the very reservation found with a dead owner is replaced,
-- and never a committed one (state 2: outcome unknown, not run again).
UPDATE retrysafe_records
SET fingerprint = :fingerprint, state = 0, token = :token,
    lease_expires_at = :lease_expires_at, expires_at = :expires_at, response = NULL
WHERE id = :id AND token = :holder AND state = 0
RETURNING token;

-- name: owners
SELECT instance, host, pid, start FROM retrysafe_owners;

-- name: forget_owner
DELETE FROM retrysafe_owners WHERE instance = :instance;

-- name: stats
-- Read-only, for `retrysafe stats` and `retrysafe purge --dry-run`. Columns: completed, in
-- progress (lease live), committed and in progress (lease live), outcome unknown (committed,
-- lease lapsed), lapsed (in progress, lease lapsed: the next request takes it over), seconds of
-- retention left on the oldest live in-progress record, expired.
SELECT
    COALESCE(SUM(state = 1 AND expires_at > :now), 0),
    COALESCE(SUM(state = 0 AND expires_at > :now AND lease_expires_at > :now), 0),
    COALESCE(SUM(state = 2 AND expires_at > :now AND lease_expires_at > :now), 0),
    COALESCE(SUM(state = 2 AND expires_at > :now AND lease_expires_at <= :now), 0),
    COALESCE(SUM(state = 0 AND expires_at > :now AND lease_expires_at <= :now), 0),
    MIN(CASE WHEN state IN (0, 2) AND expires_at > :now AND lease_expires_at > :now
        THEN expires_at END) - :now,
    COALESCE(SUM(expires_at <= :now), 0)
FROM retrysafe_records;
