package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/flow"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// delivery is one delivery of a run: the executor. It holds the lease
// (token), replays the recorded steps, runs new ones, buffers their
// records and writes them fenced, and ends the delivery (completed,
// suspended, parked, handed back). Workflow code never sees it: it holds a
// *Context, a thin handle on it. Its fields belong to the workflow's
// goroutine except those that are atomic or guarded (the heartbeat and an
// activity's Heartbeat run on others).
//
// Where its parts live:
//   - executor.go: how a delivery starts (deliver, execute) and ends
//     (finish, suspend, handBack, park), its fenced writes, and the
//     positions with the one replay lookup every kind of step goes
//     through.
//   - step.go: a step's call (stepCall) and its replay (runStep);
//     attempt.go: the one attempt runner (stepState, execute, judge) and
//     the attempts of a step the workflow waits for (attemptLoop);
//     future.go: those of a parallel one (branch); step.go (TxStep),
//     activity.go, timer.go, signal.go and compensation.go build the calls
//     of each kind.
//   - records.go: records not yet written, and the batchers all
//     deliveries of a process write through (internal/groupcommit).
//   - this file: the lease's heartbeat; dispatch.go: worker slots, direct
//     dispatch and held runs; the sweep and the engine's other background
//     jobs are internal/maintenance's (Engine.maintainer builds them).
type delivery struct {
	// ctx is the delivery's context: cancelled (with the cause) when the
	// lease is lost, the delivery ends or the engine shuts down.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// handle is what the workflow function holds.
	handle *Context

	// fwd is the context forward steps run in: the delivery's, also
	// cancelled (cause ErrCancelled) once the run's cancellation is
	// requested. Compensations run in the delivery's own context.
	fwd             context.Context
	cancelFwd       context.CancelCauseFunc
	cancelRequested atomic.Bool
	compensations   []*compensation // registered undos, oldest first; under compMu (parallel steps register theirs)
	compMu          sync.Mutex
	parallelUndos   bool // a parallel step registered an undo (see undoOrder)
	compensating    bool // the undos are running
	// sagaCause is the failure (or cancellation) the undos run for, kept
	// with the run's error if an undo fails.
	sagaCause *ErrorInfo
	// deliveries counts this run's deliveries, this one included.
	deliveries int
	// deadline is when the run's timeout ends (StartOpts.RunTimeout), nil
	// for none.
	deadline *time.Time

	e          *Engine
	wf         registered
	queue      *flow.Admitter // the admitter of the run's queue, nil for none
	runID      uuid.UUID
	workflowID string
	token      uuid.UUID // the lease's fencing token
	log        *slog.Logger

	pos positions    // step positions and the records of earlier deliveries
	buf recordBuffer // records of finished steps not yet written
	// lastRecorded is the seq of the latest step that wrote its own record
	// (a tx step), -1 for none.
	lastRecorded   int
	lastRecordedAt time.Time // its record's completion time
	// chain is the transaction of the latest tx steps, open until the
	// run's next durable point (see txChain); nil for none.
	// Atomic: a record write that settles it may run on a parallel step's
	// goroutine, though a chain is never open while one runs.
	chain  atomic.Pointer[txChain]
	inStep atomic.Bool // a step is running: guards nested and concurrent Step calls

	// claimedAt is when this delivery took the lease (monotonic); once it
	// has lived a whole lease without progress, its next heartbeat counts
	// it as long-lived in the run row and sets long, for crash-loop
	// attribution (see crashLoop). longMu serializes that with a hand-back,
	// which undoes the mark.
	claimedAt time.Time
	longMu    sync.Mutex
	long      bool
	// lastBeatSent is when the latest heartbeat was sent (unix nanoseconds;
	// see beatIfDue).
	lastBeatSent atomic.Int64

	// progressed: a record write of this delivery updated the run row,
	// resetting its stalled-delivery counts (see keepsLease).
	// Atomic: parallel steps (Go) write from their own goroutines.
	progressed atomic.Bool
	// patches holds the changes (Patched) this delivery took fresh: the
	// IDs pending for the next position (patchNext, -1 for none) until a
	// step takes it, then the IDs of each position, which every record of
	// that position carries (store.Fence.Patches). Parallel steps' writes
	// read it, hence the mutex.
	patchMu    sync.Mutex
	patchAt    map[int]*string
	hasPatches atomic.Bool // patchAt is not empty
	patchNext  int
	patchIDs   []string
	// writeMu keeps one record write or heartbeat of this delivery in
	// flight: a batch of the record writer holds at most one write per
	// fence, and a run is never in a write batch and a heartbeat batch at
	// once (see beat). Taken after longMu.
	writeMu sync.Mutex

	// Parallel steps (future.go), set up by the first: a slot per step
	// running, a signal as one ends, their context (the forward steps', also cancelled when the
	// workflow function returns), the steps running, and the park of one
	// that panicked.
	branchSlots    chan struct{}
	branchEnded    chan struct{} // signalled as a parallel step ends (see pauseForBranches)
	branchCtx      context.Context
	cancelBranches context.CancelCauseFunc
	branches       sync.WaitGroup
	branchPark     atomic.Pointer[parkReason]

	// Child runs (child.go): the run's parent, if it is a child; whether
	// it started children (a record of kind child); the records of
	// children this delivery wrote (their start, their outcome), by
	// position; the children its end cancelled.
	parent         *store.ParentRef
	runTimeout     time.Duration // StartOpts.RunTimeout, for a ContinueAsNew's run
	traceContext   []byte        // the run's stored trace context, for a ContinueAsNew's run
	hasChildren    bool
	childRecs      map[int]*store.StepRecord
	closedChildren []uuid.UUID

	ended  bool  // this delivery has handed the run back; no more writes
	endErr error // what Step returns from now on
	// unstorable: a record was refused by PostgreSQL for its data and the
	// run is being parked (see end).
	unstorable bool
	// ticketErr fails the delivery's ticket so River retries it: set when
	// an unowned run could not be re-enqueued (see rescueUnowned).
	ticketErr error

	// leaseUntil is a conservative local view of the lease's expiry: the
	// monotonic time a fenced write that extended it was sent, plus
	// LeaseDuration. The database set a later expiry, so until then no other
	// delivery can hold the run.
	leaseUntil atomic.Pointer[time.Time]
}

// extendedAt records that a fenced write sent at sent extended the lease.
func (d *delivery) extendedAt(sent time.Time) {
	until := sent.Add(d.e.cfg.LeaseDuration)
	d.leaseUntil.Store(&until)
}

// leaseLeft is how much of the lease this delivery can count on.
func (d *delivery) leaseLeft() time.Duration { return time.Until(*d.leaseUntil.Load()) }

// heartbeat extends d's lease every Config.HeartbeatInterval while the
// delivery runs, unless a record write just did. It cancels the delivery
// with ErrLeaseLost once another delivery owns the run, and also once the local lease view runs out
// without a successful renewal (a partition, a paused process): past that
// point another delivery may hold the run, so this one must stop even
// before it can ask. The returned func stops it.
func (e *Engine) heartbeat(d *delivery) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		interval := e.cfg.HeartbeatInterval
		t := time.NewTimer(nextBeat(time.Now(), interval))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-d.ctx.Done():
				return
			case <-t.C:
				t.Reset(nextBeat(time.Now(), interval))
				left := d.leaseLeft()
				if left <= 0 {
					d.cancel(ErrLeaseLost)
					return
				}
				if left > interval+interval/2 {
					// A record write extended the lease lately: it still
					// has half an interval to spare at the next tick.
					continue
				}
				// An activity's Heartbeat may have just sent one.
				err := d.beatIfDue(interval / 2)
				switch {
				case errors.Is(err, store.ErrLeaseLost):
					return
				case err != nil:
					d.log.Warn("lease heartbeat failed", "error", err)
				}
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

// nextBeat is how long from now until the next heartbeat tick: ticks fall
// on multiples of interval of the wall clock, the same for every delivery
// of the process, so the deliveries that are due beat together and their
// heartbeats share one statement (see newBeatBatcher).
func nextBeat(now time.Time, interval time.Duration) time.Duration {
	return now.Truncate(interval).Add(interval).Sub(now)
}
