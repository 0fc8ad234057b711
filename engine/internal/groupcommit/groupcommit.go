// Package groupcommit batches the calls of many goroutines into shared
// database round trips: the record writes, starts, claims and heartbeats
// of all a process's deliveries go out a few statements at a time, however
// many deliveries run.
package groupcommit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// Batcher batches the calls of many goroutines into shared database
// round trips, without a timer: a call made while fewer than MaxActive
// batches are in flight leads a batch at once, so at low load a batch is
// one call and waits for nothing; a call made while they are all in flight
// queues, and whatever queued goes out together (up to MaxBatch) when one
// of them returns. The batch is as large as the load makes it.
//
// The leader of a batch is one of its callers (no goroutine of its own, so
// nothing to start or stop): it runs its own call with the oldest queued
// ones, hands the results out, and passes the lead to the oldest call still
// queued.
type Batcher[Q, R any] struct {
	MaxActive, MaxBatch int
	// Size, when set, is a call's payload in bytes: a batch takes queued
	// calls while their sum stays within MaxBatchBytes (the leader's own
	// call always goes), so batches stay far from the 1 GiB a PostgreSQL
	// message may hold whatever a payload limit allows.
	Size func(Q) int
	// Exec runs one batch and returns one result per call, in order. It
	// must not fail as a whole: a result carries its own error.
	Exec func(calls []Q) []R
	// Failed is every call's result when Exec panics (a bug), so that the
	// batch's callers get an error and the batcher keeps working.
	Failed func(panicked any) R

	mu     sync.Mutex
	queue  []*call[Q, R]
	active int // batches in flight, each with a leader
}

type call[Q, R any] struct {
	req  Q
	res  R
	lead bool          // this call leads a batch (under mu)
	wake chan struct{} // exactly one send: res is set, or this call now leads
}

// Do queues req and returns its result once its batch has run.
func (g *Batcher[Q, R]) Do(req Q) R {
	c := &call[Q, R]{req: req, wake: make(chan struct{}, 1)}
	g.mu.Lock()
	if g.active < g.MaxActive {
		g.active++
		c.lead = true
	} else {
		g.queue = append(g.queue, c)
		g.mu.Unlock()
		<-c.wake
		g.mu.Lock()
		if !c.lead {
			g.mu.Unlock()
			return c.res
		}
	}
	// Lead one batch: this call and the oldest queued ones.
	n := min(len(g.queue), g.MaxBatch-1)
	if g.Size != nil {
		bytes := g.Size(c.req)
		for i := range n {
			if bytes += g.Size(g.queue[i].req); bytes > MaxBatchBytes {
				n = i
				break
			}
		}
	}
	batch := make([]*call[Q, R], 0, n+1)
	batch = append(append(batch, c), g.queue[:n]...)
	g.queue = append(g.queue[:0:0], g.queue[n:]...)
	g.mu.Unlock()

	reqs := make([]Q, len(batch))
	for i, b := range batch {
		reqs[i] = b.req
	}
	res := g.run(reqs)

	g.mu.Lock()
	for i, b := range batch {
		b.res = res[i]
		if b != c {
			b.wake <- struct{}{}
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
	return c.res
}

// run calls Exec, turning a panic into failed results for the whole batch.
func (g *Batcher[Q, R]) run(reqs []Q) (res []R) {
	defer func() {
		if p := recover(); p != nil {
			res = make([]R, len(reqs))
			if g.Failed != nil {
				for i := range res {
					res[i] = g.Failed(p)
				}
			}
		}
	}()
	return g.Exec(reqs)
}

// BatchPanic is the error of every call of a batch whose statement code
// panicked.
func BatchPanic(p any) error { return fmt.Errorf("pgdurable: a batch of writes panicked: %v", p) }

// Group commit sizes: batches in flight at once per process (Active),
// calls of at most this many deliveries per statement (Batch), and the
// payload bytes a batch may carry (MaxBatchBytes).
const (
	Active        = 2
	Batch         = 500
	MaxBatchBytes = 64 << 20
)

// Outcome is one call's share of a batch: its result, or the error that
// failed it.
type Outcome[R any] struct {
	Res R
	Err error
}

// Store builds a batcher over a store call that answers a batch call by
// call, run with timeout on a context of its own. When the
// call fails as a whole, every call of the batch gets its error, except
// with isolate, where a failure that can recur (a row PostgreSQL refuses)
// is found by calling again with each alone, so it fails its own caller
// only; a transient failure (a dropped connection, a deadlock) is returned
// to every call, whose caller tries it again.
func Store[Q, R any](call func(context.Context, []Q) ([]R, error), size func(Q) int, isolate bool, timeout time.Duration) *Batcher[Q, Outcome[R]] {
	return &Batcher[Q, Outcome[R]]{
		MaxActive: Active,
		MaxBatch:  Batch,
		Size:      size,
		Failed:    func(p any) Outcome[R] { return Outcome[R]{Err: BatchPanic(p)} },
		Exec: func(calls []Q) []Outcome[R] {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			out := make([]Outcome[R], len(calls))
			res, err := call(ctx, calls)
			if err == nil {
				for i := range out {
					out[i].Res = res[i]
				}
				return out
			}
			if transient, _ := store.IsTransient(err); !isolate || transient || len(calls) == 1 {
				for i := range out {
					out[i].Err = err
				}
				return out
			}
			for i, q := range calls {
				if one, err := call(ctx, []Q{q}); err != nil {
					out[i].Err = err
				} else {
					out[i].Res = one[0]
				}
			}
			return out
		},
	}
}
