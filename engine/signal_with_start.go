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

// SignalWithStart sends the signal name with payload to the run of w whose
// workflow ID is opts.WorkflowID, starting that run with input in first if
// there is none, in one transaction (Temporal's SignalWithStart): callers
// that race with one workflow ID get one run, and every signal reaches it,
// in the order they committed. A run that exists keeps its input (in is
// not compared with it). opts.StartAt and Delay apply to a run it starts;
// sopts (may be nil) gives the signal its idempotency key. The run starts
// through River (not in this process at once), with the signal already
// buffered for its AwaitSignal.
//
// StartResult.Existing tells whether the run existed. Errors: those of
// Start and of Signal; ErrInvalidArgument when opts.WorkflowID is empty;
// ErrRunClosed when the run with that workflow ID has finished (a workflow
// ID names one run for good, so no new run is started).
func (w *Workflow[In, Out]) SignalWithStart(ctx context.Context, e *Engine, in In, opts *StartOpts, name string, payload any, sopts *SignalOpts) (*StartResult, error) {
	input, err := w.encode(in)
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: encoding signal payload: %v", ErrInvalidInput, err)
	}
	return e.signalWithStart(ctx, w.name, w.opts.Version, input, opts, name, raw, sopts)
}

// SignalWithStartJSON is SignalWithStart for the registered workflow
// named workflow, with its input and the signal's payload already encoded
// as JSON (the HTTP API and the CLI pass them through); the input must
// decode as the workflow's input type, as StartJSON checks it.
func (e *Engine) SignalWithStartJSON(ctx context.Context, workflow string, input json.RawMessage, opts *StartOpts, name string, payload []byte, sopts *SignalOpts) (*StartResult, error) {
	r, ok := e.workflow(workflow)
	if !ok {
		return nil, fmt.Errorf("%w: %q is not registered in this process (registered: %s)", ErrUnknownWorkflow, workflow, e.registeredNames())
	}
	input, err := e.checkInput(r, workflow, input)
	if err != nil {
		return nil, err
	}
	if err := jsonSyntax(payload); err != nil {
		return nil, fmt.Errorf("%w: signal payload is not valid JSON: %w", ErrInvalidInput, err)
	}
	return e.signalWithStart(ctx, workflow, r.version, input, opts, name, payload, sopts)
}

func (e *Engine) signalWithStart(ctx context.Context, workflow string, version int, input []byte, opts *StartOpts, name string, payload []byte, sopts *SignalOpts) (res *StartResult, err error) {
	if opts == nil || opts.WorkflowID == "" {
		return nil, fmt.Errorf("%w: SignalWithStart needs StartOpts.WorkflowID: it names the run to signal or start", ErrInvalidArgument)
	}
	if err := e.checkSignal(name, payload, sopts); err != nil {
		return nil, err
	}
	r, err := e.newRun(workflow, version, input, opts)
	if err != nil {
		return nil, err
	}
	span, traceCtx := e.tr.start(ctx, workflow, r.WorkflowID)
	defer func() { started(span, res, err) }()
	r.TraceContext = traceCtx
	var sent store.SignalSent
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		ins, err := store.InsertRun(ctx, tx, r)
		switch {
		case errors.Is(err, store.ErrConflict):
			// The run exists with another input: it is the one to signal.
		case errors.Is(err, store.ErrBadPayload):
			return fmt.Errorf("%w: %v", ErrInvalidInput, err)
		case err != nil:
			return fmt.Errorf("pgdurable: starting workflow %q: %w", workflow, err)
		case !ins.Existing && needsTicket(r):
			if err := e.queue.Enqueue(ctx, tx, ins.RunID, time.Time{}); err != nil {
				return err
			}
		}
		res = &StartResult{RunID: ins.RunID, WorkflowID: r.WorkflowID, Existing: ins.Existing || err != nil, Status: RunStatus(ins.Status)}
		sent, err = e.sendSignal(ctx, tx, ins.RunID, name, payload, sopts)
		return err
	})
	if err != nil {
		return nil, err
	}
	if !sent.Duplicate {
		e.sobs.SignalSent(workflow, name, sent.Woken)
	}
	e.obs.RunStarted(workflow, res.Existing)
	return res, nil
}
