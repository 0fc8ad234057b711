package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// ParentClosePolicy says what happens to a child run that is still running
// when its parent closes (completes, fails, is compensated or cancelled),
// as Temporal's policy of that name. A dead parent closes nothing: an
// operator may replay it.
type ParentClosePolicy string

// Parent-close policies.
const (
	// ParentCloseCancel (the default) requests the child's cancellation
	// once the parent's workflow function has returned (or, failing, as
	// its undos begin): the child compensates and ends cancelled.
	ParentCloseCancel ParentClosePolicy = "cancel"
	// ParentCloseAbandon leaves the child running on its own.
	ParentCloseAbandon ParentClosePolicy = "abandon"
	// ParentCloseWait keeps the parent open, waiting (holding no worker),
	// until the child has ended: the parent's workflow function has
	// returned, and the parent ends with that outcome once its children
	// of this policy have ended, however they ended.
	ParentCloseWait ParentClosePolicy = "wait"
)

// ChildOpts are a child run's options. A nil *ChildOpts takes the defaults.
type ChildOpts struct {
	// WorkflowID is the child's workflow ID (1 to 400 bytes, not a UUID:
	// see StartOpts.WorkflowID). Default:
	// the parent's run ID and the child's step position,
	// "<parent run ID>:<position>", the same on every replay (a path segment
	// as it is, in the HTTP API). A given ID
	// that a run other than this child holds fails StartChild with
	// ErrWorkflowIDConflict, recorded, so a replay fails the same way.
	WorkflowID string
	// ParentClosePolicy says what happens to the child if it still runs
	// when the parent closes. Default ParentCloseCancel.
	ParentClosePolicy ParentClosePolicy
	// RunTimeout is the child's StartOpts.RunTimeout (0: none).
	RunTimeout time.Duration
}

func (o *ChildOpts) validate() error {
	if o == nil {
		return nil
	}
	switch o.ParentClosePolicy {
	case "", ParentCloseCancel, ParentCloseAbandon, ParentCloseWait:
	default:
		return fmt.Errorf("%w: ChildOpts.ParentClosePolicy %q is not cancel, abandon or wait", ErrInvalidArgument, o.ParentClosePolicy)
	}
	if o.RunTimeout < 0 {
		return fmt.Errorf("%w: ChildOpts.RunTimeout %s is negative", ErrInvalidArgument, o.RunTimeout)
	}
	if o.WorkflowID != "" {
		if err := checkChosenWorkflowID(o.WorkflowID); err != nil {
			return fmt.Errorf("%w: ChildOpts.WorkflowID: %v", ErrInvalidArgument, err)
		}
	}
	return nil
}

func (o *ChildOpts) policy() ParentClosePolicy {
	if o == nil || o.ParentClosePolicy == "" {
		return ParentCloseCancel
	}
	return o.ParentClosePolicy
}

func (o *ChildOpts) workflowID(parent uuid.UUID, seq int) string {
	if o == nil || o.WorkflowID == "" {
		return fmt.Sprintf("%s:%d", parent, seq)
	}
	return o.WorkflowID
}

// ChildRun is a child run a workflow started (StartChild): its IDs, and
// its result once it ends (Get).
type ChildRun[Out any] struct {
	d          *delivery
	seq        int
	name       string
	runID      uuid.UUID
	workflowID string
}

// RunID is the child's run ID (its first run's, if it continued as new).
func (c *ChildRun[Out]) RunID() uuid.UUID { return c.runID }

// WorkflowID is the child's workflow ID.
func (c *ChildRun[Out]) WorkflowID() string { return c.workflowID }

// Get waits for the child to end and returns its output, or a *ChildError
// when it ended otherwise (failed, compensated, cancelled, terminated, or
// dead with its dead job discarded: its recorded error is in the chain, so
// errors.Is finds ErrCancelled for a cancelled child and errors.As a
// *StepError of its failed step). The outcome is recorded with the
// parent's step that started the child, so every replay returns the same
// one.
//
// A child parked as dead has not ended: an operator may replay it. The
// parent is parked with it (reason child_dead, its dead job naming the
// child's, DeadJob.ChildDeadJobID), as a step whose retries ran out parks
// the run that called it, and nothing is undone. Replaying either dead
// job replays both: the parent waits for the child again and takes its
// outcome. Discarding the child's dead job and replaying the parent's
// gives the parent the child's death as a *ChildError of status dead.
//
// While the child runs, the parent is suspended, holding no goroutine,
// worker slot or River job; the statement that ends the child wakes it.
// Parallel steps (Go) still running keep the parent's delivery until they
// end, and Get checks on the child meanwhile. Other errors: ErrCancelled
// (the parent's cancellation was requested: the parent stops its
// children as it compensates), or the error that ended the delivery,
// which the workflow should return.
func (c *ChildRun[Out]) Get(ctx *Context) (Out, error) {
	var zero Out
	if ctx == nil || ctx.d != c.d {
		return zero, errors.New("pgdurable: ChildRun.Get called with another run's Context")
	}
	raw, err := c.d.childResult(c.seq, c.name)
	if err != nil {
		return zero, err
	}
	return decodeOutput[Out](c.name, raw, nil)
}

// ChildError is what ChildRun.Get returns for a child run that ended
// without output. It unwraps to the child's recorded error.
type ChildError struct {
	Workflow string    // the child's workflow name
	RunID    uuid.UUID // the child's run ID (its first run's)
	Status   RunStatus // failed, compensated, cancelled, terminated or dead
	// Info is the child run's recorded error; Err is Info decoded (see
	// ErrorInfo.Err), nil when none was recorded.
	Info *ErrorInfo
	Err  error
}

// Error names the child, its status and its error.
func (e *ChildError) Error() string {
	msg := "no error recorded"
	if e.Info != nil {
		msg = e.Info.Message
	}
	return fmt.Sprintf("child workflow %q (run %s) ended %s: %s", e.Workflow, e.RunID, e.Status, msg)
}

// Unwrap returns the child's decoded error.
func (e *ChildError) Unwrap() error { return e.Err }

// childErrorClass is the class of a parent's record of a child that ended
// with status.
func childErrorClass(status string) ErrorClass { return ErrorClass("child_" + status) }

// StartChild starts wf as a child run of this run, with input in, as the
// run's next step (kind "child", named after wf): the child's run and the
// parent's record of it, which holds the child's run ID, are written in
// one transaction with the child's River job, so the child starts exactly
// once, and a replay returns the recorded child without starting another.
// The child runs on any process that registers wf. opts may be nil.
//
// What happens to a child still running when the parent closes is its
// ParentClosePolicy's; when the parent fails or is cancelled and
// compensates, its children of policy cancel and wait are cancelled first
// and the parent waits for them to end before its own undos run (a child
// started after a step is undone before it). Get returns its result.
//
// Errors: ErrInvalidArgument (bad opts, nil wf), ErrInvalidInput (in does
// not encode, or is over Config.MaxPayloadBytes), neither recorded;
// ErrWorkflowIDConflict when opts.WorkflowID is another run's (recorded:
// replays fail alike); ErrCancelled when the parent's cancellation was
// requested; or the error that ended the delivery.
func StartChild[In, Out any](ctx *Context, wf *Workflow[In, Out], in In, opts *ChildOpts) (*ChildRun[Out], error) {
	if wf == nil {
		return nil, fmt.Errorf("%w: StartChild with a nil workflow", ErrInvalidArgument)
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	input, err := wf.encode(in)
	if err != nil {
		return nil, err
	}
	d := ctx.d
	if len(input) > d.e.cfg.MaxPayloadBytes {
		return nil, d.e.tooLarge(wf.name, len(input))
	}
	seq, runID, workflowID, err := d.startChild(wf.name, wf.opts.Version, input, opts)
	if err != nil {
		return nil, err
	}
	return &ChildRun[Out]{d: d, seq: seq, name: wf.name, runID: runID, workflowID: workflowID}, nil
}

// ChildWorkflow runs wf as a child and waits for its result: StartChild
// then Get.
func ChildWorkflow[In, Out any](ctx *Context, wf *Workflow[In, Out], in In, opts *ChildOpts) (Out, error) {
	c, err := StartChild(ctx, wf, in, opts)
	if err != nil {
		var zero Out
		return zero, err
	}
	return c.Get(ctx)
}

// startChild takes the child's position and starts it, or replays its
// record.
func (d *delivery) startChild(name string, version int, input []byte, opts *ChildOpts) (int, uuid.UUID, string, error) {
	seq, err := d.enterStep("child workflow", name, false)
	if err != nil {
		return 0, uuid.Nil, "", err
	}
	defer d.inStep.Store(false)
	workflowID := opts.workflowID(d.runID, seq)
	if d.cancelRequested.Load() {
		if rec := d.pos.at(seq); rec == nil || rec.Kind == string(KindCompensation) {
			d.pos.giveBack()
			return 0, uuid.Nil, "", ErrCancelled
		}
	}
	rec, ok := d.replay(seq, name, KindChild)
	if !ok {
		return 0, uuid.Nil, "", d.endErr
	}
	d.hasChildren = true
	if rec != nil {
		d.e.obs.StepReplayed(StepReplayedEvent{Workflow: d.wf.name, Kind: KindChild})
		if rec.RequestID == nil { // the start was refused
			return 0, uuid.Nil, "", stepErrorFromRecord(rec)
		}
		return seq, *rec.RequestID, workflowID, nil
	}
	if !d.mayStartStep() {
		return 0, uuid.Nil, "", d.endErr
	}
	r, err := d.e.newRun(d.ctx, name, version, input, &StartOpts{WorkflowID: workflowID, RunTimeout: opts.runTimeout(),
		engineMade: opts == nil || opts.WorkflowID == ""})
	if err != nil {
		return 0, uuid.Nil, "", err
	}
	r.Parent = &store.ParentRef{RunID: d.runID, Seq: seq, ClosePolicy: string(opts.policy())}
	r.TraceContext = d.e.tr.inject(d.ctx) // the child's deliveries continue the parent's trace
	started := time.Now()
	now := d.e.now()
	var taken bool
	var cancel bool
	d.writeMu.Lock()
	err = d.do(func(ctx context.Context) error {
		return d.e.txn(ctx, func(tx pgx.Tx) error {
			rec = &store.StepRecord{Seq: seq, Name: name, Kind: string(KindChild), Status: store.StepStarted,
				Attempts: 1, StartedAt: now}
			ins, err := store.InsertChild(ctx, d.e.on(tx), r)
			switch taken = errors.Is(err, store.ErrChildIDTaken); {
			case taken:
				info := stepFailure(fmt.Errorf("%w: child workflow %q: ID %q is held by run %s", ErrWorkflowIDConflict, name, workflowID, ins.RunID),
					ClassPermanent, name, seq, 1)
				rec.Status, rec.Error, rec.CompletedAt = store.StepFailed, info.json(), &now
			case err != nil:
				return err
			default:
				rec.RequestID = &ins.RunID
				if !ins.Existing {
					if err := d.e.queue.Enqueue(ctx, tx, ins.RunID, time.Time{}); err != nil {
						return err
					}
				}
			}
			recs := []*store.StepRecord{rec}
			if p := d.buf.pending; p != nil {
				recs = append(recs, p)
			}
			var w store.StepsWritten
			w, err = store.WriteSteps(ctx, d.e.on(tx), d.fence(), "", recs...)
			cancel = w.CancelRequested
			return err
		})
	})
	d.writeMu.Unlock()
	if err != nil {
		d.end(err)
		return 0, uuid.Nil, "", d.endErr
	}
	d.buf.take() // written by the transaction
	d.extendedAt(started)
	d.progressed.Store(true)
	d.noteCancel(cancel)
	d.noteChildRecord(rec)
	if taken {
		d.e.obs.StepAttempt(StepAttemptEvent{Workflow: d.wf.name, Step: name, Kind: KindChild, Attempt: 1, Outcome: "failed", Duration: time.Since(started)})
		return 0, uuid.Nil, "", stepErrorFromRecord(rec)
	}
	d.e.obs.StepAttempt(StepAttemptEvent{Workflow: d.wf.name, Step: name, Kind: KindChild, Attempt: 1, Outcome: "completed", Duration: time.Since(started)})
	d.log.Debug("child run started", "child_run_id", *rec.RequestID, "child_workflow", name, "seq", seq)
	return seq, *rec.RequestID, workflowID, nil
}

func (o *ChildOpts) runTimeout() time.Duration {
	if o == nil {
		return 0
	}
	return o.RunTimeout
}

// noteChildRecord keeps rec, a record of a child this delivery wrote.
func (d *delivery) noteChildRecord(rec *store.StepRecord) {
	if d.childRecs == nil {
		d.childRecs = map[int]*store.StepRecord{}
	}
	d.childRecs[rec.Seq] = rec
}

// childRecord is the parent's latest record of its child at seq: written
// by this delivery, or by an earlier one.
func (d *delivery) childRecord(seq int) *store.StepRecord {
	if rec, ok := d.childRecs[seq]; ok {
		return rec
	}
	return d.pos.at(seq)
}

// childPoll is how often Get looks at a child while parallel steps keep
// the parent's delivery.
const childPoll = 250 * time.Millisecond

// childResult is Get: the recorded outcome of the child at seq, recorded
// now if it has ended, or the parent suspended until it ends.
func (d *delivery) childResult(seq int, name string) ([]byte, error) {
	for {
		if d.parkPanickedBranch() {
			return nil, d.endErr
		}
		if rec := d.childRecord(seq); rec != nil {
			switch rec.Status {
			case store.StepCompleted:
				return rec.Output, nil
			case store.StepFailed, store.StepCancelled:
				return nil, childErrorFromRecord(rec)
			}
		}
		if d.cancelRequested.Load() {
			return nil, ErrCancelled
		}
		if d.ctx.Err() != nil {
			d.interrupted()
			return nil, d.endErr
		}
		settled, dead, err := d.settleChildren([]int{seq}, false)
		if err != nil {
			d.end(err)
			return nil, d.endErr
		}
		if dead != nil {
			if !d.parkForDeadChild(seq, dead) {
				continue // an operator replayed the child meanwhile: wait for it
			}
			return nil, d.endErr
		}
		if settled > 0 {
			continue
		}
		if d.branchesRunning() {
			if !d.flushStarted() {
				return nil, d.endErr
			}
			d.waitBranches(childPoll)
			continue
		}
		if !d.suspendForChildren([]int{seq}) {
			return nil, d.endErr
		}
	}
}

// settleChildren records the outcome of those children at seqs that have
// ended, in the parent's records of them, and says how many it recorded.
// A child parked as dead with its dead job open has not ended for good:
// an operator may replay it. Unless deadEnds, it is not recorded but
// returned (the first such), for the parent waiting for it to park.
func (d *delivery) settleChildren(seqs []int, deadEnds bool) (int, *store.ChildEnd, error) {
	var ends []store.ChildEnd
	err := d.do(func(ctx context.Context) (err error) {
		ends, err = store.ChildEnds(ctx, d.e.db, d.runID, seqs)
		return err
	})
	if err != nil || len(ends) == 0 {
		return 0, nil, err
	}
	recs := make([]*store.StepRecord, 0, len(ends))
	var dead *store.ChildEnd
	for _, c := range ends {
		rec := d.childRecord(c.Seq)
		if rec == nil {
			continue // not this delivery's to record: a Get of it will
		}
		if c.DeadJobID != nil && !deadEnds {
			if dead == nil {
				dead = &c
			}
			continue
		}
		done := *rec
		now := d.e.now()
		done.CompletedAt, done.Fresh = &now, false
		if c.Status == store.RunCompleted {
			done.Status, done.Output, done.Error = store.StepCompleted, c.Output, nil
		} else {
			info := decodeErrorInfo(c.Error)
			ce := &ChildError{Workflow: done.Name, RunID: *done.RequestID, Status: RunStatus(c.Status), Info: info}
			rec := &ErrorInfo{Class: childErrorClass(c.Status), Message: ce.Error(), Cause: info, Step: done.Name, Seq: &done.Seq}
			done.Status, done.Output, done.Error = store.StepFailed, nil, rec.json()
			if c.Status == store.RunCancelled {
				done.Status = store.StepCancelled // a cancelled child is no failure of the parent's
			}
		}
		recs = append(recs, &done)
	}
	if len(recs) == 0 {
		return 0, dead, nil
	}
	if !d.write(recs...) {
		return 0, nil, d.endErr
	}
	for _, r := range recs {
		d.noteChildRecord(r)
	}
	return len(recs), dead, nil
}

// parkForDeadChild parks the run, waiting for its child at seq that is
// parked as dead (c), with reason child_dead and the child's dead job
// linked: replaying either dead job replays both, and this run goes on
// waiting for the child; discarding the child's gives this run, once
// replayed, the child's failure (a *ChildError of status dead). False when
// the child's dead job was replayed meanwhile: the run is not parked.
func (d *delivery) parkForDeadChild(seq int, c *store.ChildEnd) bool {
	name := d.childRecord(seq).Name
	cause := decodeErrorInfo(c.Error)
	info := &ErrorInfo{Class: ClassChildDead, Step: name, Seq: &seq, Cause: cause,
		Message: fmt.Sprintf("child run %s (workflow %q), which this run waits for, is parked as dead (dead job %s): "+
			"replay its dead job or this one to replay both, this run then waits for the child again; "+
			"or discard the child's and replay this one to give this run the child's failure", c.RunID, name, *c.DeadJobID)}
	d.log.Warn("child run parked as dead; parking its parent with it", "child_run_id", c.RunID, "child_dead_job_id", *c.DeadJobID)
	return d.park(nil, &parkReason{reason: ReasonChildDead, info: info, childRunID: &c.RunID, childDeadJobID: c.DeadJobID})
}

// childErrorFromRecord decodes a parent's failed record of a child: the
// *ChildError its Get returns, live and on replay alike. A start that was
// refused (no child run) decodes as the step error it recorded.
func childErrorFromRecord(rec *store.StepRecord) error {
	info := decodeErrorInfo(rec.Error)
	status, ok := strings.CutPrefix(string(info.Class), "child_")
	if rec.RequestID == nil || !ok {
		return stepErrorFromRecord(rec)
	}
	ce := &ChildError{Workflow: rec.Name, RunID: *rec.RequestID, Status: RunStatus(status), Info: info.Cause}
	if info.Cause != nil {
		ce.Err = info.Cause.Err()
	}
	return ce
}

// branchesRunning reports whether parallel steps of this delivery run.
func (d *delivery) branchesRunning() bool { return len(d.branchSlots) > 0 }

// waitBranches waits until no parallel step runs, for at most max.
func (d *delivery) waitBranches(max time.Duration) {
	deadline := time.Now().Add(max)
	for d.branchesRunning() && time.Now().Before(deadline) && d.ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
}

// suspendForChildren hands the run back until one of its children at
// seqs ends: false when it did (the delivery ended), true when one of them
// had ended already (nothing written; the caller reads it).
func (d *delivery) suspendForChildren(seqs []int) bool {
	if !d.settleChain() {
		return false
	}
	status := StatusWaiting
	if d.compensating || d.cancelRequested.Load() {
		status = StatusCompensating // the cancel sweep wakes a waiting run at once
	}
	var ended bool
	d.longMu.Lock()
	err := d.do(func(ctx context.Context) error {
		ended = false
		err := d.e.txn(ctx, func(tx pgx.Tx) error {
			return store.SuspendForChildren(ctx, d.e.on(tx), d.fence(), store.ChildWaitParams{Pending: d.buf.pending, Status: string(status), Seqs: seqs})
		})
		if errors.Is(err, store.ErrChildEnded) {
			ended = true
			return nil
		}
		return err
	})
	d.longMu.Unlock()
	if err != nil {
		d.end(err)
		return false
	}
	if ended {
		return true
	}
	d.buf.take()
	d.log.Debug("waiting for child runs", "seqs", seqs)
	d.end(nil)
	return false
}

// Which children the parent cancels, and waits for, before it closes:
// once its workflow function returned (completed, failed with nothing to
// undo, continued as new), and before its undos run.
var (
	closeCancels    = []string{string(ParentCloseCancel)}
	closeWaits      = []string{string(ParentCloseWait)}
	compensateStops = []string{string(ParentCloseCancel), string(ParentCloseWait)}
)

// closeChildren is what the parent does with its children before it
// closes: it requests the cancellation of those of policies cancel, then
// waits until every child of policies wait has ended. True once none is
// open; false when the delivery ended (the parent suspended until one
// ends, or a write failed).
func (d *delivery) closeChildren(cancel, wait []string) bool {
	if !d.hasChildren {
		return true
	}
	policies := wait
	if len(cancel) > 0 {
		var cancelled []uuid.UUID
		err := d.do(func(ctx context.Context) error {
			return d.e.txn(ctx, func(tx pgx.Tx) error {
				// Its own row first: a child continuing as new meanwhile
				// commits its new run before, or waits (see store.LockRun).
				if err := store.LockRun(ctx, d.e.on(tx), d.runID); err != nil {
					return err
				}
				c, err := store.CancelChildren(ctx, d.e.on(tx), d.runID, cancel, cancelledJSON())
				if err != nil {
					return err
				}
				cancelled = c.Cancelled
				return d.e.queue.EnqueueMany(ctx, tx, c.Woken)
			})
		})
		if err != nil {
			d.end(err)
			return false
		}
		d.e.noteCancelled(cancelled)
	}
	for {
		var open []int
		err := d.do(func(ctx context.Context) (err error) {
			open, err = store.OpenChildren(ctx, d.e.db, d.runID, policies, 100)
			return err
		})
		if err != nil {
			d.end(err)
			return false
		}
		if len(open) == 0 {
			return d.settleStartedChildren()
		}
		if !d.suspendForChildren(open) {
			return false
		}
	}
}

// settleStartedChildren records the outcomes of the children this run's
// records still show running that have ended, so a closed parent's view
// shows how each ended.
func (d *delivery) settleStartedChildren() bool {
	var seqs []int
	for i := range d.pos.next {
		if rec := d.childRecord(i); rec != nil && rec.Kind == string(KindChild) && rec.Status == store.StepStarted {
			seqs = append(seqs, i)
		}
	}
	if len(seqs) == 0 {
		return true
	}
	if _, _, err := d.settleChildren(seqs, true); err != nil {
		if !d.ended {
			d.end(err)
		}
		return false
	}
	return true
}

// endRelated, in the transaction that ends the run with status, does what
// its end does to related runs: its parent, waiting for it, is woken; its
// children of policy cancel still running are cancelled when it closed.
func (d *delivery) endRelated(ctx context.Context, tx pgx.Tx, status RunStatus) error {
	if p := d.parent; p != nil && status != StatusContinued { // a continued child's chain goes on
		woken, err := store.WakeParent(ctx, d.e.on(tx), p.RunID, p.Seq)
		if err != nil {
			return err
		}
		if woken {
			if err := d.e.queue.Enqueue(ctx, tx, p.RunID, time.Time{}); err != nil {
				return err
			}
		}
	}
	if d.hasChildren && status.closed() {
		c, err := store.CancelChildren(ctx, d.e.on(tx), d.runID, []string{string(ParentCloseCancel)}, cancelledJSON())
		if err != nil {
			return err
		}
		d.closedChildren = c.Cancelled
		return d.e.queue.EnqueueMany(ctx, tx, c.Woken)
	}
	return nil
}

// lockParent locks the parent's row, if the run has a parent, before the
// transaction that ends the run writes its own (see store.LockRun).
func (d *delivery) lockParent(ctx context.Context, tx pgx.Tx) error {
	if d.parent == nil {
		return nil
	}
	return store.LockRun(ctx, d.e.on(tx), d.parent.RunID)
}

// related reports whether the run's end touches other runs (see
// endRelated): it has a parent, or it started children.
func (d *delivery) related() bool { return d.parent != nil || d.hasChildren }

// endTx ends the run in a transaction of its own with w, the terminal
// write, and endRelated.
func (d *delivery) endTx(w *store.RecordWrite, status RunStatus) error {
	d.writeMu.Lock()
	defer d.writeMu.Unlock()
	tries := 0
	err := d.do(func(ctx context.Context) error {
		if tries++; tries > 1 {
			for _, r := range w.Records {
				r.Fresh = false
			}
		}
		return d.e.txn(ctx, func(tx pgx.Tx) error {
			if err := d.lockParent(ctx, tx); err != nil {
				return err
			}
			res, err := store.WriteRecords(ctx, d.e.on(tx), []*store.RecordWrite{w})
			if err != nil {
				return err
			}
			if !res[0].Landed {
				return store.ErrLeaseLost
			}
			return d.endRelated(ctx, tx, status)
		})
	})
	if err == nil {
		d.e.noteCancelled(d.closedChildren)
	}
	return err
}

// cancelledJSON is the recorded error of a run cancelled before it ever
// ran.
func cancelledJSON() []byte { return newErrorInfo(ErrCancelled, ClassCancelled).json() }

// noteCancelled tells the deliveries in this process of runs whose
// cancellation was just committed (another process's hear of it at their
// next write or heartbeat).
func (e *Engine) noteCancelled(runIDs []uuid.UUID) {
	for _, id := range runIDs {
		if d, ok := e.live.Load(id); ok {
			d.(*delivery).noteCancel(true)
		}
	}
}

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
// The new run takes the latest version of the workflow registered in this
// process (see Engine.Register): a chain moves to new code here. in must
// encode as JSON that decodes as the workflow's input type (ErrInvalidInput
// otherwise, returned here). A cancellation requested
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
	// The next run takes the latest version registered here: a chain
	// moves to new code at its continue-as-new.
	next := d.wf
	if latest, ok := e.workflow(d.wf.name); ok {
		next = latest
	}
	r, err := e.newRun(d.ctx, next.name, next.version, input, &StartOpts{WorkflowID: d.workflowID, RunTimeout: d.runTimeout, engineMade: true})
	if err != nil {
		d.park(nil, &parkReason{reason: ReasonPermanentError, info: newErrorInfo(err, ClassPermanent)})
		return
	}
	r.Parent = d.parent
	r.TraceContext = d.traceContext // the chain stays in one trace, its first delivery here too
	r.ContinuedFrom = &d.runID
	wf, path := e.planStart(nil, next.name, next.version, false, r.FlowQueue != "")
	e.route(&r, path)
	sent := time.Now()
	d.writeMu.Lock()
	err = d.do(func(ctx context.Context) error {
		return e.txn(ctx, func(tx pgx.Tx) error {
			if err := d.lockParent(ctx, tx); err != nil { // ancestors first (see store.LockRun)
				return err
			}
			if p := d.buf.pending; p != nil {
				if _, err := store.WriteSteps(ctx, e.on(tx), d.fence(), "", p); err != nil {
					return err
				}
			}
			if err := store.ContinueRun(ctx, e.on(tx), d.fence(), r.RunID); err != nil {
				return err
			}
			ins, err := store.InsertRun(ctx, e.on(tx), r)
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
			if err := store.MoveSignals(ctx, e.on(tx), d.runID, r.RunID); err != nil {
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
