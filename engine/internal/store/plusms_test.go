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

// The sweep's jitter spreads runs uniformly over [0, 1) for one seed, as
// random() did, and draws anew with another seed.
func TestJitterIsUniformPerSeed(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	const n = 20000
	var deciles []int64
	var lo, hi, mean float64
	require.NoError(t, db.Pool.QueryRow(ctx, `
		WITH j AS (SELECT `+store.Jitter("gen_random_uuid()", "$1::bigint")+` AS v FROM generate_series(1, $2))
		SELECT array_agg(c ORDER BY d), min(lo), max(hi), sum(s) / $2
		FROM (SELECT width_bucket(v, 0, 1, 10) AS d, count(*) AS c, min(v) AS lo, max(v) AS hi, sum(v) AS s FROM j GROUP BY 1) b`,
		int64(7), n).Scan(&deciles, &lo, &hi, &mean))
	require.Len(t, deciles, 10, "every tenth of [0, 1) drawn")
	for i, c := range deciles {
		require.InDelta(t, n/10, c, n/10*0.1, "tenth %d", i)
	}
	require.GreaterOrEqual(t, lo, 0.0)
	require.Less(t, hi, 1.0)
	require.InDelta(t, 0.5, mean, 0.02)

	var same int
	require.NoError(t, db.Pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE `+store.Jitter("id", "1")+` = `+store.Jitter("id", "2")+`)
		FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, 1000)) x`).Scan(&same))
	require.Zero(t, same, "another seed draws anew")
}
