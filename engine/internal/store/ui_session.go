package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// CreateUISession records a web UI session by its hash, with the digest
// that ties it to the API token it was opened with, valid for ttl, and
// deletes the sessions that expired.
func CreateUISession(ctx context.Context, db DBTX, hash, tokenDigest []byte, ttl time.Duration) error {
	if _, err := db.Exec(ctx, `DELETE FROM pgdurable.ui_sessions WHERE expires_at < now()`); err != nil {
		return translate(err)
	}
	_, err := db.Exec(ctx, `INSERT INTO pgdurable.ui_sessions (session_hash, token_digest, expires_at)
		VALUES ($1, $2, now() + $3::bigint * interval '1 millisecond')`, hash, tokenDigest, ms(ttl))
	return translate(err)
}

// UISession is what UISessionTokenDigest found of a session.
type UISession struct {
	// Live is false when there is no such session: never created,
	// signed out or expired.
	Live bool
	// TokenDigest ties the session to the API token it was opened with
	// (nil for a row written without one).
	TokenDigest []byte
}

// UISessionTokenDigest returns the token digest of the live session with
// this hash.
func UISessionTokenDigest(ctx context.Context, db DBTX, hash []byte) (UISession, error) {
	var digest []byte
	err := db.QueryRow(ctx, `SELECT token_digest FROM pgdurable.ui_sessions WHERE session_hash = $1 AND expires_at > now()`, hash).Scan(&digest)
	if errors.Is(err, pgx.ErrNoRows) {
		return UISession{}, nil
	}
	if err != nil {
		return UISession{}, translate(err)
	}
	return UISession{Live: true, TokenDigest: digest}, nil
}

// DeleteUISession ends a session (sign-out).
func DeleteUISession(ctx context.Context, db DBTX, hash []byte) error {
	_, err := db.Exec(ctx, `DELETE FROM pgdurable.ui_sessions WHERE session_hash = $1`, hash)
	return translate(err)
}

// DeleteAllUISessions ends every session (sign out everywhere) and returns
// how many of them were live at now; expired rows go too.
func DeleteAllUISessions(ctx context.Context, db DBTX, now time.Time) (int64, error) {
	var live int64
	err := db.QueryRow(ctx, `WITH ended AS (DELETE FROM pgdurable.ui_sessions RETURNING expires_at)
		SELECT count(*) FROM ended WHERE expires_at > $1`, now).Scan(&live)
	return live, translate(err)
}
