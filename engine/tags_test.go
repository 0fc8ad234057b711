package engine_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

func TestTagsLabelRunsAndFilterLists(t *testing.T) {
	t.Parallel()
	wait := engine.Define("tagged-wait", func(ctx *engine.Context, n int) (int, error) {
		if n >= 3 {
			return n, nil
		}
		if n > 0 {
			return 0, engine.ContinueAsNew(ctx, n+1)
		}
		return engine.AwaitSignal[int](ctx, "go", 0)
	}, nil)
	b := setup(t, nil, wait)
	ctx := testCtx(t)
	start := func(id string, in int, tags map[string]string) *engine.StartResult {
		t.Helper()
		res, err := wait.Start(ctx, b.engine, in, &engine.StartOpts{WorkflowID: id, Tags: tags})
		require.NoError(t, err)
		return res
	}
	eu := start("a", 0, map[string]string{"customer": "c_42", "region": "eu"})
	us := start("b", 0, map[string]string{"customer": "c_42", "region": "us"})
	start("c", 0, nil)
	other := start("d", 0, map[string]string{"customer": "c_7", "region": "eu"})

	run, err := b.engine.GetRun(ctx, eu.RunID)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"customer": "c_42", "region": "eu"}, run.Tags)

	ids := func(tags map[string]string) []string {
		t.Helper()
		runs, _, err := b.engine.ListRuns(ctx, engine.ListRunsParams{Tags: tags})
		require.NoError(t, err)
		var out []string
		for _, r := range runs {
			out = append(out, r.WorkflowID)
		}
		return out
	}
	require.Equal(t, []string{"b", "a"}, ids(map[string]string{"customer": "c_42"}))
	require.Equal(t, []string{"a"}, ids(map[string]string{"customer": "c_42", "region": "eu"}))
	require.Equal(t, []string{"d", "a"}, ids(map[string]string{"region": "eu"}))
	require.Empty(t, ids(map[string]string{"region": "apac"}))
	require.Len(t, ids(nil), 4)

	// A start that finds its run keeps that run's tags.
	again := start("a", 0, map[string]string{"customer": "someone-else"})
	require.True(t, again.Existing)
	require.Equal(t, []string{"a"}, ids(map[string]string{"customer": "c_42", "region": "eu"}))

	// Bulk actions take the tag filter.
	res, err := b.engine.CancelRuns(ctx, engine.CancelRunsParams{Filter: engine.ListRunsParams{Tags: map[string]string{"customer": "c_42"}}, DryRun: true})
	require.NoError(t, err)
	require.Equal(t, 2, res.Matched)
	res, err = b.engine.CancelRuns(ctx, engine.CancelRunsParams{Filter: engine.ListRunsParams{Tags: map[string]string{"customer": "c_42"}}, DryRun: false})
	require.NoError(t, err)
	require.Equal(t, 2, res.Done)
	waitStatus(t, b.engine, us.RunID, engine.StatusCancelled, 20*time.Second)
	run, err = b.engine.GetRun(ctx, other.RunID)
	require.NoError(t, err)
	require.Nil(t, run.CancelRequestedAt, "another customer's run is untouched")

	// A run ContinueAsNew starts keeps the chain's tags.
	start("chain", 1, map[string]string{"batch": "b-1"})
	eventually(t, 20*time.Second, "the chain to end", func() bool {
		id, err := b.engine.FindRun(ctx, "chain")
		require.NoError(t, err)
		r, err := b.engine.GetRun(ctx, id)
		require.NoError(t, err)
		return r.Status == engine.StatusCompleted
	})
	require.Equal(t, []string{"chain", "chain", "chain"}, ids(map[string]string{"batch": "b-1"}))

	for _, bad := range []struct {
		tags map[string]string
		want string
	}{
		{map[string]string{"": "x"}, "tag key"},
		{map[string]string{"a b": "x"}, "tag key"},
		{map[string]string{"k=v": "x"}, "tag key"},
		{map[string]string{strings.Repeat("k", 65): "x"}, "tag key"},
		{map[string]string{"k": ""}, "must be 1 to 256 bytes"},
		{map[string]string{"k": strings.Repeat("v", 257)}, "must be 1 to 256 bytes"},
		{map[string]string{"k": "a\x1bb"}, "control character"},
		{map[string]string{"k": "\xff"}, "not valid UTF-8"},
		{func() map[string]string {
			m := map[string]string{}
			for i := range engine.MaxTags + 1 {
				m[fmt.Sprint("k", i)] = "v"
			}
			return m
		}(), "at most 20"},
	} {
		_, err := wait.Start(ctx, b.engine, 0, &engine.StartOpts{Tags: bad.tags})
		require.ErrorIs(t, err, engine.ErrInvalidArgument, "%v", bad.tags)
		require.ErrorContains(t, err, bad.want)
		_, _, err = b.engine.ListRuns(ctx, engine.ListRunsParams{Tags: bad.tags})
		require.ErrorIs(t, err, engine.ErrInvalidArgument)
	}
}

// Starts through the batched path (many concurrent starts in one insert)
// keep each run's own tags.
func TestTagsSurviveBatchedStarts(t *testing.T) {
	t.Parallel()
	wf := engine.Define("tagged-batch", func(ctx *engine.Context, n int) (int, error) { return n, nil }, nil)
	b := setup(t, nil, wf)
	ctx := testCtx(t)
	errs := make(chan error, 50)
	for i := range 50 {
		go func() {
			_, err := wf.Start(ctx, b.engine, i, &engine.StartOpts{WorkflowID: fmt.Sprint("t-", i), Tags: map[string]string{"n": fmt.Sprint(i), "all": "yes"}})
			errs <- err
		}()
	}
	for range 50 {
		require.NoError(t, <-errs)
	}
	for _, i := range []int{0, 17, 49} {
		runs, _, err := b.engine.ListRuns(ctx, engine.ListRunsParams{Tags: map[string]string{"n": fmt.Sprint(i)}})
		require.NoError(t, err)
		require.Len(t, runs, 1)
		require.Equal(t, fmt.Sprint("t-", i), runs[0].WorkflowID)
	}
	runs, _, err := b.engine.ListRuns(ctx, engine.ListRunsParams{Tags: map[string]string{"all": "yes"}, Limit: 100})
	require.NoError(t, err)
	require.Len(t, runs, 50)
}
