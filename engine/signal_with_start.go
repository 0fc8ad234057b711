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

// SignalWithStartParams is one SignalWithStart call: the run to signal or
// start (Opts.WorkflowID is required: it names the run), its input for a
// start, and the signal.
type SignalWithStartParams[In any] struct {
	Input In
	// Opts: WorkflowID required; StartAt and Delay apply to a run it starts.
	Opts *StartOpts
	// Signal is the signal's name; Payload its value (encoded as JSON).
	Signal  string
	Payload any
	// SignalOpts (may be nil) gives the signal its idempotency key.
	SignalOpts *SignalOpts
}

// SignalWithStart sends the signal p.Signal with p.Payload to the run of w
// whose workflow ID is p.Opts.WorkflowID, starting that run with p.Input
// first if there is none, in one transaction (Temporal's SignalWithStart):
// callers that race with one workflow ID get one run, and every signal
// reaches it, in the order they committed. A run that exists keeps its
// input (p.Input is not compared with it). The run starts through River
// (not in this process at once), with the signal already buffered for its
// AwaitSignal.
//
// StartResult.Existing tells whether the run existed. Errors: those of
// Start and of Signal; ErrInvalidArgument when p.Opts.WorkflowID is empty;
// ErrRunClosed when the run with that workflow ID has finished (a workflow
// ID names one run for good, so no new run is started).
func (w *Workflow[In, Out]) SignalWithStart(ctx context.Context, e *Engine, p SignalWithStartParams[In]) (*StartResult, error) {
	input, err := w.encode(p.Input)
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(p.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: encoding signal payload: %v", ErrInvalidInput, err)
	}
	return e.signalWithStart(ctx, w.opts.Version, SignalWithStartJSONParams{Workflow: w.name, Input: input, Opts: p.Opts,
		Signal: p.Signal, Payload: raw, SignalOpts: p.SignalOpts})
}

// SignalWithStartJSONParams is SignalWithStartParams for
// SignalWithStartJSON: the workflow by name, its input and the signal's
// payload already encoded as JSON.
type SignalWithStartJSONParams struct {
	Workflow   string
	Input      json.RawMessage
	Opts       *StartOpts // WorkflowID required
	Signal     string
	Payload    json.RawMessage
	SignalOpts *SignalOpts
}

// SignalWithStartJSON is SignalWithStart for the registered workflow
// named p.Workflow, with its input and the signal's payload already
// encoded as JSON (the HTTP API and the CLI pass them through); the input
// must decode as the workflow's input type, as StartJSON checks it.
func (e *Engine) SignalWithStartJSON(ctx context.Context, p SignalWithStartJSONParams) (*StartResult, error) {
	r, ok := e.workflow(p.Workflow)
	if !ok {
		return nil, fmt.Errorf("%w: %q is not registered in this process (registered: %s)", ErrUnknownWorkflow, p.Workflow, e.registeredNames())
	}
	input, err := e.checkInput(r, p.Workflow, p.Input)
	if err != nil {
		return nil, err
	}
	if err := jsonSyntax(p.Payload); err != nil {
		return nil, fmt.Errorf("%w: signal payload is not valid JSON: %w", ErrInvalidInput, err)
	}
	p.Input = input
	return e.signalWithStart(ctx, r.version, p)
}

func (e *Engine) signalWithStart(ctx context.Context, version int, p SignalWithStartJSONParams) (res *StartResult, err error) {
	workflow, opts, name, payload, sopts := p.Workflow, p.Opts, p.Signal, []byte(p.Payload), p.SignalOpts
	if opts == nil || opts.WorkflowID == "" {
		return nil, fmt.Errorf("%w: SignalWithStart needs StartOpts.WorkflowID: it names the run to signal or start", ErrInvalidArgument)
	}
	if err := e.checkSignal(name, payload, sopts); err != nil {
		return nil, err
	}
	r, err := e.newRun(workflow, version, p.Input, opts)
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
		e.obs.SignalSent(SignalSentEvent{Workflow: workflow, Signal: name, Woken: sent.Woken})
	}
	e.obs.RunStarted(RunStartedEvent{Workflow: workflow, Existing: res.Existing})
	return res, nil
}
