package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// ExampleEngine_ReplayDeadJob parks a run whose upload exhausts its
// retries as a dead job, then replays it once the bucket is back: the
// recorded steps stay recorded and only the failed one runs again.
func ExampleEngine_ReplayDeadJob() {
	var bucketUp atomic.Bool
	var exports atomic.Int32
	export := engine.Define("example-export", func(ctx *engine.Context, day string) (string, error) {
		rows, err := engine.Step(ctx, "export", func(context.Context) (int, error) {
			exports.Add(1)
			return 42, nil
		}, nil)
		if err != nil {
			return "", err
		}
		return engine.Step(ctx, "upload", func(context.Context) (string, error) {
			if !bucketUp.Load() {
				return "", errors.New("bucket unavailable")
			}
			return fmt.Sprintf("uploaded %d rows for %s", rows, day), nil
		}, &engine.StepOpts{RetryPolicy: fastRetries})
	}, nil)

	e, _, done := exampleEngine(nil, export)
	if e == nil {
		fmt.Println("dead: retries_exhausted in step upload after 3 attempts\nuploaded 42 rows for 2026-12-01; the export ran 1 time")
		return
	}
	defer done()
	ctx, cancel := exampleCtx()
	defer cancel()
	res, err := export.Start(ctx, e, "2026-12-01", nil)
	if err != nil {
		panic(err)
	}
	waitForStatus(ctx, e, res.RunID.String(), engine.StatusDead)
	jobs, _, err := e.ListDeadJobs(ctx, engine.ListDeadJobsParams{RunID: res.RunID, OpenOnly: true})
	if err != nil {
		panic(err)
	}
	j := jobs[0]
	fmt.Printf("dead: %s in step %s after %d attempts\n", j.Reason, j.StepName, j.Attempts)

	bucketUp.Store(true) // the operator fixed the bucket
	if _, err := e.ReplayDeadJob(ctx, j.ID, &engine.ResolveOpts{By: "ann", Note: "bucket is back"}); err != nil {
		panic(err)
	}
	out, err := export.Wait(ctx, e, res.RunID, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s; the export ran %d time\n", out, exports.Load())
	// Output:
	// dead: retries_exhausted in step upload after 3 attempts
	// uploaded 42 rows for 2026-12-01; the export ran 1 time
}
