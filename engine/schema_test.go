package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/internal/maintenance"
	"github.com/pgdurable/pgdurable/engine/internal/queue"
	"github.com/pgdurable/pgdurable/engine/internal/store"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// The migrations create, and move, what the engine's statements name;
// storage/migrations cannot import the engine's internal packages, so
// its copies are checked here.
func TestMigrationsAgreeWithTheStore(t *testing.T) {
	require.Equal(t, DefaultSchema, store.DefaultSchema)
	require.Equal(t, DefaultSchema, migrations.DefaultSchema)
	require.ElementsMatch(t, store.Tables, migrations.Tables)
	// The move carries River jobs of this kind (migrations.riverKind) and
	// counts a process alive for this long (migrations.processLive).
	require.Equal(t, "pgdurable.run", queue.Kind)
	require.Equal(t, 30*time.Second, maintenance.ProcessLive)
	require.NoError(t, store.ValidSchemaName(DefaultSchema))
	for _, name := range []string{"acme", "Acme", "pg_x", "a-b", ""} {
		require.Equal(t, store.ValidSchemaName(name) == nil, migrations.ValidSchemaName(name) == nil, name)
	}
}
