package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/pgdurable/pgdurable/engine/internal/maintenance"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// DefaultRetention is Config.Retention's default: finished runs are kept a
// week.
const DefaultRetention = 7 * 24 * time.Hour

// MinRetention is the least Config.Retention New takes, and the least
// age at which the HTTP API (POST /v1/runs/prune) and engine runs prune
// delete finished runs: a run that just ended stays readable (Wait, a
// follow, a client's retry of its start) at least this long, and a typo
// ("1ns") cannot delete every finished run at once. Engine.Prune itself
// takes any positive age (tests, scripts).
const MinRetention = time.Minute

// PruneParams says what Engine.Prune deletes.
type PruneParams struct {
	// OlderThan is how long ago a run must have ended to be deleted
	// (more than 0).
	OlderThan time.Duration
	// DryRun counts what would be deleted and deletes nothing.
	DryRun bool
	// Progress, when set, is called after each batch with the rows
	// deleted so far (engine runs prune prints it), on Prune's goroutine.
	Progress func(PruneResult)
}

// PruneResult counts the rows a prune deleted (or, dry, would delete).
type PruneResult struct {
	Runs          int64 `json:"runs"`
	Steps         int64 `json:"steps"`
	Signals       int64 `json:"signals"`
	DeadJobs      int64 `json:"dead_jobs"`
	ScheduleFires int64 `json:"schedule_fires"`
}

func (r *PruneResult) add(p store.Pruned) {
	r.Runs += p.Runs
	r.Steps += p.Steps
	r.Signals += p.Signals
	r.DeadJobs += p.DeadJobs
	r.ScheduleFires += p.ScheduleFires
}

// Retention is how long this engine keeps finished runs: its
// Config.Retention with the default filled in (DefaultRetention when the
// Config left it 0), negative when it keeps them for ever. It is what the
// engine's sweep prunes for once started (engine serve logs it).
func (e *Engine) Retention() time.Duration { return e.cfg.Retention }

// Prune deletes the runs that ended more than p.OlderThan ago (completed,
// failed, compensated, cancelled, continued, terminated, and dead runs
// whose dead jobs are all resolved, as long ago), with their steps,
// signals and dead-job rows, and schedule fires recorded as long ago; all
// of every queue. It keeps every run with an unresolved dead job, and a
// child whose parent still runs (or is dead), which may yet read its
// outcome. It deletes in batches of 500 runs, each its own transaction
// that skips rows others hold locked, so it never waits for a worker nor
// makes one wait. Every started engine does this in its sweep (at its
// first sweep, then about once a minute) for Config.Retention; use Prune
// (or engine runs prune) for a one-off. Errors: ErrInvalidArgument for an
// OlderThan not above 0; ctx's; the database's.
func (e *Engine) Prune(ctx context.Context, p PruneParams) (PruneResult, error) {
	var res PruneResult
	if p.OlderThan <= 0 {
		return res, fmt.Errorf("%w: PruneParams.OlderThan %s is not above 0", ErrInvalidArgument, p.OlderThan)
	}
	cutoff := e.now().Add(-p.OlderThan)
	if p.DryRun {
		n, err := store.CountPrunable(ctx, e.db, cutoff)
		if err != nil {
			return res, fmt.Errorf("pgdurable: %w", err)
		}
		res.add(n)
		return res, nil
	}
	for {
		n, err := e.pruneBatch(ctx, cutoff)
		res.add(n)
		if err != nil {
			return res, err
		}
		if p.Progress != nil {
			p.Progress(res)
		}
		if !maintenance.Full(n) {
			return res, nil
		}
	}
}

func (e *Engine) pruneBatch(ctx context.Context, cutoff time.Time) (store.Pruned, error) {
	n, err := store.PruneBatch(ctx, e.db, cutoff, maintenance.PruneBatch)
	if err != nil {
		return n, fmt.Errorf("pgdurable: %w", err)
	}
	for table, c := range map[string]int64{"workflow_runs": n.Runs, "workflow_steps": n.Steps,
		"workflow_signals": n.Signals, "dead_jobs": n.DeadJobs, "schedule_fires": n.ScheduleFires} {
		if c > 0 {
			e.obs.RowsPruned(RowsPrunedEvent{Table: table, Rows: c})
		}
	}
	return n, nil
}
