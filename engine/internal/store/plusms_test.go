package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// plusMS's UTC arithmetic gives the instant timestamptz + interval does,
// in any session time zone, across a daylight-saving change, and for
// negative and day-long spans.
func TestPlusMSIsTimestamptzPlusInterval(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for _, zone := range []string{"UTC", "America/New_York", "Australia/Lord_Howe"} {
		_, err := conn.Exec(ctx, "SELECT set_config('TimeZone', $1, false)", zone)
		require.NoError(t, err)
		for _, ts := range []string{"now()", "'2026-03-08 01:59:59.999999-05'::timestamptz", "'2026-04-05 01:45:00+11'::timestamptz"} {
			for _, ms := range []int64{0, 1, -1, 900, 86_400_000, -86_400_000, 604_800_123} {
				var same bool
				q := "SELECT " + ts + " + $1::bigint * interval '1 millisecond' = " + store.PlusMS(ts, "$1::bigint")
				require.NoError(t, conn.QueryRow(ctx, q, ms).Scan(&same), q)
				require.True(t, same, "%s in %s plus %d ms", ts, zone, ms)
			}
		}
	}
}
