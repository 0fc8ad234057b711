package engine

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// sweepBatch bounds the runs of each kind one sweep re-enqueues.
const sweepBatch = 500

// sweepLoop runs sweep and fires due schedules every SweepInterval, with
// jitter so several engines do not sweep in lockstep. Every engine sweeps, not only River's leader: a
// dead leader would delay crash recovery by River's leader TTL, and SKIP
// LOCKED keeps concurrent sweeps off each other's rows.
func (e *Engine) sweepLoop(ctx context.Context) {
	defer e.active.Done()
	var lastOrphanCheck time.Time
	prune := time.Now() // the first pass prunes
	seen := time.Now()  // Start recorded this process
	for {
		wait := e.cfg.SweepInterval/2 + rand.N(e.cfg.SweepInterval)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		for {
			n, err := e.sweep(ctx)
			if err != nil && ctx.Err() == nil {
				e.log.Warn("sweep failed", "error", err)
			}
			if n < sweepBatch {
				break
			}
		}
		if err := e.fireSchedules(ctx); err != nil && ctx.Err() == nil {
			e.log.Warn("schedule tick failed", "error", err)
		}
		if err := e.pollCancels(ctx); err != nil && ctx.Err() == nil {
			e.log.Warn("cancellation check failed", "error", err)
		}
		if time.Since(seen) >= processBeat {
			seen = time.Now()
			e.seeProcess(ctx)
		}
		if e.cfg.Retention > 0 && !time.Now().Before(prune) {
			e.retentionPass(ctx)
			prune = nextPrune(time.Now())
		}
		if time.Since(lastOrphanCheck) >= orphanCheckInterval(e.cfg.LeaseDuration) {
			lastOrphanCheck = time.Now()
			if err := e.sweepOrphans(ctx); err != nil && ctx.Err() == nil {
				e.log.Warn("orphaned delivery sweep failed", "error", err)
			}
		}
	}
}

func orphanCheckInterval(lease time.Duration) time.Duration { return min(lease/2, 5*time.Second) }

// cancelPollAge: a delivery younger than this is not checked for a
// cancellation by the sweep; its own writes will tell it soon enough.
const cancelPollAge = 100 * time.Millisecond

// pollCancels tells this process's deliveries that have run for a while of
// a cancellation requested from another process, in one read-only query
// per sweep: a running step hears of it within about SweepInterval
// instead of at the next heartbeat. (A cancel in this process flags its
// delivery at once.) Its cost is per sweep, not per run; LISTEN would wake
// the listening backend for every NOTIFY in the database, River's
// included.
func (e *Engine) pollCancels(ctx context.Context) error {
	var ids []uuid.UUID
	e.live.Range(func(k, v any) bool {
		if d := v.(*delivery); !d.cancelRequested.Load() && time.Since(d.claimedAt) >= cancelPollAge {
			ids = append(ids, k.(uuid.UUID))
		}
		return len(ids) < sweepBatch
	})
	if len(ids) == 0 {
		return nil
	}
	cancelled, err := store.CancelRequested(ctx, e.pool, ids)
	for _, id := range cancelled {
		if d, ok := e.live.Load(id); ok {
			d.(*delivery).noteCancel(true)
		}
	}
	return err
}

// sweepOrphans re-enqueues runs whose ticket River fetched more than a
// lease ago without the run ever being claimed: the process died between
// River's fetch and the claim. River's rescuer would take minutes.
func (e *Engine) sweepOrphans(ctx context.Context) error {
	stale, err := e.queue.StaleTickets(ctx, e.cfg.LeaseDuration)
	if err != nil || len(stale) == 0 {
		return err
	}
	var ids []uuid.UUID
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		ids, err = store.ReenqueueOrphans(ctx, tx, stale, e.cfg.LeaseDuration)
		if err != nil {
			return err
		}
		return e.queue.EnqueueMany(ctx, tx, ids)
	})
	for _, id := range ids {
		e.log.Warn("delivery died before claiming the run; run re-enqueued", "run_id", id)
	}
	return err
}

// sweep enqueues a delivery for each run whose lease expired and each
// waiting run that is due, in one transaction, and returns how many runs it
// handled. A run caught in repeated crashes is held back instead (see
// store.Sweep) and enqueued by the sweep that finds it due.
func (e *Engine) sweep(ctx context.Context) (int, error) {
	var swept []store.SweptRun
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		var err error
		swept, err = store.Sweep(ctx, tx, e.cfg.Queue, e.now(), e.cfg.LeaseDuration, sweepBatch)
		if err != nil {
			return err
		}
		ids := make([]uuid.UUID, 0, len(swept))
		for _, s := range swept {
			if s.Cause != store.SweptCrashBackoff && s.Cause != store.SweptTimedOut {
				ids = append(ids, s.RunID)
			}
		}
		return e.queue.EnqueueMany(ctx, tx, ids)
	})
	if err != nil {
		return 0, err
	}
	for _, s := range swept {
		switch s.Cause {
		case store.SweptLeaseExpired:
			e.log.Warn("lease expired; run re-enqueued for another delivery", "run_id", s.RunID)
		case store.SweptTimedOut:
			// A delivery of this process hears of it now; one elsewhere at
			// its engine's next sweep (pollCancels), write or heartbeat.
			if d, ok := e.live.Load(s.RunID); ok {
				d.(*delivery).noteCancel(true)
			}
			e.log.Info("run timeout passed; run cancelled", "run_id", s.RunID)
		case store.SweptCrashBackoff:
			e.log.Warn("lease expired again without progress; run held back before its next delivery",
				"run_id", s.RunID, "stalled_deliveries", s.Stalled, "wake_at", s.WakeAt.UTC().Format(time.RFC3339Nano))
		}
	}
	return len(swept), nil
}
