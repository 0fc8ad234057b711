package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pgdurable/pgdurable/engine/internal/queue"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// writeTimeout bounds a record write. Writes use a context detached from
// the delivery's, so a shutdown does not lose a finished step's record.
const writeTimeout = 15 * time.Second

// busyRetry is how long a ticket that found every worker busy for
// slotWait waits before River delivers it again.
const busyRetry = 100 * time.Millisecond

// slotWait is how long a ticket River fetched waits for one of the
// process's workers before it goes back to River: about a second, so a
// ticket that a busy process fetched (River counts only its own running
// tickets, not runs started here) reaches an idle process within about a
// second of that process asking for work, as a held run does.
const slotWait = holdBudget

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
// started itself share (see planStart), for at most slotWait (and half a
// lease: a ticket River fetched and that waited longer would look
// abandoned to the orphan sweep); then it goes back to River, for a
// process with a free worker.
func (e *Engine) deliver(ctx context.Context, runID uuid.UUID) error {
	select {
	case e.slots <- struct{}{}:
	default:
		wait := time.NewTimer(min(slotWait, e.cfg.LeaseDuration/2))
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
		return e.missed(ctx, runID, miss)
	}
	return e.runClaimed(ctx, claimed, token, sent)
}

// runClaimed runs a delivery that claimed a run under token at sent: it
// moves the run to the latest version (AutoUpgrade), hands it back when
// this process does not register its version, else executes it.
func (e *Engine) runClaimed(ctx context.Context, claimed *store.ClaimedRun, token uuid.UUID, sent time.Time) error {
	runID := claimed.RunID
	log := e.log.With("run_id", runID, "workflow", claimed.WorkflowName, "workflow_id", claimed.WorkflowID)
	wf, upgrade, ok := e.deliveryVersion(claimed.WorkflowName, claimed.WorkflowVersion)
	if upgrade {
		moved, err := store.UpgradeRunVersion(context.WithoutCancel(ctx), e.db, store.Fence{RunID: runID, Token: token}, wf.version)
		if err != nil {
			return err // the database failed: River retries the ticket
		}
		if !moved {
			// The claim was lost (swept, or taken with a PostgreSQL crash):
			// River's retry claims the run again or finds it leased.
			return fmt.Errorf("pgdurable: run %s: claim lost before its move to version %d", runID, wf.version)
		}
		log.Info("run moved to the latest version of its workflow (WorkflowOpts.AutoUpgrade)",
			"workflow_version", wf.version, "was_version", claimed.WorkflowVersion)
		claimed.WorkflowVersion, claimed.VersionWaitSince = wf.version, nil
	}
	if !ok {
		retry := unknownWorkflowRetry(queue.Snoozes(ctx))
		since, err := e.releaseUnregistered(context.WithoutCancel(ctx), claimed, token)
		if err != nil {
			return err
		}
		e.logVersionWait(log, claimed, since, retry)
		return queue.Snooze(retry)
	}
	return e.execute(ctx, wf, claimed, token, sent)
}

// logVersionWait tells the operator about a run handed back for a process
// that registers its version, waiting since since: an error once it waited
// Config.VersionWaitAlert (no process of that version is running, or none
// has taken it for that long), else, as is routine in a rolling deploy, an
// info line. Each at most once every few minutes per workflow version, and
// once every 10 s in all: many versions waiting at once make a few lines,
// and the metrics count them all.
func (e *Engine) logVersionWait(log *slog.Logger, claimed *store.ClaimedRun, since time.Time, retry time.Duration) {
	key := fmt.Sprintf("%s v%d", claimed.WorkflowName, claimed.WorkflowVersion)
	waited := e.now().Sub(since)
	if alert := e.cfg.VersionWaitAlert; alert > 0 && !since.IsZero() && waited >= alert {
		if e.warnOnce("overdue "+key, 10*time.Minute) && e.warnOnce("overdue version waits", 10*time.Second) {
			log.Error("run has waited too long for a process that registers its workflow version; start one (its waiting runs go on at once), "+
				"or one whose latest version of the workflow sets WorkflowOpts.AutoUpgrade",
				"workflow_version", claimed.WorkflowVersion, "waiting_since", since, "waited", waited.Round(time.Second).String(),
				"alert_after", alert.String(), "registered", e.registeredNames())
		}
		return
	}
	if e.warnOnce(key, time.Minute) && e.warnOnce("version waits", 10*time.Second) {
		log.Info("workflow version not registered in this process; handing its runs back for a process that registers it",
			"workflow_version", claimed.WorkflowVersion, "retry_in", retry.String(), "registered", e.registeredNames())
	}
}

// endVersionWait clears the wait for a process that registers the run's
// version, now that one (this) holds it under token. A failure is logged
// and leaves the run to run: the next delivery clears it.
func (e *Engine) endVersionWait(log *slog.Logger, claimed *store.ClaimedRun, token uuid.UUID) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	if err := store.ClearVersionWait(ctx, e.db, store.Fence{RunID: claimed.RunID, Token: token}); err != nil {
		log.Warn("clearing the run's wait for a process of its version failed; it still shows as waiting", "error", err)
		return
	}
	log.Info("run picked up by a process that registers its workflow version",
		"workflow_version", claimed.WorkflowVersion, "waited", e.now().Sub(*claimed.VersionWaitSince).Round(time.Millisecond).String())
}

// releaseUnregistered gives back the claim (under token) of a run whose
// workflow version this process does not register, and returns since when
// the run has waited for a process that does. In the same transaction, a
// run whose cancellation was requested and that no delivery ever ran ends
// cancelled: nothing of it ran, so nothing is to undo, and it would wait
// for a process of its version only to end so. For a child (the parent's
// row locked first, as every end of a child does): CancelChildren saw it
// claimed and only asked for its cancellation; it ends now and wakes its
// parent, as a cancelled child that never started does.
func (e *Engine) releaseUnregistered(ctx context.Context, claimed *store.ClaimedRun, token uuid.UUID) (since time.Time, err error) {
	// Always in a transaction with the end of a cancelled unstarted run:
	// a cancel requested while this claim was held (after the claim read
	// the run) is acted on now, not at the next hand-back.
	fence := store.Fence{RunID: claimed.RunID, Token: token}
	p := claimed.Parent
	var ended bool
	err = e.inTx(ctx, nil, func(tx pgx.Tx) error {
		if p != nil {
			if err := store.LockRun(ctx, e.on(tx), p.RunID); err != nil {
				return err
			}
		}
		var err error
		if since, err = store.ReleaseUnregistered(ctx, e.on(tx), fence, e.now()); err != nil {
			return err
		}
		if ended, err = store.EndCancelledUnstarted(ctx, e.on(tx), claimed.RunID, cancelledJSON(), e.now()); err != nil || !ended || p == nil {
			return err
		}
		woken, err := store.WakeParent(ctx, e.on(tx), p.RunID, p.Seq)
		if err != nil || !woken {
			return err
		}
		return e.queue.Enqueue(ctx, tx, p.RunID, time.Time{})
	})
	if err == nil && ended {
		if p != nil {
			e.log.Info("child run cancelled before any delivery ran it", "run_id", claimed.RunID, "parent_run_id", p.RunID)
		} else {
			e.log.Info("run cancelled before any delivery ran it, while it waited for a process of its workflow version", "run_id", claimed.RunID)
		}
		e.notifyEnded(claimed.RunID)
	}
	return since, err
}

// execute runs the workflow function for a delivery that holds the run's
// lease under token (claimed at sent), and records how it ended. A non-nil
// result fails the delivery's River ticket so River tries it again.
func (e *Engine) execute(ctx context.Context, wf registered, claimed *store.ClaimedRun, token uuid.UUID, sent time.Time) error {
	defer func(began time.Time) { e.deliveryTime.add(time.Since(began)) }(time.Now())
	runID := claimed.RunID
	log := e.log.With("run_id", runID, "workflow", claimed.WorkflowName, "workflow_id", claimed.WorkflowID)
	ctx, span := e.tr.deliver(ctx, claimed, sent)
	defer span.End()
	dctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	fwd, cancelFwd := context.WithCancelCause(dctx)
	defer cancelFwd(nil)
	d := &delivery{
		ctx: dctx, cancel: cancel, fwd: fwd, cancelFwd: cancelFwd, e: e, wf: wf, runID: runID,
		workflowID: claimed.WorkflowID, token: token, log: log, pos: newPositions(claimed.Steps), lastRecorded: -1,
		claimedAt: sent, deliveries: claimed.Deliveries, deadline: claimed.Deadline, parent: claimed.Parent,
		runTimeout: claimed.RunTimeout, traceContext: claimed.TraceContext,
	}
	for i := range claimed.Steps {
		if claimed.Steps[i].Kind == string(KindChild) {
			d.hasChildren = true
			break
		}
	}
	if claimed.FlowQueue != "" {
		e.mu.Lock()
		if q := e.flowQueues[claimed.FlowQueue]; q != nil {
			d.queue = q.admitter
		}
		e.mu.Unlock()
	}
	d.handle = &Context{Context: dctx, d: d}
	d.extendedAt(sent)
	e.live.Store(runID, d)
	defer e.live.CompareAndDelete(runID, d)
	d.noteCancel(claimed.CancelRequested)
	stopHeartbeat := e.heartbeat(d)
	defer stopHeartbeat()
	if claimed.VersionWaitSince != nil {
		e.endVersionWait(log, claimed, token)
	}

	if died := claimed.StalledDeliveries - 1; crashLoop(died, claimed.LongStalled, e.cfg.MaxDeliveries) {
		why := &parkReason{reason: ReasonCrashLoop, attempts: died, info: &ErrorInfo{
			Class: ClassCrashLoop,
			Message: fmt.Sprintf("%d consecutive deliveries ended without recording progress (worker crashed or was killed), "+
				"%d of them within their first lease; MaxDeliveries is %d",
				died, max(died-claimed.LongStalled, 0), e.cfg.MaxDeliveries),
		}}
		if rec := d.pos.last(); rec != nil && rec.Status != store.StepCompleted {
			// The latest record is unsettled: the step the deliveries died in.
			why.info.Step, why.info.Seq = rec.Name, &rec.Seq
		}
		d.park(nil, why)
		return nil
	}
	defer d.dropChain()
	out, p, err := d.runWorkflow(claimed.Input)
	d.stopBranches()
	if !d.ended && !d.settleChain() {
		return d.ticketErr
	}
	d.finish(out, err, p)
	return d.ticketErr
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

// missingRunSnoozes bounds how long a ticket waits for its run to become
// visible (missingRunRetry's backoff): 20 ms doubling to 30 s, about ten
// minutes in all.
const missingRunSnoozes = 30

// leasedRunSnoozes bounds, on Citus, how long a ticket that finds its run
// leased by another delivery waits for a write that may have released it
// (see missed): 20 ms doubling, 1.3 s in all, the two-phase commit's
// window many times over. Most such tickets are duplicates, which would
// otherwise each try to claim the run 30 times over ten minutes.
const leasedRunSnoozes = 6

// missingRunRetry is the wait before the (n+1)th look for a ticket's run.
func missingRunRetry(n int) time.Duration {
	return min(20*time.Millisecond<<min(n, 11), 30*time.Second)
}

// missed handles a ticket that found the run not claimable.
func (e *Engine) missed(ctx context.Context, runID uuid.UUID, m *store.ClaimMiss) error {
	// On a cluster (Citus) a ticket can also be visible before the write
	// that made it due: a wake, a hand-back or a sweep writes the run on a
	// worker node and the ticket on the coordinator in one two-phase
	// commit, which commits the coordinator first and the worker node's
	// prepared part after it (milliseconds later, or, when the node failed
	// in between, once it is back). The ticket then finds the run as it
	// was (waiting, leased, dead): it waits for the write as for a missing
	// run, rather than leave the run due without a ticket. A run closed
	// for good never becomes due again.
	citus, err := store.OnCitus(ctx, e.db)
	if err != nil {
		return err
	}
	early := func() error {
		limit := missingRunSnoozes
		if m.Leased {
			limit = leasedRunSnoozes
		}
		if n := queue.Snoozes(ctx); n < limit {
			return queue.Snooze(missingRunRetry(n))
		}
		return nil
	}
	switch {
	case m.NotExists:
		// On a cluster (Citus) a run's row and its ticket commit on
		// different nodes, and two-phase commit makes the ticket visible
		// first, or, when a node fails mid-commit, until that node is back
		// and Citus's recovery commits the run: wait for the run rather
		// than complete a ticket whose run may yet appear. A run deleted
		// for good (retention, a discarded dead job) drops its ticket after
		// about ten minutes of backoff.
		n := queue.Snoozes(ctx)
		if n < missingRunSnoozes {
			return queue.Snooze(missingRunRetry(n))
		}
		if e.warnOnce("missing run tickets", 10*time.Second) {
			e.log.Warn("dropping a delivery ticket whose run has not existed for ten minutes (deleted, or never committed)",
				"run_id", runID, "snoozes", n)
		}
		return nil
	case m.Leased && !citus:
		// Duplicates end here; a live lease holder that dies is covered by
		// the sweeper, which enqueues a new ticket.
		return nil
	case m.WakeAt != nil && m.WakeAt.After(e.now()) && RunStatus(m.Status).active():
		// An early ticket (clock skew, a duplicate): wait until due rather
		// than drop it, so no waiting run is ever left without a ticket.
		return queue.Snooze(max(m.WakeAt.Sub(e.now()), 10*time.Millisecond))
	case m.FlowQueue != "" && RunStatus(m.Status).active() && !m.Leased:
		// Its queue's admission claims it: the ticket's work is to make it
		// ready (a failure fails the ticket, which River retries) and have
		// this process admit. A run ready already (the lease sweep makes
		// a run ready as it sends its ticket) still needs the admission.
		if _, err := store.MarkReady(context.WithoutCancel(ctx), e.db, runID, m.FlowQueue, e.now()); err != nil {
			return err
		}
		e.pokeQueue(m.FlowQueue)
		return nil
	case m.WakeAt != nil && RunStatus(m.Status).active() && !m.Leased:
		return queue.Snooze(max(m.WakeAt.Sub(e.now()), 10*time.Millisecond))
	case citus && !RunStatus(m.Status).closed():
		return early()
	}
	return nil
}

// runWorkflow calls the workflow function, recovering a panic.
func (d *delivery) runWorkflow(input []byte) (out []byte, p *panicInfo, err error) {
	defer func() {
		if r := recover(); r != nil {
			p = &panicInfo{value: r, stack: debug.Stack()}
		}
	}()
	out, err = d.wf.run(d.handle, input)
	return out, nil, err
}

// finish records how the workflow function ended, unless the delivery has
// already handed the run back.
func (d *delivery) finish(out []byte, err error, p *panicInfo) {
	if d.ended {
		return
	}
	var poison *errPoisonInput
	var unserializable *errUnserializableOutput
	var next *continueAsNewError
	errors.As(err, &next)
	switch {
	case p != nil:
		info := newErrorInfo(&PanicError{Value: fmt.Sprint(p.value)}, ClassPanic)
		info.Message = "panic in workflow code: " + info.Message
		info.Stack = truncateStack(p.stack)
		d.log.Error("workflow panicked", "error_class", ClassPanic, "panic", info.Message)
		d.park(nil, &parkReason{reason: ReasonPanic, info: info})
	case d.ctx.Err() != nil:
		d.interrupted()
	case errors.As(err, &poison):
		d.park(nil, &parkReason{reason: ReasonPoisonInput, info: newErrorInfo(err, ClassPoisonInput)})
	case errors.As(err, &unserializable):
		class := ClassUnserializable
		if errors.Is(err, ErrOutputTooLarge) {
			class = ClassOutputTooLarge
		}
		d.park(nil, &parkReason{reason: ReasonPermanentError, info: newErrorInfo(err, class)})
	case d.cancelRequested.Load():
		d.compensate(StatusCancelled, d.cancelInfo())
	case (err == nil || next != nil) && d.pos.replaying():
		d.parkUnreplayed("workflow returned")
	case next != nil:
		if !d.closeChildren(closeCancels, closeWaits) {
			return
		}
		d.continueAsNew(next.input)
	case err == nil:
		if !d.closeChildren(closeCancels, closeWaits) {
			return
		}
		d.close(StatusCompleted, d.finishRun(StatusCompleted, out, nil))
		d.log.Debug("run completed")
	default:
		info := newErrorInfo(err, ClassWorkflow)
		var se *StepError
		if errors.As(err, &se) {
			info.Class, info.Step, info.Seq, info.Attempt = se.Class, se.Step, &se.Seq, se.Attempt
		}
		if d.hasCompensations() {
			d.compensate(StatusCompensated, info)
			return
		}
		if !d.closeChildren(closeCancels, closeWaits) {
			return
		}
		d.close(StatusFailed, d.finishRun(StatusFailed, nil, info.json()))
		d.log.Info("run failed", "error_class", info.Class, "error", info.Message)
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
func (d *delivery) do(write func(ctx context.Context) error) error {
	return d.retryWrite(write, true)
}

// doOnce is do for a write that must not run twice if its first try may
// have committed (taking a signal): it retries only what certainly rolled
// back.
func (d *delivery) doOnce(write func(ctx context.Context) error) error {
	return d.retryWrite(write, false)
}

func (d *delivery) retryWrite(write func(ctx context.Context) error, idempotent bool) error {
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), writeTimeout)
		err := write(ctx)
		cancel()
		transient, ambiguous := store.IsTransient(err)
		if !transient || (ambiguous && !idempotent) || try == writeRetries || d.leaseLeft() <= 0 {
			return err
		}
		d.log.Warn("record write failed; trying it again", "error", err, "try", try+2)
		time.Sleep(writeRetryBackoff << try)
	}
}

// end marks the delivery over after a terminal write returned err.
func (d *delivery) end(err error) {
	if store.IsDataError(err) && !d.unstorable {
		// PostgreSQL refuses a record for its data: every delivery would
		// fail the same way until the run is parked as a crash loop, with
		// the cause lost. Park it now without that record, saying why.
		d.unstorable = true
		d.buf.take() // the refused record, most likely; parked without it
		d.log.Error("PostgreSQL refused a record of this run; parking it", "error", err)
		d.park(nil, &parkReason{reason: ReasonPermanentError, info: &ErrorInfo{Class: ClassUnserializable,
			Message: "PostgreSQL refused a record of this run: " + err.Error()}})
		return
	}
	d.ended = true
	d.endErr = errDeliveryEnded
	switch {
	case errors.Is(err, errReplayStopped):
		d.endErr = err // Replay reads where; the scratch run is left as it is
	case errors.Is(err, store.ErrLeaseLost):
		d.endErr = ErrLeaseLost
		d.e.obs.LeaseLost(LeaseLostEvent{Workflow: d.wf.name})
		d.log.Warn("lease lost; this delivery stops", "error_class", "lease_lost")
		d.rescueUnowned()
	case errors.Is(err, errChainLost) && d.handBack(nil, StatusPending, time.Time{}, false) == nil:
		// Nothing of the chained steps committed: the run goes back to its
		// queue at once, for a delivery that runs them again.
		d.log.Warn("chained tx steps rolled back; run handed back", "error", err)
	case err != nil:
		// The record is not written. If the claim survived, the lease
		// expires and the sweep hands the run to another delivery, which
		// replays from the records. If a database crash took the claim
		// with it (it commits asynchronously), no lease is left to expire:
		// failing the ticket makes River retry it, and that retry claims
		// the run, or finds it leased and leaves it to the sweep.
		d.endErr = fmt.Errorf("pgdurable: writing records of run %s: %w", d.runID, err)
		d.ticketErr = d.endErr
		d.log.Error("write failed; run will be redelivered", "error", err)
	}
	d.cancel(d.endErr)
}

// rescueUnowned gives the run a new ticket when the lost lease belongs to
// nobody: the claim was lost in a PostgreSQL crash (it commits
// asynchronously), so no other delivery holds the run and the ticket that
// brought this one is about to complete. Usually another delivery holds the
// run and nothing is written.
func (d *delivery) rescueUnowned() {
	err := d.do(func(ctx context.Context) error {
		return d.e.txn(ctx, func(tx pgx.Tx) error {
			unowned, err := store.ReenqueueUnowned(ctx, d.e.on(tx), d.runID)
			if err != nil || !unowned {
				return err
			}
			d.log.Warn("run held by no delivery after a lost lease (a claim lost in a database crash); re-enqueued")
			return d.e.queue.Enqueue(ctx, tx, d.runID, time.Time{})
		})
	})
	if err != nil {
		// Neither sweep sees an unowned run whose ticket completed: fail
		// the ticket so River retries it.
		d.log.Error("re-enqueueing an unowned run failed; River retries its ticket", "error", err)
		d.ticketErr = err
	}
}

// close ends the delivery after the run's terminal write, which returned
// err; the run ended with status when err is nil.
func (d *delivery) close(status RunStatus, err error) {
	d.end(err)
	if err == nil {
		d.e.obs.RunEnded(RunEndedEvent{RunID: d.runID, Workflow: d.wf.name, Status: status})
		d.e.notifyEnded(d.runID)
	}
}

// write records recs now (fenced, one round trip; see keepsLease for
// when it extends the lease).
// False when the delivery ended.
func (d *delivery) write(recs ...*store.StepRecord) bool { return d.writeStatus("", recs...) }

// writeStatus is write that also moves the run to status ("" unchanged).
func (d *delivery) writeStatus(status RunStatus, recs ...*store.StepRecord) bool {
	if !d.settleChain() { // the tx steps before come first
		return false
	}
	sent := time.Now()
	w := &store.RecordWrite{Fence: d.fence(), Records: recs, Status: string(status), KeepLease: d.keepsLease()}
	res, err := d.commit(w)
	if err != nil {
		d.end(err)
		return false
	}
	if !w.KeepLease || status != "" {
		d.extendedAt(sent)
		d.progressed.Store(true)
	}
	d.noteCancel(res.CancelRequested)
	return true
}

// keepsLease reports whether the next record write may leave the run row
// as it is (store.RecordWrite.KeepLease): once this delivery's progress is
// in the row (its stalled-delivery counts reset by a write that extended
// the lease), a write extends the lease only when the lease is a
// heartbeat interval old, like the heartbeat, instead of on every step.
func (d *delivery) keepsLease() bool {
	lease := d.e.cfg.LeaseDuration
	// Never below half the lease: the check before each step renews one
	// with less left (see mayStartStep).
	return d.progressed.Load() && d.leaseLeft() > max(lease-d.e.cfg.HeartbeatInterval, lease/2)
}

// finishRun ends the run with a terminal status, writing the pending
// record with it.
func (d *delivery) finishRun(status RunStatus, output, errJSON []byte) error {
	w := &store.RecordWrite{Fence: d.fence(), Status: string(status), Finish: true, Output: output, Error: errJSON}
	w.Records = d.buf.takeWith(nil)
	if d.related() {
		return d.endTx(w, status)
	}
	_, err := d.commit(w)
	return err
}

// commit sends w through the engine's record writer, which commits it with
// the writes of other deliveries in flight, retrying a transient failure
// as do does. ErrLeaseLost when w's fence no longer holds.
func (d *delivery) commit(w *store.RecordWrite) (store.WriteResult, error) {
	d.writeMu.Lock()
	defer d.writeMu.Unlock()
	var res store.WriteResult
	tries := 0
	err := d.do(func(context.Context) error {
		if tries++; tries > 1 {
			// The earlier try may have committed: upsert this time.
			for _, r := range w.Records {
				r.Fresh = false
			}
		}
		o := d.e.records.Do(w)
		if o.Err != nil {
			return o.Err
		}
		if res = o.Res; !res.Landed {
			return store.ErrLeaseLost
		}
		return nil
	})
	return res, err
}

// fence is this delivery's right to write the run's records, with the
// changes its records carry (see delivery.patchAt).
func (d *delivery) fence() store.Fence {
	f := store.Fence{RunID: d.runID, Token: d.token, Lease: d.e.cfg.LeaseDuration}
	if d.hasPatches.Load() {
		f.Patches = d.patchesAt
	}
	return f
}

// patchesAt is the changes the records of position seq carry (nil: none).
func (d *delivery) patchesAt(seq int) *string {
	d.patchMu.Lock()
	defer d.patchMu.Unlock()
	return d.patchAt[seq]
}

// pendPatch notes that the run took change id at position seq, which no
// step has taken yet: the step that takes it records the change. Every
// call counts, the same ID again too: written as markers of their own
// (see markPendingPatches), each call replays its own.
func (d *delivery) pendPatch(seq int, id string) {
	if len(d.patchIDs) == 0 || d.patchNext != seq {
		d.patchNext, d.patchIDs = seq, nil
	}
	d.patchIDs = append(d.patchIDs, id)
}

// attachPatches gives position seq, just taken by a step, the changes
// pending for it (see pendPatch).
func (d *delivery) attachPatches(seq int) {
	if len(d.patchIDs) == 0 {
		return
	}
	if d.patchNext == seq {
		ids := strings.Join(d.patchIDs, "\n")
		d.patchMu.Lock()
		if d.patchAt == nil {
			d.patchAt = map[int]*string{}
		}
		d.patchAt[seq] = &ids
		d.patchMu.Unlock()
		d.hasPatches.Store(true)
	}
	d.patchIDs = nil
}

// mayStartStep is the check before a step's function runs: the delivery
// must not be interrupted and must still hold the lease. A flushed record
// proves the lease; without one (the first step of a delivery, after a
// replayed step, after a retry's record) the local lease view does, and
// when less than half of it is left (a paused process, a long stretch of
// workflow code) a fenced renewal settles it: one round trip, rare.
func (d *delivery) mayStartStep() bool {
	if d.ended {
		return false
	}
	if d.ctx.Err() != nil {
		d.interrupted()
		return false
	}
	if d.leaseLeft() > d.e.cfg.LeaseDuration/2 {
		return true
	}
	return d.renew()
}

// renew extends the lease with a fenced heartbeat; false when lost.
func (d *delivery) renew() bool {
	if err := d.beat(); err != nil {
		d.end(err)
		return false
	}
	return true
}

// beatIfDue sends a heartbeat unless one was sent less than gap ago, so
// that activity heartbeats and the lease heartbeat together write about
// once per HeartbeatInterval however often user code calls Heartbeat.
func (d *delivery) beatIfDue(gap time.Duration) error {
	now := time.Now().UnixNano()
	last := d.lastBeatSent.Load()
	if time.Duration(now-last) < gap || !d.lastBeatSent.CompareAndSwap(last, now) {
		return nil
	}
	return d.beat()
}

// beat is one fenced heartbeat: it extends the lease and picks up a
// cancellation request. Safe on any goroutine (the lease heartbeat, an
// activity's Heartbeat): on a lost lease it cancels the delivery's context
// and leaves ending the delivery to the workflow's goroutine.
func (d *delivery) beat() error {
	sent := time.Now()
	// The mark and a hand-back's undo of it must not interleave (see long).
	d.longMu.Lock()
	defer d.longMu.Unlock()
	// Nor a heartbeat and a record write of this delivery: with one of the
	// two in flight at a time, no run is in a heartbeat batch and a write
	// batch at once, so the batches never wait for each other's rows in
	// opposite orders (a deadlock PostgreSQL breaks only after a second,
	// failing both batches; at a 1 s lease that lost healthy runs' leases).
	d.writeMu.Lock()
	defer d.writeMu.Unlock()
	markLong := !d.long && time.Since(d.claimedAt) >= d.e.cfg.LeaseDuration
	o := d.e.beats.Do(store.Beat{Fence: d.fence(), MarkLong: markLong})
	cancelRequested, marked, err := o.Res.CancelRequested, o.Res.Marked, o.Err
	if err == nil && !o.Res.Landed {
		err = store.ErrLeaseLost
	}
	switch {
	case errors.Is(err, store.ErrLeaseLost):
		d.cancel(ErrLeaseLost)
		return err
	case err != nil:
		return err
	}
	d.extendedAt(sent)
	d.noteCancel(cancelRequested)
	d.long = d.long || marked
	return nil
}

// noteCancel cancels forward work once the run's cancellation is requested.
func (d *delivery) noteCancel(requested bool) {
	if requested && d.cancelRequested.CompareAndSwap(false, true) {
		d.cancelFwd(ErrCancelled)
		d.log.Info("run cancellation requested; forward steps stop, compensations run")
	}
}

// flush writes the pending record of the previous step. Recording lazily
// lets the last step's record share the run's completion statement, which
// saves one commit per run; nothing runs between a step and its record
// except deterministic workflow code.
func (d *delivery) flush() bool {
	rec := d.buf.take()
	if rec == nil {
		return true
	}
	return d.write(rec)
}

// flushStarted writes the pending record now when a row shows its step
// started (an activity's, a retried step's, one with a
// ScheduleToCloseTimeout's: their attempts are announced). The workflow
// calls it before it may wait long with the record unwritten (a tx step's
// transaction, a parallel step, a wait in place), so such an outcome is
// never held back behind the wait: a crash meanwhile would call the step
// again and report a lost attempt. A plain step's first record may wait:
// nothing shows it started, and a crash runs it again, as Step promises.
// False when the delivery ended.
func (d *delivery) flushStarted() bool {
	if d.ended {
		return false
	}
	if p := d.buf.pending; p == nil || p.Fresh && (!d.hasPatches.Load() || d.patchesAt(p.Seq) == nil) {
		return true
	}
	// Started, or carrying the changes the run took (Patched): a parallel
	// step's record, written apart, must never land at a later position
	// while this one is lost, where a replay would read the run as one
	// that took the old code.
	return d.flush()
}

// suspend hands the run back until wakeAt, writing rec (may be nil) and the
// next delivery's ticket in one transaction.
func (d *delivery) suspend(rec *store.StepRecord, wakeAt time.Time) {
	if !d.settleChain() {
		return
	}
	if rec != nil && d.buf.pending != nil && !d.flush() {
		return
	}
	if rec == nil {
		rec = d.buf.take()
	}
	status := StatusWaiting
	if d.compensating || d.cancelRequested.Load() {
		// An undo waits for its retry, or a cancelled run for the retry
		// that settles an activity: the run is compensating, which the
		// sweep wakes at wakeAt only (a waiting run it would wake at once,
		// for its cancellation).
		status = StatusCompensating
	}
	d.end(d.handBack(rec, status, wakeAt, true))
}

// interrupted ends a delivery whose context was cancelled: after a lost
// lease nothing more is written; after a shutdown the run is released at
// once for another worker instead of waiting for its lease to expire.
func (d *delivery) interrupted() {
	if d.ended || !d.settleChain() {
		return
	}
	if errors.Is(context.Cause(d.ctx), ErrLeaseLost) {
		d.end(store.ErrLeaseLost)
		return
	}
	rec := d.buf.take()
	cause := context.Cause(d.ctx)
	if cause == nil && d.e.draining.Load() {
		cause = errDraining
	}
	if cause == nil && d.queuePaused() {
		cause = errQueuePaused
	}
	d.log.Info("delivery interrupted; run handed back", "cause", cause)
	status := StatusPending
	if d.compensating {
		status = StatusCompensating
	}
	d.end(d.handBack(rec, status, time.Time{}, rec != nil))
}

// handBack gives up the lease with status, writing rec (may be nil). A
// waiting run gets no ticket now: the sweep enqueues one when wakeAt comes,
// so a waiting run holds no River job. A pending run (a shutdown handed it
// back) gets its ticket in the same transaction.
func (d *delivery) handBack(rec *store.StepRecord, status RunStatus, wakeAt time.Time, progress bool) error {
	if !d.settleChain() {
		return d.endErr
	}
	d.longMu.Lock() // a heartbeat in flight has marked the delivery, or will find the lease gone
	defer d.longMu.Unlock()
	return d.do(func(ctx context.Context) error {
		if !wakeAt.IsZero() {
			return store.SuspendRun(ctx, d.e.db, d.fence(), store.SuspendParams{Pending: rec, Status: string(status), WakeAt: &wakeAt,
				Progress: progress, WasLong: d.long})
		}
		return d.e.txn(ctx, func(tx pgx.Tx) error {
			if err := store.SuspendRun(ctx, d.e.on(tx), d.fence(), store.SuspendParams{Pending: rec, Status: string(status),
				Progress: progress, WasLong: d.long}); err != nil {
				return err
			}
			return d.e.queue.Enqueue(ctx, tx, d.runID, time.Time{})
		})
	})
}

// parkReason is why a run is parked, with the step record to write.
type parkReason struct {
	reason   DeadReason
	info     *ErrorInfo
	rec      *store.StepRecord // the failing step, if any
	attempts int               // the dead job's attempts when there is no rec
	// childRunID and childDeadJobID link a child_dead park to the child.
	childRunID, childDeadJobID *uuid.UUID
}

func parkNonDeterminism(seq int, name string, kind StepKind, rec *store.StepRecord) *parkReason {
	return &parkReason{reason: ReasonNonDeterminism, info: &ErrorInfo{
		Class: ClassNonDeterminism, Step: name, Seq: &seq,
		Message: fmt.Sprintf("step %d is recorded as %s %q but the workflow now calls %s %q; the code changed under a running workflow"+nondeterminismHint,
			seq, rec.Kind, rec.Name, kind, name),
	}}
}

// park marks the run dead with a dead_jobs row, writing rec (the failing
// step) or else the pending record in the same statement. It returns false
// only for a child_dead park whose child's dead job was replayed meanwhile:
// nothing is written, and the delivery goes on (it waits for the child).
func (d *delivery) park(rec *store.StepRecord, why *parkReason) bool {
	if !d.settleChain() {
		return true
	}
	if rec != nil && d.buf.pending != nil && !d.flush() {
		return true
	}
	if rec == nil {
		rec = d.buf.take()
	}
	now := d.e.now()
	runErr := *why.info
	runErr.Stack = "" // the stack lives in dead_jobs; keep the run's error short
	p := &store.Park{
		ID: uuid.Must(store.NewDeadJobID(d.runID)), Reason: string(why.reason), FirstFailedAt: now, LastFailedAt: now, Attempts: why.attempts,
		ErrorClass: storableText(string(why.info.Class)), ErrorMessage: storableText(why.info.Message), Deliveries: d.deliveries,
		ChildRunID: why.childRunID, ChildDeadJobID: why.childDeadJobID,
	}
	if d.sagaCause != nil && why.reason == ReasonCompensationFailed {
		// The undo's error is the dead job's; the failure that started the
		// compensation stays with it.
		runErr.ForwardError = d.sagaCause
		p.ForwardError = d.sagaCause.json()
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
	err := d.do(func(ctx context.Context) error {
		if !d.related() {
			return store.ParkRun(ctx, d.e.db, d.fence(), rec, p)
		}
		return d.e.txn(ctx, func(tx pgx.Tx) error {
			if err := d.lockParent(ctx, tx); err != nil {
				return err
			}
			if err := store.ParkRun(ctx, d.e.on(tx), d.fence(), rec, p); err != nil {
				return err
			}
			if why.childDeadJobID != nil {
				// The run's row is locked now, and a replay of the child
				// locks it first (see lockFamily): either the replay
				// committed before (the child runs again: no park), or it
				// comes after and finds this dead job to replay with it.
				if open, err := store.DeadJobOpen(ctx, d.e.on(tx), *why.childRunID, *why.childDeadJobID); err != nil || !open {
					return cmp.Or(err, errChildReplayed)
				}
			}
			return d.endRelated(ctx, tx, StatusDead)
		})
	})
	if errors.Is(err, errChildReplayed) {
		d.buf.pending = rec // nothing was written
		return false
	}
	if err == nil {
		d.log.Warn("run parked as dead", "reason", why.reason, "error_class", why.info.Class, "error", why.info.Message)
	}
	d.close(StatusDead, err)
	return true
}

// errQueuePaused is why a delivery handed its run back at a step boundary
// when its queue was paused.
var errQueuePaused = errors.New("pgdurable: the run's queue is paused: the run is handed back at a step boundary, and waits in its queue until it is resumed")

// queuePaused reports whether d's run is in a queue this process saw
// paused (see Admitter.Paused).
func (d *delivery) queuePaused() bool {
	return d.queue != nil && d.queue.Paused()
}

// errDraining is why a delivery that Stop ended at a step boundary handed
// its run back.
var errDraining = errors.New("pgdurable: Stop called: the run is handed back at a step boundary, for another worker")

// errChildReplayed rolls back a child_dead park whose child an operator
// replayed meanwhile.
var errChildReplayed = errors.New("the dead child was replayed")

// cancelInfo is the error a cancelled run ends with: its timeout's once
// its deadline passed (the sweep requested the cancellation), else
// ErrCancelled.
func (d *delivery) cancelInfo() *ErrorInfo {
	if d.deadline != nil && !d.e.now().Before(*d.deadline) {
		return newErrorInfo(&runTimeoutError{deadline: *d.deadline}, ClassTimeout)
	}
	return newErrorInfo(ErrCancelled, ClassCancelled)
}

// runTimeoutError is the error of a run cancelled at its deadline
// (StartOpts.RunTimeout): errors.Is finds ErrTimeout and ErrCancelled in
// it, live and once recorded.
type runTimeoutError struct{ deadline time.Time }

func (e *runTimeoutError) Error() string {
	return "run timeout: the run's deadline (StartOpts.RunTimeout from its first pick-up) passed at " +
		e.deadline.UTC().Format(time.RFC3339Nano) + "; it was cancelled"
}
func (e *runTimeoutError) Is(target error) bool {
	return target == ErrTimeout || target == ErrCancelled
}

// warnOnce reports whether to log, now, the warning key names: at most
// once per every per key (a run's unregistered workflow, met at every
// delivery).
func (e *Engine) warnOnce(key string, every time.Duration) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.warned == nil {
		e.warned = map[string]time.Time{}
	}
	if last, ok := e.warned[key]; ok && time.Since(last) < every {
		return false
	}
	e.warned[key] = time.Now()
	return true
}

// nondeterminismHint ends a nondeterminism dead job's message with what
// to do about it.
const nondeterminismHint = ": put the change behind engine.Patched, or ship it as a new workflow version " +
	"and replay this dead job onto one whose code replays these steps (engine dead replay ID --version N)"

// positions hands out a run's step positions in call order and holds the
// records earlier deliveries wrote, by position: a step whose position
// has a record replays it instead of running. Positions follow calls, not
// completions, so a replay lines up with the run that recorded it.
type positions struct {
	recorded []store.StepRecord // by seq; a hole (a position with no record) has an empty Name
	next     int                // the next step's position
}

// newPositions places steps (in seq order, as a claim loads them) at their
// positions. Parallel steps (Go) may leave holes: a later position
// recorded while an earlier one still ran when the delivery ended.
func newPositions(steps []store.StepRecord) positions {
	if n := len(steps); n == 0 || steps[n-1].Seq == n-1 {
		return positions{recorded: steps} // dense: the common case, no copy
	}
	recorded := make([]store.StepRecord, steps[len(steps)-1].Seq+1)
	for _, s := range steps {
		recorded[s.Seq] = s
	}
	return positions{recorded: recorded}
}

// take is the next step's position.
func (p *positions) take() int {
	seq := p.next
	p.next++
	return seq
}

// giveBack returns the position take just handed out, for a step that
// never started and left nothing recorded (a run's cancellation stopped
// it first): the undos take its place. Not when a later position is
// recorded (a parallel step left this one a hole): the position stays
// taken, so the steps after it replay at their own.
func (p *positions) giveBack() {
	if !p.replaying() {
		p.next--
	}
}

// skipForward moves past every recorded position that is not an undo's,
// before the undos run: a cancelled or failed replay may stop (at a hole
// a parallel step left) before steps that an earlier delivery recorded
// after it, and the undos' positions follow the last forward record, as
// they did in the delivery that recorded them.
func (p *positions) skipForward() {
	for i := len(p.recorded) - 1; i >= p.next; i-- {
		if r := p.at(i); r != nil && r.Kind != string(KindCompensation) {
			p.next = i + 1
			return
		}
	}
}

// at is position seq's record from an earlier delivery, nil for a
// position no delivery recorded.
func (p *positions) at(seq int) *store.StepRecord {
	if seq < 0 || seq >= len(p.recorded) || p.recorded[seq].Name == "" {
		return nil
	}
	return &p.recorded[seq]
}

// replaying reports whether the next position is recorded.
func (p *positions) replaying() bool { return p.next < len(p.recorded) }

// last is the newest record of an earlier delivery, nil for none.
func (p *positions) last() *store.StepRecord { return p.at(len(p.recorded) - 1) }

// replay looks position seq up for a step of kind named name: the record
// an earlier delivery wrote there, or nil for a new step. Every kind of
// step goes through it (step, tx step, activity, sleep, signal, undo).
// A record of another name or kind means the workflow's code changed under
// the run: the run is parked as nondeterminism and ok is false.
func (d *delivery) replay(seq int, name string, kind StepKind) (rec *store.StepRecord, ok bool) {
	rec = d.pos.at(seq)
	if rec != nil && (rec.Name != name || rec.Kind != string(kind)) {
		d.park(nil, parkNonDeterminism(seq, name, kind, rec))
		return nil, false
	}
	return rec, true
}

// sameInput reports whether step name, at position seq, has the input its
// record rec was written with (see StepOpts.Input); when not, the run is
// parked as nondeterminism and false returned (hash is the step's
// StepOpts.Input hash). A record or step without
// an input hash is not checked.
func (d *delivery) sameInput(seq int, name string, hash *int64, rec *store.StepRecord) bool {
	if rec == nil || rec.InputHash == nil || hash == nil || *rec.InputHash == *hash {
		return true
	}
	d.park(nil, &parkReason{reason: ReasonNonDeterminism, info: &ErrorInfo{Class: ClassNonDeterminism, Step: name, Seq: &seq,
		Message: fmt.Sprintf("step %d %q is recorded with another input (hash %016x) than the workflow now gives it (hash %016x): "+
			"steps of this name were reordered, or their input is computed otherwise; the code changed under a running workflow"+nondeterminismHint,
			seq, name, uint64(*rec.InputHash), uint64(*hash))}})
	return false
}

// parkUnreplayed parks a run whose workflow function (or compensation)
// returned (what) before calling every recorded step: the code changed
// under the run.
func (d *delivery) parkUnreplayed(what string) {
	d.park(nil, &parkReason{reason: ReasonNonDeterminism, info: &ErrorInfo{Class: ClassNonDeterminism,
		Message: fmt.Sprintf("%s after %d steps but %d are recorded", what, d.pos.next, len(d.pos.recorded))}})
}
