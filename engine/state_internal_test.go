package engine

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// The exported statuses spell what the store writes and reads: the
// constants are literal, so go doc shows "pending", not an internal name.
func TestStatusesMatchTheStore(t *testing.T) {
	t.Parallel()
	for s, want := range map[RunStatus]string{StatusPending: store.RunPending, StatusRunning: store.RunRunning,
		StatusWaiting: store.RunWaiting, StatusCompleted: store.RunCompleted, StatusFailed: store.RunFailed,
		StatusCompensating: store.RunCompensating, StatusCompensated: store.RunCompensated, StatusCancelled: store.RunCancelled,
		StatusDead: store.RunDead, StatusContinued: store.RunContinued, StatusTerminated: store.RunTerminated} {
		require.Equal(t, want, string(s))
	}
	for s, want := range map[StepStatus]string{StepStarted: store.StepStarted, StepCompleted: store.StepCompleted,
		StepFailed: store.StepFailed, StepRetrying: store.StepRetrying, StepParked: store.StepParked, StepCancelled: store.StepCancelled} {
		require.Equal(t, want, string(s))
	}
	require.Len(t, RunStatuses(), 11, "every run status, once")
	for _, s := range RunStatuses() {
		require.True(t, s.valid(), s)
	}
	for _, r := range DeadReasons() {
		require.True(t, r.valid(), r)
	}
}
