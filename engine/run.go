package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pgdurable/pgdurable/engine/internal/groupcommit"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// StartOpts are per-start options. A nil *StartOpts starts a run with its
// new run ID as its workflow ID (a UUID v7; a v8 that carries the run's
// route when the runs are spread over routes, migrate up --routes).
type StartOpts struct {
	// WorkflowID is the start's idempotency key (1 to 400 bytes, not . or
	// .., and not a UUID in any spelling: run IDs are UUIDs, and a run ID
	// names a run wherever a workflow ID does, so "order-<uuid>" rather
	// than "<uuid>"; nor "<uuid>:<digits>", a child's default; ErrInvalidInput
	// otherwise), unique per workflow name:
	// starting the same workflow with the
	// same ID and the same input returns the existing run; with a different
	// input, ErrWorkflowIDConflict. With routes it chooses the run's
	// route, so every run of one workflow ID is in one route.
	// Default: the new run's ID.
	WorkflowID string
	// StartAt delays the run: it is inserted waiting (its WakeAt this
	// time, by Config.Clock) and no worker picks it up before then; while
	// it waits it holds no worker, goroutine or River job, and it can be
	// cancelled (Engine.Cancel) or started at once (Engine.StartNow). A
	// zero or past time starts it now.
	//
	// A signal sent to it while it waits (Signal, SignalWithStart) does
	// not start it early: the signal is buffered, and the run's
	// AwaitSignal receives it once the run has started, at its time or at
	// StartNow. (Temporal's StartDelay differs: there a signal ends the
	// delay and the workflow starts at once.)
	StartAt time.Time
	// Delay is StartAt as a wait from now, with StartAt's behaviour (a
	// signal does not end it early). Set at most one of the two
	// (ErrInvalidArgument otherwise, and for a negative Delay).
	Delay time.Duration
	// RunTimeout bounds the run (0: no bound; negative: ErrInvalidArgument).
	// Its clock starts when a worker first picks the run up (after any
	// delay); at the deadline the run's cancellation is requested, as
	// Engine.Cancel would: its forward steps stop, its compensations run,
	// and it ends cancelled, its error holding ErrTimeout and ErrCancelled.
	// A sleeping or waiting run is woken for it. The deadline is kept
	// across deliveries and set again when a dead run is replayed.
	RunTimeout time.Duration
	// Tags label the run for people and for filters (ListRunsParams.Tags,
	// the API's and the CLI's tag filter, the web UI): at most MaxTags,
	// each key 1 to 64 of A-Z a-z 0-9 _ . - and each value 1 to 256 bytes
	// of printable UTF-8 (ErrInvalidArgument otherwise). They are stored
	// with the run and indexed. A start that finds its workflow ID's run
	// (the same input) keeps that run's tags; a run ContinueAsNew starts
	// takes the tags of the run it continues; child runs start untagged.
	Tags map[string]string
	// Queue puts the run in this flow-controlled queue instead of its
	// workflow's (WorkflowOpts.Queue); see Engine.RegisterQueue.
	Queue string
	// QueueKey is the run's key in its queue (at most MaxQueueKeyBytes),
	// instead of the one WorkflowOpts.QueueKey computes.
	QueueKey string
	// Priority orders the queue's ready runs: higher first (MinPriority
	// to MaxPriority, default 0); equal priorities go by fair share
	// between keys, and in start order within a key. See
	// QueueOpts.PriorityAging for how long a low priority can wait.
	Priority int
	// KeyWeight is the share of the queue the run's key gets against
	// other keys when both have runs waiting (MinKeyWeight to MaxKeyWeight;
	// default 1): a key of weight 2 starts two runs for each one of a key
	// of weight 1. Keys are served by start-time fair queuing: a key that
	// queued 10,000 runs does not delay a key that queues one by more than
	// about one run of each other key waiting.
	KeyWeight float64
	// DeduplicationID refuses the start (ErrDuplicate) while a run of the
	// queue that holds the same ID is open (pending, running, waiting or
	// compensating); once it ends the ID is free again. Unlike WorkflowID,
	// which names one run forever, it guards only against running twice
	// at once. At most MaxDeduplicationIDBytes. Needs a queue. On an
	// installation whose runs are spread over routes (migrate up
	// --routes) it chooses the run's route, so that the runs sharing it
	// are in one route, and a start that also gives a WorkflowID, which
	// would choose the route too, fails with ErrInvalidArgument.
	DeduplicationID string
	// Debounce collapses the starts of the workflow with one key that come
	// within a window into one run, which starts with the latest start's
	// input (see Debounce). Not with WorkflowID, StartAt, Delay or
	// DeduplicationID.
	Debounce *Debounce
	// ReturnDuplicate makes a start refused for its DeduplicationID
	// return the open run that holds it (StartResult.Existing and
	// Deduplicated) instead of ErrDuplicate.
	ReturnDuplicate bool

	schedule string // set by the scheduler: the schedule whose fire starts the run
	// engineMade: the engine made WorkflowID, no caller chose it (a child's
	// default, "<parent run ID>:<position>"; a continued chain's, its first
	// run's ID when started without one): it is not held to the rule for
	// chosen IDs.
	engineMade bool
}

// startAt is when a run started now with opts is due: nil for now.
func (o *StartOpts) startAt(now time.Time) (*time.Time, error) {
	switch {
	case o == nil:
		return nil, nil
	case o.RunTimeout < 0:
		return nil, fmt.Errorf("%w: StartOpts.RunTimeout %s is negative", ErrInvalidArgument, o.RunTimeout)
	case o.Delay < 0:
		return nil, fmt.Errorf("%w: StartOpts.Delay %s is negative", ErrInvalidArgument, o.Delay)
	case o.Delay > 0 && !o.StartAt.IsZero():
		return nil, fmt.Errorf("%w: StartOpts has both StartAt and Delay; set one", ErrInvalidArgument)
	}
	at := o.StartAt
	if o.Delay > 0 {
		at = now.Add(o.Delay)
	}
	if !at.After(now) {
		return nil, nil
	}
	return &at, nil
}

// StartResult identifies the run a start created or found.
type StartResult struct {
	RunID      uuid.UUID `json:"run_id"`
	WorkflowID string    `json:"workflow_id"`
	// Existing is true when a run with this workflow ID and input already
	// existed; no new run was created.
	Existing bool `json:"existing"`
	// Deduplicated is true when the run is the open run that holds the
	// start's StartOpts.DeduplicationID (ReturnDuplicate).
	Deduplicated bool `json:"deduplicated,omitempty"`
	// Debounced is true when the start joined a run waiting out its
	// debounce window (StartOpts.Debounce): that run now has this start's
	// input.
	Debounced bool `json:"debounced,omitempty"`
	// Status is the run's status when the start returned.
	Status RunStatus `json:"status"`
}

// StartJSON starts a run of the registered workflow name with a JSON input,
// which must decode as the workflow's input type (ErrInvalidInput
// otherwise; ErrUnknownWorkflow for an unregistered name). It is what
// services use; Go callers use Workflow.Start. An input that is not valid
// JSON is refused saying where it breaks ("at byte offset N", N being
// encoding/json's *json.SyntaxError Offset, which errors.As finds in the
// error).
//
// The run and its first delivery are inserted in one transaction. Twenty
// concurrent starts with one workflow ID give one run.
func (e *Engine) StartJSON(ctx context.Context, name string, input json.RawMessage, opts *StartOpts) (*StartResult, error) {
	return e.startRegistered(ctx, nil, name, input, opts)
}

// StartJSONTx is StartJSON inside the caller's transaction.
func (e *Engine) StartJSONTx(ctx context.Context, tx pgx.Tx, name string, input json.RawMessage, opts *StartOpts) (*StartResult, error) {
	return e.startRegistered(ctx, tx, name, input, opts)
}

func (e *Engine) startRegistered(ctx context.Context, tx pgx.Tx, name string, input json.RawMessage, opts *StartOpts) (*StartResult, error) {
	r, ok := e.workflow(name)
	if !ok {
		return nil, fmt.Errorf("%w: %q is not registered in this process (registered: %s)", ErrUnknownWorkflow, name, e.registeredNames())
	}
	input, err := e.checkInput(r, name, input)
	if err != nil {
		return nil, err
	}
	return e.startJSON(ctx, tx, name, r.version, input, opts)
}

// checkInput checks a JSON input for the registered workflow r named name
// (empty means null): its size, its encoding, that it decodes as r's input
// type, and that PostgreSQL can store it.
func (e *Engine) checkInput(r registered, name string, input json.RawMessage) (json.RawMessage, error) {
	if len(input) == 0 {
		input = json.RawMessage("null")
	}
	if len(input) > e.cfg.MaxPayloadBytes {
		return nil, e.tooLarge(name, len(input))
	}
	if !utf8.Valid(input) {
		return nil, fmt.Errorf("%w: input of workflow %q is not valid UTF-8", ErrInvalidInput, name)
	}
	if err := r.decode(input); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) { // kept for errors.As: where the JSON breaks
			return nil, fmt.Errorf("%w: input of workflow %q: %w", ErrInvalidInput, name, err)
		}
		return nil, fmt.Errorf("%w: input of workflow %q: %v", ErrInvalidInput, name, err)
	}
	if err := checkStorable(input); err != nil {
		return nil, fmt.Errorf("%w: input of workflow %q: %v", ErrInvalidInput, name, err)
	}
	if err := checkJSONShape(input, true); err != nil {
		return nil, fmt.Errorf("%w: input of workflow %q: %v", ErrInvalidInput, name, err)
	}
	return input, nil
}

// startJSON is the one start path. With tx nil the run is inserted with
// the concurrent starts of this process, in one statement (see
// insertRuns); with tx, in the caller's transaction.
func (e *Engine) startJSON(ctx context.Context, tx pgx.Tx, name string, version int, input []byte, opts *StartOpts) (res *StartResult, err error) {
	r, err := e.newRun(ctx, name, version, input, opts)
	if err != nil {
		return nil, err
	}
	workflowID := r.WorkflowID
	span, traceCtx := e.tr.start(ctx, name, workflowID)
	defer func() { started(span, res, err) }()
	r.TraceContext = traceCtx
	wf, path := e.planStart(tx, name, version, r.StartAt != nil, r.FlowQueue != "")
	e.route(&r, path)
	sent := time.Now()
	var ins *store.InsertedRun
	if tx != nil {
		ins, err = e.insertRunTx(ctx, tx, r)
	} else {
		o := e.starts.Do(r)
		ins, err = o.Res, o.Err
	}
	e.afterStart(wf, path, r, err == nil && !ins.Existing, sent)
	switch {
	case errors.Is(err, store.ErrConflict):
		return nil, fmt.Errorf("%w: workflow %q, ID %q (run %s)", ErrWorkflowIDConflict, name, workflowID, ins.RunID)
	case errors.Is(err, store.ErrBadPayload):
		return nil, fmt.Errorf("%w: %v", ErrInvalidInput, err)
	case err != nil:
		return nil, fmt.Errorf("pgdurable: starting workflow %q: %w", name, err)
	case ins.Deduplicated && !opts.ReturnDuplicate:
		return nil, fmt.Errorf("%w: queue %q, deduplication ID %q: run %s is %s", ErrDuplicate, r.FlowQueue, r.DedupID, ins.RunID, ins.Status)
	}
	if ins.WorkflowID != "" {
		workflowID = ins.WorkflowID // a debounced or deduplicated start found this run
	}
	res = &StartResult{RunID: ins.RunID, WorkflowID: workflowID, Existing: ins.Existing, Deduplicated: ins.Deduplicated,
		Debounced: ins.Debounced, Status: RunStatus(ins.Status)}
	e.obs.RunStarted(RunStartedEvent{Workflow: name, Existing: res.Existing})
	if !res.Existing {
		e.log.DebugContext(ctx, "run started", "run_id", res.RunID, "workflow", name, "workflow_id", workflowID)
	}
	return res, nil
}

// StartNow starts a delayed run (StartOpts.StartAt or Delay; FindRun turns
// a workflow ID into its run ID) at once
// instead of at its start time: it becomes pending and a worker picks it up
// as any new run. A run already pending (started now by an earlier call,
// or never delayed) is left as it is.
//
// Errors: ErrNotFound (no such run), ErrRunClosed (it finished: cancelled
// while waiting, say), ErrInvalidArgument (it is not a delayed run waiting
// to start: it has started).
func (e *Engine) StartNow(ctx context.Context, runID uuid.UUID) error {
	return e.txn(ctx, func(tx pgx.Tx) error {
		res, err := store.StartNow(ctx, e.on(tx), runID)
		status, woken := res.Status, res.Woken
		switch {
		case errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("%w: run %s", ErrNotFound, runID)
		case err != nil:
			return fmt.Errorf("pgdurable: starting run %s now: %w", runID, err)
		case woken:
			return e.queue.Enqueue(ctx, tx, runID, time.Time{})
		case RunStatus(status).closed():
			return fmt.Errorf("%w: run %s is %s", ErrRunClosed, runID, status)
		case RunStatus(status) == StatusPending:
			return nil // started now by an earlier call, not picked up yet
		}
		return fmt.Errorf("%w: run %s is %s and has started; StartNow starts a delayed run", ErrInvalidArgument, runID, status)
	})
}

func runTimeoutOf(opts *StartOpts) time.Duration {
	if opts == nil {
		return 0
	}
	return opts.RunTimeout
}

func scheduleOf(opts *StartOpts) *string {
	if opts == nil || opts.schedule == "" {
		return nil
	}
	return &opts.schedule
}

func (e *Engine) tooLarge(name string, n int) error {
	return fmt.Errorf("%w: input of workflow %q is %d bytes, over the %d-byte limit",
		ErrInvalidInput, name, n, e.cfg.MaxPayloadBytes)
}

// inTx runs fn in tx when it is non-nil (the caller commits; on Citus the
// commit is then made a two-phase one, whatever the caller writes after,
// see store.TwoPhaseCaller), otherwise in a new transaction that it
// commits.
//
// A transaction of its own that PostgreSQL rolled back for a deadlock or a
// serialization failure (two operators acting on one run at once, say) is
// run again, up to txRetries more times, rather than failing: fn must
// leave nothing behind but its transaction's writes (it runs again from
// the start).
func (e *Engine) inTx(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) error) error {
	if tx != nil {
		if err := fn(tx); err != nil {
			return err
		}
		return store.TwoPhaseCaller(ctx, e.on(tx))
	}
	for try := 0; ; try++ {
		err := e.txn(ctx, fn)
		if transient, ambiguous := store.IsTransient(err); !transient || ambiguous || try == txRetries {
			return err
		}
		time.Sleep(txRetryBackoff << try)
	}
}

// txRetries and txRetryBackoff: how often inTx runs a transaction again
// that PostgreSQL rolled back for a deadlock or serialization failure,
// and the wait before the first retry (doubling).
const (
	txRetries      = 3
	txRetryBackoff = 20 * time.Millisecond
)

// insertRunTx inserts r in the caller's tx, with its River ticket when it
// is new.
func (e *Engine) insertRunTx(ctx context.Context, tx pgx.Tx, r store.NewRun) (*store.InsertedRun, error) {
	ins, err := store.InsertRun(ctx, e.on(tx), r)
	if err != nil || ins.Existing {
		return ins, err
	}
	if needsTicket(r) {
		if err := e.queue.Enqueue(ctx, tx, ins.RunID, time.Time{}); err != nil {
			return ins, err
		}
	}
	// The caller commits: on Citus in two phases, whatever the caller
	// writes after this call, and for a run without a ticket (delayed,
	// flow-controlled) too: the run is on a worker node, the caller's rows
	// may be on the coordinator (see store.TwoPhaseCaller).
	return ins, store.TwoPhaseCaller(ctx, e.on(tx))
}

// newStartBatcher coalesces the starts of concurrent callers of e into
// multi-row inserts (see groupcommit.Batcher).
func newStartBatcher(e *Engine) *groupcommit.Batcher[store.NewRun, groupcommit.Outcome[*store.InsertedRun]] {
	return &groupcommit.Batcher[store.NewRun, groupcommit.Outcome[*store.InsertedRun]]{MaxActive: groupcommit.Active, MaxBatch: groupcommit.Batch,
		Size: func(r store.NewRun) int { return len(r.Input) }, Exec: e.insertRuns,
		Failed: func(p any) groupcommit.Outcome[*store.InsertedRun] {
			return groupcommit.Outcome[*store.InsertedRun]{Err: groupcommit.BatchPanic(p)}
		}}
}

// insertRuns inserts a batch of starts. A batch that certainly rolled back
// for a transient reason is tried again (writeRetries times); a failure
// that can recur (an input PostgreSQL refuses) is found by inserting each
// on its own, so it fails only its own start; a dropped connection, which
// may have committed, fails them all (a caller's retry with the same
// workflow ID finds its run).
func (e *Engine) insertRuns(runs []store.NewRun) []groupcommit.Outcome[*store.InsertedRun] {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	var out []groupcommit.Outcome[*store.InsertedRun]
	var err error
	for try := 0; ; try++ {
		if out, err = e.insertRunBatch(ctx, runs); err == nil {
			return out
		}
		// A batch that certainly rolled back (a serialization failure, a
		// deadlock with another process's starts) is tried again as it is.
		if transient, ambiguous := store.IsTransient(err); !transient || ambiguous || try == writeRetries {
			break
		}
		time.Sleep(writeRetryBackoff << try)
	}
	out = make([]groupcommit.Outcome[*store.InsertedRun], len(runs))
	if transient, _ := store.IsTransient(err); transient || len(runs) == 1 {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	for i, r := range runs {
		one, err := e.insertRunBatch(ctx, []store.NewRun{r})
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i] = one[0]
	}
	return out
}

// needsTicket: r is new work for River now (not claimed or held by this
// process, not delayed: the sweep enqueues a delayed run when it is due;
// not queued: its queue's admission claims it).
func needsTicket(r store.NewRun) bool {
	return r.Claim == nil && r.Hold == 0 && r.StartAt == nil && r.FlowQueue == ""
}

// insertRunBatch inserts runs in one statement, and, for the new ones that
// no process executes at once, their River tickets in the same transaction.
// Without tickets to insert, the statement is its own transaction: one
// round trip.
func (e *Engine) insertRunBatch(ctx context.Context, runs []store.NewRun) ([]groupcommit.Outcome[*store.InsertedRun], error) {
	var res []store.InsertedRunResult
	var err error
	if slices.ContainsFunc(runs, needsTicket) {
		err = e.txn(ctx, func(tx pgx.Tx) error {
			if res, err = store.InsertRuns(ctx, e.on(tx), runs); err != nil {
				return err
			}
			var tickets []uuid.UUID
			for i, r := range res {
				if r.Err == nil && !r.Run.Existing && needsTicket(runs[i]) {
					tickets = append(tickets, r.Run.RunID)
				}
			}
			return e.queue.EnqueueMany(ctx, tx, tickets)
		})
	} else {
		res, err = store.InsertRuns(ctx, e.db, runs)
	}
	if err != nil {
		return nil, err
	}
	out := make([]groupcommit.Outcome[*store.InsertedRun], len(runs))
	for i, r := range res {
		out[i] = groupcommit.Outcome[*store.InsertedRun]{Res: r.Run, Err: r.Err}
	}
	return out, nil
}

// Run is a run as GetRun and ListRuns report it. Its JSON is the run's one
// shape, in the HTTP API and the CLI's --json alike; each step adds its
// duration in milliseconds once it completed ("duration_ms").
type Run struct {
	readyAt         *time.Time      // ready for its queue's admission since (see noteQueued)
	RunID           uuid.UUID       `json:"run_id"`
	WorkflowName    string          `json:"workflow"`
	WorkflowVersion int             `json:"workflow_version"`
	WorkflowID      string          `json:"workflow_id"`
	Status          RunStatus       `json:"status"`
	Input           json.RawMessage `json:"input,omitempty"`
	Output          json.RawMessage `json:"output,omitempty"` // set when completed
	Error           *ErrorInfo      `json:"error,omitempty"`  // set when failed, compensated, cancelled, terminated or dead
	Deliveries      int             `json:"deliveries"`       // how many times a worker picked it up
	// LeaseToken is the fencing token of the delivery that holds (or last
	// held) the run's lease, and LeaseExpiresAt when that lease ends
	// unless its worker extends it: past it, another worker may take the
	// run over. A run that no delivery holds may still show its last
	// delivery's.
	LeaseToken     *uuid.UUID `json:"lease_token,omitempty"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	// StalledDeliveries is how many deliveries since the run's last
	// progress (a recorded step), a running one included: on a run that is
	// not running, that many deliveries in a row died (see
	// Config.MaxDeliveries), and a waiting run with no AwaitSignal is held
	// in crash backoff until WakeAt.
	StalledDeliveries int `json:"stalled_deliveries"`
	// WaitingFor, on a pending (or compensating) run that processes handed
	// back because they do not register its workflow version, says what it
	// waits for ("a process that registers checkout v1"), and WaitingSince
	// since when (the first hand-back). Both are cleared when a process that
	// registers the version picks the run up. GetRun also sets WaitingFor,
	// without WaitingSince, on such a run that no process has handed back
	// yet when no live engine process on its queue registers its version
	// (none is running, say). Such a run is never parked
	// or retried for want of a process; Config.VersionWaitAlert says when
	// it is overdue.
	//
	// A ready run of a flow-controlled queue says what holds it there:
	// "queue payments is paused (card processor down, by alice)", "a process that serves queue payments",
	// "a slot of queue payments (5 of 5 running)", "a slot of key cus_1 in
	// queue payments (1 of 1 running)", "queue payments's rate limit (next
	// start at ...)", or "its turn in queue payments (12 runs ahead)", and
	// WaitingSince since when it has been ready.
	WaitingFor   string     `json:"waiting_for,omitempty"`
	WaitingSince *time.Time `json:"waiting_since,omitempty"`
	// Queue is the run's flow-controlled queue ("" for none), QueueKey its
	// key there and Priority its priority (StartOpts).
	Queue       string     `json:"queue,omitempty"`
	QueueKey    string     `json:"queue_key,omitempty"`
	Priority    int        `json:"priority,omitempty"`
	WakeAt      *time.Time `json:"wake_at,omitempty"`      // when a waiting run is next due
	AwaitSignal string     `json:"await_signal,omitempty"` // the signal a waiting run waits for (a SelectSignal's: its names, comma-separated)
	// AwaitSignals lists the names a SelectSignal waits for (nil for one).
	AwaitSignals []string   `json:"await_signals,omitempty"`
	ScheduleName string     `json:"schedule_name,omitempty"` // the schedule whose fire started it
	CreatedAt    time.Time  `json:"created_at"`
	StartedAt    *time.Time `json:"started_at,omitempty"`
	CompletedAt  *time.Time `json:"completed_at,omitempty"`
	// CancelRequestedAt is when Cancel was first called for the run; a run
	// with it set stops its forward steps, compensates and ends cancelled.
	CancelRequestedAt *time.Time `json:"cancel_requested_at,omitempty"`
	// RunTimeoutMS is the run's timeout in milliseconds (StartOpts.RunTimeout),
	// 0 for none; DeadlineAt is when it ends, set from its first pick-up
	// until it ends.
	RunTimeoutMS int64      `json:"run_timeout_ms,omitempty"`
	DeadlineAt   *time.Time `json:"deadline_at,omitempty"`
	// ParentRunID is the parent run of a child run (StartChild), ParentSeq
	// the parent's step that started it, and ParentClosePolicy what the
	// parent's close does to it.
	ParentRunID       *uuid.UUID        `json:"parent_run_id,omitempty"`
	ParentSeq         *int              `json:"parent_seq,omitempty"`
	ParentClosePolicy ParentClosePolicy `json:"parent_close_policy,omitempty"`
	// ContinuedRunID, on a run that ended with ContinueAsNew (status
	// continued), is the run that took over its workflow ID.
	ContinuedRunID *uuid.UUID `json:"continued_run_id,omitempty"`
	// FirstRunID, on a run a ContinueAsNew started, is the first run of
	// its chain.
	FirstRunID *uuid.UUID `json:"first_run_id,omitempty"`
	// AwaitChildren lists the positions of the children a waiting run
	// waits for (ChildRun.Get, or its close waiting for them).
	AwaitChildren []int `json:"await_children,omitempty"`
	// Tags are the run's labels (StartOpts.Tags); nil for none.
	Tags    map[string]string `json:"tags,omitempty"`
	Steps   []StepInfo        `json:"steps,omitempty"`   // filled by GetRun only
	Signals []SignalInfo      `json:"signals,omitempty"` // filled by GetRun only, in the order sent
	// Children are the run's child runs (StartChild), filled by GetRun
	// only: one per child, the first 1,000 by position. A child that
	// continued as new is listed once, at the latest run of its chain.
	Children []ChildInfo `json:"children,omitempty"`
}

// ChildInfo is a child run of a run, as GetRun lists it. A child that
// continued as new (ContinueAsNew) is shown at the latest run of its
// chain: RunID, Status, CreatedAt and CompletedAt are that run's, and
// FirstRunID names the chain's first run, the one the parent started
// (ChildRun.RunID), whose Run.ContinuedRunID leads through the chain.
type ChildInfo struct {
	Seq               int               `json:"seq"` // the parent's step that started it
	RunID             uuid.UUID         `json:"run_id"`
	WorkflowName      string            `json:"workflow"`
	WorkflowID        string            `json:"workflow_id"`
	Status            RunStatus         `json:"status"`
	ParentClosePolicy ParentClosePolicy `json:"parent_close_policy"`
	CreatedAt         time.Time         `json:"created_at"`
	CompletedAt       *time.Time        `json:"completed_at,omitempty"`
	// FirstRunID is the first run of the child's continue-as-new chain;
	// nil for a child that never continued (RunID is then that run).
	FirstRunID *uuid.UUID `json:"first_run_id,omitempty"`
}

// SignalInfo is a signal sent to a run: ConsumedSeq is the AwaitSignal step
// that received it, nil while it waits in the buffer.
type SignalInfo struct {
	ID          int64           `json:"id"`
	Name        string          `json:"name"`
	Payload     json.RawMessage `json:"payload"`
	SentAt      time.Time       `json:"sent_at"`
	ConsumedSeq *int            `json:"consumed_seq,omitempty"`
	ConsumedAt  *time.Time      `json:"consumed_at,omitempty"`
	// Key is the signal's idempotency key (SignalOpts.Key), "" for none.
	Key string `json:"idempotency_key,omitempty"`
}

// StepInfo is one recorded step of a run.
type StepInfo struct {
	Seq           int             `json:"seq"`
	Name          string          `json:"name"`
	Kind          StepKind        `json:"kind"`
	Status        StepStatus      `json:"status"`
	Attempts      int             `json:"attempts"`
	RequestID     *uuid.UUID      `json:"request_id,omitempty"`
	Output        json.RawMessage `json:"output,omitempty"`
	Error         *ErrorInfo      `json:"error,omitempty"`
	NextAttemptAt *time.Time      `json:"next_attempt_at,omitempty"`
	StartedAt     time.Time       `json:"started_at"`
	CompletedAt   *time.Time      `json:"completed_at,omitempty"`
	// TimedOut: an AwaitSignal step whose timeout passed (it returned
	// ErrTimeout), told apart from one that received a signal.
	TimedOut bool `json:"timed_out,omitempty"`
	// Compensation names the undo registered with a forward step;
	// CompensationOf is the seq of the forward step a compensation undoes.
	Compensation   *string `json:"compensation,omitempty"`
	CompensationOf *int    `json:"compensation_of,omitempty"`
	// InputHash is the hash of the input the step was given
	// (StepOpts.Input), which a replay compares; nil when none was.
	InputHash *int64 `json:"input_hash,omitempty"`
	// Patches are the changes (Patched) the run took right before this
	// step, which a replay reads; nil for none.
	Patches []string `json:"patches,omitempty"`
	// FailedAttempts are the step's failed attempts as they were
	// recorded, oldest first: the latest 20 (older ones are dropped), with
	// a Replayed entry where a dead job's replay started its count again.
	// The attempt that completed the step is not among them (Status,
	// Attempts and CompletedAt tell it); nil for a step that never failed.
	// Steps recorded before the store kept this have none.
	FailedAttempts []AttemptFailure `json:"failed_attempts,omitempty"`
}

// AttemptFailure is one failed attempt of a step (StepInfo.FailedAttempts),
// or a marker where a dead job's replay started the step's attempts again.
type AttemptFailure struct {
	// Attempt is the attempt's number (1 for the first; counted again
	// from 1 after a replay). 0 on a Replayed marker.
	Attempt int `json:"attempt,omitempty"`
	// Status is what the failure made of the step: retrying (another
	// attempt follows), failed (the error went back to the workflow) or
	// parked (the run became dead). "" on a Replayed marker.
	Status StepStatus `json:"status,omitempty"`
	// Class and Message are the attempt's error's class (transient,
	// permanent, timeout, panic, worker_lost for an attempt that died with
	// its worker, ...) and message, cut to 300 characters.
	Class   ErrorClass `json:"class,omitempty"`
	Message string     `json:"message,omitempty"`
	// At is when the failure was recorded: when the attempt ended, or,
	// for a worker_lost attempt, when the next delivery found it lost
	// (about a lease after its worker died). On a Replayed marker, when
	// the replay was made.
	At time.Time `json:"at"`
	// Replayed marks a dead job's replay, not an attempt: the attempts
	// after it count from 1 again.
	Replayed bool `json:"replayed,omitempty"`
}

// splitPatches reads a step's patches column (nil: none).
func splitPatches(p *string) []string {
	if p == nil || *p == "" {
		return nil
	}
	return strings.Split(*p, "\n")
}

// joinPatches is splitPatches' inverse.
func joinPatches(ids []string) *string {
	if len(ids) == 0 {
		return nil
	}
	s := strings.Join(ids, "\n")
	return &s
}

// decodeFailures reads a step's failed_attempts column (nil: none; a value
// that does not decode is left out, never fatal to reading the run).
func decodeFailures(b []byte) []AttemptFailure {
	if len(b) == 0 {
		return nil
	}
	var out []AttemptFailure
	if err := json.Unmarshal(b, &out); err != nil {
		return nil
	}
	return out
}

// MarshalJSON writes the step's fields and, once it completed, its
// duration from StartedAt to CompletedAt in whole milliseconds as
// "duration_ms".
func (s StepInfo) MarshalJSON() ([]byte, error) {
	type fields StepInfo // without this method
	v := struct {
		fields
		DurationMS *int64 `json:"duration_ms,omitempty"`
	}{fields: fields(s)}
	if s.CompletedAt != nil {
		d := s.CompletedAt.Sub(s.StartedAt).Milliseconds()
		v.DurationMS = &d
	}
	return json.Marshal(v)
}

func runFromRow(r *store.RunRow) *Run {
	var names, awaits []string
	var children []int
	if r.AwaitSignal != nil {
		for _, a := range strings.Split(*r.AwaitSignal, store.AwaitSeparator) {
			if seq, ok := store.ChildSeqOf(a); ok {
				children = append(children, seq)
			} else {
				names = append(names, a)
			}
		}
	}
	if len(names) > 1 {
		awaits = names
	}
	var waitingFor string
	var waitingSince *time.Time
	if r.VersionWaitSince != nil && (r.Status == string(StatusPending) || r.Status == string(StatusRunning) || r.Status == string(StatusCompensating)) {
		waitingFor, waitingSince = versionWaitReason(r.WorkflowName, r.WorkflowVersion), r.VersionWaitSince
	}
	return &Run{
		WaitingFor: waitingFor, WaitingSince: waitingSince,
		AwaitSignals: awaits, AwaitChildren: children,
		ParentRunID: r.ParentRunID, ParentSeq: r.ParentSeq, ContinuedRunID: r.ContinuedRunID, FirstRunID: r.FirstRunID, ParentClosePolicy: ParentClosePolicy(deref(r.ParentClosePolicy)),
		RunID: r.RunID, WorkflowName: r.WorkflowName, WorkflowVersion: r.WorkflowVersion,
		WorkflowID: r.WorkflowID, Status: RunStatus(r.Status), Input: r.Input, Output: r.Output,
		Error: decodeErrorInfo(r.Error), Deliveries: r.Deliveries, StalledDeliveries: r.Stalled, WakeAt: r.WakeAt,
		CreatedAt: r.CreatedAt, StartedAt: r.StartedAt, CompletedAt: r.CompletedAt,
		AwaitSignal: strings.Join(names, ", "), ScheduleName: deref(r.ScheduleName), CancelRequestedAt: r.CancelRequestedAt,
		RunTimeoutMS: derefInt(r.RunTimeoutMS), DeadlineAt: r.DeadlineAt,
		LeaseToken: r.OwnerToken, LeaseExpiresAt: r.LeaseExpiresAt, Tags: decodeTags(r.Tags),
		Queue: deref(r.FlowQueue), QueueKey: deref(r.FlowKey), Priority: r.Priority,
		readyAt: r.ReadyAt,
	}
}

// noteUnserved sets run.WaitingFor (without WaitingSince) on a pending
// or compensating run that no process has handed back yet when no live
// engine process on its queue registers its version: before the first
// hand-back (no process at all is running, say), the reason would
// otherwise show nowhere. One read of the process registry, for such
// runs only.
func (e *Engine) noteUnserved(ctx context.Context, run *Run, queue string) error {
	if run.WaitingFor != "" || (run.Status != StatusPending && run.Status != StatusCompensating) || run.WakeAt != nil {
		return nil
	}
	live, err := liveVersionsOf(ctx, e.db, queue, run.WorkflowName)
	if err != nil || live.serves(run.WorkflowVersion) {
		return err
	}
	run.WaitingFor = versionWaitReason(run.WorkflowName, run.WorkflowVersion)
	return nil
}

// versionWaitReason is Run.WaitingFor for a run of workflow name, version v.
func versionWaitReason(name string, v int) string {
	return fmt.Sprintf("a process that registers %s v%d", name, v)
}

// FindRun resolves runOrWorkflowID, a run ID or a workflow ID, to a run
// ID, as Signal does. Errors: ErrNotFound, or ErrInvalidArgument when the
// workflow ID is used by runs of several workflows.
func (e *Engine) FindRun(ctx context.Context, runOrWorkflowID string) (uuid.UUID, error) {
	if checkName("run", runOrWorkflowID, 400) != nil {
		// No run has such an ID (bytes PostgreSQL cannot compare, a
		// control character): not found, rather than a database error.
		return uuid.Nil, fmt.Errorf("%w: no run with run ID or workflow ID %q", ErrNotFound, truncateText(runOrWorkflowID, 64))
	}
	id, err := store.ResolveRun(ctx, e.db, runOrWorkflowID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return uuid.Nil, fmt.Errorf("%w: no run with run ID or workflow ID %q", ErrNotFound, runOrWorkflowID)
	case errors.Is(err, store.ErrAmbiguous):
		return uuid.Nil, fmt.Errorf("%w: workflow ID %q is used by runs of several workflows; use the run ID", ErrInvalidArgument, runOrWorkflowID)
	case err != nil:
		return uuid.Nil, fmt.Errorf("pgdurable: finding run %q: %w", runOrWorkflowID, err)
	}
	return id, nil
}

// GetRun reads a run with its steps; ErrNotFound when there is none.
func (e *Engine) GetRun(ctx context.Context, runID uuid.UUID) (*Run, error) {
	return e.GetRunWith(ctx, runID, nil)
}

// GetRunOpts trims what GetRunWith reads, for a caller that reads a run
// again and again (a follower: engine runs show --follow, a page that
// refreshes) and needs only what may have changed. A nil *GetRunOpts reads
// everything, as GetRun.
type GetRunOpts struct {
	// StepsFrom leaves out the steps at positions below it (0: every
	// step). A step that completed, failed or was cancelled does not
	// change, so a follower asks from its first step that had not.
	StepsFrom int
	// NoSignals leaves Run.Signals out.
	NoSignals bool
	// NoPayloads leaves out the run's input, the steps' outputs (and so
	// StepInfo.TimedOut) and the signals' payloads: up to
	// Config.MaxPayloadBytes each. The run's output and every error stay.
	NoPayloads bool
}

// GetRunWith is GetRun, reading only what opts asks for. Errors as
// GetRun's, and ErrInvalidArgument for a negative opts.StepsFrom.
func (e *Engine) GetRunWith(ctx context.Context, runID uuid.UUID, opts *GetRunOpts) (*Run, error) {
	var parts store.RunParts
	if opts != nil {
		if opts.StepsFrom < 0 || opts.StepsFrom > math.MaxInt32 {
			return nil, fmt.Errorf("%w: GetRunOpts.StepsFrom %d is not a step position (0 to %d)", ErrInvalidArgument, opts.StepsFrom, math.MaxInt32)
		}
		parts = store.RunParts{StepsFrom: opts.StepsFrom, NoSignals: opts.NoSignals, NoPayloads: opts.NoPayloads}
	}
	detail, err := store.GetRunParts(ctx, e.db, runID, parts)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: run %s", ErrNotFound, runID)
	}
	if err != nil {
		return nil, fmt.Errorf("pgdurable: reading run %s: %w", runID, err)
	}
	run := runFromRow(detail.Run)
	if err := e.noteUnserved(ctx, run, detail.Run.Queue); err != nil {
		return nil, fmt.Errorf("pgdurable: reading run %s: %w", runID, err)
	}
	if err := e.noteQueued(ctx, run); err != nil {
		return nil, fmt.Errorf("pgdurable: reading run %s: %w", runID, err)
	}
	for _, s := range detail.Steps {
		run.Steps = append(run.Steps, StepInfo{
			Seq: s.Seq, Name: s.Name, Kind: StepKind(s.Kind), Status: StepStatus(s.Status), Attempts: s.Attempts,
			RequestID: s.RequestID, Output: s.Output, Error: decodeErrorInfo(s.Error),
			NextAttemptAt: s.NextAttemptAt, StartedAt: s.StartedAt, CompletedAt: s.CompletedAt,
			Compensation: s.Compensation, CompensationOf: s.CompensationOf, InputHash: s.InputHash, Patches: splitPatches(s.Patches), FailedAttempts: decodeFailures(s.FailedAttempts),
			TimedOut: s.Kind == string(KindSignal) && s.Status == store.StepCompleted && signalTimedOut(s.Output),
		})
	}
	for _, c := range detail.Children {
		run.Children = append(run.Children, ChildInfo{Seq: c.Seq, RunID: c.RunID, WorkflowName: c.WorkflowName,
			WorkflowID: c.WorkflowID, Status: RunStatus(c.Status), ParentClosePolicy: ParentClosePolicy(c.ClosePolicy),
			CreatedAt: c.CreatedAt, CompletedAt: c.CompletedAt, FirstRunID: c.FirstRunID})
	}
	for _, s := range detail.Signals {
		info := SignalInfo{ID: s.ID, Name: s.Name, Payload: s.Payload, SentAt: s.CreatedAt,
			ConsumedSeq: s.ConsumedSeq, ConsumedAt: s.ConsumedAt}
		if s.Key != nil {
			info.Key = *s.Key
		}
		run.Signals = append(run.Signals, info)
	}
	return run, nil
}

// StatusOpenRuns is not a run status but a filter: as
// ListRunsParams.Status, it keeps the runs in every open status
// (RunStatus.Open: pending, running, waiting, compensating, dead); with
// Workflow and Version, what keeps a version in use.
const StatusOpenRuns = "open"

// ListRunsParams filters ListRuns. Zero fields match everything.
type ListRunsParams struct {
	Workflow string
	// Status keeps the runs in this status, or in any open one
	// (StatusOpenRuns).
	Status RunStatus
	// WorkflowIDPrefix keeps the runs whose workflow ID starts with it,
	// byte for byte (case-sensitive; "" keeps all): at most 400 bytes of
	// valid UTF-8 without NUL, else ErrInvalidArgument. No index serves
	// it: alone, it reads the runs newest first until the page is full,
	// which suits tools and tests (a batch of runs tagged with a common
	// prefix) rather than a hot path.
	WorkflowIDPrefix string
	// CreatedAfter and CreatedBefore keep the runs created in [after,
	// before) (zero: no bound), to the millisecond; the run IDs' order
	// serves them (UUID v7). FinishedAfter and FinishedBefore keep those
	// that finished in that range (a run not finished is left out); no
	// index serves them.
	CreatedAfter, CreatedBefore   time.Time
	FinishedAfter, FinishedBefore time.Time
	// Tags keeps the runs tagged with every one of these key/value pairs
	// (StartOpts.Tags; nil: no filter), through an index of tagged runs.
	// Bounded as StartOpts.Tags is.
	Tags map[string]string
	// TopLevel keeps only the runs no other run started: child runs
	// (StartChild; Run.ParentRunID set) are left out, and a top-level
	// run's children stay reachable from its Run.Children. No index
	// serves it; it filters the runs the other fields select.
	TopLevel bool
	// Patched keeps the runs that took the change of this name (see
	// Patched: a step record names it); Unpatched keeps those that did
	// not, which
	// with a Workflow and an open Status are the runs that may still
	// replay the code before the change. A step name's rules apply (else
	// ErrInvalidArgument). The runs' steps are read per run: pair these
	// with Workflow and Status.
	Patched, Unpatched string
	// Version keeps the runs of this workflow version (Run.WorkflowVersion;
	// 0: any): with Workflow and an open Status, the runs that keep a
	// version's code in use, which must reach 0 before the version is
	// unregistered. Negative is ErrInvalidArgument.
	Version int
	Limit   int    // 1..1000, default 50
	Cursor  string // the nextCursor the previous page's ListRuns returned
}

// ListRuns returns runs newest first, and a cursor for the next page ("" on
// the last page).
func (e *Engine) ListRuns(ctx context.Context, p ListRunsParams) (runs []*Run, nextCursor string, err error) {
	limit, before, err := pageParams(p.Limit, p.Cursor)
	if err != nil {
		return nil, "", err
	}
	if p.Status != "" && p.Status != StatusOpenRuns && !p.Status.valid() {
		return nil, "", fmt.Errorf("%w: unknown run status %q (a run status, or open)", ErrInvalidArgument, p.Status)
	}
	if err := checkFilter("workflow", p.Workflow); err != nil {
		return nil, "", err
	}
	if err := checkPrefix("workflow ID prefix", p.WorkflowIDPrefix, 400); err != nil {
		return nil, "", err
	}
	tags, err := checkTags("the tag filter", p.Tags)
	if err != nil {
		return nil, "", err
	}
	if p.Version < 0 || p.Version > math.MaxInt32 {
		return nil, "", fmt.Errorf("%w: workflow version %d is not a version (1 to %d, or 0 for any)", ErrInvalidArgument, p.Version, math.MaxInt32)
	}
	if p.Patched != "" && p.Patched == p.Unpatched {
		return nil, "", fmt.Errorf("%w: patched and unpatched name the same change %q: no run matches both", ErrInvalidArgument, p.Patched)
	}
	for what, id := range map[string]string{"patched": p.Patched, "unpatched": p.Unpatched} {
		if id == "" {
			continue
		}
		if err := checkName(what+" change ID", id, 200); err != nil {
			return nil, "", fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
	}
	rows, err := store.ListRuns(ctx, e.db, store.RunFilter{Workflow: p.Workflow, Status: string(p.Status), Tags: tags,
		Patched: p.Patched, Unpatched: p.Unpatched, Version: p.Version,
		WorkflowIDPrefix: p.WorkflowIDPrefix, TopLevel: p.TopLevel, Before: before, Limit: limit + 1,
		CreatedAfter: timeOrNil(p.CreatedAfter), CreatedBefore: timeOrNil(p.CreatedBefore),
		FinishedAfter: timeOrNil(p.FinishedAfter), FinishedBefore: timeOrNil(p.FinishedBefore)})
	if err != nil {
		return nil, "", fmt.Errorf("pgdurable: %w", err)
	}
	for i, r := range rows {
		if i == limit {
			nextCursor = runs[limit-1].RunID.String()
			break
		}
		runs = append(runs, runFromRow(r))
	}
	return runs, nextCursor, nil
}

// checkFilter validates a name filter: empty (no filter) or a name that
// could be stored.
func checkFilter(what, v string) error {
	if v == "" {
		return nil
	}
	if err := checkName(what+" filter", v, 400); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return nil
}

// storable reports whether PostgreSQL can store s as text of at most max
// bytes: valid UTF-8 without NUL (text refuses both).
func storable(s string, max int) bool {
	return len(s) <= max && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// checkPrefix validates a prefix filter: a prefix of a stored name may
// end in white space or stop short of a name's end, so only what no
// stored name can hold is refused (over max bytes, invalid UTF-8, NUL).
func checkPrefix(what, v string, max int) error {
	switch {
	case len(v) > max:
		return fmt.Errorf("%w: %s %q is over %d bytes", ErrInvalidArgument, what, truncateText(v, 64), max)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: %s %q is not valid UTF-8", ErrInvalidArgument, what, v)
	case strings.ContainsRune(v, 0):
		return fmt.Errorf("%w: %s %q contains a NUL character", ErrInvalidArgument, what, v)
	}
	return nil
}

// pageParams validates a page size and an opaque cursor (an ID).
func pageParams(limit int, cursor string) (int, *uuid.UUID, error) {
	limit = orDefault(limit, 50)
	if limit < 1 || limit > 1000 {
		return 0, nil, fmt.Errorf("%w: limit %d is outside 1..1000", ErrInvalidArgument, limit)
	}
	if cursor == "" {
		return limit, nil, nil
	}
	id, err := uuid.Parse(cursor)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: invalid cursor %q", ErrInvalidArgument, cursor)
	}
	return limit, &id, nil
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func derefInt(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

// UnsettledSteps returns the run's steps whose latest attempt started and
// has no recorded outcome: the steps, activities and undos (kinds step,
// activity and compensation) whose status is started, in seq order. In a
// run still going they are in progress. In a terminated run they were in
// flight when it was terminated, and nothing will settle them: no attempt
// follows and no undo runs, so each may have taken effect (a card
// charged, its answer lost) with nothing to reverse it. Check each with
// the service it called, by its request ID (RequestID: the same for every
// attempt, and the idempotency key package activities gives its calls,
// Call.IdempotencyKey). A plain step's first attempt is not announced, so
// one in flight leaves no record here at all; a tx step's effect commits
// with its record or not at all.
func (r *Run) UnsettledSteps() []StepInfo {
	var out []StepInfo
	for _, s := range r.Steps {
		if s.Status == StepStarted && (s.Kind == KindStep || s.Kind == KindActivity || s.Kind == KindCompensation) {
			out = append(out, s)
		}
	}
	return out
}

// MaxTags bounds a run's tags (StartOpts.Tags) and a list's tag filter.
const MaxTags = 20

// tagKey is what a tag's key may be: a name for people and for query
// strings, "key=value" and "key:value" splitting at its first = or :.
var tagKey = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// checkTags validates tags (what names them in errors: "StartOpts.Tags")
// and returns them as the JSON object stored (nil for none). Errors wrap
// ErrInvalidArgument.
func checkTags(what string, tags map[string]string) ([]byte, error) {
	if len(tags) == 0 {
		return nil, nil
	}
	if len(tags) > MaxTags {
		return nil, fmt.Errorf("%w: %s has %d tags; at most %d", ErrInvalidArgument, what, len(tags), MaxTags)
	}
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		if !tagKey.MatchString(k) {
			return nil, fmt.Errorf("%w: %s: tag key %q must be 1 to 64 of A-Z a-z 0-9 _ . -", ErrInvalidArgument, what, truncateText(k, 64))
		}
		if err := checkName("tag "+k+"'s value", tags[k], 256); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrInvalidArgument, what, err)
		}
	}
	b, err := json.Marshal(tags)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidArgument, what, err)
	}
	return b, nil
}

// decodeTags reads stored tags (nil for none).
func decodeTags(b []byte) map[string]string {
	if len(b) == 0 {
		return nil
	}
	var m map[string]string
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}
