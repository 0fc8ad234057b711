package commands_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// On a binary built with its own workflows and no Options.Dev, engine dev
// --help says what that binary registers, not the payment example, and
// the commands dev prints run this binary as it was invoked, not go run
// ./cmd/engine.
func TestDevOnACustomBinary(t *testing.T) {
	t.Parallel()
	var help bytes.Buffer
	require.Equal(t, 0, commands.Execute(context.Background(), []string{"dev", "--help"},
		commands.Options{Workflows: workflows(), Stdout: &help, Stderr: &help, Getenv: func(string) string { return "" }}))
	require.Contains(t, help.String(), "It works the workflows this binary registers (double, hostile, approval).")
	require.NotContains(t, help.String(), "payment")
	require.NotContains(t, help.String(), "Stripe")

	db := enginetest.NewDB(t)
	for _, c := range []struct{ invocation, want string }{
		{"", os.Args[0]}, // a test binary: as it was started
		{"./bin/myengine", "./bin/myengine"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		listen := freePort(t)
		out, errOut := &syncBuffer{}, &syncBuffer{}
		done := make(chan int, 1)
		go func() {
			done <- commands.Execute(ctx, []string{"--database-url", db.URL, "dev", "--listen", listen, "--log-level", "warn"},
				commands.Options{Workflows: workflows(), Invocation: c.invocation, Stdout: out, Stderr: errOut, Getenv: func(string) string { return "" }})
		}()
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), "Ctrl-C"); {
			require.True(t, time.Now().Before(deadline), "dev printed no hints: %s %s", out.String(), errOut.String())
			time.Sleep(50 * time.Millisecond)
		}
		resp, err := http.Get("http://" + listen + "/healthz")
		require.NoError(t, err)
		resp.Body.Close()
		cancel()
		require.Equal(t, 0, <-done, errOut.String())
		printed := out.String()
		require.NotContains(t, printed, "go run ./cmd/engine")
		require.Contains(t, printed, "' "+c.want+" runs list\n")
		require.Contains(t, printed, "  start    "+c.want+" --address http://"+listen+" start double --input '<its input as JSON>' --wait   (registered: double, hostile, approval)\n")
	}
}
