package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// These races were found by an attack pass on child runs and
// continue-as-new; each test failed before its fix.

// A child ends while its parent is still running a step, and its commit
// is slow (a deferred trigger sleeps at COMMIT, after the end's wake-up
// ran): the parent, calling Get meanwhile, must not suspend for a child
// whose end it cannot see yet and then never be woken. The child's end
// locks the parent's row first, so the parent's suspension waits for it
// and then sees the child ended.
func TestParentSuspensionRacingASlowChildEndIsWoken(t *testing.T) {
	t.Parallel()
	enginetest.SkipOnCitus(t, "slows a child's commit with a trigger on the runs' table, which Citus refuses on a distributed table")
	child := engine.Define("race-slow-child", func(ctx *engine.Context, in int) (int, error) { return in + 1, nil }, nil)
	parent := engine.Define("race-slow-parent", func(ctx *engine.Context, _ int) (int, error) {
		c, err := engine.StartChild(ctx, child, 41, nil)
		if err != nil {
			return 0, err
		}
		if _, err := engine.Step(ctx, "busy", func(context.Context) (int, error) {
			time.Sleep(1500 * time.Millisecond) // the child ends meanwhile
			return 0, nil
		}, nil); err != nil {
			return 0, err
		}
		return c.Get(ctx)
	}, nil)
	b := setup(t, nil, parent, child)
	ctx := testCtx(t)
	_, err := b.db.Pool.Exec(ctx, `CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(3); RETURN NULL; END $$`)
	require.NoError(t, err)
	for _, runs := range b.db.RouteTables("workflow_runs") {
		_, err := b.db.Pool.Exec(ctx, `CREATE CONSTRAINT TRIGGER slow_child_commit AFTER UPDATE ON `+runs+` DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (NEW.status = 'completed' AND OLD.status <> 'completed' AND NEW.parent_run_id IS NOT NULL)
EXECUTE FUNCTION slow_commit()`)
		require.NoError(t, err)
	}
	res, err := parent.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := parent.Wait(wctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 42, out)
}

// A child that ended during its parent's delivery (the parent busy in a
// step) is found by the parent's Get in that delivery, from the start
// record that delivery wrote; before, Get looked only at earlier
// deliveries' records and spun.
func TestGetFindsAChildThatEndedInTheSameDelivery(t *testing.T) {
	t.Parallel()
	child := engine.Define("race-same-child", func(ctx *engine.Context, in int) (int, error) { return in + 1, nil }, nil)
	parent := engine.Define("race-same-parent", func(ctx *engine.Context, _ int) (int, error) {
		c, err := engine.StartChild(ctx, child, 41, nil)
		if err != nil {
			return 0, err
		}
		if _, err := engine.Step(ctx, "busy", func(context.Context) (int, error) {
			time.Sleep(500 * time.Millisecond)
			return 0, nil
		}, nil); err != nil {
			return 0, err
		}
		sel, err := engine.Select(ctx, "ended", engine.OnChild(c), engine.OnTimer(time.Hour))
		if err != nil || sel.Index != 0 {
			return 0, fmt.Errorf("select: %d, %v", sel.Index, err)
		}
		return c.Get(ctx)
	}, nil)
	b := setup(t, nil, parent, child)
	ctx := testCtx(t)
	res, err := parent.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := parent.Wait(wctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 42, out)
}

// 200 parents, each running five children one after another that end at
// once: every parent completes (none left waiting for a child that ended,
// none spinning).
func TestManyParentsOfQuickChildrenAllComplete(t *testing.T) {
	t.Parallel()
	child := engine.Define("race-quick-child", func(ctx *engine.Context, in int) (int, error) { return in + 1, nil }, nil)
	parent := engine.Define("race-quick-parent", func(ctx *engine.Context, _ int) (int, error) {
		sum := 0
		for i := range 5 {
			v, err := engine.ChildWorkflow(ctx, child, i, nil)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	}, nil)
	b := setup(t, nil, parent, child)
	ctx := testCtx(t)
	for i := range 200 {
		_, err := parent.Start(ctx, b.engine, i, nil)
		require.NoError(t, err)
	}
	eventually(t, 45*time.Second, "every parent to complete", func() bool {
		var open int
		require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs
			WHERE workflow_name = 'race-quick-parent' AND status <> 'completed'`)).Scan(&open))
		return open == 0
	})
	var wrong int
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs
		WHERE workflow_name = 'race-quick-parent' AND output <> '15'::jsonb`)).Scan(&wrong))
	require.Zero(t, wrong)
}

// A cancellation another process commits while a run is between its last
// write and its ContinueAsNew wins: the run compensates and ends
// cancelled, and the chain stops. Before, the run continued and the new
// run did not inherit the cancellation.
func TestCancelFromAnotherProcessStopsAContinueAsNewLoop(t *testing.T) {
	t.Parallel()
	loop := engine.Define("race-cancel-loop", func(ctx *engine.Context, n int) (int, error) {
		next, err := engine.Step(ctx, "tick", func(context.Context) (int, error) { return n + 1, nil }, nil)
		if err != nil {
			return 0, err
		}
		time.Sleep(100 * time.Millisecond) // workflow code between its last step and its return
		return 0, engine.ContinueAsNew(ctx, next)
	}, nil)
	b := setup(t, nil, loop)
	client := newEngine(t, b.db, nil, false, loop) // another process's engine: an API server
	ctx := testCtx(t)
	for trial := range 6 {
		wid := fmt.Sprintf("race-cancel-%d", trial)
		res, err := loop.Start(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: wid})
		require.NoError(t, err)
		time.Sleep(time.Duration(300+rand.IntN(300)) * time.Millisecond)
		for {
			id, err := client.FindRun(ctx, wid)
			require.NoError(t, err)
			if err := client.Cancel(ctx, id); err == nil {
				break
			} else if !errors.Is(err, engine.ErrRunClosed) {
				require.NoError(t, err)
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = loop.Wait(wctx, b.engine, res.RunID, 20*time.Millisecond)
		cancel()
		require.ErrorIs(t, err, engine.ErrCancelled, "trial %d", trial)
	}
}

// A child that loops with ContinueAsNew, in another process, under the
// default policy cancel: the parent's completion stops the whole chain.
func TestParentCloseCancelsAChildThatContinuesAsNew(t *testing.T) {
	t.Parallel()
	child := engine.Define("race-loop-child", func(ctx *engine.Context, n int) (int, error) {
		next, err := engine.Step(ctx, "tick", func(context.Context) (int, error) { return n + 1, nil }, nil)
		if err != nil {
			return 0, err
		}
		time.Sleep(50 * time.Millisecond)
		return 0, engine.ContinueAsNew(ctx, next)
	}, nil)
	parent := engine.Define("race-loop-parent", func(ctx *engine.Context, _ int) (int, error) {
		if _, err := engine.StartChild(ctx, child, 0, nil); err != nil {
			return 0, err
		}
		if _, err := engine.Step(ctx, "busy", func(context.Context) (int, error) {
			time.Sleep(500 * time.Millisecond)
			return 0, nil
		}, nil); err != nil {
			return 0, err
		}
		return 1, nil
	}, nil)
	b := setup(t, nil, parent)
	newEngine(t, b.db, nil, true, child) // the child runs in another process
	ctx := testCtx(t)
	res, err := parent.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	_, err = parent.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the child chain to end", func() bool {
		var open int
		require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT count(*) FROM pgdurable.workflow_runs
			WHERE parent_run_id = $1 AND status IN ('pending', 'running', 'waiting', 'compensating')`), res.RunID).Scan(&open))
		return open == 0
	})
	var status string
	require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT status FROM pgdurable.workflow_runs WHERE parent_run_id = $1 AND status <> 'continued'`),
		res.RunID).Scan(&status))
	require.Equal(t, "cancelled", status)
}

// Eight senders signal a continue-as-new loop that continues after every
// one or two signals, by workflow ID: every send succeeds (a signal
// follows the chain to its latest run rather than report it closed) and
// every signal is received once across the chain.
func TestSignalsByWorkflowIDFollowAFastContinueAsNewLoop(t *testing.T) {
	t.Parallel()
	const senders, per = 8, 25
	wf := engine.Define("race-signal-loop", func(ctx *engine.Context, got []int) ([]int, error) {
		if len(got) >= senders*per {
			return got, nil
		}
		v, err := engine.AwaitSignal[int](ctx, "n", 0)
		if err != nil {
			return nil, err
		}
		got = append(got, v)
		if len(got)%3 != 0 {
			if v, err = engine.AwaitSignal[int](ctx, "n", 0); err != nil {
				return nil, err
			}
			got = append(got, v)
		}
		return nil, engine.ContinueAsNew(ctx, got)
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, []int{}, &engine.StartOpts{WorkflowID: "signal-loop"})
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, senders*per)
	for s := range senders {
		wg.Go(func() {
			for i := range per {
				if err := b.engine.Signal(ctx, "signal-loop", "n", s*per+i, nil); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	out, err := wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	seen := map[int]int{}
	for _, v := range out {
		seen[v]++
	}
	for i := range senders * per {
		require.Equal(t, 1, seen[i], "signal %d", i)
	}
}

// A parent cancelled while its child, whose workflow no engine registers,
// was never picked up: the child ends cancelled at once (it has nothing to
// undo) and the parent ends cancelled, instead of waiting for a worker
// that never comes.
func TestCancelledParentEndsAChildThatNeverStarted(t *testing.T) {
	t.Parallel()
	ghost := engine.Define("race-ghost", func(ctx *engine.Context, _ int) (string, error) { return "", nil }, nil)
	parent := engine.Define("race-ghost-parent", func(ctx *engine.Context, _ int) (string, error) {
		return engine.ChildWorkflow(ctx, ghost, 0, nil)
	}, nil)
	b := setup(t, nil, parent) // ghost is registered nowhere
	ctx := testCtx(t)
	res, err := parent.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusWaiting, 10*time.Second)
	require.NoError(t, b.engine.Cancel(ctx, res.RunID))
	_, err = parent.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.ErrorIs(t, err, engine.ErrCancelled)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, run.Children[0].Status)
	kid, err := b.engine.GetRun(ctx, run.Children[0].RunID)
	require.NoError(t, err)
	require.NotNil(t, kid.Error)
	require.ErrorIs(t, kid.Error.Err(), engine.ErrCancelled)
}

// The same, when the parent's cancellation comes while a process that
// does not register the child's workflow holds a claim on it (a moment
// between its claim and its hand-back): the cancellation can only be
// requested then, and once the claim is given back no delivery may ever
// act on it. The hand-back ends the child cancelled and wakes the parent.
// Before, the parent waited until some process registered the child's
// workflow (the test above failed that way once under load).
func TestCancelledParentEndsAChildCancelledWhileClaimedElsewhere(t *testing.T) {
	t.Parallel()
	ghost := engine.Define("claimed-ghost", func(ctx *engine.Context, _ int) (string, error) { return "", nil }, nil)
	parent := engine.Define("claimed-ghost-parent", func(ctx *engine.Context, _ int) (string, error) {
		return engine.ChildWorkflow(ctx, ghost, 0, nil)
	}, nil)
	b := setup(t, nil, parent) // ghost is registered nowhere
	ctx := testCtx(t)
	res, err := parent.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusWaiting, 10*time.Second)
	run, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	child := run.Children[0]
	// Another process claims the child (this engine's own deliveries of
	// it claim and hand it back too: the claim is taken when it is free).
	token := uuid.New()
	eventually(t, 10*time.Second, "the child claimed", func() bool {
		tag, err := b.db.Pool.Exec(ctx, `UPDATE `+b.db.RunTable("workflow_runs", child.RunID)+` SET owner_token = $2, status = 'running',
			deliveries = deliveries + 1, lease_expires_at = now() + interval '1 minute'
			WHERE run_id = $1 AND status = 'pending' AND owner_token IS NULL`, child.RunID, token)
		require.NoError(t, err)
		return tag.RowsAffected() == 1
	})
	require.NoError(t, b.engine.Cancel(ctx, res.RunID))
	// The parent writes its compensating status, then requests its
	// children's cancellation in a transaction of its own.
	waitStatus(t, b.engine, res.RunID, engine.StatusCompensating, 10*time.Second)
	eventually(t, 10*time.Second, "the cancellation is requested of the claimed child", func() bool {
		var requested bool
		require.NoError(t, b.db.Pool.QueryRow(ctx, b.db.SQL(`SELECT cancel_requested_at IS NOT NULL FROM pgdurable.workflow_runs WHERE run_id = $1`),
			child.RunID).Scan(&requested))
		return requested
	})

	require.NoError(t, engine.ReleaseUnregistered(ctx, b.engine, child.RunID, token, res.RunID, child.Seq, child.ParentClosePolicy))
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = parent.Wait(wctx, b.engine, res.RunID, 20*time.Millisecond)
	require.ErrorIs(t, err, engine.ErrCancelled)
	kid, err := b.engine.GetRun(ctx, child.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, kid.Status)
	require.ErrorIs(t, kid.Error.Err(), engine.ErrCancelled)
}

// A dead child parks the parent waiting for it; once an operator
// discards the child's dead job, the parent's replay gives it the child's
// death as a *ChildError of status dead, and it goes on (here, to
// complete). The discarded child cannot be replayed after that.
func TestDiscardedDeadChildGivesItsReplayedParentTheFailure(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	kid := engine.Define("race-dead-kid", func(ctx *engine.Context, _ int) (string, error) {
		if _, err := engine.Step(ctx, "p", func(context.Context) (string, error) {
			if calls.Add(1) == 1 {
				panic("kaput")
			}
			return "alive", nil
		}, nil); err != nil {
			return "", err
		}
		return engine.AwaitSignal[string](ctx, "forever", 0)
	}, nil)
	parent := engine.Define("race-dead-parent", func(ctx *engine.Context, _ int) (string, error) {
		c, err := engine.StartChild(ctx, kid, 0, nil)
		if err != nil {
			return "", err
		}
		_, err = c.Get(ctx)
		var ce *engine.ChildError
		if !errors.As(err, &ce) || ce.Status != engine.StatusDead {
			return "", fmt.Errorf("want a dead child, got %v", err)
		}
		return "saw it die", nil
	}, nil)
	b := setup(t, nil, parent, kid)
	ctx := testCtx(t)
	res, err := parent.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusDead, 10*time.Second)
	parentJob := openDeadJob(t, b.engine, res.RunID)
	require.Equal(t, engine.ReasonChildDead, parentJob.Reason)
	_, err = b.engine.DiscardDeadJob(ctx, *parentJob.ChildDeadJobID, &engine.ResolveOpts{Note: "cannot be fixed"})
	require.NoError(t, err)
	_, err = b.engine.ReplayDeadJob(ctx, parentJob.ID, nil)
	require.NoError(t, err)
	out, err := parent.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, "saw it die", out)
	_, err = b.engine.ReplayDeadJob(ctx, *parentJob.ChildDeadJobID, nil)
	require.ErrorIs(t, err, engine.ErrDeadJobResolved)
	require.EqualValues(t, 1, calls.Load(), "the discarded child never ran again")
}

// A workflow ID of . or .. is refused: no URL path carries it as a
// segment, so the HTTP API could not name the run by it.
func TestDotWorkflowIDsAreRefused(t *testing.T) {
	t.Parallel()
	wf := engine.Define("dot-ids", func(ctx *engine.Context, _ int) (int, error) {
		_, err := engine.StartChild(ctx, engine.Define("dot-kid", func(*engine.Context, int) (int, error) { return 0, nil }, nil), 0,
			&engine.ChildOpts{WorkflowID: ".."})
		if !errors.Is(err, engine.ErrInvalidArgument) {
			return 0, fmt.Errorf("child: %v", err)
		}
		return 1, nil
	}, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	for _, id := range []string{".", ".."} {
		_, err := wf.Start(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: id})
		require.ErrorIs(t, err, engine.ErrInvalidInput, id)
	}
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	out, err := wf.Wait(ctx, b.engine, res.RunID, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 1, out)
}
