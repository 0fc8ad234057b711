package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine"
)

// A chosen workflow ID may not parse as a UUID, in any spelling: a run ID
// names a run wherever a workflow ID does, so a start whose ID spelled
// another run's ID would aim an operator's cancel at that other run
// (found by an attack pass). Runs started without an ID keep their run ID
// as their workflow ID.
func TestWorkflowIDsThatParseAsUUIDsAreRefused(t *testing.T) {
	t.Parallel()
	kid := engine.Define("uuid-id-kid", func(*engine.Context, int) (int, error) { return 0, nil }, nil)
	wf := engine.Define("uuid-ids", func(ctx *engine.Context, n int) (string, error) {
		if n == 0 {
			return "", nil
		}
		_, err := engine.StartChild(ctx, kid, 0, &engine.ChildOpts{WorkflowID: ctx.RunID().String()})
		return fmt.Sprint(errors.Is(err, engine.ErrInvalidArgument)), nil
	}, nil)
	b := setup(t, nil, wf, kid)
	ctx := testCtx(t)
	victim, err := wf.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	require.Equal(t, victim.RunID.String(), victim.WorkflowID, "no ID given: the run's ID")
	id := victim.RunID
	for _, spelling := range []string{
		id.String(), strings.ToUpper(id.String()), "{" + id.String() + "}", "urn:uuid:" + id.String(),
		strings.ReplaceAll(id.String(), "-", ""), uuid.NewString(),
	} {
		_, err := wf.Start(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: spelling})
		require.ErrorIs(t, err, engine.ErrInvalidInput, spelling)
		require.ErrorContains(t, err, "parses as a UUID", spelling)
		_, err = b.engine.StartJSON(ctx, "uuid-ids", []byte(`0`), &engine.StartOpts{WorkflowID: spelling})
		require.ErrorIs(t, err, engine.ErrInvalidInput, spelling)
		_, err = wf.SignalWithStart(ctx, b.engine, engine.SignalWithStartParams[int]{Input: 0, Opts: &engine.StartOpts{WorkflowID: spelling}, Signal: "s", Payload: 1, SignalOpts: nil})
		require.ErrorIs(t, err, engine.ErrInvalidInput, spelling)
	}
	res, err := wf.Start(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: "order-" + id.String()})
	require.NoError(t, err, "a prefixed UUID is a fine workflow ID")
	require.NotEqual(t, victim.RunID, res.RunID)

	parent, err := wf.Start(ctx, b.engine, 1, nil)
	require.NoError(t, err)
	out, err := wf.Wait(context.Background(), b.engine, parent.RunID, 0)
	require.NoError(t, err)
	require.Equal(t, "true", out, "a child's chosen workflow ID is held to the same rule")
}

// The rule for chosen workflow IDs does not touch the ones the engine
// makes: a chain started without an ID continues as new under its first
// run's ID (a UUID), and a child takes its default "<parent>:<position>";
// a caller may choose neither shape (found by an attack pass: the chain
// was parked dead at its first ContinueAsNew).
func TestEngineMadeWorkflowIDsPassAndTheirShapesAreReserved(t *testing.T) {
	t.Parallel()
	kid := engine.Define("made-id-kid", func(*engine.Context, int) (int, error) { return 1, nil }, nil)
	loop := engine.Define("made-id-loop", func(ctx *engine.Context, n int) (int, error) {
		if n < 3 {
			return 0, engine.ContinueAsNew(ctx, n+1)
		}
		return engine.ChildWorkflow(ctx, kid, 0, nil)
	}, nil)
	b := setup(t, nil, loop, kid)
	ctx := testCtx(t)
	res, err := loop.Start(ctx, b.engine, 0, nil)
	require.NoError(t, err)
	require.Equal(t, res.RunID.String(), res.WorkflowID)
	run := waitStatus(t, b.engine, res.RunID, engine.StatusContinued, 10*time.Second)
	require.NotNil(t, run.ContinuedRunID)
	last := *run.ContinuedRunID
	for {
		r, err := b.engine.GetRun(ctx, last)
		require.NoError(t, err)
		if r.ContinuedRunID == nil {
			break
		}
		last = *r.ContinuedRunID
	}
	out, err := loop.Wait(ctx, b.engine, last, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 1, out, "the chain ran its three continues and its child")

	for _, id := range []string{res.RunID.String() + ":0", strings.ToUpper(uuid.NewString()) + ":12"} {
		_, err := loop.Start(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: id})
		require.ErrorIs(t, err, engine.ErrInvalidInput, id)
		require.ErrorContains(t, err, "a child run's default ID", id)
	}
	_, err = loop.Start(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: res.RunID.String() + ":x"})
	require.NoError(t, err, "only <uuid>:<digits> is reserved")
}
