package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// ContinueAsNew returns the error that, returned by the workflow function,
// ends this run and starts a fresh run of the same workflow with input in,
// under the same workflow ID, in one transaction (Temporal's
// continue-as-new): a workflow that loops for ever (a subscription, a
// poller) keeps each run's history, and its replay, to one iteration.
//
//	return zero, engine.ContinueAsNew(ctx, next)
//
// The ended run's status is continued (Run.ContinuedRunID names the new
// run); signals it had not consumed move to the new run, which inherits
// its parent (a child's chain ends, for its parent, with its last run) and
// its run timeout (StartOpts.RunTimeout, counted per run). The workflow ID
// names the latest run of the chain: Signal, FindRun and the HTTP API
// resolve it to that run, and Result and Wait on any run of the chain
// follow it to the latest. Children of policy wait are waited for first;
// those of policy cancel are cancelled as the run ends.
//
// in must encode as JSON that decodes as the workflow's input type
// (ErrInvalidInput otherwise, returned here). A cancellation requested
// before the run ends wins: the run compensates and ends cancelled.
func ContinueAsNew[In any](ctx *Context, in In) error {
	d := ctx.d
	b, err := json.Marshal(in)
	if err == nil {
		err = checkStorable(b)
	}
	if err != nil {
		return fmt.Errorf("%w: encoding the ContinueAsNew input of workflow %q: %v", ErrInvalidInput, d.wf.name, err)
	}
	if len(b) > d.e.cfg.MaxPayloadBytes {
		return d.e.tooLarge(d.wf.name, len(b))
	}
	if err := d.wf.decode(b); err != nil {
		return fmt.Errorf("%w: the ContinueAsNew input does not decode as workflow %q's input: %v", ErrInvalidInput, d.wf.name, err)
	}
	return &continueAsNewError{input: b}
}

// continueAsNewError carries ContinueAsNew's input to finish.
type continueAsNewError struct{ input []byte }

func (e *continueAsNewError) Error() string {
	return "pgdurable: continue as new (return this error from the workflow function)"
}

// continueAsNew ends the run as continued by a new run with input, which
// it inserts, with its River job or dispatched here, in the same
// transaction.
func (d *delivery) continueAsNew(input []byte) {
	e := d.e
	r, err := e.newRun(d.wf.name, d.wf.version, input, &StartOpts{WorkflowID: d.workflowID, RunTimeout: d.runTimeout, engineMade: true})
	if err != nil {
		d.park(nil, &parkReason{reason: ReasonPermanentError, info: newErrorInfo(err, ClassPermanent)})
		return
	}
	r.Parent = d.parent
	r.TraceContext = d.traceContext // the chain stays in one trace, its first delivery here too
	r.ContinuedFrom = &d.runID
	wf, path := e.planStart(nil, d.wf.name, false)
	e.route(&r, path)
	sent := time.Now()
	d.writeMu.Lock()
	err = d.do(func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			if err := d.lockParent(ctx, tx); err != nil { // ancestors first (see store.LockRun)
				return err
			}
			if p := d.buf.pending; p != nil {
				if _, err := store.WriteSteps(ctx, tx, d.fence(), "", p); err != nil {
					return err
				}
			}
			if err := store.ContinueRun(ctx, tx, d.fence(), r.RunID); err != nil {
				return err
			}
			ins, err := store.InsertRun(ctx, tx, r)
			switch {
			case err != nil:
				return err
			case ins.Existing:
				return fmt.Errorf("pgdurable: workflow ID %q is held by run %s as run %s continues", d.workflowID, ins.RunID, d.runID)
			case needsTicket(r):
				if err := e.queue.Enqueue(ctx, tx, r.RunID, time.Time{}); err != nil {
					return err
				}
			}
			if err := store.MoveSignals(ctx, tx, d.runID, r.RunID); err != nil {
				return err
			}
			return d.endRelated(ctx, tx, StatusContinued)
		})
	})
	d.writeMu.Unlock()
	e.afterStart(wf, path, r, err == nil, sent)
	if errors.Is(err, store.ErrCancelRequested) {
		// A cancellation accepted before the run ended wins: nothing was
		// written; the run compensates and ends cancelled instead.
		d.noteCancel(true)
		d.compensate(StatusCancelled, d.cancelInfo())
		return
	}
	d.buf.take() // written by the transaction
	if err == nil {
		e.noteCancelled(d.closedChildren)
		e.obs.RunStarted(RunStartedEvent{Workflow: d.wf.name})
		d.log.Debug("run continued as new", "next_run_id", r.RunID)
	}
	d.close(StatusContinued, err)
}
