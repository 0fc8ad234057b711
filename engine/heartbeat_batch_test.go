package engine_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// beatCounter counts the heartbeat statements a pool sends.
type beatCounter struct{ n atomic.Int64 }

func (b *beatCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, "long_stalled_deliveries = ") && strings.HasPrefix(strings.TrimSpace(d.SQL), "UPDATE") {
		b.n.Add(1)
	}
	return ctx
}
func (*beatCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Twenty deliveries in long steps heartbeat on the same ticks, so their
// heartbeats share statements: far fewer than one per delivery per tick.
func TestHeartbeatsOfAProcessShareStatements(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 20
	beats := &beatCounter{}
	cfg.ConnConfig.Tracer = beats
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	wf := engine.Define("long-step", func(ctx *engine.Context, in int) (int, error) {
		return engine.Step(ctx, "long", func(context.Context) (int, error) {
			time.Sleep(2500 * time.Millisecond)
			return in, nil
		}, nil)
	}, nil)
	e, err := engine.New(pool, &engine.Config{LeaseDuration: time.Second, HeartbeatInterval: 250 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, e.Register(wf))
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(func() { _ = e.StopAndCancel(context.Background()) })
	ctx := testCtx(t)
	const runs = 20
	var ids []engine.StartResult
	for i := range runs {
		res, err := wf.Start(ctx, e, i, nil)
		require.NoError(t, err)
		ids = append(ids, *res)
	}
	for i, r := range ids {
		out, err := wf.Wait(ctx, e, r.RunID, 20*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, i, out)
	}
	// 2.5 s of steps at one beat per 250 ms tick: ~10 ticks, 200 beats one by one.
	t.Logf("%d heartbeat statements for %d deliveries", beats.n.Load(), runs)
	require.Less(t, beats.n.Load(), int64(60))
}
