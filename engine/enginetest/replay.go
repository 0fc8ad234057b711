package enginetest

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// Replay checks w's current code against the recorded history h (see
// engine.Replay), in a database of its own (NewDB), and fails the test
// (tb.Fatalf) naming the first position where the code departs from the
// history: what was recorded there and what the code did. No step's
// function runs.
//
//	h := enginetest.ReadHistory(t, "testdata/checkout/order-1.json")
//	enginetest.Replay(t, checkout, h)
func Replay(tb testing.TB, w engine.Registration, h *engine.History) {
	tb.Helper()
	db := NewDB(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := engine.Replay(ctx, db.Pool, w, h)
	var re *engine.ReplayError
	switch {
	case errors.As(err, &re):
		tb.Fatalf("run %s (%s) no longer replays: %s\n  recorded: %s\n  the code: %s", h.RunID, h.WorkflowID, re.Message, re.Recorded, re.Called)
	case err != nil:
		tb.Fatalf("replaying run %s: %v", h.RunID, err)
	}
}

// ReadHistory reads a history that `engine runs export` wrote (JSON),
// failing the test when it cannot.
func ReadHistory(tb testing.TB, path string) *engine.History {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("reading history: %v", err)
	}
	var h engine.History
	if err := json.Unmarshal(b, &h); err != nil {
		tb.Fatalf("reading history %s: %v", path, err)
	}
	return &h
}

// ReplayDir replays every history in dir (its *.json files, in name
// order) against w, each as a subtest named after its file, so CI catches
// a change that would strand runs in flight before it is deployed. Keep a
// folder per workflow: a history of another workflow fails. A folder with
// no history fails too, as a path mistake would.
func ReplayDir(t *testing.T, w engine.Registration, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatalf("listing histories: %v", err)
	}
	if len(files) == 0 {
		t.Fatalf("no history (*.json) in %s", dir)
	}
	sort.Strings(files)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			Replay(t, w, ReadHistory(t, f))
		})
	}
}
