package engine

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// FreeWorkers is how many of e's MaxWorkers slots are free now, for tests
// that must not start a run before a finished delivery has given its slot
// back: Wait returns when the run's end commits, a moment before its
// delivery returns and frees the slot.
func FreeWorkers(e *Engine) int { return cap(e.slots) - len(e.slots) }

// ReleaseUnregistered gives back the claim token holds on child run runID
// (its parent's step seq started it, with policy) as a process that does
// not register the child's workflow gives it back.
func ReleaseUnregistered(ctx context.Context, e *Engine, runID, token, parent uuid.UUID, seq int, policy ParentClosePolicy) error {
	_, err := e.releaseUnregistered(ctx, &store.ClaimedRun{RunID: runID,
		Parent: &store.ParentRef{RunID: parent, Seq: seq, ClosePolicy: string(policy)}}, token)
	return err
}

// OnRateTurn calls f with each rate-limit turn taken in this process and
// the time the limit granted it at; nil stops.
func OnRateTurn(f func(name string, at time.Time)) {
	if f == nil {
		rateTurnTaken.Store(nil)
		return
	}
	rateTurnTaken.Store(&f)
}

// AfterBulkList calls f after each status a bulk cancel of e lists the
// runs of.
func AfterBulkList(e *Engine, f func(RunStatus)) { e.afterBulkList = f }
