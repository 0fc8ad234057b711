package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// TerminateOpts says why a run is terminated, and by whom: both are kept
// in the run's error (and in its dead job's resolution, if it had one),
// and logged.
type TerminateOpts struct {
	// Reason is why (1 to 1,000 bytes): required. It is one line of
	// UTF-8 text: no control characters (newlines and tabs included), bidi
	// overrides or isolates (U+202A to U+202E, U+2066 to U+2069) or line
	// and paragraph separators (U+2028, U+2029), which would let it forge
	// or reorder what an operator reads in lists and logs.
	Reason string
	// By names who terminated it (up to 200 bytes, one line as Reason;
	// "" for nobody named).
	By string
}

// Terminate ends a run at once, for the operator who knows why: its status
// becomes terminated and its error says who terminated it and why (class
// "terminated"). Unlike Cancel, nothing more of it runs: no compensation,
// no step. A delivery running it in this process stops now; one in
// another process finds its lease gone at its next record write or
// heartbeat and stops (a step already running finishes, and its record is
// refused). An open dead job is resolved as discarded. What its end does
// to other runs happens as for any end: its parent, waiting for it, is
// woken (Get returns a *ChildError with status terminated), and its
// children of policies cancel and wait are cancelled.
//
// An activity in flight when the run is terminated is not undone: its
// call may complete (a card charged) while its outcome is never recorded,
// and no compensation runs, so its effect can stand with nothing to
// reverse it. Its step stays recorded as started, with its request ID:
// Run.UnsettledSteps lists such steps of the terminated run (engine runs
// show and the web UI's run page show them), for an operator to check
// each with the service it called, by that request ID, and undo it by
// hand. Cancel instead when the undos must run.
//
// Terminating a terminated run succeeds (a client may retry). Errors:
// ErrNotFound, ErrRunClosed (it completed, failed, was compensated,
// cancelled or continued), ErrInvalidArgument (opts nil: a reason is
// required; a reason or name out of bounds or with a character
// TerminateOpts refuses).
func (e *Engine) Terminate(ctx context.Context, runID uuid.UUID, opts *TerminateOpts) error {
	if opts == nil {
		return fmt.Errorf("%w: termination needs TerminateOpts with a reason: say why", ErrInvalidArgument)
	}
	if err := checkText("termination reason", opts.Reason, 1, 1000); err != nil {
		return err
	}
	if strings.TrimSpace(opts.Reason) == "" {
		return fmt.Errorf("%w: termination reason is blank: say why", ErrInvalidArgument)
	}
	if err := checkText("terminated by", opts.By, 0, 200); err != nil {
		return err
	}
	msg := "terminated: " + opts.Reason
	if opts.By != "" {
		msg = "terminated by " + opts.By + ": " + opts.Reason
	}
	info := &ErrorInfo{Class: ClassTerminated, Message: msg}
	var t store.Terminated
	var cancelled []uuid.UUID
	err := e.inTx(ctx, nil, func(tx pgx.Tx) error {
		if err := lockFamilyOf(ctx, e.on(tx), runID); err != nil {
			return err
		}
		var err error
		if t, err = store.TerminateRun(ctx, e.on(tx), store.TerminateParams{RunID: runID, Error: info.json(), By: opts.By, Note: msg}); err != nil {
			return err
		}
		if !t.Ended {
			return nil
		}
		if p := t.Parent; p != nil {
			woken, err := store.WakeParent(ctx, e.on(tx), p.RunID, p.Seq)
			if err != nil {
				return err
			}
			if woken {
				if err := e.queue.Enqueue(ctx, tx, p.RunID, time.Time{}); err != nil {
					return err
				}
			}
		}
		c, err := store.CancelChildren(ctx, e.on(tx), runID, compensateStops, cancelledJSON())
		if err != nil {
			return err
		}
		cancelled = c.Cancelled
		return e.queue.EnqueueMany(ctx, tx, c.Woken)
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w: run %s", ErrNotFound, runID)
	case err != nil:
		return fmt.Errorf("pgdurable: terminating run %s: %w", runID, err)
	case !t.Ended && RunStatus(t.Status) == StatusTerminated:
		return nil // terminated already: a retried request
	case !t.Ended:
		return fmt.Errorf("%w: run %s is %s", ErrRunClosed, runID, t.Status)
	}
	if d, ok := e.live.Load(runID); ok {
		d.(*delivery).cancel(ErrLeaseLost) // its lease is gone: it stops, writing nothing
	}
	e.noteCancelled(cancelled)
	e.log.Warn("run terminated", "run_id", runID, "workflow", t.Workflow, "by", opts.By, "reason", opts.Reason, "was", t.Status)
	e.obs.RunEnded(RunEndedEvent{RunID: runID, Workflow: t.Workflow, Status: StatusTerminated})
	e.notifyEnded(runID)
	return nil
}

// checkText checks one line of an operator's text (a termination's
// reason, who acted): min to max bytes of free text (checkFreeText) with
// no line break or tab either, as it is shown on one line (in the run's
// error, lists and logs).
func checkText(what, s string, minLen, maxLen int) error {
	switch {
	case len(s) < minLen || len(s) > maxLen:
		return fmt.Errorf("%w: %s must be %d to %d bytes", ErrInvalidArgument, what, minLen, maxLen)
	case strings.ContainsAny(s, "\n\t"):
		return fmt.Errorf("%w: %s contains a line break or a tab: write it on one line", ErrInvalidArgument, what)
	}
	return checkFreeText(what, s, maxLen)
}

// misleading reports the characters operator text may not hold although
// they are not control characters: bidi overrides, embeddings and
// isolates (U+202A to U+202E, U+2066 to U+2069), which reorder what a
// reader sees around them ("evil\u202egnp.exe" reads as "evilexe.png"),
// and line and paragraph separators (U+2028, U+2029), which break a line
// where a reader does not expect one.
func misleading(r rune) bool {
	return r >= '\u202a' && r <= '\u202e' || r >= '\u2066' && r <= '\u2069' || r == '\u2028' || r == '\u2029'
}
