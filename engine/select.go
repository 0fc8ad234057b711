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

// MaxSelectCases bounds the cases of one Select.
const MaxSelectCases = 20

type selectKind int

const (
	caseFuture selectKind = iota + 1
	caseChild
	caseSignal
	caseTimer
)

// SelectCase is one thing Select waits for. Build it with OnFuture,
// OnChild, OnSignal or OnTimer.
type SelectCase struct {
	kind    selectKind
	d       *delivery
	ready   <-chan struct{} // a future's
	seq     int             // a child's position
	signal  string
	timeout time.Duration
	err     error // why the case is malformed
}

// OnFuture is ready when the parallel step f has its outcome (Get would
// not wait), whether it succeeded or failed.
func OnFuture[T any](f *Future[T]) SelectCase {
	if f == nil {
		return SelectCase{err: errors.New("OnFuture of a nil future")}
	}
	return SelectCase{kind: caseFuture, d: f.d, ready: f.done}
}

// OnChild is ready when the child run c has ended, however it ended, or
// is parked as dead (ChildRun.Get then parks this run with it, see Get).
func OnChild[T any](c *ChildRun[T]) SelectCase {
	if c == nil {
		return SelectCase{err: errors.New("OnChild of a nil child run")}
	}
	return SelectCase{kind: caseChild, d: c.d, seq: c.seq}
}

// OnSignal is ready when a signal named name is buffered for the run; if
// it wins, Select takes it (Selected.Payload), as AwaitSignal would.
func OnSignal(name string) SelectCase { return SelectCase{kind: caseSignal, signal: name} }

// OnTimer is ready once d has passed since the Select first ran (recorded
// before the Select waits, suspended or in place, so a replay or a later
// delivery keeps the same deadline). d must not be negative; 0 is ready
// at once.
func OnTimer(d time.Duration) SelectCase {
	if d < 0 {
		return SelectCase{err: fmt.Errorf("OnTimer %s is negative", d)}
	}
	return SelectCase{kind: caseTimer, timeout: d}
}

// Selected is what Select returns: the index of the case that won and,
// for an OnSignal case, the signal it took (its name and its payload as
// PostgreSQL's jsonb keeps it).
type Selected struct {
	Index   int
	Signal  string
	Payload json.RawMessage
}

// selectOutcome is a Select's record.
type selectOutcome struct {
	Index   int             `json:"index"`
	Signal  string          `json:"signal,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Select waits for the first of cases to be ready: parallel steps
// (OnFuture), child runs (OnChild), signals (OnSignal) and timers
// (OnTimer). When several are ready at once, the first in cases wins.
// The winner is recorded as a step of kind "select" named name, so every
// replay takes the same branch whatever has become ready since; a signal
// that wins is taken by the same transaction.
//
// While only durable cases remain (children, signals, timers), and no
// parallel step of the run is running, the run is suspended, holding
// nothing, until a child of the cases ends, a signal of the cases is sent
// or the earliest timer passes. While a future of the cases (or any other
// parallel step) is running, the delivery waits in place, and looks at
// the children and signals of the cases every 250 ms; a Select with a
// timer writes its start down first, so a redelivery (a deploy, a crash)
// keeps its deadline.
//
// cases holds 1 to MaxSelectCases cases of this run, with distinct signal
// names (ErrInvalidArgument otherwise, not recorded). Other errors:
// ErrCancelled (the run's cancellation was requested), or the error that
// ended the delivery, which the workflow should return.
func Select(ctx *Context, name string, cases ...SelectCase) (Selected, error) {
	d := ctx.d
	if err := checkName("select name", name, 200); err != nil {
		return Selected{}, fmt.Errorf("pgdurable: %w", err)
	}
	if len(cases) == 0 || len(cases) > MaxSelectCases {
		return Selected{}, fmt.Errorf("%w: Select %q has %d cases; it takes 1 to %d", ErrInvalidArgument, name, len(cases), MaxSelectCases)
	}
	seen := map[string]bool{}
	for i, c := range cases {
		switch {
		case c.err != nil:
			return Selected{}, fmt.Errorf("%w: Select %q case %d: %v", ErrInvalidArgument, name, i, c.err)
		case c.kind == 0:
			return Selected{}, fmt.Errorf("%w: Select %q case %d is empty; build cases with OnFuture, OnChild, OnSignal or OnTimer", ErrInvalidArgument, name, i)
		case c.d != nil && c.d != d:
			return Selected{}, fmt.Errorf("%w: Select %q case %d belongs to another run's Context", ErrInvalidArgument, name, i)
		case c.kind == caseSignal:
			if err := checkName("signal name", c.signal, 200); err != nil {
				return Selected{}, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
			}
			if seen[c.signal] {
				return Selected{}, fmt.Errorf("%w: Select %q names signal %q twice", ErrInvalidArgument, name, c.signal)
			}
			seen[c.signal] = true
		}
	}
	return d.selectCases(name, cases)
}

// First waits for the first of fs to have its outcome and returns its
// index and what its Get returns: Select over OnFuture cases, recorded as
// a step named name, then Get.
func First[T any](ctx *Context, name string, fs []*Future[T]) (int, T, error) {
	var zero T
	if len(fs) == 0 {
		return -1, zero, fmt.Errorf("%w: First %q of no futures", ErrInvalidArgument, name)
	}
	cases := make([]SelectCase, len(fs))
	for i, f := range fs {
		cases[i] = OnFuture(f)
	}
	sel, err := Select(ctx, name, cases...)
	if err != nil {
		return -1, zero, err
	}
	v, err := fs[sel.Index].Get(ctx)
	return sel.Index, v, err
}

// selectCases is Select once its cases are checked.
func (d *delivery) selectCases(name string, cases []SelectCase) (Selected, error) {
	seq, err := d.enterStep("select", name, false)
	if err != nil {
		return Selected{}, err
	}
	defer d.inStep.Store(false)
	rec, ok := d.replay(seq, name, KindSelect)
	if !ok {
		return Selected{}, d.endErr
	}
	startedAt := d.e.now()
	written := false
	if rec != nil {
		switch rec.Status {
		case store.StepCompleted:
			d.e.obs.StepReplayed(StepReplayedEvent{Workflow: d.wf.name, Kind: KindSelect})
			return decodeSelected(name, rec.Output)
		case store.StepCancelled:
			return Selected{}, ErrCancelled
		}
		written, startedAt = true, rec.StartedAt
	}
	var deadline *time.Time
	var childSeqs []int
	for _, c := range cases {
		switch c.kind {
		case caseTimer:
			if t := startedAt.Add(c.timeout); deadline == nil || t.Before(*deadline) {
				deadline = &t
			}
		case caseChild:
			childSeqs = append(childSeqs, c.seq)
		}
	}
	for {
		if d.cancelRequested.Load() {
			if !written {
				d.pos.giveBack()
				return Selected{}, ErrCancelled
			}
			now := d.e.now()
			d.buf.stopped = &store.StepRecord{Seq: seq, Name: name, Kind: string(KindSelect), Status: store.StepCancelled,
				StartedAt: startedAt, CompletedAt: &now}
			return Selected{}, ErrCancelled
		}
		if d.parkPanickedBranch() || !d.mayStartStep() {
			return Selected{}, d.endErr
		}
		ended, err := d.endedChildren(childSeqs)
		if err != nil {
			d.end(err)
			return Selected{}, d.endErr
		}
		winner := -1
		now := d.e.now()
		var signals []string // those of cases before the first ready one
		for i, c := range cases {
			if c.kind == caseSignal {
				signals = append(signals, c.signal)
			}
			if c.ready != nil && closed(c.ready) || c.kind == caseChild && ended[c.seq] ||
				c.kind == caseTimer && !now.Before(startedAt.Add(c.timeout)) {
				winner = i
				break
			}
		}
		inPlace := winner < 0 && (d.branchesRunning() || pendingFuture(cases))
		if inPlace && deadline != nil && !written {
			// Waiting in place, the select writes its start down first,
			// as a suspension would: a redelivery keeps its deadline.
			rec := &store.StepRecord{Seq: seq, Name: name, Kind: string(KindSelect), Status: store.StepStarted,
				StartedAt: startedAt, NextAttemptAt: deadline, Fresh: true}
			if !d.write(d.buf.takeWith(rec)...) {
				return Selected{}, d.endErr
			}
			written = true
		}
		if inPlace && !d.flushStarted() {
			return Selected{}, d.endErr
		}
		if winner < 0 && len(signals) == 0 && inPlace {
			d.waitForCases(cases, deadline, false)
			continue
		}
		out, again, err := d.commitSelect(seq, name, startedAt, deadline, cases, signals, winner, !inPlace, childSeqs)
		switch {
		case err != nil:
			d.end(err)
			return Selected{}, d.endErr
		case out != nil:
			d.e.obs.StepAttempt(StepAttemptEvent{Workflow: d.wf.name, Step: name, Kind: KindSelect, Attempt: 1, Outcome: "completed", Duration: d.e.now().Sub(startedAt)})
			return Selected(*out), nil
		case again:
			continue // a child ended as the run was about to wait for it
		case !inPlace:
			d.log.Debug("select waiting", "select", name, "seq", seq)
			d.end(nil)
			return Selected{}, d.endErr
		}
		d.waitForCases(cases, deadline, len(signals) > 0 || len(childSeqs) > 0)
	}
}

// commitSelect, in one transaction, takes the oldest buffered signal of
// signals (the run's row locked, as AwaitSignal) or else takes winner
// (-1: none ready) and records the outcome; with none and suspend, it
// suspends the run until a signal or child of cases or deadline, unless a
// child of childSeqs has ended meanwhile (again).
func (d *delivery) commitSelect(seq int, name string, startedAt time.Time, deadline *time.Time, cases []SelectCase,
	signals []string, winner int, suspend bool, childSeqs []int) (out *selectOutcome, again bool, err error) {
	var cancel bool
	err = d.doOnce(func(ctx context.Context) error {
		out, again, cancel = nil, false, false
		err := d.e.txn(ctx, func(tx pgx.Tx) error {
			if len(signals) > 0 {
				taken, err := store.TakeSignal(ctx, d.e.on(tx), d.fence(), signals, seq)
				if err != nil {
					return err
				}
				got, payload, found := taken.Name, taken.Payload, taken.Found
				cancel = taken.CancelRequested
				if found {
					for i, c := range cases {
						if c.kind == caseSignal && c.signal == got {
							out = &selectOutcome{Index: i, Signal: got, Payload: payload}
						}
					}
				}
			}
			if out == nil && winner >= 0 {
				out = &selectOutcome{Index: winner}
			}
			var recs []*store.StepRecord
			if p := d.buf.pending; p != nil {
				recs = append(recs, p)
			}
			if out == nil {
				if !suspend || cancel {
					return errNothingToWrite
				}
				awaits := append([]string(nil), signals...)
				for _, s := range childSeqs {
					awaits = append(awaits, store.ChildToken(s))
				}
				rec := &store.StepRecord{Seq: seq, Name: name, Kind: string(KindSelect), Status: store.StepStarted,
					StartedAt: startedAt, NextAttemptAt: deadline}
				if len(recs) > 0 {
					if _, err := store.WriteSteps(ctx, d.e.on(tx), d.fence(), "", recs...); err != nil {
						return err
					}
				}
				w := store.AwaitParams{Pending: rec, Status: store.RunWaiting, Awaits: awaits, WakeAt: deadline}
				if err := store.SuspendAwaiting(ctx, d.e.on(tx), d.fence(), w); err != nil {
					return err
				}
				if len(childSeqs) > 0 {
					return store.CheckChildrenOpen(ctx, d.e.on(tx), d.runID, childSeqs)
				}
				return nil
			}
			raw, err := json.Marshal(out)
			if err != nil {
				return err
			}
			now := d.e.now()
			recs = append(recs, &store.StepRecord{Seq: seq, Name: name, Kind: string(KindSelect), Status: store.StepCompleted,
				Attempts: 1, Output: raw, NextAttemptAt: deadline, StartedAt: startedAt, CompletedAt: &now})
			d.lastRecordedAt = now
			_, err = store.WriteSteps(ctx, d.e.on(tx), d.fence(), "", recs...)
			return err
		})
		switch {
		case errors.Is(err, errNothingToWrite):
			return nil
		case errors.Is(err, store.ErrChildEnded):
			again = true
			return nil
		}
		return err
	})
	if err != nil {
		return nil, false, err
	}
	d.noteCancel(cancel)
	if out != nil || (suspend && !again && !cancel) {
		d.buf.take() // written by the transaction
	}
	if cancel && out == nil {
		return nil, true, nil // the loop's cancellation check ends the select
	}
	return out, again, nil
}

// errNothingToWrite rolls back a select's transaction that found nothing
// ready and is not to suspend the run.
var errNothingToWrite = errors.New("nothing to write")

// endedChildren reports which children at seqs have ended: those whose
// outcome is recorded, and those the database says ended.
func (d *delivery) endedChildren(seqs []int) (map[int]bool, error) {
	if len(seqs) == 0 {
		return nil, nil
	}
	ended := map[int]bool{}
	var open []int
	for _, s := range seqs {
		if r := d.childRecord(s); r != nil && (r.Status == store.StepCompleted || r.Status == store.StepFailed) {
			ended[s] = true
		} else {
			open = append(open, s)
		}
	}
	if len(open) == 0 {
		return ended, nil
	}
	var ends []store.ChildEnd
	err := d.do(func(ctx context.Context) (err error) {
		ends, err = store.ChildEnds(ctx, d.e.db, d.runID, open)
		return err
	})
	for _, c := range ends {
		ended[c.Seq] = true
	}
	return ended, err
}

// pendingFuture reports whether a future of cases is still running.
func pendingFuture(cases []SelectCase) bool {
	for _, c := range cases {
		if c.ready != nil && !closed(c.ready) {
			return true
		}
	}
	return false
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitForCases waits in place until a future of cases is ready, deadline
// passes, the run's cancellation is requested, the delivery ends, or, with
// poll, childPoll has passed (to look at signals and children again).
func (d *delivery) waitForCases(cases []SelectCase, deadline *time.Time, poll bool) {
	ready := make(chan struct{}, 1)
	stop := make(chan struct{})
	defer close(stop)
	for _, c := range cases {
		if c.ready == nil || closed(c.ready) {
			continue
		}
		go func(ch <-chan struct{}) {
			select {
			case <-ch:
				select {
				case ready <- struct{}{}:
				default:
				}
			case <-stop:
			}
		}(c.ready)
	}
	wait := time.Hour
	if poll || d.branchesRunning() {
		wait = childPoll
	}
	if deadline != nil {
		wait = min(wait, max(deadline.Sub(d.e.now()), 0))
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ready:
	case <-t.C:
	case <-d.fwd.Done():
	case <-d.ctx.Done():
	}
}

func decodeSelected(name string, raw []byte) (Selected, error) {
	var o selectOutcome
	if err := json.Unmarshal(raw, &o); err != nil {
		return Selected{}, fmt.Errorf("pgdurable: decoding recorded select %q: %w", name, err)
	}
	return Selected(o), nil
}
