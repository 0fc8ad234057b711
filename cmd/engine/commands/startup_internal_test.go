package commands

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/storage/migrations"
)

// A database that does not exist on a server that answers fails serve and
// dev at once, saying to create it, instead of retrying for 30 s (a new
// user's DATABASE_URL named one they had not created), nor does a Citus
// worker node's database; a server that does not answer is still waited
// for.
func TestStartupDoesNotWaitForAMissingDatabase(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	calls := 0
	began := time.Now()
	err := retryStartup(context.Background(), log, func() error {
		calls++
		return &pgconn.PgError{Code: "3D000", Message: `database "nu_missing" does not exist`}
	})
	require.Error(t, err)
	require.Equal(t, 1, calls)
	require.Less(t, time.Since(began), 5*time.Second)
	require.ErrorContains(t, err, `database "nu_missing" does not exist`)
	require.ErrorContains(t, err, "create it first (createdb)")

	// Nor for a Citus worker node's database: the URL is wrong, and stays so.
	calls = 0
	err = retryStartup(context.Background(), log, func() error {
		calls++
		return fmt.Errorf("checking the schema: %w", migrations.ErrCitusWorker)
	})
	require.ErrorIs(t, err, migrations.ErrCitusWorker)
	require.Equal(t, 1, calls)

	calls = 0
	ctx, cancel := context.WithCancel(context.Background())
	err = retryStartup(ctx, log, func() error {
		calls++
		if calls == 2 {
			cancel()
		}
		return errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	})
	require.Error(t, err)
	require.Equal(t, 2, calls, "an unreachable server is retried")
}
