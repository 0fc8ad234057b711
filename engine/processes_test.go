package engine_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// ListWorkflows reports what live engine processes register: two started
// engines with overlapping registrations (one at version 2), by name with
// their versions and processes; an engine that stops drops out, and an
// engine that was never started (a CLI's) is not listed.
func TestListWorkflowsShowsWhatLiveProcessesRegister(t *testing.T) {
	t.Parallel()
	a1 := engine.Define("lw-a", func(*engine.Context, int) (int, error) { return 0, nil }, nil)
	a2 := engine.Define("lw-a", func(*engine.Context, int) (int, error) { return 0, nil }, &engine.WorkflowOpts{Version: 2})
	bwf := engine.Define("lw-b", func(*engine.Context, int) (int, error) { return 0, nil }, nil)
	b := setup(t, nil, a1)
	second := newEngine(t, b.db, nil, true, a2, bwf)
	newEngine(t, b.db, nil, false, bwf) // never started
	ctx := testCtx(t)
	wfs, err := b.engine.ListWorkflows(ctx)
	require.NoError(t, err)
	require.Len(t, wfs, 2)
	require.Equal(t, "lw-a", wfs[0].Name)
	require.Equal(t, []int{1, 2}, wfs[0].Versions)
	require.Len(t, wfs[0].Processes, 2)
	require.Equal(t, os.Getpid(), wfs[0].Processes[0].PID)
	require.Equal(t, "lw-b", wfs[1].Name)
	require.Len(t, wfs[1].Processes, 1, "the engine that was never started is not a live process")

	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, second.Stop(sctx))
	wfs, err = b.engine.ListWorkflows(ctx)
	require.NoError(t, err)
	require.Len(t, wfs, 1)
	require.Equal(t, []int{1}, wfs[0].Versions)
}
