package engine

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/pgdurable/pgdurable/engine/internal/groupcommit"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// newRecordWriter builds the writer every delivery of e sends its record
// writes through: the records of concurrent deliveries are committed in one
// statement and one transaction, each fenced on its own.
func newRecordWriter(e *Engine) *perRoute[*store.RecordWrite, groupcommit.Outcome[store.WriteResult]] {
	write := func(ctx context.Context, writes []*store.RecordWrite) ([]store.WriteResult, error) {
		return store.WriteRecords(ctx, e.db, writes)
	}
	size := func(w *store.RecordWrite) int {
		n := len(w.Output) + len(w.Error)
		for _, r := range w.Records {
			n += len(r.Output) + len(r.Error)
		}
		return n
	}
	return &perRoute[*store.RecordWrite, groupcommit.Outcome[store.WriteResult]]{
		make: func() *groupcommit.Batcher[*store.RecordWrite, groupcommit.Outcome[store.WriteResult]] {
			return groupcommit.Store(write, size, true, writeTimeout)
		},
		route: func(w *store.RecordWrite) int { return store.RouteOfRun(w.Fence.RunID) },
	}
}

// perRoute is one batcher per route (see store.Routes), each made on its
// first use: a batch holds the items of one route's runs, which on a Citus
// cluster are one worker node's, so that each batch is one node's
// statement and transaction, and the routes' batches go in parallel.
type perRoute[Q, R any] struct {
	make  func() *groupcommit.Batcher[Q, R]
	route func(Q) int
	mu    sync.Mutex
	b     [store.MaxRoutes]atomic.Pointer[groupcommit.Batcher[Q, R]]
}

// Do is Batcher.Do on q's route's batcher.
func (p *perRoute[Q, R]) Do(q Q) R {
	k := p.route(q)
	b := p.b[k].Load()
	if b == nil {
		p.mu.Lock()
		if b = p.b[k].Load(); b == nil {
			b = p.make()
			p.b[k].Store(b)
		}
		p.mu.Unlock()
	}
	return b.Do(q)
}

// newClaimBatcher coalesces the claims of concurrent deliveries of e (the
// tickets of one River fetch start together; held runs start as workers
// free up) into one round trip.
func newClaimBatcher(e *Engine) *perRoute[store.Fence, groupcommit.Outcome[store.ClaimResult]] {
	return &perRoute[store.Fence, groupcommit.Outcome[store.ClaimResult]]{
		make: func() *groupcommit.Batcher[store.Fence, groupcommit.Outcome[store.ClaimResult]] {
			return groupcommit.Store(func(ctx context.Context, fences []store.Fence) ([]store.ClaimResult, error) {
				return store.ClaimRuns(ctx, e.db, fences, e.now())
			}, nil, false, writeTimeout)
		},
		route: func(f store.Fence) int { return store.RouteOfRun(f.RunID) },
	}
}

// claim takes the lease on runID with token, in a batch with the claims
// of other deliveries (see store.ClaimRuns).
func (e *Engine) claim(runID, token uuid.UUID) (*store.ClaimedRun, *store.ClaimMiss, error) {
	o := e.claims.Do(store.Fence{RunID: runID, Token: token, Lease: e.cfg.LeaseDuration})
	return o.Res.Run, o.Res.Miss, o.Err
}

// newBeatBatcher coalesces the heartbeats of concurrent deliveries of e:
// they beat on ticks aligned across the process (see heartbeat), so the
// deliveries whose lease is due share one statement.
func newBeatBatcher(e *Engine) *perRoute[store.Beat, groupcommit.Outcome[store.BeatResult]] {
	return &perRoute[store.Beat, groupcommit.Outcome[store.BeatResult]]{
		make: func() *groupcommit.Batcher[store.Beat, groupcommit.Outcome[store.BeatResult]] {
			return groupcommit.Store(func(ctx context.Context, beats []store.Beat) ([]store.BeatResult, error) {
				return store.Heartbeats(ctx, e.db, beats)
			}, nil, false, writeTimeout)
		},
		route: func(b store.Beat) int { return store.RouteOfRun(b.Fence.RunID) },
	}
}

// recordBuffer holds records of finished steps that are not yet written.
// Writing a plain step's record lazily lets it share the next write (the
// next step's announcement, the run's completion, a hand-back), which
// saves a commit per step; nothing runs between a step and its record
// except deterministic workflow code, so nothing is lost that a replay
// would not redo.
type recordBuffer struct {
	// pending is the record of the latest step, written with the
	// delivery's next write.
	pending *store.StepRecord
	// stopped is the record of a step the run's cancellation stopped,
	// written with the compensation's first write.
	stopped *store.StepRecord
}

// take empties the buffer of its pending record and returns it (nil when
// there is none): the caller writes it.
func (b *recordBuffer) take() *store.StepRecord {
	rec := b.pending
	b.pending = nil
	return rec
}

// takeWith is take with rec (when not nil) after the pending record, in
// the order they are to be written.
func (b *recordBuffer) takeWith(rec *store.StepRecord) []*store.StepRecord {
	var recs []*store.StepRecord
	if p := b.take(); p != nil {
		recs = append(recs, p)
	}
	if rec != nil {
		recs = append(recs, rec)
	}
	return recs
}

// takeAll empties the buffer: the pending record, then the stopped one.
func (b *recordBuffer) takeAll() []*store.StepRecord {
	recs := b.takeWith(b.stopped)
	b.stopped = nil
	return recs
}
