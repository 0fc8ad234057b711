package engine

import (
	"context"
	"fmt"
	"sync"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// groupCommit batches the calls of many goroutines into shared database
// round trips, without a timer: a call made while fewer than maxActive
// batches are in flight leads a batch at once, so at low load a batch is
// one call and waits for nothing; a call made while they are all in flight
// queues, and whatever queued goes out together (up to maxBatch) when one
// of them returns. The batch is as large as the load makes it.
//
// The leader of a batch is one of its callers (no goroutine of its own, so
// nothing to start or stop): it runs its own call with the oldest queued
// ones, hands the results out, and passes the lead to the oldest call still
// queued.
type groupCommit[Q, R any] struct {
	maxActive, maxBatch int
	// size, when set, is a call's payload in bytes: a batch takes queued
	// calls while their sum stays within maxBatchBytes (the leader's own
	// call always goes), so batches stay far from the 1 GiB a PostgreSQL
	// message may hold whatever MaxPayloadBytes allows.
	size func(Q) int
	// exec runs one batch and returns one result per call, in order. It
	// must not fail as a whole: a result carries its own error.
	exec func(calls []Q) []R
	// failed is every call's result when exec panics (a bug), so that the
	// batch's callers get an error and the batcher keeps working.
	failed func(panicked any) R

	mu     sync.Mutex
	queue  []*groupCall[Q, R]
	active int // batches in flight, each with a leader
}

type groupCall[Q, R any] struct {
	req  Q
	res  R
	lead bool          // this call leads a batch (under mu)
	wake chan struct{} // exactly one send: res is set, or this call now leads
}

// do queues req and returns its result once its batch has run.
func (g *groupCommit[Q, R]) do(req Q) R {
	call := &groupCall[Q, R]{req: req, wake: make(chan struct{}, 1)}
	g.mu.Lock()
	if g.active < g.maxActive {
		g.active++
		call.lead = true
	} else {
		g.queue = append(g.queue, call)
		g.mu.Unlock()
		<-call.wake
		g.mu.Lock()
		if !call.lead {
			g.mu.Unlock()
			return call.res
		}
	}
	// Lead one batch: this call and the oldest queued ones.
	n := min(len(g.queue), g.maxBatch-1)
	if g.size != nil {
		bytes := g.size(call.req)
		for i := range n {
			if bytes += g.size(g.queue[i].req); bytes > maxBatchBytes {
				n = i
				break
			}
		}
	}
	batch := make([]*groupCall[Q, R], 0, n+1)
	batch = append(append(batch, call), g.queue[:n]...)
	g.queue = append(g.queue[:0:0], g.queue[n:]...)
	g.mu.Unlock()

	reqs := make([]Q, len(batch))
	for i, c := range batch {
		reqs[i] = c.req
	}
	res := g.run(reqs)

	g.mu.Lock()
	for i, c := range batch {
		c.res = res[i]
		if c != call {
			c.wake <- struct{}{}
		}
	}
	if len(g.queue) > 0 {
		// Hand the lead on, so that no caller waits for more than its own
		// batch and the one before.
		next := g.queue[0]
		g.queue = g.queue[1:]
		next.lead = true
		next.wake <- struct{}{}
	} else {
		g.active--
	}
	g.mu.Unlock()
	return call.res
}

// run calls exec, turning a panic into failed results for the whole batch.
func (g *groupCommit[Q, R]) run(reqs []Q) (res []R) {
	defer func() {
		if p := recover(); p != nil {
			res = make([]R, len(reqs))
			if g.failed != nil {
				for i := range res {
					res[i] = g.failed(p)
				}
			}
		}
	}()
	return g.exec(reqs)
}

// batchPanic is the error of every call of a batch whose statement code
// panicked.
func batchPanic(p any) error { return fmt.Errorf("pgdurable: a batch of writes panicked: %v", p) }

// Group commit sizes: batches in flight at once per process, and records
// of at most this many deliveries per statement.
const (
	groupCommitActive = 2
	groupCommitBatch  = 500
	maxBatchBytes     = 64 << 20
)

// outcome is one call's share of a batch: its result, or the error that
// failed it.
type outcome[R any] struct {
	res R
	err error
}

// storeBatcher builds a batcher over a store call that answers a batch
// call by call, run with writeTimeout on a context of its own. When the
// call fails as a whole, every call of the batch gets its error, except
// with isolate, where a failure that can recur (a row PostgreSQL refuses)
// is found by calling again with each alone, so it fails its own caller
// only; a transient failure (a dropped connection, a deadlock) is returned
// to every call, whose caller tries it again.
func storeBatcher[Q, R any](call func(context.Context, []Q) ([]R, error), size func(Q) int, isolate bool) *groupCommit[Q, outcome[R]] {
	return &groupCommit[Q, outcome[R]]{
		maxActive: groupCommitActive,
		maxBatch:  groupCommitBatch,
		size:      size,
		failed:    func(p any) outcome[R] { return outcome[R]{err: batchPanic(p)} },
		exec: func(calls []Q) []outcome[R] {
			ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
			defer cancel()
			out := make([]outcome[R], len(calls))
			res, err := call(ctx, calls)
			if err == nil {
				for i := range out {
					out[i].res = res[i]
				}
				return out
			}
			if transient, _ := store.IsTransient(err); !isolate || transient || len(calls) == 1 {
				for i := range out {
					out[i].err = err
				}
				return out
			}
			for i, q := range calls {
				if one, err := call(ctx, []Q{q}); err != nil {
					out[i].err = err
				} else {
					out[i].res = one[0]
				}
			}
			return out
		},
	}
}

// newRecordWriter builds the writer every delivery of e sends its record
// writes through: the records of concurrent deliveries are committed in one
// statement and one transaction, each fenced on its own.
func newRecordWriter(e *Engine) *groupCommit[*store.RecordWrite, outcome[store.WriteResult]] {
	write := func(ctx context.Context, writes []*store.RecordWrite) ([]store.WriteResult, error) {
		return store.WriteRecords(ctx, e.pool, writes)
	}
	size := func(w *store.RecordWrite) int {
		n := len(w.Output) + len(w.Error)
		for _, r := range w.Records {
			n += len(r.Output) + len(r.Error)
		}
		return n
	}
	return storeBatcher(write, size, true)
}

// newClaimBatcher coalesces the claims of concurrent deliveries of e (the
// tickets of one River fetch start together; held runs start as workers
// free up) into one round trip.
func newClaimBatcher(e *Engine) *groupCommit[store.Fence, outcome[store.ClaimResult]] {
	return storeBatcher(func(ctx context.Context, fences []store.Fence) ([]store.ClaimResult, error) {
		return store.ClaimRuns(ctx, e.pool, fences, e.now())
	}, nil, false)
}

// claim takes the lease on runID with token, in a batch with the claims
// of other deliveries (see store.ClaimRuns).
func (e *Engine) claim(runID, token uuid.UUID) (*store.ClaimedRun, *store.ClaimMiss, error) {
	o := e.claims.do(store.Fence{RunID: runID, Token: token, Lease: e.cfg.LeaseDuration})
	return o.res.Run, o.res.Miss, o.err
}

// newBeatBatcher coalesces the heartbeats of concurrent deliveries of e:
// they beat on ticks aligned across the process (see heartbeat), so the
// deliveries whose lease is due share one statement.
func newBeatBatcher(e *Engine) *groupCommit[store.Beat, outcome[store.BeatResult]] {
	return storeBatcher(func(ctx context.Context, beats []store.Beat) ([]store.BeatResult, error) {
		return store.Heartbeats(ctx, e.pool, beats)
	}, nil, false)
}
