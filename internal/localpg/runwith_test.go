package localpg_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/localpg"
)

// A stop (the context's end: withpg's SIGINT or SIGTERM) reaches what
// the command started, not only the command: go test, signalled alone,
// exits and leaves its test binary running against a server about to be
// removed. Here the command, like go test, does not pass the signal on
// and waits for its child: only the group's SIGINT ends the child, after
// which the command exits 3 (SIGKILLed after RunWith's 30 s grace, it
// would be 137).
func TestRunWithStopsTheCommandsWholeGroup(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for {
			if _, err := os.Stat(pidFile); err == nil {
				time.Sleep(100 * time.Millisecond) // the child execs sleep
				cancel()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	code := localpg.RunWith(ctx, nil, []string{"sh", "-c", `trap ":" INT; sh -c "echo \$\$ > ` + pidFile + `; exec sleep 60"; exit 3`})
	require.Equal(t, 3, code, "the command's child got the stop, and the command ended on its own")
	requireGone(t, pidFile)
}

// What the command leaves running when it ends is killed: nothing of it
// outlives the server that withpg stops next.
func TestRunWithKillsWhatTheCommandLeft(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "pid")
	code := localpg.RunWith(context.Background(), nil, []string{"sh", "-c", `sleep 60 & echo $! > ` + pidFile})
	require.Zero(t, code)
	requireGone(t, pidFile)
}

// requireGone waits for the process whose pid is in pidFile to end.
func requireGone(t *testing.T, pidFile string) {
	t.Helper()
	raw, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		if syscall.Kill(pid, 0) != nil {
			return true
		}
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		return err == nil && strings.Contains(string(stat), ") Z ") // a zombie: ended, not reaped yet
	}, 5*time.Second, 10*time.Millisecond, "process %d outlived the command", pid)
}

// The exit status is the command's, and 128 plus the signal's number
// when a signal ended it, as a shell reports it.
func TestRunWithExitStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	require.Equal(t, 0, localpg.RunWith(ctx, nil, []string{"true"}))
	require.Equal(t, 7, localpg.RunWith(ctx, nil, []string{"sh", "-c", "exit 7"}))
	require.Equal(t, 137, localpg.RunWith(ctx, nil, []string{"sh", "-c", "kill -9 $$"}))
	require.Equal(t, 0, localpg.RunWith(ctx, []string{"X_RUNWITH=yes"}, []string{"sh", "-c", `test "$X_RUNWITH" = yes`}))
	require.Equal(t, 1, localpg.RunWith(ctx, nil, []string{"/nonexistent/program"}))
}

// The variable the test-server commands set is the one enginetest reads.
func TestReuseTestDatabasesIsEnginetestsVariable(t *testing.T) {
	t.Parallel()
	require.Equal(t, enginetest.EnvReuse+"=1", localpg.ReuseTestDatabases)
}
