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
// the constants it keeps of theirs are checked here.
func TestMigrationsAgreeWithTheStore(t *testing.T) {
	require.Equal(t, DefaultSchema, store.DefaultSchema)
	require.Equal(t, DefaultSchema, migrations.DefaultSchema)
	// The move carries River jobs of this kind (migrations.riverKind) and
	// counts a process alive for this long (migrations.processLive).
	require.Equal(t, "pgdurable.run", queue.Kind)
	require.Equal(t, 30*time.Second, maintenance.ProcessLive)
	require.NoError(t, migrations.ValidSchemaName(DefaultSchema))
}
