package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// chargeSaga is a reservation (with its undo) and then a charge activity
// that does not heartbeat (a card charge), as the payment example has.
type chargeSaga struct {
	mu       sync.Mutex
	attempts []time.Time // when each charge attempt started
	releases atomic.Int32
	refunds  atomic.Int32
	charge   func(attempt int) (string, error)
	policy   *engine.RetryPolicy
}

func (s *chargeSaga) attemptsSince(t time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, a := range s.attempts {
		if !a.Before(t) {
			n++
		}
	}
	return n
}

func (s *chargeSaga) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.attempts)
}

func (s *chargeSaga) workflow(name string) *engine.Workflow[int, string] {
	return engine.Define(name, func(ctx *engine.Context, _ int) (string, error) {
		if _, err := engine.Step(ctx, "reserve", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		if err := ctx.Compensate(engine.Undo{Name: "release", Fn: func(context.Context, *engine.ActivityAttempt) error {
			s.releases.Add(1)
			return nil
		}}); err != nil {
			return "", err
		}
		ch, err := engine.RunActivity(ctx, "charge", func(_ context.Context, a *engine.ActivityAttempt) (string, error) {
			s.mu.Lock()
			s.attempts = append(s.attempts, time.Now())
			s.mu.Unlock()
			return s.charge(a.Attempt)
		}, &engine.ActivityOpts{RetryPolicy: s.policy})
		if err != nil {
			return "", err
		}
		if err := ctx.Compensate(engine.Undo{Name: "refund", Fn: func(context.Context, *engine.ActivityAttempt) error {
			s.refunds.Add(1)
			return nil
		}}); err != nil {
			return "", err
		}
		return ch, nil
	}, nil)
}

// The gateway is unreachable (every attempt is refused: no effect), the
// charge keeps retrying, and the run is cancelled: no attempt starts after
// the cancellation is known, the reservation is released, and the run ends
// cancelled within a few seconds with at most a couple of deliveries.
// Before, a cancelled activity kept retrying, and a cancelled run waiting
// for its retry was re-suspended and woken again in a tight loop.
func TestCancelStopsRetriesOfAnActivityThatHadNoEffect(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// waitFor is what the run is doing when it is cancelled.
		waitFor engine.RunStatus
		policy  engine.RetryPolicy
	}{
		{"retrying-in-place", engine.StatusRunning, engine.RetryPolicy{InitialInterval: 100 * time.Millisecond, BackoffCoefficient: 1, MaximumAttempts: 100}},
		{"suspended-for-its-retry", engine.StatusWaiting, engine.RetryPolicy{InitialInterval: 3 * time.Second, MaximumAttempts: 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := &chargeSaga{policy: &tc.policy, charge: func(int) (string, error) {
				return "", engine.NoEffect(errors.New("dial tcp 127.0.0.1:1: connect: connection refused"))
			}}
			wf := s.workflow("no-effect-" + tc.name)
			b := setup(t, &engine.Config{SweepInterval: 50 * time.Millisecond}, wf)
			ctx := testCtx(t)
			res, err := wf.Start(ctx, b.engine, 0, nil)
			require.NoError(t, err)
			eventually(t, 10*time.Second, "the charge to be retrying", func() bool {
				run, err := b.engine.GetRun(ctx, res.RunID)
				require.NoError(t, err)
				return s.count() >= 2 && run.Status == tc.waitFor || tc.waitFor == engine.StatusWaiting && run.Status == engine.StatusWaiting
			})
			require.NoError(t, b.engine.Cancel(ctx, res.RunID))
			cancelledAt := time.Now()
			run := waitStatus(t, b.engine, res.RunID, engine.StatusCancelled, 5*time.Second)
			took := time.Since(cancelledAt)
			require.LessOrEqual(t, s.attemptsSince(cancelledAt.Add(50*time.Millisecond)), 0, "no charge attempt after the cancellation")
			require.LessOrEqual(t, run.Deliveries, 3)
			require.EqualValues(t, 1, s.releases.Load(), "the reservation is released")
			require.Zero(t, s.refunds.Load(), "nothing was charged, nothing refunded")
			require.NotNil(t, run.CancelRequestedAt)
			require.ErrorIs(t, run.Error.Err(), engine.ErrCancelled)
			for _, st := range run.Steps {
				require.NotEqual(t, "retrying", string(st.Status), "a finished run shows no step still retrying: %+v", st)
			}
			require.Equal(t, "cancelled", string(run.Steps[1].Status), "the charge was stopped by the cancellation")
			require.Nil(t, run.Steps[1].NextAttemptAt)
			t.Logf("cancelled %s after the request, %d deliveries, %d charge attempts", took.Round(time.Millisecond), run.Deliveries, s.count())
		})
	}
}

// An activity whose failed attempt may have taken effect (a timeout: the
// charge may have been made with its answer lost) is settled after the
// cancellation: retried with its request ID until its outcome is known, so
// the refund runs if it was charged. It waits for its backoff as
// compensating, which the sweep does not wake early, so there is no loop.
func TestCancelSettlesAnActivityThatMayHaveTakenEffect(t *testing.T) {
	t.Parallel()
	s := &chargeSaga{policy: &engine.RetryPolicy{InitialInterval: 2 * time.Second, MaximumAttempts: 5, DisableJitter: true},
		charge: func(attempt int) (string, error) {
			if attempt == 1 {
				return "", errors.New("read tcp: i/o timeout") // may have been charged
			}
			return "ch_1", nil // the same request ID: the API answers with the charge
		}}
	wf := s.workflow("settle")
	b := setup(t, &engine.Config{SweepInterval: 50 * time.Millisecond}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusWaiting, 10*time.Second)
	require.NoError(t, b.engine.Cancel(ctx, res.RunID))
	eventually(t, 5*time.Second, "the run to wait for its settling retry as compensating", func() bool {
		run, err := b.engine.GetRun(ctx, res.RunID)
		require.NoError(t, err)
		return run.Status == engine.StatusCompensating && run.WakeAt != nil
	})
	run := waitStatus(t, b.engine, res.RunID, engine.StatusCancelled, 10*time.Second)
	require.Equal(t, 2, s.count(), "one settling attempt")
	require.EqualValues(t, 1, s.refunds.Load(), "the charge it found is refunded")
	require.EqualValues(t, 1, s.releases.Load())
	require.LessOrEqual(t, run.Deliveries, 3)
}

// Cancelling is idempotent: again while the run is being cancelled, and
// again once it is cancelled, succeeds (an HTTP client's retry); a run that
// completed cannot be cancelled.
func TestCancelAgainIsANoOp(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	inUndo := make(chan struct{}, 1)
	wf := engine.Define("cancel-twice", func(ctx *engine.Context, _ int) (string, error) {
		if _, err := engine.Step(ctx, "a", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		if err := ctx.Compensate(engine.Undo{Name: "undo_a", Fn: func(context.Context, *engine.ActivityAttempt) error {
			inUndo <- struct{}{}
			<-release
			return nil
		}}); err != nil {
			return "", err
		}
		_, err := engine.Step(ctx, "b", func(sctx context.Context) (int, error) {
			<-sctx.Done()
			return 0, sctx.Err()
		}, nil)
		return "", err
	}, nil)
	done := echoWorkflow("cancel-done")
	b := setup(t, nil, wf, done)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusRunning, 10*time.Second)
	require.NoError(t, b.engine.Cancel(ctx, res.RunID))
	first, err := b.engine.GetRun(ctx, res.RunID)
	require.NoError(t, err)
	require.NotNil(t, first.CancelRequestedAt)
	<-inUndo
	require.NoError(t, b.engine.Cancel(ctx, res.RunID), "while compensating")
	close(release)
	run := waitStatus(t, b.engine, res.RunID, engine.StatusCancelled, 10*time.Second)
	require.NoError(t, b.engine.Cancel(ctx, res.RunID), "once cancelled")
	require.Equal(t, first.CancelRequestedAt, run.CancelRequestedAt, "the first request's time is kept")

	fin, err := done.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	waitStatus(t, b.engine, fin.RunID, engine.StatusCompleted, 10*time.Second)
	require.ErrorIs(t, b.engine.Cancel(ctx, fin.RunID), engine.ErrRunClosed)
}

// A cancelled run settles an activity that may have taken effect with a
// bounded number of attempts: after 3 that still fail without knowing, it
// is parked for an operator (class unsettled) instead of retrying for as
// long as its policy allows (found by an attack pass: 313 attempts over 12
// minutes with MaximumAttempts 1000). A replay once the service answers
// settles it and compensates: the run ends cancelled.
func TestCancelledRunSettlesAnUnknownOutcomeAFewTimesThenParks(t *testing.T) {
	t.Parallel()
	var up atomic.Bool
	s := &chargeSaga{policy: &engine.RetryPolicy{InitialInterval: 20 * time.Millisecond, BackoffCoefficient: 1, MaximumAttempts: 1000},
		charge: func(int) (string, error) {
			if up.Load() {
				return "ch_1", nil
			}
			return "", errors.New("502 bad gateway") // may have been charged
		}}
	wf := s.workflow("unsettled")
	b := setup(t, &engine.Config{SweepInterval: 50 * time.Millisecond}, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	eventually(t, 10*time.Second, "the charge retrying", func() bool { return s.count() >= 3 })
	require.NoError(t, b.engine.Cancel(ctx, res.RunID))
	cancelledAt := time.Now()
	run := waitStatus(t, b.engine, res.RunID, engine.StatusDead, 10*time.Second)
	require.LessOrEqual(t, s.attemptsSince(cancelledAt), 4, "at most 3 settling attempts (and one in flight)")
	require.Equal(t, engine.ClassUnsettled, run.Error.Class)
	require.ErrorIs(t, run.Error.Err(), engine.ErrRetriesExhausted)
	dj := openDeadJob(t, b.engine, res.RunID)
	require.Contains(t, dj.ErrorMessage, "could not learn whether this activity took effect")
	require.Zero(t, s.releases.Load(), "an operator decides: nothing is undone yet")

	up.Store(true)
	_, err = b.engine.ReplayDeadJob(ctx, dj.ID, &engine.ResolveOpts{By: "test"})
	require.NoError(t, err)
	waitStatus(t, b.engine, res.RunID, engine.StatusCancelled, 10*time.Second)
	require.EqualValues(t, 1, s.refunds.Load(), "the charge it found is refunded")
	require.EqualValues(t, 1, s.releases.Load())
}

// A cancel made in another process reaches a running step at its engine's
// next sweep (about SweepInterval), not only at its next heartbeat: here
// the heartbeat is 10 s away.
func TestCancelFromAnotherProcessReachesARunningStepAtTheNextSweep(t *testing.T) {
	t.Parallel()
	inStep := make(chan struct{})
	stopped := make(chan time.Time, 1)
	wf := engine.Define("cancel-remote", func(ctx *engine.Context, _ int) (string, error) {
		_, err := engine.Step(ctx, "wait", func(sctx context.Context) (int, error) {
			close(inStep)
			<-sctx.Done()
			stopped <- time.Now()
			return 0, sctx.Err()
		}, nil)
		return "", err
	}, nil)
	db := enginetest.NewDB(t)
	worker := newEngine(t, db, &engine.Config{LeaseDuration: 30 * time.Second}, true, wf)
	other := newEngine(t, db, nil, false, wf) // another process: not running the run
	ctx := testCtx(t)
	res, err := wf.Start(ctx, other, 0, nil)
	require.NoError(t, err)
	<-inStep
	require.NoError(t, other.Cancel(ctx, res.RunID))
	cancelledAt := time.Now()
	select {
	case at := <-stopped:
		t.Logf("the step saw the cancellation %s after it was made", at.Sub(cancelledAt).Round(time.Millisecond))
		require.Less(t, at.Sub(cancelledAt), 3*time.Second, "well before the 10 s heartbeat")
	case <-time.After(8 * time.Second):
		t.Fatal("the step never saw the cancellation")
	}
	waitStatus(t, worker, res.RunID, engine.StatusCancelled, 10*time.Second)
}

// A cancellation from another process that the delivery first hears of in
// AwaitSignal (no heartbeat, sweep or write told it before) still lets the
// step before the wait be recorded: its record was waiting to be written
// with the next write, and the wait, woken by the cancellation, wrote
// nothing. Before, the record was dropped: the run ended cancelled with
// the undo's record pointing at a step that had none, and a redelivery
// during the compensation parked the run as nondeterministic.
func TestCancelHeardByAwaitSignalKeepsTheStepBeforeIt(t *testing.T) {
	t.Parallel()
	inStep, cancelled := make(chan struct{}), make(chan struct{})
	var undone atomic.Int32
	wf := engine.Define("cancel-at-signal", func(ctx *engine.Context, _ int) (string, error) {
		if _, err := engine.Step(ctx, "reserve", func(context.Context) (int, error) {
			close(inStep)
			<-cancelled // returns after the cancellation committed, before the delivery knows of it
			return 1, nil
		}, nil); err != nil {
			return "", err
		}
		if err := ctx.Compensate(engine.Undo{Name: "release", Fn: func(context.Context, *engine.ActivityAttempt) error {
			undone.Add(1)
			return nil
		}}); err != nil {
			return "", err
		}
		_, err := engine.AwaitSignal[int](ctx, "go", 0)
		return "", err
	}, nil)
	db := enginetest.NewDB(t)
	// No sweep and no heartbeat within the test: AwaitSignal is where the
	// delivery learns of the cancellation.
	worker := newEngine(t, db, &engine.Config{LeaseDuration: 60 * time.Second, SweepInterval: time.Hour}, true, wf)
	other := newEngine(t, db, nil, false, wf)
	ctx := testCtx(t)
	res, err := wf.Start(ctx, other, 0, nil)
	require.NoError(t, err)
	<-inStep
	require.NoError(t, other.Cancel(ctx, res.RunID))
	close(cancelled)
	run := waitStatus(t, worker, res.RunID, engine.StatusCancelled, 20*time.Second)
	require.EqualValues(t, 1, undone.Load())
	var steps []string
	for _, s := range run.Steps {
		steps = append(steps, fmt.Sprintf("%d:%s:%s", s.Seq, s.Name, s.Status))
	}
	require.Equal(t, []string{"0:reserve:completed", "1:release:completed"}, steps)
	require.Equal(t, 0, *run.Steps[1].CompensationOf)
}
