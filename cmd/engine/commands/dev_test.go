package commands_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/internal/citus"
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

// engine dev --citus starts a cluster of its own, serves against its
// coordinator (every table local to it) and removes the cluster on exit;
// with a database named it refuses before starting anything.
func TestDevWithCitus(t *testing.T) {
	t.Parallel()
	if enginetest.Citus() {
		t.Skip("starts a cluster of its own, whatever TEST_DATABASE_URL names: the pass on one PostgreSQL runs it")
	}
	var errOut bytes.Buffer
	code := commands.Execute(context.Background(), []string{"--database-url", "postgres://127.0.0.1:1/x", "dev", "--citus"},
		commands.Options{Workflows: workflows(), Stdout: &errOut, Stderr: &errOut, Getenv: func(string) string { return "" }})
	require.NotEqual(t, 0, code)
	require.Contains(t, errOut.String(), "--citus starts a cluster of its own; it takes no --database-url or DATABASE_URL")

	if !citus.Installed() {
		if os.Getenv("PGDURABLE_REQUIRE_CITUS") == "1" {
			t.Fatal(citus.ErrNotInstalled)
		}
		t.Skip(citus.ErrNotInstalled)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listen := freePort(t)
	out, logs := &syncBuffer{}, &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- commands.Execute(ctx, []string{"dev", "--citus", "--listen", listen, "--log-level", "warn"},
			commands.Options{Workflows: workflows(), Stdout: out, Stderr: logs, Getenv: func(string) string { return "" }})
	}()
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(out.String(), "Ctrl-C"); {
		require.True(t, time.Now().Before(deadline), "dev printed no hints: %s %s", out.String(), logs.String())
		time.Sleep(50 * time.Millisecond)
	}
	require.Contains(t, logs.String(), "engine dev: started a throwaway Citus cluster")
	require.Contains(t, logs.String(), "engine dev: worker node 2 127.0.0.1:")
	code, started, _ := overHTTP(t, "http://"+listen, "", "start", "double", "--id", "citus-1", "--input", `{"n": 21}`, "--wait")
	require.Equal(t, 0, code, started)
	require.Contains(t, started, "42")
	cancel()
	require.Equal(t, 0, <-done, logs.String())
	dir := regexp.MustCompile(`coordinator 127\.0\.0\.1:\d+ in (\S+)`).FindStringSubmatch(logs.String())
	require.Len(t, dir, 2, logs.String())
	_, err := os.Stat(dir[1])
	require.True(t, os.IsNotExist(err), "the cluster's directory is removed on exit: %v", err)
}
