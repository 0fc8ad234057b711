package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"

	"github.com/pgdurable/pgdurable/engine/internal/groupcommit"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// StartParams is one run of a StartMany call: its input and options (nil:
// a new UUID v7 as its workflow ID).
type StartParams[In any] struct {
	Input In
	Opts  *StartOpts
}

// Bounds of one StartMany call: the runs, and the bytes of their encoded
// inputs together (each input is also bound by Config.MaxPayloadBytes).
const (
	MaxStartMany      = 10_000
	maxStartManyBytes = groupcommit.MaxBatchBytes
)

// StartMany starts one run of w per element of starts, in one transaction:
// one multi-row insert, and River's tickets for the runs that need one in
// one InsertMany (River's). It is for callers that have a batch at hand (an
// import, a fan-out from a queue consumer); concurrent Start calls are
// coalesced the same way without it.
//
// All of them start or none does. The results are in starts' order. A start
// whose workflow ID is taken by a run with the same input returns that run
// (Existing), as Start does, and so does a second start in the same call
// with an ID and input seen earlier in it; an ID taken with a different
// input fails the call with ErrWorkflowIDConflict. An input that does not
// encode or validate fails it with ErrInvalidInput; both errors name the
// start by its index. More than MaxStartMany starts, or inputs over 64 MiB
// together, are ErrInvalidArgument. Runs reach workers as Start's do: a
// process that registers w and has free workers runs them itself.
func (w *Workflow[In, Out]) StartMany(ctx context.Context, e *Engine, starts []StartParams[In]) ([]*StartResult, error) {
	return w.startMany(ctx, e, nil, starts)
}

// StartManyTx is StartMany inside the caller's transaction: the runs exist,
// and will be delivered, only if tx commits.
func (w *Workflow[In, Out]) StartManyTx(ctx context.Context, e *Engine, tx pgx.Tx, starts []StartParams[In]) ([]*StartResult, error) {
	return w.startMany(ctx, e, tx, starts)
}

func (w *Workflow[In, Out]) startMany(ctx context.Context, e *Engine, tx pgx.Tx, starts []StartParams[In]) ([]*StartResult, error) {
	if len(starts) > MaxStartMany {
		return nil, fmt.Errorf("%w: %d starts in one StartMany call, over the %d limit", ErrInvalidArgument, len(starts), MaxStartMany)
	}
	runs := make([]store.NewRun, len(starts))
	total := 0
	for i, s := range starts {
		input, err := w.encode(s.Input)
		if err != nil {
			return nil, fmt.Errorf("start %d: %w", i, err)
		}
		if len(input) <= e.cfg.MaxPayloadBytes { // over it, newRun says so for this start
			if total += len(input); total > maxStartManyBytes {
				return nil, fmt.Errorf("%w: the inputs of one StartMany call are over %d bytes together", ErrInvalidArgument, maxStartManyBytes)
			}
		}
		if runs[i], err = e.newRun(w.name, w.opts.Version, input, s.Opts); err != nil {
			return nil, fmt.Errorf("start %d: %w", i, err)
		}
	}
	if len(runs) == 0 {
		return []*StartResult{}, nil
	}
	// One start span for the call: every run it starts joins its trace.
	span, traceCtx := e.tr.start(ctx, w.name, "")
	span.SetAttributes(attribute.Int(attrPrefix+"runs", len(runs)))
	defer span.End()
	for i := range runs {
		runs[i].TraceContext = traceCtx
	}

	// Each run reaches a worker as a Start's would, the runs this call
	// holds counted against the process's bound; the slots taken for runs
	// to dispatch are given back unless they are dispatched.
	paths := make([]startPath, len(runs))
	var wf registered
	e.heldMu.Lock()
	room := e.maxHeld() - len(e.held)
	e.heldMu.Unlock()
	for i := range runs {
		var p registered
		p, paths[i] = e.planStart(tx, w.name, runs[i].StartAt != nil)
		if paths[i] != viaRiver {
			wf = p
		}
		if paths[i] == holdLocal {
			if room--; room < 0 {
				paths[i] = viaRiver
			}
		}
		e.route(&runs[i], paths[i])
	}
	sent := time.Now()
	var inserted []store.InsertedRunResult
	err := e.inTx(ctx, tx, func(tx pgx.Tx) error {
		var err error
		if inserted, err = store.InsertRuns(ctx, tx, runs); err != nil {
			return err
		}
		var tickets []uuid.UUID
		for i, r := range inserted {
			switch {
			case errors.Is(r.Err, store.ErrConflict):
				return fmt.Errorf("start %d: %w: workflow %q, ID %q (run %s)", i, ErrWorkflowIDConflict, w.name, runs[i].WorkflowID, r.Run.RunID)
			case r.Err != nil:
				return fmt.Errorf("start %d: %w", i, r.Err)
			case !r.Run.Existing && needsTicket(runs[i]):
				tickets = append(tickets, r.Run.RunID)
			}
		}
		return e.queue.EnqueueMany(ctx, tx, tickets)
	})
	out := make([]*StartResult, len(runs))
	for i, r := range runs {
		e.afterStart(wf, paths[i], r, err == nil && !inserted[i].Run.Existing, sent)
		if err == nil {
			ins := inserted[i].Run
			out[i] = &StartResult{RunID: ins.RunID, WorkflowID: r.WorkflowID, Existing: ins.Existing, Status: RunStatus(ins.Status)}
		}
	}
	switch {
	case errors.Is(err, ErrWorkflowIDConflict):
		return nil, err
	case errors.Is(err, store.ErrBadPayload):
		return nil, fmt.Errorf("%w: %v", ErrInvalidInput, err)
	case err != nil:
		return nil, fmt.Errorf("pgdurable: starting %d runs of workflow %q: %w", len(runs), w.name, err)
	}
	for _, res := range out {
		e.obs.RunStarted(RunStartedEvent{Workflow: w.name, Existing: res.Existing})
	}
	return out, nil
}
