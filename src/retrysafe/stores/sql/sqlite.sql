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
INSERT INTO retrysafe_records (id, fingerprint, state, token, lease_expires_at, expires_at, response)
VALUES (:id, :fingerprint, 0, :token, :lease_expires_at, :expires_at, NULL)
ON CONFLICT (id) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    state = 0,
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
