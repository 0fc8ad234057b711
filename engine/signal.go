package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// signalOutcome is the record of an AwaitSignal or SelectSignal step.
type signalOutcome struct {
	Payload  json.RawMessage `json:"payload,omitempty"`
	TimedOut bool            `json:"timed_out,omitempty"`
	// Signal is the name of the signal a SelectSignal received (AwaitSignal
	// records none: it waits for one name).
	Signal string `json:"signal,omitempty"`
}

// SignalOpts are a signal's options. The zero value and nil are the
// defaults.
type SignalOpts struct {
	// Key is the signal's idempotency key (1 to 200 bytes; "" for none),
	// unique per run: a signal sent again with the same key, name and
	// payload (a client's retry after a lost response) is accepted and not
	// stored again, so the run receives it once; with another name or
	// payload it fails with ErrSignalKeyConflict. Payloads are compared as
	// PostgreSQL's jsonb compares them (key order and white space do not
	// matter), and a retry is answered as the first send was: Signal does
	// not tell the two apart.
	Key string
}

func (o *SignalOpts) key() string {
	if o == nil {
		return ""
	}
	return o.Key
}

// Signal sends a signal named name with payload (any JSON-encodable value;
// nil sends JSON null) to the run target names: a run ID, or a workflow ID
// when it names runs of one workflow only. Signals are buffered in the
// order sent until the run's AwaitSignal for that name consumes them, each
// exactly once; a run waiting for this name is woken at once (its delivery
// is enqueued in the same transaction). A run waiting for its delayed
// start (StartOpts.StartAt, Delay) is not started by a signal, unlike
// Temporal's StartDelay: the signal waits in the buffer until the run
// starts, at its time or at StartNow. opts may be nil.
//
// Errors: ErrNotFound (no such run), ErrRunClosed (the run completed,
// failed, was compensated, cancelled or terminated, or continued as new:
// nothing will read the signal; a workflow ID names the latest run of a
// chain), ErrInvalidArgument (a bad name or key, an ambiguous workflow
// ID), ErrInvalidInput (payload does not encode or is over
// Config.MaxPayloadBytes), ErrSignalKeyConflict (opts.Key was used for
// another signal), ErrLimitExceeded (the run holds Config.MaxSignalsPerRun
// signals, or the payload would take it over Config.MaxSignalBytesPerRun:
// signals are kept once consumed, for replays). A dead run accepts
// signals: a replay may read them.
func (e *Engine) Signal(ctx context.Context, target, name string, payload any, opts *SignalOpts) error {
	return e.signal(ctx, nil, target, name, payload, opts)
}

// SignalTx is Signal in the caller's transaction: the signal exists, and
// wakes the run, only if tx commits (the outbox pattern, as StartTx).
func (e *Engine) SignalTx(ctx context.Context, tx pgx.Tx, target, name string, payload any, opts *SignalOpts) error {
	return e.signal(ctx, tx, target, name, payload, opts)
}

// SignalJSON is Signal with a payload already encoded as JSON (the HTTP API
// and the CLI pass it through); it must be one valid JSON value
// (ErrInvalidInput otherwise, saying at which byte offset it breaks, as
// StartJSON does).
func (e *Engine) SignalJSON(ctx context.Context, target, name string, payload []byte, opts *SignalOpts) error {
	if err := jsonSyntax(payload); err != nil {
		return fmt.Errorf("%w: signal payload is not valid JSON: %w", ErrInvalidInput, err)
	}
	return e.signalRaw(ctx, nil, target, name, payload, opts)
}

func (e *Engine) signal(ctx context.Context, tx pgx.Tx, target, name string, payload any, opts *SignalOpts) error {
	raw, err := json.Marshal(payload)
	if err != nil {
		return fmt.Errorf("%w: encoding signal payload: %v", ErrInvalidInput, err)
	}
	return e.signalRaw(ctx, tx, target, name, raw, opts)
}

// checkSignal checks a signal's name, key and payload before it is sent.
func (e *Engine) checkSignal(name string, payload []byte, opts *SignalOpts) error {
	if err := checkName("signal name", name, 200); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if key := opts.key(); key != "" {
		if err := checkName("signal idempotency key", key, 200); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
	}
	if len(payload) > e.cfg.MaxPayloadBytes {
		return fmt.Errorf("%w: signal payload is %d bytes, over the %d-byte limit", ErrInvalidInput, len(payload), e.cfg.MaxPayloadBytes)
	}
	if err := checkStorable(payload); err != nil {
		return fmt.Errorf("%w: signal payload: %v", ErrInvalidInput, err)
	}
	if err := checkJSONShape(payload, true); err != nil {
		return fmt.Errorf("%w: signal payload: %v", ErrInvalidInput, err)
	}
	return nil
}

func (e *Engine) signalRaw(ctx context.Context, tx pgx.Tx, target, name string, payload []byte, opts *SignalOpts) error {
	if err := e.checkSignal(name, payload, opts); err != nil {
		return err
	}
	if err := checkName("run", target, 400); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	var sent store.SignalSent
	err := e.inTx(ctx, tx, func(tx pgx.Tx) error {
		for hop := 0; ; hop++ {
			runID, err := store.ResolveRun(ctx, e.on(tx), target)
			switch {
			case errors.Is(err, store.ErrNotFound):
				return fmt.Errorf("%w: run %q", ErrNotFound, target)
			case errors.Is(err, store.ErrAmbiguous):
				return fmt.Errorf("%w: workflow ID %q is used by runs of several workflows; signal by run ID", ErrInvalidArgument, target)
			case err != nil:
				return fmt.Errorf("pgdurable: signalling %q: %w", target, err)
			}
			sent, err = e.sendSignal(ctx, tx, runID, name, payload, opts)
			if sent.Status == store.RunContinued && !sent.Duplicate && runID.String() != target && hop < maxSignalHops {
				continue // the run continued as new since the workflow ID named it: signal the new one
			}
			return err
		}
	})
	if err == nil && !sent.Duplicate {
		// With SignalTx the caller's commit is still ahead: counted as stored.
		e.obs.SignalSent(SignalSentEvent{Workflow: sent.Workflow, Signal: name, Woken: sent.Woken})
	}
	return err
}

// maxSignalHops bounds how many times a signal by workflow ID follows the
// workflow's chain of runs while they continue as new under it: each hop
// finds the chain's latest run and locks it, which holds it from
// continuing until the signal commits (and then the signal moves with
// it), so only a chain that continued between the look-up and the lock
// needs another hop.
const maxSignalHops = 100

// sendSignal stores a checked signal for runID in tx and enqueues the
// run's delivery when the signal wakes it.
func (e *Engine) sendSignal(ctx context.Context, tx pgx.Tx, runID uuid.UUID, name string, payload []byte, opts *SignalOpts) (store.SignalSent, error) {
	sent, err := store.SendSignal(ctx, e.on(tx), store.SignalParams{RunID: runID, Name: name, Payload: payload, Key: opts.key(),
		Limits: store.SignalLimits{Count: e.cfg.MaxSignalsPerRun, Bytes: e.cfg.MaxSignalBytesPerRun}})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return sent, fmt.Errorf("%w: run %s", ErrNotFound, runID)
	case errors.Is(err, store.ErrLimit):
		return sent, fmt.Errorf("%w: %s (Config.MaxSignalsPerRun, MaxSignalBytesPerRun)", ErrLimitExceeded,
			strings.TrimPrefix(err.Error(), store.ErrLimit.Error()+": "))
	case errors.Is(err, store.ErrKeyReused):
		return sent, fmt.Errorf("%w: %s", ErrSignalKeyConflict, strings.TrimPrefix(err.Error(), store.ErrKeyReused.Error()+": "))
	case errors.Is(err, store.ErrBadPayload):
		return sent, fmt.Errorf("%w: signal payload: %v", ErrInvalidInput, err)
	case err != nil:
		return sent, fmt.Errorf("pgdurable: signalling run %s: %w", runID, err)
	case sent.Duplicate:
		return sent, nil // the first send was accepted, whatever the run did since
	case RunStatus(sent.Status).closed():
		return sent, fmt.Errorf("%w: run %s is %s", ErrRunClosed, runID, sent.Status)
	case sent.Woken:
		return sent, e.queue.Enqueue(ctx, tx, runID, time.Time{})
	}
	return sent, nil
}

// AwaitSignal waits for the next signal named name sent to this run and
// returns its payload decoded as T. Signals sent earlier are buffered:
// each AwaitSignal for a name takes the oldest one not yet taken, so two
// waits receive two signals in the order they were sent, each exactly once
// (taking it and recording this step commit together).
//
// With none buffered the run is suspended: the delivery ends and the run
// waits with no goroutine, connection, worker slot or River job until a
// signal wakes it (at once) or timeout passes (timeout <= 0: no timeout),
// after which AwaitSignal returns ErrTimeout. Both outcomes are recorded
// as a step of kind "signal" named name, so replays return them unchanged.
// While parallel steps of the run (Go) are running, the delivery waits in
// place instead (its start, and so its timeout, recorded first), looking
// for the signal every 250 ms, and suspends once none is left: a started
// parallel step runs once, to its end.
//
// Other errors: ErrCancelled (the run was cancelled while waiting), a
// decode error wrapping ErrInvalidInput when the payload does not fit T
// (the signal stays consumed; its raw payload is in the step record), or
// the error that ended the delivery, which the workflow should return.
func AwaitSignal[T any](ctx *Context, name string, timeout time.Duration) (T, error) {
	var out T
	_, raw, err := ctx.d.awaitSignal(name, []string{name}, timeout)
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, fmt.Errorf("%w: signal %q payload does not decode as %T: %v", ErrInvalidInput, name, out, err)
	}
	return out, nil
}

// MaxSelectSignals bounds the signal names one SelectSignal waits for.
const MaxSelectSignals = 20

// SelectSignal waits for the first of several signals, or for timeout: it
// returns the name of the signal it received and its payload (one JSON
// value, as PostgreSQL's jsonb stores it: its white space and key order
// may differ from what was sent), the oldest buffered one of those names
// when several are. Taking
// it and recording this step commit together, as AwaitSignal's, and the
// outcome is recorded as a step of kind "signal" named name, so a replay
// takes the same branch whatever signals arrived since. With none of them
// buffered the run is suspended, holding nothing, until one is sent (a
// signal of any of the names wakes it) or timeout passes (<= 0: no
// timeout), when SelectSignal returns "" and an error wrapping ErrTimeout.
// AwaitSignal is SelectSignal for one name, its payload decoded.
//
// signals holds 1 to MaxSelectSignals distinct signal names
// (ErrInvalidArgument otherwise, not recorded). Other errors as
// AwaitSignal's.
func SelectSignal(ctx *Context, name string, signals []string, timeout time.Duration) (signal string, payload json.RawMessage, err error) {
	if err := checkName("select name", name, 200); err != nil {
		return "", nil, fmt.Errorf("pgdurable: %w", err)
	}
	if len(signals) == 0 || len(signals) > MaxSelectSignals {
		return "", nil, fmt.Errorf("%w: SelectSignal %q waits for %d signal names; it takes 1 to %d", ErrInvalidArgument, name, len(signals), MaxSelectSignals)
	}
	for i, s := range signals {
		if err := checkName("signal name", s, 200); err != nil {
			return "", nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
		if slices.Contains(signals[:i], s) {
			return "", nil, fmt.Errorf("%w: SelectSignal %q names signal %q twice", ErrInvalidArgument, name, s)
		}
	}
	signal, payload, err = ctx.d.awaitSignal(name, signals, timeout)
	if err == nil && signal == "" {
		signal = signals[0] // a wait for one name records none
	}
	return signal, payload, err
}

// awaitSignal is AwaitSignal and SelectSignal: a step named name waiting
// for the first signal of names. The signal's name is recorded (and
// returned) only when there are several. While parallel steps of the run
// are running, the delivery waits in place (looking for the signal every
// childPoll) rather than suspending, so they run once, to their end; the
// wait's start is written first, so a redelivery keeps its deadline.
func (d *delivery) awaitSignal(name string, names []string, timeout time.Duration) (string, []byte, error) {
	seq, err := d.enterStep("signal", name, false)
	if err != nil {
		return "", nil, err
	}
	defer d.inStep.Store(false)
	startedAt := d.e.now()
	var deadline *time.Time
	written := false
	rec, ok := d.replay(seq, name, KindSignal)
	if !ok {
		return "", nil, d.endErr
	}
	if rec != nil {
		if rec.Status == store.StepCompleted {
			d.e.obs.StepReplayed(StepReplayedEvent{Workflow: d.wf.name, Kind: KindSignal})
			return decodeSignalOutcome(name, rec.Output)
		}
		written, deadline, startedAt = true, rec.NextAttemptAt, rec.StartedAt
	} else if timeout > 0 {
		t := startedAt.Add(timeout)
		deadline = &t
	}
	// stopped ends the wait for the run's cancellation: a wait that was
	// recorded (the run suspended in it) is recorded as cancelled, written
	// with the compensation's first write, so a finished run shows no wait
	// still started; one that was not gives its position back to the undos.
	stopped := func() (string, []byte, error) {
		if !written {
			d.pos.giveBack()
			return "", nil, ErrCancelled
		}
		now := d.e.now()
		d.buf.stopped = &store.StepRecord{Seq: seq, Name: name, Kind: string(KindSignal), Status: store.StepCancelled,
			StartedAt: startedAt, CompletedAt: &now}
		return "", nil, ErrCancelled
	}
	for {
		if d.cancelRequested.Load() {
			return stopped()
		}
		if d.parkPanickedBranch() || !d.mayStartStep() {
			return "", nil, d.endErr
		}
		inPlace := d.branchesRunning()
		outcome, cancel, err := d.takeSignal(seq, name, names, startedAt, deadline, inPlace, written)
		if err != nil {
			d.end(err)
			return "", nil, d.endErr
		}
		if cancel && outcome == nil {
			// Woken by the cancellation, the transaction wrote nothing: the
			// previous step's record stays buffered for the compensation's
			// first write.
			d.noteCancel(true)
			return stopped()
		}
		d.buf.take() // written by the transaction
		if outcome == nil && inPlace {
			written = true
			d.pauseForBranches(deadline, true)
			if d.ctx.Err() != nil {
				d.interrupted()
				return "", nil, d.endErr
			}
			continue
		}
		if outcome == nil {
			d.log.Debug("waiting for a signal", "signal", name, "seq", seq)
			d.end(nil)
			return "", nil, d.endErr
		}
		d.lastRecorded = seq
		d.noteCancel(cancel)
		d.e.obs.StepAttempt(StepAttemptEvent{Workflow: d.wf.name, Step: name, Kind: KindSignal, Attempt: 1, Outcome: "completed", Duration: d.e.now().Sub(startedAt)})
		return outcome.result(name)
	}
}

// takeSignal is one look of awaitSignal at position seq, in one
// transaction with the buffered record: it takes the oldest signal of
// names and records the outcome, or records the timeout once deadline
// passed; with neither, it suspends the run waiting for them, or with
// inPlace writes the wait's start (unless written) and leaves the run to
// its delivery. cancel reports that the run's cancellation was found
// (then nothing is written when no signal was taken).
func (d *delivery) takeSignal(seq int, name string, names []string, startedAt time.Time, deadline *time.Time,
	inPlace, written bool) (outcome *signalOutcome, cancel bool, err error) {
	err = d.doOnce(func(ctx context.Context) error {
		return d.e.txn(ctx, func(tx pgx.Tx) error {
			outcome, cancel = nil, false
			taken, err := store.TakeSignal(ctx, d.e.on(tx), d.fence(), names, seq)
			if err != nil {
				return err
			}
			got, payload, found, cancelled := taken.Name, taken.Payload, taken.Found, taken.CancelRequested
			cancel = cancelled
			now := d.e.now()
			switch {
			case found:
				outcome = &signalOutcome{Payload: payload}
				if len(names) > 1 {
					outcome.Signal = got
				}
			case deadline != nil && !now.Before(*deadline):
				outcome = &signalOutcome{TimedOut: true}
			case cancelled:
				return nil // woken by the cancellation: no wait recorded
			}
			var recs []*store.StepRecord // the buffer is emptied once this commits
			if p := d.buf.pending; p != nil {
				recs = append(recs, p)
			}
			if outcome == nil {
				rec := &store.StepRecord{Seq: seq, Name: name, Kind: string(KindSignal), Status: store.StepStarted,
					StartedAt: startedAt, NextAttemptAt: deadline}
				if inPlace {
					if !written {
						recs = append(recs, rec)
					}
					if len(recs) == 0 {
						return nil
					}
					_, err := store.WriteSteps(ctx, d.e.on(tx), d.fence(), "", recs...)
					return err
				}
				if len(recs) > 0 {
					if _, err := store.WriteSteps(ctx, d.e.on(tx), d.fence(), "", recs...); err != nil {
						return err
					}
				}
				return store.SuspendAwaiting(ctx, d.e.on(tx), d.fence(), store.AwaitParams{Pending: rec, Status: store.RunWaiting, Awaits: names, WakeAt: deadline})
			}
			out, err := json.Marshal(outcome)
			if err != nil {
				return err
			}
			recs = append(recs, &store.StepRecord{Seq: seq, Name: name, Kind: string(KindSignal), Status: store.StepCompleted,
				Attempts: 1, Output: out, NextAttemptAt: deadline, StartedAt: startedAt, CompletedAt: &now})
			d.lastRecordedAt = now // for an undo registered with this step
			_, err = store.WriteSteps(ctx, d.e.on(tx), d.fence(), "", recs...)
			return err
		})
	})
	return outcome, cancel, err
}

// signalTimedOut reads a completed AwaitSignal record: true when it
// records a timeout.
func signalTimedOut(raw []byte) bool {
	var o signalOutcome
	return json.Unmarshal(raw, &o) == nil && o.TimedOut
}

func decodeSignalOutcome(name string, raw []byte) (string, []byte, error) {
	var o signalOutcome
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", nil, fmt.Errorf("pgdurable: decoding recorded signal %q: %w", name, err)
	}
	return o.result(name)
}

// result is what AwaitSignal and SelectSignal return for this outcome,
// live or replayed: the signal received (SelectSignal's) and its payload.
func (o *signalOutcome) result(name string) (string, []byte, error) {
	if o.TimedOut {
		return "", nil, fmt.Errorf("%w waiting for signal %q", ErrTimeout, name)
	}
	return o.Signal, o.Payload, nil
}

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
	r, err := e.newRun(ctx, workflow, version, p.Input, opts)
	if err != nil {
		return nil, err
	}
	span, traceCtx := e.tr.start(ctx, workflow, r.WorkflowID)
	defer func() { started(span, res, err) }()
	r.TraceContext = traceCtx
	var sent store.SignalSent
	err = e.txn(ctx, func(tx pgx.Tx) error {
		ins, err := store.InsertRun(ctx, e.on(tx), r)
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
