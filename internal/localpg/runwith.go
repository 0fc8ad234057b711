package localpg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// ReuseTestDatabases is what the test-server commands (withpg,
// withcluster) add to their command's environment: enginetest.EnvReuse
// set to 1, so that each test binary reuses its finished tests'
// databases. Only a server removed after the command may be told so: the
// databases a binary holds when it exits are never dropped.
const ReuseTestDatabases = "PGDURABLE_TEST_REUSE=1"

// RunWith runs command args (a program and its arguments) with this
// process's standard streams and environment plus env (name=value, later
// ones win), and returns its exit status: 128 plus the signal's number
// when a signal ended it (as a shell reports it), 1 with the reason on
// stderr when it could not start. The command runs in a process group of
// its own, so that what it starts can be reached: when ctx ends first
// (the caller's SIGINT or SIGTERM) the whole group gets SIGINT, and 30 s
// later SIGKILL (go test passes a SIGINT to no test binary: signalled
// alone, it would exit and leave them running against a server about to
// be removed); and whatever of the group is left when the command ends is
// killed. The test-server commands (withpg, withcluster) run their
// command this way, then stop their server.
func RunWith(ctx context.Context, env []string, args []string) int {
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) }
	cmd.WaitDelay = 30 * time.Second
	err := cmd.Run()
	if cmd.Process != nil {
		// The group's leftovers (a test binary whose go test was killed,
		// the processes a test started): nothing may outlive the server.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return exit.ExitCode()
	default:
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
}
