// Package maintenance holds the jobs an engine runs in the background, each
// a Service with its own interval and tests: the lease sweep (runs whose
// lease expired, waiting runs that are due, runs past their timeout), the
// schedule firer, cancellation polling, the process registry, the retention
// prune and the sweep of orphaned tickets. A Maintainer runs them.
//
// It follows River's internal/maintenance with two differences. River
// runs the services on the elected leader only; here every engine process
// runs them (a dead leader would delay crash recovery by River's leader
// TTL, and SKIP LOCKED keeps concurrent sweeps off each other's rows).
// River runs each service on its own goroutine; here they run in order on
// one, so that one engine's maintenance holds at most one connection at a
// time and a slow job delays the next instead of overlapping it.
//
// The services know nothing of package engine: they get what they need
// from it as small interfaces (DB, Queue) and funcs (the clock, "tell the
// deliveries of this process", "start a run of this workflow").
package maintenance

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// DB is the database the services work in, the engine's pool: the store's
// seam, and transactions for the writes that enqueue River tickets with
// them.
type DB interface {
	store.DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Queue is what the services need of the engine's River queue
// (*queue.Queue).
type Queue interface {
	// EnqueueMany inserts one delivery ticket per run in tx, due now.
	EnqueueMany(ctx context.Context, tx pgx.Tx, runIDs []uuid.UUID) error
	// StaleTickets returns the runs whose ticket River has had running
	// for longer than olderThan.
	StaleTickets(ctx context.Context, olderThan time.Duration) ([]uuid.UUID, error)
}

// sweepBatch bounds the runs of each kind one sweep re-enqueues, and the
// deliveries one cancellation poll asks about.
const sweepBatch = 500

// Service is one maintenance job.
type Service interface {
	// RunOnce does one pass. It logs its own failures, so that one
	// service's failure does not keep the next from running.
	RunOnce(ctx context.Context)
	// Next is when the service is due again, on the wall clock, after a
	// pass that began at began and ended at ended; before the first pass
	// began is zero and ended is when the Maintainer started. The zero
	// time means at every tick.
	Next(began, ended time.Time) time.Time
}

// Maintainer runs its Services, in order, at ticks Interval/2 to
// 3×Interval/2 apart (Interval on average, spread so that engines started
// together do not sweep in lockstep): at each tick every service that is
// due (see Service.Next) runs, one after the other, on one goroutine.
// Between Start and Stop; not safe for concurrent use.
type Maintainer struct {
	// Interval is the mean time between ticks (Config.SweepInterval),
	// measured from the end of one tick's work to the next tick.
	Interval time.Duration
	// Services run in this order at each tick.
	Services []Service

	now    func() time.Time // the wall clock; time.Now unless a test sets it
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs the services on a goroutine of their own until Stop. ctx's
// values reach the services, its cancellation does not: only Stop stops
// them.
func (m *Maintainer) Start(ctx context.Context) {
	if m.now == nil {
		m.now = time.Now
	}
	ctx, m.cancel = context.WithCancel(context.WithoutCancel(ctx))
	m.done = make(chan struct{})
	go m.run(ctx)
}

// Stop cancels the services' context and waits for the pass under way, if
// any, to end.
func (m *Maintainer) Stop() {
	m.cancel()
	<-m.done
}

func (m *Maintainer) run(ctx context.Context) {
	defer close(m.done)
	start := m.now()
	next := make([]time.Time, len(m.Services))
	for i, s := range m.Services {
		next[i] = s.Next(time.Time{}, start)
	}
	for {
		wait := m.Interval/2 + rand.N(m.Interval)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		for i, s := range m.Services {
			began := m.now()
			if began.Before(next[i]) {
				continue
			}
			s.RunOnce(ctx)
			next[i] = s.Next(began, m.now())
		}
	}
}
