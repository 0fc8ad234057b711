package maintenance

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// PruneBatch is how many runs (and how many schedule fires) one prune
// statement deletes, Engine.Prune's as the Pruner's: a batch is one short
// transaction that skips rows others hold locked.
const PruneBatch = 500

// pruneEvery is how often, on average, the Pruner runs, and pruneBudget
// how long one pass may take before it leaves the rest for the next.
const (
	pruneEvery  = time.Minute
	pruneBudget = 5 * time.Second
)

// Full reports whether a prune batch that deleted n was full, so that
// more may be left to delete.
func Full(n store.Pruned) bool { return n.Runs >= PruneBatch || n.ScheduleFires >= PruneBatch }

// Pruner deletes the runs that ended more than Retention ago
// (Config.Retention), with their rows, as Engine.Prune does: at the first
// tick, then 30 to 90 s after each pass ended (a minute on average, spread
// so that engines started together do not prune in step). A pass deletes
// batches until one is not full or 5 s have passed. Engines prune at once
// without blocking each other (SKIP LOCKED).
type Pruner struct {
	// Log is the engine's Config.Logger: a pass that deleted anything
	// logs its counts at info level.
	Log *slog.Logger
	// Retention is how long finished runs are kept: above 0 (an engine
	// that keeps them for ever has no Pruner).
	Retention time.Duration
	// Now is the engine's clock (Config.Clock), which run end times
	// follow.
	Now func() time.Time
	// Batch deletes one batch of at most PruneBatch runs that ended
	// before cutoff (the engine's, which also tells its observer).
	Batch func(ctx context.Context, cutoff time.Time) (store.Pruned, error)
}

// Next: at the first tick, then 30 to 90 s after the last pass ended.
func (*Pruner) Next(began, ended time.Time) time.Time {
	if began.IsZero() {
		return ended
	}
	return ended.Add(pruneEvery/2 + rand.N(pruneEvery))
}

// RunOnce prunes batches until one is not full or the 5 s budget has
// passed, and logs what it deleted.
func (p *Pruner) RunOnce(ctx context.Context) {
	cutoff := p.Now().Add(-p.Retention)
	deadline := time.Now().Add(pruneBudget)
	var total store.Pruned
	for time.Now().Before(deadline) && ctx.Err() == nil {
		n, err := p.Batch(ctx, cutoff)
		total.Runs += n.Runs
		total.Steps += n.Steps
		total.ScheduleFires += n.ScheduleFires
		if err != nil {
			if ctx.Err() == nil {
				p.Log.Warn("retention prune failed", "error", err)
			}
			break
		}
		if !Full(n) {
			break
		}
	}
	if total.Runs > 0 || total.ScheduleFires > 0 {
		p.Log.Info("pruned finished runs past retention", "runs", total.Runs, "steps", total.Steps,
			"schedule_fires", total.ScheduleFires, "retention", p.Retention.String())
	}
}
