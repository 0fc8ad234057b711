package store

import (
	"context"
	"time"
)

// CreateUISession records a web UI session by its hash, valid for ttl, and
// deletes the sessions that expired.
func CreateUISession(ctx context.Context, db DBTX, hash []byte, ttl time.Duration) error {
	if _, err := db.Exec(ctx, `DELETE FROM ui_sessions WHERE expires_at < now()`); err != nil {
		return translate(err)
	}
	_, err := db.Exec(ctx, `INSERT INTO ui_sessions (session_hash, expires_at) VALUES ($1, now() + $2::bigint * interval '1 millisecond')`,
		hash, ms(ttl))
	return translate(err)
}

// UISessionValid reports whether the session with this hash exists and
// has not expired.
func UISessionValid(ctx context.Context, db DBTX, hash []byte) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM ui_sessions WHERE session_hash = $1 AND expires_at > now())`, hash).Scan(&ok)
	return ok, translate(err)
}

// DeleteUISession ends a session (sign-out).
func DeleteUISession(ctx context.Context, db DBTX, hash []byte) error {
	_, err := db.Exec(ctx, `DELETE FROM ui_sessions WHERE session_hash = $1`, hash)
	return translate(err)
}
