-- Read-only statements of `retrysafe stats` and `retrysafe purge --dry-run`.
-- state: 0 = in progress, 1 = completed, 2 = in progress with its effects committed.
-- Rows of *_stats: completed, in progress (lease live), committed and in progress (lease live),
-- outcome unknown (committed, lease lapsed), lapsed (in progress, lease lapsed: the next request
-- takes it over), seconds of retention left on the oldest live in-progress record, expired.
-- SQLite times are Unix seconds passed as :now; PostgreSQL uses the server's clock.

-- name: sqlite_stats
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

-- name: postgres_stats
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
