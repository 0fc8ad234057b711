package localpg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"
)

// RunWith runs command args (a program and its arguments) with this
// process's standard streams and environment plus env (name=value, later
// ones win), and returns its exit status: 1 with the reason on stderr when
// it could not start. When ctx ends first (the caller's SIGINT or SIGTERM)
// the command gets SIGINT, and 30 s later SIGKILL, so that go test can
// stop its test processes and clean up. The test-server commands
// (withpg, withcluster) run their command this way.
func RunWith(ctx context.Context, env []string, args []string) int {
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	default:
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
}
