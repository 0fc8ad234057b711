package engine_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

// Where crash-patch's child worker hangs until the test kills it: in the
// workflow's code right after Patched returned (its marker not written
// yet), or inside the first step of the new code (the marker written with
// the activity's request ID).
const (
	envHangAfterPatched = "PGDURABLE_TEST_HANG_AFTER_PATCHED"
	envHangInNewCode    = "PGDURABLE_TEST_HANG_IN_NEW_CODE"
)

// patchCrashWorkflows are crash workflows for Patched.
func patchCrashWorkflows(pool *pgxpool.Pool) []engine.Registration {
	patched := engine.Define("crash-patch", func(ctx *engine.Context, _ crashIn) (string, error) {
		if _, err := engine.Step(ctx, "before", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		branch := "old"
		if engine.Patched(ctx, "fraud-check") {
			if os.Getenv(envHangAfterPatched) == "1" {
				if err := bumpCalls(context.Background(), pool, ctx.RunID(), "after_patched"); err != nil {
					return "", err
				}
				select {}
			}
			if _, err := engine.RunActivity(ctx, "fraud_check", func(actx context.Context, _ *engine.ActivityAttempt) (int, error) {
				if err := bumpCalls(context.WithoutCancel(actx), pool, ctx.RunID(), "fraud_check"); err != nil {
					return 0, err
				}
				if os.Getenv(envHangInNewCode) == "1" {
					select {}
				}
				return 1, nil
			}, nil); err != nil {
				return "", err
			}
			branch = "new"
		} else if _, err := engine.Step(ctx, "old_check", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		if _, err := engine.Step(ctx, "after", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		return branch, nil
	}, nil)
	// hole takes a change, then runs a plain step of the new code (whose
	// record, carrying the change, is written lazily), then a parallel
	// step, whose record is written apart; with envHangInNewCode its
	// worker hangs once the parallel step's record is written.
	hole := engine.Define("crash-patch-hole", func(ctx *engine.Context, _ crashIn) (string, error) {
		if _, err := engine.Step(ctx, "before", func(context.Context) (int, error) { return 1, nil }, nil); err != nil {
			return "", err
		}
		branch := "old"
		if engine.Patched(ctx, "x") {
			if _, err := engine.Step(ctx, "new_b", func(sctx context.Context) (int, error) {
				return 1, bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), "new_b")
			}, nil); err != nil {
				return "", err
			}
			branch = "new"
		} else if _, err := engine.Step(ctx, "old_b", func(sctx context.Context) (int, error) {
			return 1, bumpCalls(context.WithoutCancel(sctx), pool, ctx.RunID(), "old_b")
		}, nil); err != nil {
			return "", err
		}
		if _, err := engine.Go(ctx, "par", func(context.Context) (int, error) { return 1, nil }, nil).Get(ctx); err != nil {
			return "", err
		}
		if os.Getenv(envHangInNewCode) == "1" {
			if err := bumpCalls(context.Background(), pool, ctx.RunID(), "hang"); err != nil {
				return "", err
			}
			select {}
		}
		return branch, nil
	}, nil)
	return []engine.Registration{patched, hole}
}

// A plain step after Patched, then a parallel step: the plain step's
// record (which carries the change) is written before the parallel step
// starts, so a worker killed once the parallel step's record is written
// never leaves a hole where a replay would read the old code.
func TestAChangeIsWrittenBeforeAParallelStepAfterIt(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	createCallsTable(t, db.Pool)
	wfs := crashWorkflows(db.Pool)
	client := newEngine(t, db, nil, false, wfs...)
	ctx := testCtx(t)
	res, err := client.StartJSON(ctx, "crash-patch-hole", []byte(`{}`), nil)
	require.NoError(t, err)
	child := crashtest.StartWorker(t, db, 2*time.Second, envHangInNewCode+"=1")
	eventually(t, 30*time.Second, "the parallel step's end", func() bool { return calls(t, db.Pool, res.RunID, "hang") == 1 })
	crashtest.Kill(t, child)
	worker := newEngine(t, db, &engine.Config{LeaseDuration: 2 * time.Second}, true, wfs...)
	run := waitStatus(t, worker, res.RunID, engine.StatusCompleted, 30*time.Second)
	require.JSONEq(t, `"new"`, string(run.Output))
	require.Zero(t, calls(t, db.Pool, res.RunID, "old_b"), "the old code never ran")
	require.Equal(t, 1, calls(t, db.Pool, res.RunID, "new_b"))
}

// A worker killed between Patched and the first step of the new code, with
// that step's record (which records the change) written or not: the next
// delivery takes the same branch, and the change is recorded once, on the
// step after Patched.
func TestPatchedTakesTheSameBranchAfterACrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, env, reached string
		fraudChecks        int // the new code's activity: run again when killed in it
		recorded           int // records naming the change when the worker is killed
	}{
		{"change not yet recorded", envHangAfterPatched, "after_patched", 1, 0},
		{"change recorded", envHangInNewCode, "fraud_check", 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := enginetest.NewDB(t)
			createCallsTable(t, db.Pool)
			wfs := crashWorkflows(db.Pool)
			client := newEngine(t, db, nil, false, wfs...)
			ctx := testCtx(t)
			res, err := client.StartJSON(ctx, "crash-patch", []byte(`{}`), nil)
			require.NoError(t, err)

			child := crashtest.StartWorker(t, db, 2*time.Second, tc.env+"=1")
			eventually(t, 30*time.Second, tc.reached+" to be reached", func() bool {
				return calls(t, db.Pool, res.RunID, tc.reached) == 1
			})
			var recorded, markers int
			require.NoError(t, db.Pool.QueryRow(ctx, db.SQL(`SELECT count(*) FILTER (WHERE patches = 'fraud-check'), count(*) FILTER (WHERE kind = 'patch')
				FROM pgdurable.workflow_steps WHERE run_id = $1`), res.RunID).Scan(&recorded, &markers))
			require.Equal(t, tc.recorded, recorded)
			require.Zero(t, markers, "no marker row of its own")
			crashtest.Kill(t, child)

			worker := newEngine(t, db, &engine.Config{LeaseDuration: 2 * time.Second}, true, wfs...)
			run := waitStatus(t, worker, res.RunID, engine.StatusCompleted, 30*time.Second)
			require.JSONEq(t, `"new"`, string(run.Output))
			steps := enginetest.RequireSteps(ctx, t, worker, res.RunID, []string{"before", "fraud_check", "after"})
			require.Equal(t, []string{"fraud-check"}, steps[1].Patches)
			require.Equal(t, tc.fraudChecks, calls(t, db.Pool, res.RunID, "fraud_check"))
			require.Equal(t, tc.fraudChecks, steps[1].Attempts, "one request ID, one attempt per call")
		})
	}
}
