package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

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
		_, err = wf.SignalWithStart(ctx, b.engine, 0, &engine.StartOpts{WorkflowID: spelling}, "s", 1, nil)
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
