package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pgdurable/pgdurable/engine/internal/groupcommit"
	"github.com/pgdurable/pgdurable/engine/internal/store"
	"go.opentelemetry.io/otel/attribute"
)

// WorkflowOpts tunes a workflow. A nil *WorkflowOpts takes the defaults.
type WorkflowOpts struct {
	// Version is the version of the code, recorded on each run and in
	// dead jobs. A run stays on the version it started with: a process
	// works only the runs of the versions it registers (Engine.Register
	// takes several versions of one workflow side by side), so a change
	// that does not replay the old steps ships as a new version, both
	// registered until the old version's runs have ended (or see
	// AutoUpgrade). Default 1.
	Version int
	// AutoUpgrade, set on the latest version a process registers, moves
	// the runs of older versions of the workflow to it at their next
	// delivery in that process (Run.WorkflowVersion changes, and the
	// engine logs the move), instead of pinning each run to its version:
	// for teams that ship every change behind Patched, so that the latest
	// code replays every run's recorded steps and one version is enough.
	// A run never moves to an older version; without AutoUpgrade on the
	// latest version, runs stay pinned. A change not behind a patch parks
	// the upgraded runs that replay past it as nondeterminism (repair them
	// with ResolveOpts.Version).
	AutoUpgrade bool
	// RetryPolicy fills fields its steps leave zero, before the engine's.
	RetryPolicy *RetryPolicy
	// MaxParallelSteps bounds the steps of one run started with Go or GoTx
	// that run at once (default 32): Go waits for one to end before it
	// starts another, so a fan-out over 10,000 items holds 32 goroutines
	// (and, for GoTx, at most 32 pool connections). Negative is an error.
	MaxParallelSteps int
	// Queue puts the workflow's runs in a flow-controlled queue
	// (Engine.RegisterQueue), unless a start names another
	// (StartOpts.Queue): a process serving the queue admits them within
	// its limits. Empty: no queue, runs start as soon as a worker is free.
	Queue string
	// QueueKey computes a run's key in its queue from the run's JSON
	// input (KeyOf builds one from a function of the decoded input), for
	// QueueOpts.KeyConcurrency, KeyRateLimit and fair shares: a customer
	// ID, say. StartOpts.QueueKey overrides it. An error fails the start
	// with ErrInvalidInput.
	QueueKey func(input json.RawMessage) (string, error)
}

// Workflow is a registered-by-name Go function, defined with Define. In and
// Out are encoded as JSON: the input when the run starts, the output when
// it completes.
type Workflow[In, Out any] struct {
	name string
	fn   func(*Context, In) (Out, error)
	opts WorkflowOpts
	err  error // a definition error, reported by Register and Start
}

// Define names fn as a workflow. The name is what the database stores, so
// it must stay stable across deploys (1 to 200 bytes); change the code
// behind a name only in ways that replay the same steps in the same order
// (see Patched), or define a new WorkflowOpts.Version and register it
// beside the old one until the old version's runs have ended.
//
// fn receives a *Context and must be deterministic apart from its steps:
// anything that reads the clock, randomness or the outside world belongs in
// a Step.
func Define[In, Out any](name string, fn func(ctx *Context, in In) (Out, error), opts *WorkflowOpts) *Workflow[In, Out] {
	w := &Workflow[In, Out]{name: name, fn: fn}
	if opts != nil {
		w.opts = *opts
	}
	w.opts.Version = orDefault(w.opts.Version, 1)
	if err := checkName("workflow name", name, 200); err != nil {
		w.err = fmt.Errorf("pgdurable: %w", err)
	}
	switch {
	case fn == nil:
		w.err = fmt.Errorf("pgdurable: workflow %q has a nil function", name)
	case w.opts.RetryPolicy.validate() != nil:
		w.err = fmt.Errorf("pgdurable: workflow %q: %w", name, w.opts.RetryPolicy.validate())
	case w.opts.MaxParallelSteps < 0:
		w.err = fmt.Errorf("pgdurable: workflow %q: MaxParallelSteps %d is negative", name, w.opts.MaxParallelSteps)
	}
	return w
}

// defaultMaxParallelSteps is WorkflowOpts.MaxParallelSteps's default.
const defaultMaxParallelSteps = 32

// Name returns the workflow's stored name.
func (w *Workflow[In, Out]) Name() string { return w.name }

// Registration is what Engine.Register accepts: a workflow (a *Workflow,
// from Define), or the definition of a flow-controlled queue (DefineQueue)
// or of a rate limit (DefineRateLimit). A package that defines workflows
// can so hand out the queues and rate limits they name with them, and
// every process that registers the workflows defines those alike.
type Registration interface {
	register(e *Engine) error
}

func (w *Workflow[In, Out]) register(e *Engine) error { return e.addWorkflow(w.registration()) }

// registered is a workflow with its types erased, as the executor runs it.
type registered struct {
	name        string
	version     int
	autoUpgrade bool // WorkflowOpts.AutoUpgrade
	retry       *RetryPolicy
	maxParallel int
	queue       string                                      // WorkflowOpts.Queue
	queueKey    func(input json.RawMessage) (string, error) // WorkflowOpts.QueueKey
	err         error
	// decode checks that input decodes as In.
	decode func(input []byte) error
	// run decodes input, calls the function and encodes its output.
	run func(ctx *Context, input []byte) ([]byte, error)
}

// errPoisonInput wraps an input that does not decode as the workflow's In.
type errPoisonInput struct{ err error }

func (e *errPoisonInput) Error() string { return "input does not decode: " + e.err.Error() }
func (e *errPoisonInput) Unwrap() error { return e.err }

// errUnserializableOutput wraps an output that json.Marshal rejects.
type errUnserializableOutput struct{ err error }

func (e *errUnserializableOutput) Error() string {
	if errors.Is(e.err, ErrOutputTooLarge) {
		return "output refused: " + e.err.Error()
	}
	return "output does not encode: " + e.err.Error()
}
func (e *errUnserializableOutput) Unwrap() error { return e.err }

func (w *Workflow[In, Out]) registration() registered {
	return registered{
		name:        w.name,
		version:     w.opts.Version,
		autoUpgrade: w.opts.AutoUpgrade,
		retry:       w.opts.RetryPolicy,
		maxParallel: cmp.Or(w.opts.MaxParallelSteps, defaultMaxParallelSteps),
		queue:       w.opts.Queue,
		queueKey:    w.opts.QueueKey,
		err:         w.err,
		decode: func(input []byte) error {
			_, err := decodeStrict[In](input)
			return err
		},
		run: func(ctx *Context, input []byte) ([]byte, error) {
			in, err := decodeStrict[In](input)
			if err != nil {
				return nil, &errPoisonInput{err: err}
			}
			out, err := w.fn(ctx, in)
			if err != nil {
				return nil, err
			}
			return encodeOutput(out, ctx.d.e.cfg.MaxPayloadBytes)
		},
	}
}

// Validator is implemented by workflow inputs that check themselves. The
// engine calls Validate when a run starts (an error there is
// ErrInvalidInput: the HTTP API answers 400 and no run exists) and again
// when a delivery decodes the input (an error there parks the run as
// poison_input: the rules changed under a stored run).
type Validator interface {
	Validate() error
}

// decodeStrict decodes JSON that must hold exactly one value of type T, and
// validates it when T is a Validator.
func decodeStrict[T any](b []byte) (T, error) {
	var v T
	if err := jsonSyntax(b); err != nil {
		return v, err // what breaks and at which byte offset
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, err
	}
	if val, ok := any(v).(Validator); ok {
		if err := val.Validate(); err != nil {
			return v, err
		}
	} else if val, ok := any(&v).(Validator); ok {
		if err := val.Validate(); err != nil {
			return v, err
		}
	}
	return v, nil
}

// Start starts a run of w with input in (see Engine.StartJSON for the
// workflow-ID rules). e need not have w registered: any process may start
// runs that other processes work. When e is started, registers w and has a
// free worker slot, the run is inserted already claimed (StartResult.Status
// running) and executes in this process at once, without waiting for a
// River fetch; otherwise it is pending until a worker picks it up.
func (w *Workflow[In, Out]) Start(ctx context.Context, e *Engine, in In, opts *StartOpts) (*StartResult, error) {
	input, err := w.encode(in)
	if err != nil {
		return nil, err
	}
	return e.startJSON(ctx, nil, w.name, w.opts.Version, input, opts)
}

// StartTx is Start inside the caller's transaction: the run exists, and will
// be delivered, only if tx commits (the outbox pattern).
func (w *Workflow[In, Out]) StartTx(ctx context.Context, e *Engine, tx pgx.Tx, in In, opts *StartOpts) (*StartResult, error) {
	input, err := w.encode(in)
	if err != nil {
		return nil, err
	}
	return e.startJSON(ctx, tx, w.name, w.opts.Version, input, opts)
}

func (w *Workflow[In, Out]) encode(in In) ([]byte, error) {
	if w.err != nil {
		return nil, w.err
	}
	if val, ok := any(in).(Validator); ok {
		if err := val.Validate(); err != nil {
			return nil, fmt.Errorf("%w: input of workflow %q: %v", ErrInvalidInput, w.name, err)
		}
	}
	b, err := json.Marshal(in)
	if err == nil {
		err = checkStorable(b)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: encoding input of workflow %q: %v", ErrInvalidInput, w.name, err)
	}
	return b, nil
}

// RunError is the error Result and Wait return for a run that ended
// without output. It wraps the run's recorded error, decoded as the
// workflow saw it: errors.As finds the *StepError of the step that failed,
// the registered error types in its chain and a *PanicError; errors.Is
// finds ErrCancelled for a cancelled run, ErrRetriesExhausted, ErrTimeout
// and the registered sentinels.
type RunError struct {
	RunID  uuid.UUID
	Status RunStatus  // failed, dead, cancelled, compensated
	Info   *ErrorInfo // the recorded error, if any
	Err    error      // Info decoded (see ErrorInfo.Err); nil when none was recorded
}

// Unwrap returns the run's decoded error.
func (e *RunError) Unwrap() error { return e.Err }

// Error renders the run, its final status and its recorded message.
func (e *RunError) Error() string {
	msg := "no error recorded"
	if e.Info != nil {
		msg = e.Info.Message
	}
	return fmt.Sprintf("run %s ended %s: %s", e.RunID, e.Status, msg)
}

// Result returns a finished run's output, a *RunError when it ended any
// other way than completed, or ErrRunNotFinished. A run that continued as
// new (ContinueAsNew) is followed to the latest run of its chain, whose
// outcome Result returns.
func (w *Workflow[In, Out]) Result(ctx context.Context, e *Engine, runID uuid.UUID) (Out, error) {
	out, _, err := w.result(ctx, e, runID)
	return out, err
}

// result is Result, also returning the run it read (the latest of the
// chain runID continued into).
func (w *Workflow[In, Out]) result(ctx context.Context, e *Engine, runID uuid.UUID) (Out, uuid.UUID, error) {
	var out Out
	run, err := e.GetRun(ctx, runID)
	if err != nil {
		return out, runID, err
	}
	if run.Status == StatusContinued {
		latest, err := store.LatestRun(ctx, e.db, run.WorkflowName, run.WorkflowID)
		if err != nil {
			return out, runID, fmt.Errorf("pgdurable: finding the latest run of workflow ID %q: %w", run.WorkflowID, err)
		}
		out, err := w.Result(ctx, e, latest)
		return out, latest, err
	}
	out, err = w.runResult(run)
	return out, runID, err
}

func (w *Workflow[In, Out]) runResult(run *Run) (Out, error) {
	var out Out
	runID := run.RunID
	switch run.Status {
	case StatusCompleted:
		if err := json.Unmarshal(run.Output, &out); err != nil {
			return out, fmt.Errorf("decoding output of run %s: %w", runID, err)
		}
		return out, nil
	case StatusFailed, StatusDead, StatusCancelled, StatusCompensated, StatusTerminated:
		return out, &RunError{RunID: runID, Status: run.Status, Info: run.Error, Err: run.Error.Err()}
	}
	return out, ErrRunNotFinished
}

// Wait returns what Result returns once the run reaches a terminal status
// (completed, failed, dead, cancelled, compensated, terminated; a run that continued
// as new is followed to the latest run of its chain), or ctx's error when
// ctx is done first. It is woken as the run's end commits: at once when
// the run ends in e's process (one Start dispatched there, or that e's
// workers picked up); when it ends in another process, by a notification
// (PostgreSQL's NOTIFY) that the ending statement sends because Wait,
// having not seen the run end within 50ms, marked it watched (one write)
// and listens on a connection of its own (one per process, while some
// Wait needs it, not taken from e's pool). poll (default 50ms) is how often Wait reads the run while
// it cannot be notified; once it can, it reads it every second as well, in
// case a notification is lost with the listening connection. A dead run
// returns a *RunError with Status "dead" at once; it does not wait for an
// operator's replay. A run of a workflow that no running engine registers
// stays pending: bound ctx.
func (w *Workflow[In, Out]) Wait(ctx context.Context, e *Engine, runID uuid.UUID, poll time.Duration) (Out, error) {
	poll = orDefault(poll, 50*time.Millisecond)
	ended, stop := e.watchEnd(runID)
	defer func() { stop() }()
	var unwatch func() // set while this Wait will be notified of an end elsewhere
	defer func() {
		if unwatch != nil {
			unwatch()
		}
	}()
	for check := 0; ; check++ {
		out, latest, err := w.result(ctx, e, runID)
		if !errors.Is(err, ErrRunNotFinished) {
			return out, err
		}
		if latest != runID {
			// The run continued as new: wait for the latest of its chain.
			runID = latest
			stop()
			ended, stop = e.watchEnd(runID)
			if unwatch != nil {
				unwatch()
				unwatch = nil
			}
			check = -1
			continue
		}
		wait := poll
		switch {
		case unwatch != nil:
			wait = remoteBackstop
		case check == 0:
			// Most runs end where they were started: give that a moment
			// before marking the run watched, which is a write.
			wait = min(poll, localGrace)
		default:
			if status, done, err := e.watchRemote(ctx, runID); err == nil {
				unwatch = done
				if status.Terminal() {
					continue // it ended before the mark: read its result
				}
				wait = remoteBackstop
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return out, ctx.Err()
		case <-ended:
			// An end, here or notified; or the listener failed and woke
			// every Wait, which then watches again if its run still runs.
			stop()
			ended, stop = e.watchEnd(runID)
			if unwatch != nil {
				unwatch()
				unwatch = nil
			}
		case <-t.C:
		}
		t.Stop()
	}
}

// localGrace is how long Wait waits for a run to end in its own process
// before it arranges to be notified of an end elsewhere.
const localGrace = 50 * time.Millisecond

// Context is what workflow code receives: the delivery's context.Context
// (cancelled when the lease is lost or the engine shuts down) and a handle
// on the delivery that replays and records the run's steps. Pass it to
// Step, TxStep, RunActivity, Sleep and AwaitSignal; step functions get a
// plain context.Context so they cannot start steps themselves.
//
// A Context belongs to one delivery and one goroutine: do not keep it after
// the workflow function returns or share it between goroutines.
type Context struct {
	context.Context
	d *delivery
}

// RunID returns the run's ID.
func (c *Context) RunID() uuid.UUID { return c.d.runID }

// WorkflowID returns the run's workflow ID (the start's idempotency key).
func (c *Context) WorkflowID() string { return c.d.workflowID }

// Logger returns the engine's logger with run_id, workflow and workflow_id set.
func (c *Context) Logger() *slog.Logger { return c.d.log }

// IsReplaying reports whether the next step is already recorded, so its
// function will not run. Use it to skip logging on replay.
func (c *Context) IsReplaying() bool { return c.d.pos.replaying() }

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
		if runs[i], err = e.newRun(ctx, w.name, w.opts.Version, input, s.Opts); err != nil {
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
		p, paths[i] = e.planStart(tx, w.name, w.opts.Version, runs[i].StartAt != nil, runs[i].FlowQueue != "")
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
		if inserted, err = store.InsertRuns(ctx, e.on(tx), runs); err != nil {
			return err
		}
		var tickets []uuid.UUID
		for i, r := range inserted {
			switch {
			case errors.Is(r.Err, store.ErrConflict):
				return fmt.Errorf("start %d: %w: workflow %q, ID %q (run %s)", i, ErrWorkflowIDConflict, w.name, runs[i].WorkflowID, r.Run.RunID)
			case r.Err != nil:
				return fmt.Errorf("start %d: %w", i, r.Err)
			case r.Run.Deduplicated && (starts[i].Opts == nil || !starts[i].Opts.ReturnDuplicate):
				return fmt.Errorf("start %d: %w: queue %q, deduplication ID %q: run %s is %s", i, ErrDuplicate,
					runs[i].FlowQueue, runs[i].DedupID, r.Run.RunID, r.Run.Status)
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
			out[i] = &StartResult{RunID: ins.RunID, WorkflowID: r.WorkflowID, Existing: ins.Existing, Deduplicated: ins.Deduplicated,
				Status: RunStatus(ins.Status)}
		}
	}
	switch {
	case errors.Is(err, ErrWorkflowIDConflict), errors.Is(err, ErrDuplicate):
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
