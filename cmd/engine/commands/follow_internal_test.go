package commands

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine"
)

// flakyServer is a backend whose reads of a run as a follower makes them
// (GetRunWith) fail as an unreachable server would for its first calls,
// then answer the run, completed; the follow's last, whole read (GetRun)
// answers it too.
type flakyServer struct {
	backend
	down  int
	calls int
	run   *engine.Run
}

func (f *flakyServer) GetRunWith(context.Context, uuid.UUID, *engine.GetRunOpts) (*engine.Run, error) {
	f.calls++
	if f.calls <= f.down {
		return nil, &unreachableError{base: "http://127.0.0.1:1", err: errors.New("connection refused")}
	}
	return f.run, nil
}

func (f *flakyServer) GetRun(context.Context, uuid.UUID) (*engine.Run, error) { return f.run, nil }

// A follow over --address outlives a server restart: it keeps asking, says
// so, and ends with the run's outcome.
func TestFollowKeepsAskingARestartingServer(t *testing.T) {
	var out, errOut bytes.Buffer
	g := &global{opts: Options{Stdout: &out, Stderr: &errOut}}
	now := time.Now()
	srv := &flakyServer{down: 2, run: &engine.Run{RunID: uuid.New(), WorkflowName: "w", Status: engine.StatusCompleted, CompletedAt: &now}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run, err := g.follow(ctx, srv, srv.run.RunID)
	if err != nil {
		t.Fatalf("follow: %v", err)
	}
	if run.Status != engine.StatusCompleted || srv.calls != 3 {
		t.Fatalf("run %s after %d calls", run.Status, srv.calls)
	}
	if got := errOut.String(); !bytes.Contains([]byte(got), []byte("lost the engine")) || !bytes.Contains([]byte(got), []byte("answers again")) {
		t.Fatalf("stderr: %q", got)
	}
}

// A start that got no answer is sent again only when it never reached the
// server (the dial failed): one that may have landed is not, unless --id
// makes it idempotent.
func TestNotSentIsOnlyAFailedDial(t *testing.T) {
	dial := &url.Error{Op: "Post", URL: "http://127.0.0.1:1/v1/workflows/w/runs", Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}}
	read := &url.Error{Op: "Post", URL: "http://127.0.0.1:1/v1/workflows/w/runs", Err: &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}}
	timeout := &url.Error{Op: "Post", URL: "http://127.0.0.1:1/v1/workflows/w/runs", Err: context.DeadlineExceeded}
	if !notSent(&unreachableError{err: dial}) {
		t.Error("a refused dial never reached the server")
	}
	for _, err := range []error{read, timeout} {
		if notSent(&unreachableError{err: err}) {
			t.Errorf("%v may have reached the server", err)
		}
	}
}
