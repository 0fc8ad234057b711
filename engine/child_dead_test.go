package engine_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// deadChildFixture is a parent that charges (with a refund as its undo)
// and starts a child that prints a label (voided as its undo) and ships
// through an activity that fails while down is set, until its retries run
// out and the child is parked as dead.
type deadChildFixture struct {
	b                       *bundle
	parent, child           *engine.Workflow[string, string]
	down                    atomic.Bool
	ships, refunds, voids   atomic.Int32
	parentRun, childRun     uuid.UUID
	parentJob, childJob     *engine.DeadJob
	leaveParentWhenChildDie bool
}

func newDeadChildFixture(t *testing.T, leave bool) *deadChildFixture {
	f := &deadChildFixture{leaveParentWhenChildDie: leave}
	f.down.Store(true)
	f.child = engine.Define("ship", func(ctx *engine.Context, order string) (string, error) {
		if _, err := engine.Step(ctx, "label", func(context.Context) (string, error) { return "label-" + order, nil }, nil); err != nil {
			return "", err
		}
		if err := ctx.Compensate(engine.Undo{Name: "void_label", Fn: func(context.Context, *engine.ActivityAttempt) error {
			f.voids.Add(1)
			return nil
		}}); err != nil {
			return "", err
		}
		return engine.RunActivity(ctx, "ship",
			func(context.Context, *engine.ActivityAttempt) (string, error) {
				f.ships.Add(1)
				if f.down.Load() {
					return "", errors.New("ship: 503")
				}
				return "shipped " + order, nil
			}, &engine.ActivityOpts{RetryPolicy: &engine.RetryPolicy{
				InitialInterval: 10 * time.Millisecond, MaximumAttempts: 2}})
	}, nil)
	f.parent = engine.Define("order", func(ctx *engine.Context, order string) (string, error) {
		if _, err := engine.Step(ctx, "charge", func(context.Context) (int, error) { return 4999, nil }, nil); err != nil {
			return "", err
		}
		if err := ctx.Compensate(engine.Undo{Name: "refund", Fn: func(context.Context, *engine.ActivityAttempt) error {
			f.refunds.Add(1)
			return nil
		}}); err != nil {
			return "", err
		}
		c, err := engine.StartChild(ctx, f.child, order, nil)
		if err != nil {
			return "", err
		}
		if f.leaveParentWhenChildDie {
			// The parent does not wait for the child: once it is dead, the
			// parent fails and compensates, passing the dead child by.
			if _, err := engine.Step(ctx, "give-up", func(sctx context.Context) (int, error) {
				for {
					run, err := f.b.engine.GetRun(sctx, c.RunID())
					if err != nil {
						return 0, err
					}
					if run.Status == engine.StatusDead {
						return 0, engine.Permanent(errors.New("shipping is down: order cancelled"))
					}
					time.Sleep(20 * time.Millisecond)
				}
			}, nil); err != nil {
				return "", err
			}
		}
		return c.Get(ctx)
	}, nil)
	f.b = setup(t, nil, f.parent, f.child)
	ctx := testCtx(t)
	res, err := f.parent.Start(ctx, f.b.engine, "ord_1", nil)
	require.NoError(t, err)
	f.parentRun = res.RunID
	eventually(t, 10*time.Second, "the child to start", func() bool {
		run, err := f.b.engine.GetRun(ctx, f.parentRun)
		require.NoError(t, err)
		if len(run.Children) > 0 {
			f.childRun = run.Children[0].RunID
		}
		return f.childRun != uuid.Nil
	})
	waitStatus(t, f.b.engine, f.childRun, engine.StatusDead, 10*time.Second)
	f.childJob = openDeadJob(t, f.b.engine, f.childRun)
	require.Equal(t, engine.ReasonRetriesExhausted, f.childJob.Reason)
	return f
}

// A child parked as dead parks the parent waiting for it (reason
// child_dead, the child's dead job linked) instead of handing it a
// failure to compensate for; replaying the child's dead job, or the
// parent's, replays both, and the parent takes the child's result.
func TestDeadChildParksItsWaitingParentAndAReplayLetsItContinue(t *testing.T) {
	t.Parallel()
	for _, replay := range []string{"child", "parent"} {
		t.Run("replay "+replay, func(t *testing.T) {
			t.Parallel()
			f := newDeadChildFixture(t, false)
			ctx := testCtx(t)
			waitStatus(t, f.b.engine, f.parentRun, engine.StatusDead, 10*time.Second)
			f.parentJob = openDeadJob(t, f.b.engine, f.parentRun)
			require.Equal(t, engine.ReasonChildDead, f.parentJob.Reason)
			require.Equal(t, &f.childRun, f.parentJob.ChildRunID)
			require.Equal(t, &f.childJob.ID, f.parentJob.ChildDeadJobID)
			require.Equal(t, engine.ClassChildDead, f.parentJob.ErrorClass)
			require.Contains(t, f.parentJob.ErrorMessage, f.childJob.ID.String())
			require.Zero(t, f.refunds.Load(), "nothing is undone while an operator may still replay the child")

			f.down.Store(false)
			job := f.childJob
			if replay == "parent" {
				job = f.parentJob
			}
			_, err := f.b.engine.ReplayDeadJob(ctx, job.ID, &engine.ResolveOpts{By: "ops", Note: "shipping is back"})
			require.NoError(t, err)
			out, err := f.parent.Wait(ctx, f.b.engine, f.parentRun, 10*time.Millisecond)
			require.NoError(t, err)
			require.Equal(t, "shipped ord_1", out)
			require.EqualValues(t, 3, f.ships.Load(), "two failed attempts, then one that shipped")
			require.Zero(t, f.refunds.Load())
			require.Zero(t, f.voids.Load())
			for _, j := range []uuid.UUID{f.parentJob.ID, f.childJob.ID} {
				dj, err := f.b.engine.GetDeadJob(ctx, j)
				require.NoError(t, err)
				require.Equal(t, "replayed", dj.Resolution)
				require.Equal(t, "ops", dj.ResolvedBy)
			}
			// Replaying again changes nothing.
			_, err = f.b.engine.ReplayDeadJob(ctx, f.parentJob.ID, nil)
			require.NoError(t, err)
			_, err = f.b.engine.ReplayDeadJob(ctx, f.childJob.ID, nil)
			require.NoError(t, err)
		})
	}
}

// A dead child replayed after its parent closed (the parent was
// terminated, or it compensated without waiting for the child) runs only
// its own undos: its unfinished forward step is never tried again, and it
// ends cancelled. The refunded, cancelled order is never shipped.
func TestDeadChildReplayedAfterItsParentClosedOnlyCompensates(t *testing.T) {
	t.Parallel()
	for _, close := range []string{"terminate", "compensate"} {
		t.Run(close, func(t *testing.T) {
			t.Parallel()
			f := newDeadChildFixture(t, close == "compensate")
			ctx := testCtx(t)
			switch close {
			case "terminate":
				waitStatus(t, f.b.engine, f.parentRun, engine.StatusDead, 10*time.Second)
				require.NoError(t, f.b.engine.Terminate(ctx, f.parentRun, &engine.TerminateOpts{Reason: "order cancelled by the customer"}))
			case "compensate":
				waitStatus(t, f.b.engine, f.parentRun, engine.StatusCompensated, 10*time.Second)
				require.EqualValues(t, 1, f.refunds.Load())
			}
			f.down.Store(false)
			_, err := f.b.engine.ReplayDeadJob(ctx, f.childJob.ID, &engine.ResolveOpts{By: "ops"})
			require.NoError(t, err)
			run := waitStatus(t, f.b.engine, f.childRun, engine.StatusCancelled, 10*time.Second)
			require.EqualValues(t, 2, f.ships.Load(), "the shipment is never tried again")
			require.EqualValues(t, 1, f.voids.Load(), "the child's own undo runs")
			var ship *engine.StepInfo
			for i := range run.Steps {
				if run.Steps[i].Name == "ship" {
					ship = &run.Steps[i]
				}
			}
			require.NotNil(t, ship)
			require.Equal(t, engine.StepCancelled, ship.Status)
		})
	}
}

// ReplayDeadJob with nil options (as any resolve call takes) replays a
// linked pair as with empty ones (it panicked: found by an attack pass).
func TestReplayOfALinkedDeadJobTakesNilOptions(t *testing.T) {
	t.Parallel()
	f := newDeadChildFixture(t, false)
	ctx := testCtx(t)
	waitStatus(t, f.b.engine, f.parentRun, engine.StatusDead, 10*time.Second)
	f.down.Store(false)
	_, err := f.b.engine.ReplayDeadJob(ctx, f.childJob.ID, nil)
	require.NoError(t, err)
	out, err := f.parent.Wait(ctx, f.b.engine, f.parentRun, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "shipped ord_1", out)
}

// deadChain is a grandparent waiting for a parent waiting for a child
// whose activity fails until its retries run out: all three end dead.
type deadChain struct {
	b                *bundle
	grand            *engine.Workflow[string, string]
	down             atomic.Bool
	g, m, l          uuid.UUID
	gJob, mJob, lJob *engine.DeadJob
}

func newDeadChain(t *testing.T) *deadChain {
	c := &deadChain{}
	c.down.Store(true)
	leaf := engine.Define("chain-leaf", func(ctx *engine.Context, in string) (string, error) {
		return engine.RunActivity(ctx, "ship",
			func(context.Context, *engine.ActivityAttempt) (string, error) {
				if c.down.Load() {
					return "", errors.New("503")
				}
				return "shipped " + in, nil
			}, &engine.ActivityOpts{RetryPolicy: &engine.RetryPolicy{
				InitialInterval: 10 * time.Millisecond, MaximumAttempts: 2}})
	}, nil)
	mid := engine.Define("chain-mid", func(ctx *engine.Context, in string) (string, error) {
		return engine.ChildWorkflow(ctx, leaf, in, nil)
	}, nil)
	c.grand = engine.Define("chain-grand", func(ctx *engine.Context, in string) (string, error) {
		return engine.ChildWorkflow(ctx, mid, in, nil)
	}, nil)
	c.b = setup(t, nil, c.grand, mid, leaf)
	ctx := testCtx(t)
	res, err := c.grand.Start(ctx, c.b.engine, "x", nil)
	require.NoError(t, err)
	c.g = res.RunID
	child := func(p uuid.UUID) uuid.UUID {
		var id uuid.UUID
		eventually(t, 10*time.Second, "a child to start", func() bool {
			run, err := c.b.engine.GetRun(ctx, p)
			require.NoError(t, err)
			if len(run.Children) > 0 {
				id = run.Children[0].RunID
			}
			return id != uuid.Nil
		})
		return id
	}
	c.m = child(c.g)
	c.l = child(c.m)
	for _, r := range []uuid.UUID{c.l, c.m, c.g} {
		waitStatus(t, c.b.engine, r, engine.StatusDead, 15*time.Second)
	}
	c.gJob, c.mJob, c.lJob = openDeadJob(t, c.b.engine, c.g), openDeadJob(t, c.b.engine, c.m), openDeadJob(t, c.b.engine, c.l)
	return c
}

// Operators acting at once on the dead jobs of one family (replays from
// both ends of a three-run chain, a discard of the parent's against a
// replay of the child's) wait for each other: none fails with a deadlock,
// and the one that comes second finds the first one's work done (found by
// an attack pass: 4 of 4 concurrent replays deadlocked).
func TestConcurrentResolvesOfOneFamilyDoNotDeadlock(t *testing.T) {
	t.Parallel()
	for _, pair := range [][2]string{{"leaf", "mid"}, {"leaf", "grand"}, {"mid", "grand"}} {
		t.Run("replay "+pair[0]+" and "+pair[1], func(t *testing.T) {
			t.Parallel()
			c := newDeadChain(t)
			ctx := testCtx(t)
			jobs := map[string]uuid.UUID{"leaf": c.lJob.ID, "mid": c.mJob.ID, "grand": c.gJob.ID}
			c.down.Store(false)
			errs := make([]error, 2)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i, name := range pair {
				wg.Go(func() {
					<-start
					_, errs[i] = c.b.engine.ReplayDeadJob(ctx, jobs[name], &engine.ResolveOpts{By: name})
				})
			}
			close(start)
			wg.Wait()
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			out, err := c.grand.Wait(ctx, c.b.engine, c.g, 10*time.Millisecond)
			require.NoError(t, err)
			require.Equal(t, "shipped x", out)
		})
	}
	t.Run("discard the parent's, replay the child's", func(t *testing.T) {
		t.Parallel()
		for range 3 {
			f := newDeadChildFixture(t, false)
			ctx := testCtx(t)
			waitStatus(t, f.b.engine, f.parentRun, engine.StatusDead, 10*time.Second)
			parentJob := openDeadJob(t, f.b.engine, f.parentRun)
			f.down.Store(false)
			errs := make([]error, 2)
			var wg sync.WaitGroup
			start := make(chan struct{})
			wg.Go(func() { <-start; _, errs[0] = f.b.engine.ReplayDeadJob(ctx, f.childJob.ID, &engine.ResolveOpts{}) })
			wg.Go(func() { <-start; _, errs[1] = f.b.engine.DiscardDeadJob(ctx, parentJob.ID, &engine.ResolveOpts{}) })
			close(start)
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					require.ErrorIs(t, err, engine.ErrDeadJobResolved)
				}
			}
			require.False(t, errs[0] != nil && errs[1] != nil, "one of the two wins")
		}
	})
}

// An operator's terminate racing another's replay of the same dead run
// (or a cancel) never fails with a deadlock, and is never lost: a
// terminate that returned nil leaves the run terminated, whatever the
// replay did (found by an attack pass: 4 of 15 answered 500 "deadlock
// detected", and the run went back to running).
func TestTerminateRacingReplayOrCancelIsNeverLost(t *testing.T) {
	t.Parallel()
	var broken atomic.Bool
	broken.Store(true)
	wf := engine.Define("terminate-races", func(ctx *engine.Context, _ int) (int, error) {
		if _, err := engine.Step(ctx, "work", func(context.Context) (int, error) {
			if broken.Load() {
				panic("bug")
			}
			return 1, nil
		}, nil); err != nil {
			return 0, err
		}
		return engine.AwaitSignal[int](ctx, "never", 0) // stays open once replayed
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	const n = 15
	ids := make([]uuid.UUID, n)
	for i := range ids {
		res, err := wf.Start(ctx, b.engine, i, nil)
		require.NoError(t, err)
		ids[i] = res.RunID
	}
	jobs := make([]*engine.DeadJob, n)
	for i, id := range ids {
		waitStatus(t, b.engine, id, engine.StatusDead, 10*time.Second)
		jobs[i] = openDeadJob(t, b.engine, id)
	}
	broken.Store(false)
	for i, id := range ids {
		var wg sync.WaitGroup
		var termErr, otherErr error
		start := make(chan struct{})
		wg.Go(func() {
			<-start
			termErr = b.engine.Terminate(ctx, id, &engine.TerminateOpts{Reason: "race", By: "ops"})
		})
		wg.Go(func() {
			<-start
			if i%3 == 2 {
				otherErr = b.engine.Cancel(ctx, id)
			} else {
				_, otherErr = b.engine.ReplayDeadJob(ctx, jobs[i].ID, &engine.ResolveOpts{By: "ops"})
			}
		})
		close(start)
		wg.Wait()
		for _, err := range []error{termErr, otherErr} {
			if err != nil {
				require.True(t, errors.Is(err, engine.ErrRunClosed) || errors.Is(err, engine.ErrDeadJobResolved),
					"race %d: %v", i, err)
			}
		}
		require.NoError(t, termErr, "race %d: terminate comes first or last, and either way ends the run", i)
		run, err := b.engine.GetRun(ctx, id)
		require.NoError(t, err)
		require.Equal(t, engine.StatusTerminated, run.Status, "race %d", i)
	}
}
