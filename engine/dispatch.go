package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/engine/internal/store"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

// How a start reaches a worker.
type startPath int

const (
	// viaRiver: a River job delivers the run to whichever process fetches
	// it first.
	viaRiver startPath = iota
	// dispatchNow: the run is inserted already claimed by this process and
	// executes here at once, in a worker slot the start took.
	dispatchNow
	// holdLocal: every worker here is busy; the run is inserted pending
	// without a River job, held in this process's memory, and runs here as
	// soon as a worker frees up (see pumpHeld). The hold lasts
	// LeaseDuration: a run still held then (this process died, or is
	// still busy) gets a River job from the sweep.
	holdLocal
)

// A process holds a run only while the runs it already holds would start
// within about holdBudget: a run that would wait longer goes to River,
// which shares the backlog with the other processes (each of which would
// hold it no longer). How long the held runs would wait is estimated from
// what is known of this process's deliveries: how long they took (see
// deliveryTime), or, when the ones running now have all run longer than
// that, how long they have run so far (the estimate is wrong: the work
// got slower). MaxWorkers of them free up per that time. Nothing is held
// before a delivery has ended (an unknown duration counts against
// holding: a run of a workflow whose steps block would sit here while
// another process idles), and at most maxHeldPerWorker × MaxWorkers runs
// however fast they are (a held run costs about 100 bytes of memory). A
// held run is due to start when the estimate said; one still held when it
// has waited twice that long and holdBudget more (the estimate was wrong:
// the workers stayed busy) is handed to River, where an idle process
// takes it (see releaseOverdue). The estimate lags a change of workload
// (a burst of longer runs after shorter ones), hence the slack: with
// stuck workers the estimate is off by far more than twice.
const (
	holdBudget       = time.Second
	maxHeldPerWorker = 100
)

// startInterval is how often, by the estimate above, a worker of this
// process frees up for a held run; false before any delivery has ended.
func (e *Engine) startInterval() (time.Duration, bool) {
	d := e.deliveryTime.get()
	if d <= 0 {
		return 0, false
	}
	if youngest, ok := e.youngestDelivery(); ok && youngest > d {
		d = youngest
	}
	return max(d/time.Duration(e.cfg.MaxWorkers), time.Nanosecond), true
}

// maxHeld is how many runs this process may hold now.
func (e *Engine) maxHeld() int {
	per, ok := e.startInterval()
	if !ok {
		return 0
	}
	return int(min(holdBudget/per, time.Duration(maxHeldPerWorker*e.cfg.MaxWorkers)))
}

// youngestDelivery is how long the youngest delivery this process runs
// has run; false when it runs none.
func (e *Engine) youngestDelivery() (time.Duration, bool) {
	var youngest time.Duration
	found := false
	e.live.Range(func(_, v any) bool {
		age := time.Since(v.(*delivery).claimedAt)
		if !found || age < youngest {
			youngest, found = age, true
		}
		return true
	})
	return youngest, found
}

// movingAverage is an exponentially weighted moving average of durations,
// safe for concurrent use: each new duration weighs 1/16.
type movingAverage struct {
	mu  sync.Mutex
	avg time.Duration
}

func (m *movingAverage) add(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.avg == 0 {
		m.avg = d
		return
	}
	m.avg += (d - m.avg) / 16
}

func (m *movingAverage) get() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.avg
}

// planStart decides how a run of workflow name started now (in tx, nil for
// the start's own transaction) reaches a worker. A run is executed by this
// process (dispatchNow or holdLocal) when the engine is started and not
// stopping and registers the workflow; never when started in the caller's
// transaction, which exists only once the caller commits, nor when delayed
// (StartOpts.StartAt: the sweep wakes it when due), nor when it is
// queued (a flow-controlled queue's admission claims it). For dispatchNow
// the caller holds a worker slot: dispatch releases it, and a start that
// does not dispatch after all must release it itself.
func (e *Engine) planStart(tx pgx.Tx, name string, version int, delayed, queued bool) (registered, startPath) {
	if tx != nil || delayed || queued || e.stopping.Load() {
		return registered{}, viaRiver
	}
	e.mu.Lock()
	wf, ok := e.versions[workflowKey{name, version}] // a version not registered here goes to one that registers it
	started := e.started
	e.mu.Unlock()
	if !ok || !started {
		return registered{}, viaRiver
	}
	select {
	case e.slots <- struct{}{}:
		return wf, dispatchNow
	default:
	}
	limit := e.maxHeld()
	e.heldMu.Lock()
	hold := len(e.held) < limit
	e.heldMu.Unlock()
	if hold {
		return wf, holdLocal
	}
	return registered{}, viaRiver
}

// newRun is a start's row: a new run ID and the workflow ID (the run's ID
// unless opts gives one), with the input's size and the ID checked.
func (e *Engine) newRun(ctx context.Context, name string, version int, input []byte, opts *StartOpts) (store.NewRun, error) {
	if len(input) > e.cfg.MaxPayloadBytes {
		return store.NewRun{}, e.tooLarge(name, len(input))
	}
	var workflowID string
	if opts != nil && opts.WorkflowID != "" {
		workflowID = opts.WorkflowID
		check := checkChosenWorkflowID
		if opts.engineMade {
			check = checkWorkflowID
		}
		if err := check(workflowID); err != nil {
			return store.NewRun{}, fmt.Errorf("%w: %v", ErrInvalidInput, err)
		}
	}
	startAt, err := opts.startAt(e.now())
	if err != nil {
		return store.NewRun{}, err
	}
	var tags []byte
	if opts != nil {
		if tags, err = checkTags("StartOpts.Tags", opts.Tags); err != nil {
			return store.NewRun{}, err
		}
	}
	e.mu.Lock()
	wf := e.versions[workflowKey{name, version}] // a version not registered here has no WorkflowOpts.Queue to read
	e.mu.Unlock()
	wf.name = name
	r, err := queueOf(wf, input, opts)
	if err != nil {
		return store.NewRun{}, err
	}
	r.WorkflowName, r.WorkflowVersion = name, version
	r.Input, r.Queue, r.ScheduleName, r.StartAt, r.RunTimeout, r.Tags = input, e.cfg.Queue, scheduleOf(opts), startAt, runTimeoutOf(opts), tags
	if opts != nil && opts.Debounce != nil {
		if err := opts.Debounce.apply(&r, opts, e.now()); err != nil {
			return store.NewRun{}, err
		}
	}
	// The run's route (one, on a single PostgreSQL): its workflow ID's;
	// for a start without one, the route of what it is deduplicated or
	// debounced by, which must find the runs that share it, else any.
	var routeKey string
	switch {
	case r.DebounceKey != "":
		routeKey = migrations.DebounceKey(name, r.DebounceKey)
	case r.DedupID != "":
		routeKey = migrations.DedupKey(r.FlowQueue, r.DedupID)
	}
	if routeKey != "" && workflowID != "" {
		routes, err := store.Routes(ctx, e.db)
		if err != nil {
			return store.NewRun{}, fmt.Errorf("pgdurable: starting %q: %w", name, err)
		}
		if routes > 1 {
			return store.NewRun{}, fmt.Errorf("%w: StartOpts.DeduplicationID (deduplication_id, --deduplication-id) with a WorkflowID (workflow_id, --id): with runs spread over %d routes, a deduplication ID finds the runs that share it only when it chooses the run's route, and a workflow ID chooses it; give one of them (a workflow ID alone deduplicates its starts)",
				ErrInvalidArgument, routes)
		}
	}
	runID, err := store.NewRunIDFor(ctx, e.db, name, workflowID, routeKey)
	if err != nil {
		return store.NewRun{}, fmt.Errorf("pgdurable: generating run ID: %w", err)
	}
	if workflowID == "" {
		workflowID = runID.String()
	}
	r.RunID, r.WorkflowID = runID, workflowID
	return r, nil
}

// route readies r for path: a run to dispatch is inserted claimed by this
// process, one to hold is inserted held.
func (e *Engine) route(r *store.NewRun, path startPath) {
	switch path {
	case dispatchNow:
		r.Claim = &store.Fence{RunID: r.RunID, Token: uuid.New(), Lease: e.cfg.LeaseDuration}
		if r.RunTimeout > 0 {
			deadline := e.now().Add(r.RunTimeout) // picked up now
			r.Deadline = &deadline
		}
	case holdLocal:
		r.Hold = e.cfg.LeaseDuration
	}
}

// afterStart hands a started run to its worker once its insert returned:
// a fresh run (inserted, not found existing) is dispatched or held as
// planned; a start that dispatches nothing gives back the slot it took.
func (e *Engine) afterStart(wf registered, path startPath, r store.NewRun, fresh bool, sent time.Time) {
	switch {
	case path == dispatchNow && fresh:
		e.dispatch(wf, &store.ClaimedRun{RunID: r.RunID, WorkflowName: r.WorkflowName, WorkflowVersion: r.WorkflowVersion,
			WorkflowID: r.WorkflowID, Input: r.Input, Deliveries: 1, StalledDeliveries: 1, Status: store.RunRunning,
			Deadline: r.Deadline, Parent: r.Parent, RunTimeout: r.RunTimeout, TraceContext: r.TraceContext}, r.Claim.Token, sent)
	case path == dispatchNow:
		e.releaseSlot()
	case path == holdLocal && fresh:
		e.hold(wf, r.RunID)
	case r.FlowQueue != "" && fresh && r.StartAt == nil:
		e.pokeQueue(r.FlowQueue)
	}
}

// heldRun is a run this process holds until a worker of its is free.
type heldRun struct {
	runID uuid.UUID
	wf    registered
	// overdue is when it has waited twice as long as the estimate said,
	// and holdBudget more: then it goes to River (see releaseOverdue).
	overdue time.Time
}

// track counts a delivery this process runs outside River, so that Stop
// waits for it; false once the engine is stopping.
func (e *Engine) track() bool {
	e.heldMu.Lock()
	defer e.heldMu.Unlock()
	if e.stopping.Load() {
		return false
	}
	e.dispatched.Add(1)
	return true
}

// dispatch executes a run this process inserted already claimed, on a
// goroutine of its own, in the worker slot the start took. No River job
// exists for it: if this process dies, the run's lease expires and the
// sweep gives it one.
func (e *Engine) dispatch(wf registered, claimed *store.ClaimedRun, token uuid.UUID, sent time.Time) {
	if !e.track() {
		// Stop began since the start planned this: hand the run to River.
		e.releaseSlot()
		e.handToRiver(claimed.RunID, token)
		return
	}
	go func() {
		defer e.dispatched.Done()
		defer e.releaseSlot()
		if err := e.execute(e.dispatchCtx, wf, claimed, token, sent); err != nil {
			// Without a ticket to fail, the lease expiring hands the run on.
			e.log.Warn("directly dispatched delivery failed; the run is redelivered when its lease expires",
				"run_id", claimed.RunID, "error", err)
		}
	}()
}

// handToRiver undoes the claim of a run this process inserted claimed but
// will not execute, and gives it a River job in the same transaction.
func (e *Engine) handToRiver(runID, token uuid.UUID) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	err := e.txn(ctx, func(tx pgx.Tx) error {
		if err := store.ReleaseUnclaimed(ctx, e.on(tx), store.Fence{RunID: runID, Token: token}); err != nil {
			return err
		}
		return e.queue.Enqueue(ctx, tx, runID, time.Time{})
	})
	if err != nil {
		e.log.Warn("handing a run to River failed; it is redelivered when its lease expires", "run_id", runID, "error", err)
	}
}

// hold queues a run inserted held (holdLocal) and runs it if a worker is
// free by now.
func (e *Engine) hold(wf registered, runID uuid.UUID) {
	per, _ := e.startInterval()
	e.heldMu.Lock()
	if e.stopping.Load() {
		// Stop began while the start was in flight, and may have released
		// the runs it held already: this one gets its River job now.
		e.heldMu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		defer cancel()
		e.releaseRuns(ctx, []uuid.UUID{runID})
		return
	}
	wait := time.Duration(len(e.held)+1) * per // the estimate's
	e.held = append(e.held, heldRun{runID: runID, wf: wf, overdue: time.Now().Add(2*wait + holdBudget)})
	if e.overdue == nil {
		e.overdue = time.AfterFunc(time.Until(e.held[0].overdue), e.releaseOverdue)
	}
	e.heldMu.Unlock()
	e.pumpHeld()
}

// releaseOverdue hands the runs held past their overdue time to River:
// the estimate that held them was wrong (this process's workers stayed
// busy), and a process with a free worker takes them from there. It runs
// when the first held run is overdue, and again while runs are held.
// Held runs are overdue in the order they were held, near enough: it
// looks at the oldest.
func (e *Engine) releaseOverdue() {
	e.heldMu.Lock()
	now := time.Now()
	n := 0
	for n < len(e.held) && !e.held[n].overdue.After(now) {
		n++
	}
	overdue := e.held[:n:n]
	e.held = e.held[n:]
	e.overdue = nil
	if len(e.held) > 0 && !e.stopping.Load() {
		e.overdue = time.AfterFunc(time.Until(e.held[0].overdue), e.releaseOverdue)
	}
	e.heldMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	e.releaseHeldRuns(ctx, overdue)
}

// releaseSlot frees a worker slot and gives it to a held run, if any. A
// River delivery waiting for a slot gets it first: the freed place in the
// channel goes to a blocked sender before pumpHeld can take it, so held
// runs never starve River's.
func (e *Engine) releaseSlot() {
	<-e.slots
	e.pumpHeld()
}

// pumpHeld starts held runs, oldest first, while worker slots are free.
func (e *Engine) pumpHeld() {
	for {
		e.heldMu.Lock()
		if len(e.held) == 0 || e.stopping.Load() {
			e.heldMu.Unlock()
			return
		}
		select {
		case e.slots <- struct{}{}:
		default:
			e.heldMu.Unlock()
			return
		}
		h := e.held[0]
		e.held = e.held[1:]
		e.dispatched.Add(1) // under heldMu, before stopping: see track
		e.heldMu.Unlock()
		go e.runHeld(h)
	}
}

// runHeld claims a held run and executes it. A run that is no longer
// claimable (its hold passed and another process took it, or it was
// finished) is skipped.
func (e *Engine) runHeld(h heldRun) {
	defer e.dispatched.Done()
	defer e.releaseSlot()
	token := uuid.New()
	sent := time.Now()
	claimed, miss, err := e.claim(h.runID, token)
	switch {
	case err != nil:
		e.log.Warn("claiming a held run failed; the sweep gives it a River job when its hold passes", "run_id", h.runID, "error", err)
		return
	case miss != nil:
		return
	}
	if err := e.execute(e.dispatchCtx, h.wf, claimed, token, sent); err != nil {
		e.log.Warn("delivery of a held run failed; the run is redelivered when its lease expires", "run_id", h.runID, "error", err)
	}
}

// releaseHeld gives the runs this stopping process still holds River jobs
// at once, rather than when their hold passes.
func (e *Engine) releaseHeld(ctx context.Context) {
	e.heldMu.Lock()
	held := e.held
	e.held = nil
	if e.overdue != nil {
		e.overdue.Stop()
		e.overdue = nil
	}
	e.heldMu.Unlock()
	e.releaseHeldRuns(ctx, held)
}

// releaseHeldRuns is releaseRuns for runs this process no longer holds.
func (e *Engine) releaseHeldRuns(ctx context.Context, held []heldRun) {
	if len(held) == 0 {
		return
	}
	ids := make([]uuid.UUID, len(held))
	for i, h := range held {
		ids[i] = h.runID
	}
	e.releaseRuns(ctx, ids)
}

// releaseRuns ends the hold on ids and gives them River jobs.
func (e *Engine) releaseRuns(ctx context.Context, ids []uuid.UUID) {
	err := e.txn(ctx, func(tx pgx.Tx) error {
		released, err := store.ReleaseHeld(ctx, e.on(tx), ids)
		if err != nil {
			return err
		}
		return e.queue.EnqueueMany(ctx, tx, released)
	})
	if err != nil {
		e.log.Warn("releasing held runs failed; the sweep gives them River jobs when their hold passes",
			"runs", len(ids), "error", err)
	}
}
