package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/queue"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// writeTimeout bounds a record write. Writes use a context detached from
// the delivery's, so a shutdown does not lose a finished step's record.
const writeTimeout = 15 * time.Second

// busyRetry is how long a ticket that found every worker busy for half a
// lease waits before River delivers it again.
const busyRetry = 100 * time.Millisecond

// unknownWorkflowRetry is how long a ticket for a workflow this process
// does not register waits before another try, when it has come back to
// processes that do not register it snoozes times: a second for the first
// ten (in a rolling deploy a process that registers it is usually running
// too; each second it has an even chance or better to fetch the ticket
// first), then doubling to 30 s, so a workflow that no process registers
// does not spin.
func unknownWorkflowRetry(snoozes int) time.Duration {
	if snoozes < 10 {
		return time.Second
	}
	return min(time.Second<<min(snoozes-9, 5), 30*time.Second)
}

// deliver is one delivery of a run: River calls it for each ticket. It
// waits for one of the process's worker slots, which runs this process
// started itself share (see planStart), for at most half a lease: a ticket
// River fetched and that waited longer would look abandoned to the orphan
// sweep, so it goes back to River instead, for a process with a free
// worker.
func (e *Engine) deliver(ctx context.Context, runID uuid.UUID) error {
	select {
	case e.slots <- struct{}{}:
	default:
		wait := time.NewTimer(e.cfg.LeaseDuration / 2)
		defer wait.Stop()
		select {
		case e.slots <- struct{}{}:
		case <-wait.C:
			return queue.Snooze(busyRetry)
		case <-ctx.Done():
			return ctx.Err() // stopping: River retries the ticket
		}
	}
	defer e.releaseSlot()
	token := uuid.New()
	sent := time.Now()
	claimed, miss, err := e.claim(runID, token)
	if err != nil {
		return err // the database failed: River retries the ticket
	}
	if miss != nil {
		return e.missed(runID, miss)
	}
	log := e.log.With("run_id", runID, "workflow", claimed.WorkflowName, "workflow_id", claimed.WorkflowID)
	wf, ok := e.workflow(claimed.WorkflowName)
	if !ok {
		retry := unknownWorkflowRetry(queue.Snoozes(ctx))
		if e.warnOnce("workflow "+claimed.WorkflowName, time.Minute) {
			log.Error("workflow not registered in this process; handing its runs back for a process that registers it",
				"retry_in", retry, "registered", e.registeredNames())
		}
		if err := store.ReleaseUnclaimed(context.WithoutCancel(ctx), e.pool, store.Fence{RunID: runID, Token: token}); err != nil {
			return err
		}
		return queue.Snooze(retry)
	}
	return e.execute(ctx, wf, claimed, token, sent)
}

// execute runs the workflow function for a delivery that holds the run's
// lease under token (claimed at sent), and records how it ended. A non-nil
// result fails the delivery's River ticket so River tries it again.
func (e *Engine) execute(ctx context.Context, wf registered, claimed *store.ClaimedRun, token uuid.UUID, sent time.Time) error {
	runID := claimed.RunID
	log := e.log.With("run_id", runID, "workflow", claimed.WorkflowName, "workflow_id", claimed.WorkflowID)
	dctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	fwd, cancelFwd := context.WithCancelCause(dctx)
	defer cancelFwd(nil)
	c := &Context{
		Context: dctx, cancel: cancel, fwd: fwd, cancelFwd: cancelFwd, e: e, wf: wf, runID: runID,
		workflowID: claimed.WorkflowID, token: token, log: log, steps: claimed.Steps, lastRecorded: -1,
		claimedAt: sent, deliveries: claimed.Deliveries,
	}
	c.extendedAt(sent)
	e.live.Store(runID, c)
	defer e.live.CompareAndDelete(runID, c)
	c.noteCancel(claimed.CancelRequested)
	stopHeartbeat := e.heartbeat(c)
	defer stopHeartbeat()

	if died := claimed.StalledDeliveries - 1; crashLoop(died, claimed.LongStalled, e.cfg.MaxDeliveries) {
		why := &parkReason{reason: "crash_loop", attempts: died, info: &ErrorInfo{
			Class: ClassCrashLoop,
			Message: fmt.Sprintf("%d consecutive deliveries ended without recording progress (worker crashed or was killed), "+
				"%d of them within their first lease; MaxDeliveries is %d",
				died, max(died-claimed.LongStalled, 0), e.cfg.MaxDeliveries),
		}}
		if n := len(claimed.Steps); n > 0 && claimed.Steps[n-1].Status != store.StepCompleted {
			// The latest record is unsettled: the step the deliveries died in.
			rec := claimed.Steps[n-1]
			why.info.Step, why.info.Seq = rec.Name, &rec.Seq
		}
		c.park(nil, why)
		return nil
	}
	out, p, err := c.runWorkflow(claimed.Input)
	c.finish(out, err, p)
	return c.ticketErr
}

// longStalledFactor: deliveries that died after living a whole lease count
// toward a limit this many times MaxDeliveries.
const longStalledFactor = 5

// crashLoop reports whether a run whose last stalled deliveries died
// without progress, long of them after living a whole lease, must be
// parked. A worker that a poison run kills takes every run in flight with
// it; the poison run dies young (it kills the worker soon after its claim,
// every time), while a run in a long step that shared the worker has
// usually lived longer. Young deaths count against MaxDeliveries; all
// deaths count against longStalledFactor × MaxDeliveries, so a slow
// poison (one that takes minutes to exhaust memory) is parked too.
func crashLoop(stalled, long, maxDeliveries int) bool {
	young := stalled - long
	return young >= maxDeliveries || stalled >= longStalledFactor*maxDeliveries
}

// missed handles a ticket that found the run not claimable.
func (e *Engine) missed(runID uuid.UUID, m *store.ClaimMiss) error {
	switch {
	case m.NotExists, m.Leased:
		// Finished tickets and duplicates end here; a live lease holder that
		// dies is covered by the sweeper, which enqueues a new ticket.
		return nil
	case m.WakeAt != nil && isActive(m.Status):
		// An early ticket (clock skew, a duplicate): wait until due rather
		// than drop it, so no waiting run is ever left without a ticket.
		return queue.Snooze(max(m.WakeAt.Sub(e.now()), 10*time.Millisecond))
	}
	return nil
}

func isActive(status string) bool {
	switch status {
	case store.RunPending, store.RunRunning, store.RunWaiting, store.RunCompensating:
		return true
	}
	return false
}

// runWorkflow calls the workflow function, recovering a panic.
func (c *Context) runWorkflow(input []byte) (out []byte, p *panicInfo, err error) {
	defer func() {
		if r := recover(); r != nil {
			p = &panicInfo{value: r, stack: debug.Stack()}
		}
	}()
	out, err = c.wf.run(c, input)
	return out, nil, err
}

// finish records how the workflow function ended, unless the delivery has
// already handed the run back.
func (c *Context) finish(out []byte, err error, p *panicInfo) {
	if c.ended {
		return
	}
	var poison *errPoisonInput
	var unserializable *errUnserializableOutput
	switch {
	case p != nil:
		info := newErrorInfo(&PanicError{Value: fmt.Sprint(p.value)}, ClassPanic)
		info.Message = "panic in workflow code: " + info.Message
		info.Stack = truncateStack(p.stack)
		c.log.Error("workflow panicked", "error_class", ClassPanic, "panic", info.Message)
		c.park(nil, &parkReason{reason: "panic", info: info})
	case c.Err() != nil:
		c.interrupted()
	case errors.As(err, &poison):
		c.park(nil, &parkReason{reason: "poison_input", info: newErrorInfo(err, ClassPoisonInput)})
	case errors.As(err, &unserializable):
		class := ClassUnserializable
		if errors.Is(err, ErrOutputTooLarge) {
			class = ClassOutputTooLarge
		}
		c.park(nil, &parkReason{reason: "permanent_error", info: newErrorInfo(err, class)})
	case c.cancelRequested.Load():
		c.compensate(store.RunCancelled, newErrorInfo(ErrCancelled, ClassCancelled))
	case err == nil && c.seq < len(c.steps):
		c.park(nil, &parkReason{reason: "nondeterminism", info: &ErrorInfo{Class: ClassNonDeterminism,
			Message: fmt.Sprintf("workflow returned after %d steps but %d are recorded", c.seq, len(c.steps))}})
	case err == nil:
		c.close(store.RunCompleted, c.finishRun(store.RunCompleted, out, nil))
		c.log.Debug("run completed")
	default:
		info := newErrorInfo(err, ClassWorkflow)
		var se *StepError
		if errors.As(err, &se) {
			info.Class, info.Step, info.Seq, info.Attempt = se.Class, se.Step, &se.Seq, se.Attempt
		}
		if len(c.compensations) > 0 {
			c.compensate(store.RunCompensated, info)
			return
		}
		c.close(store.RunFailed, c.finishRun(store.RunFailed, nil, info.json()))
		c.log.Info("run failed", "error_class", info.Class, "error", info.Message)
	}
}

// writeRetries is how many more times a record write that failed for a
// transient reason is tried, writeRetryBackoff apart, doubling (50 ms to
// 400 ms): a serialization failure, a deadlock or a dropped connection must
// not end the delivery and have a step's side effect run again.
const (
	writeRetries      = 4
	writeRetryBackoff = 50 * time.Millisecond
)

// do runs a store write on a context detached from the delivery's, so a
// shutdown does not lose a finished step's record, bounded by writeTimeout.
// A transient failure is retried under the same fence while the lease
// lasts: every write do runs is idempotent under its fence (the same
// records upserted again; a terminal write that did commit fences its
// retry out, which ends the delivery as a lost lease would).
func (c *Context) do(write func(ctx context.Context) error) error {
	return c.retryWrite(write, true)
}

// doOnce is do for a write that must not run twice if its first try may
// have committed (taking a signal): it retries only what certainly rolled
// back.
func (c *Context) doOnce(write func(ctx context.Context) error) error {
	return c.retryWrite(write, false)
}

func (c *Context) retryWrite(write func(ctx context.Context) error, idempotent bool) error {
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Context), writeTimeout)
		err := write(ctx)
		cancel()
		transient, ambiguous := store.IsTransient(err)
		if !transient || (ambiguous && !idempotent) || try == writeRetries || c.leaseLeft() <= 0 {
			return err
		}
		c.log.Warn("record write failed; trying it again", "error", err, "try", try+2)
		time.Sleep(writeRetryBackoff << try)
	}
}

// end marks the delivery over after a terminal write returned err.
func (c *Context) end(err error) {
	if store.IsDataError(err) && !c.unstorable {
		// PostgreSQL refuses a record for its data: every delivery would
		// fail the same way until the run is parked as a crash loop, with
		// the cause lost. Park it now without that record, saying why.
		c.unstorable = true
		c.pending = nil
		c.log.Error("PostgreSQL refused a record of this run; parking it", "error", err)
		c.park(nil, &parkReason{reason: ReasonPermanentError, info: &ErrorInfo{Class: ClassUnserializable,
			Message: "PostgreSQL refused a record of this run: " + err.Error()}})
		return
	}
	c.ended = true
	c.endErr = errDeliveryEnded
	switch {
	case errors.Is(err, store.ErrLeaseLost):
		c.endErr = ErrLeaseLost
		c.e.obs.LeaseLost(c.wf.name)
		c.log.Warn("lease lost; this delivery stops", "error_class", "lease_lost")
		c.rescueUnowned()
	case err != nil:
		// The record is not written. If the claim survived, the lease
		// expires and the sweep hands the run to another delivery, which
		// replays from the records. If a database crash took the claim
		// with it (it commits asynchronously), no lease is left to expire:
		// failing the ticket makes River retry it, and that retry claims
		// the run, or finds it leased and leaves it to the sweep.
		c.endErr = fmt.Errorf("pgdurable: writing records of run %s: %w", c.runID, err)
		c.ticketErr = c.endErr
		c.log.Error("write failed; run will be redelivered", "error", err)
	}
	c.cancel(c.endErr)
}

// rescueUnowned gives the run a new ticket when the lost lease belongs to
// nobody: the claim was lost in a PostgreSQL crash (it commits
// asynchronously), so no other delivery holds the run and the ticket that
// brought this one is about to complete. Usually another delivery holds the
// run and nothing is written.
func (c *Context) rescueUnowned() {
	err := c.do(func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, c.e.pool, func(tx pgx.Tx) error {
			unowned, err := store.ReenqueueUnowned(ctx, tx, c.runID)
			if err != nil || !unowned {
				return err
			}
			c.log.Warn("run held by no delivery after a lost lease (a claim lost in a database crash); re-enqueued")
			return c.e.queue.Enqueue(ctx, tx, c.runID, time.Time{})
		})
	})
	if err != nil {
		// Neither sweep sees an unowned run whose ticket completed: fail
		// the ticket so River retries it.
		c.log.Error("re-enqueueing an unowned run failed; River retries its ticket", "error", err)
		c.ticketErr = err
	}
}

// close ends the delivery after the run's terminal write, which returned
// err; the run ended with status when err is nil.
func (c *Context) close(status string, err error) {
	c.end(err)
	if err == nil {
		c.e.obs.RunEnded(c.runID, c.wf.name, status)
		c.e.notifyEnded(c.runID)
	}
}

// write records recs now (fenced, extending the lease, one round trip).
// False when the delivery ended.
func (c *Context) write(recs ...*store.StepRecord) bool { return c.writeStatus("", recs...) }

// writeStatus is write that also moves the run to status ("" unchanged).
func (c *Context) writeStatus(status string, recs ...*store.StepRecord) bool {
	sent := time.Now()
	res, err := c.commit(&store.RecordWrite{Fence: c.fence(), Records: recs, Status: status})
	if err != nil {
		c.end(err)
		return false
	}
	c.extendedAt(sent)
	c.noteCancel(res.CancelRequested)
	return true
}

// finishRun ends the run with a terminal status, writing the pending
// record with it.
func (c *Context) finishRun(status string, output, errJSON []byte) error {
	w := &store.RecordWrite{Fence: c.fence(), Status: status, Finish: true, Output: output, Error: errJSON}
	if c.pending != nil {
		w.Records = []*store.StepRecord{c.pending}
	}
	_, err := c.commit(w)
	return err
}

// commit sends w through the engine's record writer, which commits it with
// the writes of other deliveries in flight, retrying a transient failure
// as do does. ErrLeaseLost when w's fence no longer holds.
func (c *Context) commit(w *store.RecordWrite) (store.WriteResult, error) {
	var res store.WriteResult
	err := c.do(func(context.Context) error {
		o := c.e.records.do(w)
		if o.err != nil {
			return o.err
		}
		if res = o.res; !res.Landed {
			return store.ErrLeaseLost
		}
		return nil
	})
	return res, err
}

// fence is this delivery's right to write the run's records.
func (c *Context) fence() store.Fence {
	return store.Fence{RunID: c.runID, Token: c.token, Lease: c.e.cfg.LeaseDuration}
}

// mayStartStep is the check before a step's function runs: the delivery
// must not be interrupted and must still hold the lease. A flushed record
// proves the lease; without one (the first step of a delivery, after a
// replayed step, after a retry's record) the local lease view does, and
// when less than half of it is left (a paused process, a long stretch of
// workflow code) a fenced renewal settles it: one round trip, rare.
func (c *Context) mayStartStep() bool {
	if c.ended {
		return false
	}
	if c.Err() != nil {
		c.interrupted()
		return false
	}
	if c.leaseLeft() > c.e.cfg.LeaseDuration/2 {
		return true
	}
	return c.renew()
}

// renew extends the lease with a fenced heartbeat; false when lost.
func (c *Context) renew() bool {
	if err := c.beat(); err != nil {
		c.end(err)
		return false
	}
	return true
}

// beatIfDue sends a heartbeat unless one was sent less than gap ago, so
// that activity heartbeats and the lease heartbeat together write about
// once per HeartbeatInterval however often user code calls Heartbeat.
func (c *Context) beatIfDue(gap time.Duration) error {
	now := time.Now().UnixNano()
	last := c.lastBeatSent.Load()
	if time.Duration(now-last) < gap || !c.lastBeatSent.CompareAndSwap(last, now) {
		return nil
	}
	return c.beat()
}

// beat is one fenced heartbeat: it extends the lease and picks up a
// cancellation request. Safe on any goroutine (the lease heartbeat, an
// activity's Heartbeat): on a lost lease it cancels the delivery's context
// and leaves ending the delivery to the workflow's goroutine.
func (c *Context) beat() error {
	sent := time.Now()
	// The mark and a hand-back's undo of it must not interleave (see long).
	c.longMu.Lock()
	defer c.longMu.Unlock()
	markLong := !c.long && time.Since(c.claimedAt) >= c.e.cfg.LeaseDuration
	o := c.e.beats.do(store.Beat{Fence: c.fence(), MarkLong: markLong})
	cancelRequested, marked, err := o.res.CancelRequested, o.res.Marked, o.err
	if err == nil && !o.res.Landed {
		err = store.ErrLeaseLost
	}
	switch {
	case errors.Is(err, store.ErrLeaseLost):
		c.cancel(ErrLeaseLost)
		return err
	case err != nil:
		return err
	}
	c.extendedAt(sent)
	c.noteCancel(cancelRequested)
	c.long = c.long || marked
	return nil
}

// noteCancel cancels forward work once the run's cancellation is requested.
func (c *Context) noteCancel(requested bool) {
	if requested && c.cancelRequested.CompareAndSwap(false, true) {
		c.cancelFwd(ErrCancelled)
		c.log.Info("run cancellation requested; forward steps stop, compensations run")
	}
}

// flush writes the pending record of the previous step. Recording lazily
// lets the last step's record share the run's completion statement, which
// saves one commit per run; nothing runs between a step and its record
// except deterministic workflow code.
func (c *Context) flush() bool {
	if c.pending == nil {
		return true
	}
	rec := c.pending
	c.pending = nil
	return c.write(rec)
}

// suspend hands the run back until wakeAt, writing rec (may be nil) and the
// next delivery's ticket in one transaction.
func (c *Context) suspend(rec *store.StepRecord, wakeAt time.Time) {
	if rec != nil && c.pending != nil && !c.flush() {
		return
	}
	if rec == nil {
		rec, c.pending = c.pending, nil
	}
	status := store.RunWaiting
	if c.compensating || c.cancelRequested.Load() {
		// An undo waits for its retry, or a cancelled run for the retry
		// that settles an activity: the run is compensating, which the
		// sweep wakes at wakeAt only (a waiting run it would wake at once,
		// for its cancellation).
		status = store.RunCompensating
	}
	c.end(c.handBack(rec, status, wakeAt, true))
}

// interrupted ends a delivery whose context was cancelled: after a lost
// lease nothing more is written; after a shutdown the run is released at
// once for another worker instead of waiting for its lease to expire.
func (c *Context) interrupted() {
	if c.ended {
		return
	}
	if errors.Is(context.Cause(c.Context), ErrLeaseLost) {
		c.end(store.ErrLeaseLost)
		return
	}
	rec := c.pending
	c.pending = nil
	c.log.Info("delivery interrupted; run handed back", "cause", context.Cause(c.Context))
	status := store.RunPending
	if c.compensating {
		status = store.RunCompensating
	}
	c.end(c.handBack(rec, status, time.Time{}, rec != nil))
}

// handBack gives up the lease with status, writing rec (may be nil). A
// waiting run gets no ticket now: the sweep enqueues one when wakeAt comes,
// so a waiting run holds no River job. A pending run (a shutdown handed it
// back) gets its ticket in the same transaction.
func (c *Context) handBack(rec *store.StepRecord, status string, wakeAt time.Time, progress bool) error {
	c.longMu.Lock() // a heartbeat in flight has marked the delivery, or will find the lease gone
	defer c.longMu.Unlock()
	return c.do(func(ctx context.Context) error {
		if !wakeAt.IsZero() {
			return store.SuspendRun(ctx, c.e.pool, c.fence(), store.SuspendParams{Pending: rec, Status: status, WakeAt: &wakeAt,
				Progress: progress, WasLong: c.long})
		}
		return pgx.BeginFunc(ctx, c.e.pool, func(tx pgx.Tx) error {
			if err := store.SuspendRun(ctx, tx, c.fence(), store.SuspendParams{Pending: rec, Status: status,
				Progress: progress, WasLong: c.long}); err != nil {
				return err
			}
			return c.e.queue.Enqueue(ctx, tx, c.runID, time.Time{})
		})
	})
}

// parkReason is why a run is parked, with the step record to write.
type parkReason struct {
	reason   string
	info     *ErrorInfo
	rec      *store.StepRecord // the failing step, if any
	attempts int               // the dead job's attempts when there is no rec
}

func parkNonDeterminism(seq int, name, kind string, rec *store.StepRecord) *parkReason {
	return &parkReason{reason: "nondeterminism", info: &ErrorInfo{
		Class: ClassNonDeterminism, Step: name, Seq: &seq,
		Message: fmt.Sprintf("step %d is recorded as %s %q but the workflow now calls %s %q; the code changed under a running workflow",
			seq, rec.Kind, rec.Name, kind, name),
	}}
}

// park marks the run dead with a dead_jobs row, writing rec (the failing
// step) or else the pending record in the same statement.
func (c *Context) park(rec *store.StepRecord, why *parkReason) {
	if rec != nil && c.pending != nil && !c.flush() {
		return
	}
	if rec == nil {
		rec, c.pending = c.pending, nil
	}
	now := c.e.now()
	runErr := *why.info
	runErr.Stack = "" // the stack lives in dead_jobs; keep the run's error short
	p := &store.Park{
		ID: uuid.Must(uuid.NewV7()), Reason: why.reason, FirstFailedAt: now, LastFailedAt: now, Attempts: why.attempts,
		ErrorClass: storableText(why.info.Class), ErrorMessage: storableText(why.info.Message), Deliveries: c.deliveries,
	}
	if c.sagaCause != nil && why.reason == ReasonCompensationFailed {
		// The undo's error is the dead job's; the failure that started the
		// compensation stays with it.
		runErr.ForwardError = c.sagaCause
		p.ForwardError = c.sagaCause.json()
	}
	p.RunError = runErr.json()
	if why.info.Stack != "" {
		stack := storableText(why.info.Stack)
		p.Stack = &stack
	}
	if why.info.Step != "" {
		step := storableText(why.info.Step)
		p.StepName = &step
	}
	p.Seq = why.info.Seq
	if why.rec != nil {
		p.Attempts = why.rec.Attempts
		if why.rec.FirstFailedAt != nil {
			p.FirstFailedAt = *why.rec.FirstFailedAt
		}
	}
	c.log.Warn("run parked as dead", "reason", why.reason, "error_class", why.info.Class, "error", why.info.Message)
	c.close(store.RunDead, c.do(func(ctx context.Context) error {
		return store.ParkRun(ctx, c.e.pool, c.fence(), rec, p)
	}))
}
