package maintenance

import (
	"context"
	"iter"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// cancelPollAge: a delivery younger than this is not checked for a
// cancellation; its own writes will tell it soon enough.
const cancelPollAge = 100 * time.Millisecond

// LiveRun is a delivery this process runs, as the CancelPoller sees it.
type LiveRun struct {
	RunID uuid.UUID
	// ClaimedAt is when the delivery took the lease (wall clock).
	ClaimedAt time.Time
	// CancelHeard: the delivery already knows its run's cancellation was
	// requested.
	CancelHeard bool
}

// CancelPoller tells this process's deliveries that have run for a while
// of a cancellation requested from another process, in one read-only query
// per tick: a running step hears of it within about a sweep interval
// instead of at the next heartbeat. (A cancel in this process flags its
// delivery at once.) Its cost is per tick, not per run; LISTEN would wake
// the listening backend for every NOTIFY in the database, River's
// included.
type CancelPoller struct {
	// DB is the engine's pool (one read per pass), Log its Config.Logger.
	DB  store.DBTX
	Log *slog.Logger
	// Live yields this process's deliveries.
	Live iter.Seq[LiveRun]
	// Cancelled tells the deliveries of runIDs that their cancellation
	// was requested.
	Cancelled func(runIDs []uuid.UUID)
}

// Next: every tick.
func (*CancelPoller) Next(_, _ time.Time) time.Time { return time.Time{} }

// RunOnce asks about at most 500 deliveries that have not heard of a
// cancellation and are older than 100 ms.
func (p *CancelPoller) RunOnce(ctx context.Context) {
	if err := p.poll(ctx); err != nil && ctx.Err() == nil {
		p.Log.Warn("cancellation check failed", "error", err)
	}
}

func (p *CancelPoller) poll(ctx context.Context) error {
	var ids []uuid.UUID
	for r := range p.Live {
		if !r.CancelHeard && time.Since(r.ClaimedAt) >= cancelPollAge {
			ids = append(ids, r.RunID)
		}
		if len(ids) >= sweepBatch {
			break
		}
	}
	if len(ids) == 0 {
		return nil
	}
	cancelled, err := store.CancelRequested(ctx, p.DB, ids)
	p.Cancelled(cancelled)
	return err
}
