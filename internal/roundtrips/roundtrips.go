// Package roundtrips counts a pgx pool's client round trips, for the
// bench command's rows and the engine's benchmarks alike.
package roundtrips

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Counter is a pgx tracer (pgx.QueryTracer and pgx.BatchTracer) that
// counts client round trips — each query, BEGIN and COMMIT included, and
// each batch — and remembers the latest batch's duration. Set it as
// ConnConfig.Tracer of the pool to measure. Safe for concurrent use.
type Counter struct {
	n          atomic.Int64
	lastBatch  atomic.Int64
	batchStart sync.Map // *pgx.Conn -> time.Time
}

// Count is the round trips so far.
func (r *Counter) Count() int64 { return r.n.Load() }

// LastBatch is the duration of the latest batch.
func (r *Counter) LastBatch() time.Duration { return time.Duration(r.lastBatch.Load()) }

// TraceQueryStart implements pgx.QueryTracer.
func (r *Counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (r *Counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart implements pgx.BatchTracer.
func (r *Counter) TraceBatchStart(ctx context.Context, c *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	r.batchStart.Store(c, time.Now())
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (r *Counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd implements pgx.BatchTracer.
func (r *Counter) TraceBatchEnd(_ context.Context, c *pgx.Conn, _ pgx.TraceBatchEndData) {
	if t, ok := r.batchStart.Load(c); ok {
		r.lastBatch.Store(int64(time.Since(t.(time.Time))))
	}
}
