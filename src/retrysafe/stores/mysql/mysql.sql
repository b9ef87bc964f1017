-- MySQL/MariaDB statements of retrysafe.stores.mysql, shared by asyncmy and PyMySQL.
--
-- Written for both MariaDB 10.11 and MySQL 8: no RETURNING (MySQL has none), no VALUES() in
-- ON DUPLICATE KEY UPDATE (deprecated in MySQL 8.0.20, and MariaDB lacks its replacement, the
-- row alias), no user variables inside expressions (deprecated in MySQL 8).
-- Placeholders are :name; retrysafe.stores.mysql._sql rewrites them once at load time to the
-- drivers' %s (a name used twice is passed twice). {table} is the validated, quoted table name,
-- {index} its expiry index, {now} the fragment below.
-- state: 0 = in progress (token holds the lease), 1 = completed (response stored),
--        2 = in progress with its side effects committed (mark_committed): never taken over;
--            once its lease lapses without completion its outcome is unknown.
-- Times are seconds since the epoch on the SERVER's clock ({now}), never the app host's, so app
-- hosts with skewed clocks agree on leases and expiry. UTC_TIMESTAMP(6) is evaluated once per
-- statement and does not depend on the session's time_zone (UNIX_TIMESTAMP(NOW()) would, around
-- a daylight-saving change).
-- Write statements answer with the driver's affected-row count (the store's connections do not
-- set CLIENT_FOUND_ROWS: a row whose values do not change counts 0).

-- name: now
(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1000000)

-- name: table_exists
SELECT COUNT(*) FROM information_schema.tables
WHERE table_schema = COALESCE(:schema_name, DATABASE()) AND table_name = :table_name;

-- name: create_table
-- Binary collations: ids and tokens compare byte for byte (the default collations ignore case).
CREATE TABLE IF NOT EXISTS {table} (
    id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    fingerprint VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    state TINYINT NOT NULL,
    token VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    lease_expires_at DOUBLE NOT NULL,
    expires_at DOUBLE NOT NULL,
    response LONGBLOB NULL,
    PRIMARY KEY (id),
    KEY {index} (expires_at)
) ENGINE = InnoDB;

-- name: reserve
-- One round trip for a new key. The insert conflicts on a live or dead record; the UPDATE part
-- then runs under the row's exclusive lock on its LATEST committed version (a locking read, not
-- the REPEATABLE READ snapshot), so two racers can never both take a key. It takes the record
-- over only when its retention ended or its lease lapsed (or it is this very token's: a retry
-- after a lost connection); otherwise every column keeps its value.
-- Each assignment repeats the whole condition (token first), so the result is the same whether
-- the server evaluates assignments left to right (MySQL, MariaDB by default) or all at once
-- (MariaDB's SIMULTANEOUS_ASSIGNMENT mode).
-- Affected rows: 1 inserted, 2 taken over (this call holds the key), 0 a live record is there
-- (the caller reads it: peek).
INSERT INTO {table} (id, fingerprint, state, token, lease_expires_at, expires_at, response)
VALUES (:id, :fingerprint, 0, :token, {now} + :lease, {now} + :ttl, NULL)
ON DUPLICATE KEY UPDATE
    token = IF(token = :token OR expires_at <= {now} OR (state = 0 AND lease_expires_at <= {now}),
               :token, token),
    fingerprint = IF(token = :token OR expires_at <= {now}
                     OR (state = 0 AND lease_expires_at <= {now}), :fingerprint, fingerprint),
    response = IF(token = :token OR expires_at <= {now}
                  OR (state = 0 AND lease_expires_at <= {now}), NULL, response),
    state = IF(token = :token OR expires_at <= {now}
               OR (state = 0 AND lease_expires_at <= {now}), 0, state),
    lease_expires_at = IF(token = :token OR expires_at <= {now}
                          OR (state = 0 AND lease_expires_at <= {now}),
                          {now} + :lease, lease_expires_at),
    expires_at = IF(token = :token OR expires_at <= {now}
                    OR (state = 0 AND lease_expires_at <= {now}), {now} + :ttl, expires_at);

-- name: peek
-- The record a reservation met, with its holder's token and whether that holder's owner lock is
-- free (1: no session holds it, the owner's process is gone; NULL for a token naming no owner).
-- Row: (fingerprint, state, lease_remaining, response, token, owner_gone).
SELECT fingerprint, state, lease_expires_at - {now}, response, token,
       IF(SUBSTRING(token, 25, 1) = '-', IS_FREE_LOCK(CONCAT(:lock_prefix, LEFT(token, 24))), NULL)
FROM {table}
WHERE id = :id AND expires_at > {now};

-- name: take_over
-- Only after peek found the owner gone: replace the very reservation found (fenced on its token,
-- never a committed or completed one). Affected rows: 1 taken over.
UPDATE {table}
SET fingerprint = :fingerprint, state = 0, token = :token,
    lease_expires_at = {now} + :lease, expires_at = {now} + :ttl, response = NULL
WHERE id = :id AND token = :holder AND state = 0;

-- name: get
-- Lazy expiry: a record past its retention is not returned even before purge deletes it.
SELECT fingerprint, state, lease_expires_at - {now}, response
FROM {table}
WHERE id = :id AND expires_at > {now};

-- name: renew
UPDATE {table} SET lease_expires_at = {now} + :lease
WHERE id = :id AND token = :token AND state IN (0, 2);

-- name: mark_committed
UPDATE {table} SET state = 2, lease_expires_at = {now} + :lease
WHERE id = :id AND token = :token AND state IN (0, 2);

-- name: delete
DELETE FROM {table} WHERE id = :id;

-- name: complete
-- The token stays on the completed row so that a complete retried after a lost connection can
-- tell its own earlier success (completed_by) from being fenced out.
UPDATE {table}
SET state = 1, response = :response, expires_at = {now} + :ttl
WHERE id = :id AND token = :token AND state IN (0, 2);

-- name: completed_by
SELECT 1 FROM {table} WHERE id = :id AND token = :token AND state = 1;

-- name: release
DELETE FROM {table} WHERE id = :id AND token = :token AND state IN (0, 2);

-- name: purge
-- One batch, in expiry order (the index), each its own short autocommit transaction.
DELETE FROM {table} WHERE expires_at <= {now} ORDER BY expires_at LIMIT :batch;

-- Owner liveness. Each process holds a named lock (GET_LOCK) called after its instance id on one
-- connection of its own; the server frees it the moment that session ends, so when the process
-- dies (its socket closes) the lock is free (peek's IS_FREE_LOCK).

-- name: owner_lock
SELECT GET_LOCK(:lock_name, 0);

-- name: stats
-- Read-only, for `retrysafe stats` and `retrysafe purge --dry-run`. Columns: completed, in
-- progress (lease live), committed and in progress (lease live), outcome unknown (committed,
-- lease lapsed), lapsed (in progress, lease lapsed: the next request takes it over), seconds of
-- retention left on the oldest live in-progress record, expired.
SELECT
    COALESCE(SUM(r.state = 1 AND r.expires_at > n.t), 0),
    COALESCE(SUM(r.state = 0 AND r.expires_at > n.t AND r.lease_expires_at > n.t), 0),
    COALESCE(SUM(r.state = 2 AND r.expires_at > n.t AND r.lease_expires_at > n.t), 0),
    COALESCE(SUM(r.state = 2 AND r.expires_at > n.t AND r.lease_expires_at <= n.t), 0),
    COALESCE(SUM(r.state = 0 AND r.expires_at > n.t AND r.lease_expires_at <= n.t), 0),
    MIN(CASE WHEN r.state IN (0, 2) AND r.expires_at > n.t AND r.lease_expires_at > n.t
             THEN r.expires_at END) - MIN(n.t),
    COALESCE(SUM(r.expires_at <= n.t), 0)
FROM (SELECT {now} AS t) AS n
LEFT JOIN {table} AS r ON 1 = 1;
