package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// LeaseSweeper gives a delivery to each run whose lease expired (its
// worker died) and each waiting run that is due, cancels runs past their
// run timeout, and holds back runs caught in repeated crashes (see
// store.Sweep), at every tick. It bounds how late a retry or a timer
// fires, and how soon a crashed worker's run is picked up again (about a
// lease after its last renewal).
type LeaseSweeper struct {
	// DB is the engine's pool, Queue its River queue (a ticket per run
	// re-enqueued, in the sweep's transaction), Log its Config.Logger.
	DB    DB
	Queue Queue
	Log   *slog.Logger
	// QueueName is the engine's queue (Config.Queue): it sweeps only its
	// runs.
	QueueName string
	// Lease is Config.LeaseDuration: how long a run whose delivery died
	// in a row without progress is held back grows from it.
	Lease time.Duration
	// Now is the engine's clock (Config.Clock), which wake and deadline
	// times follow.
	Now func() time.Time
	// Cancelled tells this process's deliveries of runs whose
	// cancellation was just committed (here: their run timeout passed),
	// so that a step running here stops at once; a delivery elsewhere
	// hears of it at its engine's next CancelPoller pass, write or
	// heartbeat.
	Cancelled func(runIDs []uuid.UUID)
}

// Next: every tick.
func (*LeaseSweeper) Next(_, _ time.Time) time.Time { return time.Time{} }

// RunOnce sweeps in batches of 500 runs until a batch is not full.
func (s *LeaseSweeper) RunOnce(ctx context.Context) {
	for {
		n, err := s.sweep(ctx)
		if err != nil && ctx.Err() == nil {
			s.Log.Warn("sweep failed", "error", err)
		}
		if n < sweepBatch {
			return
		}
	}
}

// sweep enqueues a delivery for each run whose lease expired and each
// waiting run that is due, in one transaction, and returns how many runs it
// handled. A run caught in repeated crashes is held back instead (see
// store.Sweep) and enqueued by the sweep that finds it due.
func (s *LeaseSweeper) sweep(ctx context.Context) (int, error) {
	var swept []store.SweptRun
	err := store.InTx(ctx, s.DB, func(tx pgx.Tx) error {
		var err error
		swept, err = store.Sweep(ctx, store.Bind(s.DB, tx), store.SweepParams{Queue: s.QueueName, Now: s.Now(), Lease: s.Lease, Limit: sweepBatch})
		if err != nil {
			return err
		}
		ids := make([]uuid.UUID, 0, len(swept))
		for _, r := range swept {
			if r.Cause != store.SweptCrashBackoff && r.Cause != store.SweptTimedOut {
				ids = append(ids, r.RunID)
			}
		}
		return s.Queue.EnqueueMany(ctx, tx, ids)
	})
	if err != nil {
		return 0, err
	}
	for _, r := range swept {
		switch r.Cause {
		case store.SweptLeaseExpired:
			s.Log.Warn("lease expired; run re-enqueued for another delivery", "run_id", r.RunID)
		case store.SweptTimedOut:
			s.Cancelled([]uuid.UUID{r.RunID})
			s.Log.Info("run timeout passed; run cancelled", "run_id", r.RunID)
		case store.SweptCrashBackoff:
			s.Log.Warn("lease expired again without progress; run held back before its next delivery",
				"run_id", r.RunID, "stalled_deliveries", r.Stalled, "wake_at", r.WakeAt.UTC().Format(time.RFC3339Nano))
		}
	}
	return len(swept), nil
}
