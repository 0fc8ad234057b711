package enginetest

import (
	"context"
	"testing"
	"time"

	"github.com/pgdurable/pgdurable/engine"
)

// NewEngine builds an engine on db with workflows registered. With start
// it also starts it, and stops it (StopAndCancel) when the test ends;
// without, it is a client that starts and inspects runs.
func NewEngine(t testing.TB, db *DB, cfg *engine.Config, start bool, workflows ...engine.Registration) *engine.Engine {
	t.Helper()
	e, err := engine.New(db.Pool, cfg)
	if err != nil {
		t.Fatalf("engine.New: %v", err)
	}
	if err := e.Register(workflows...); err != nil {
		t.Fatalf("registering workflows: %v", err)
	}
	if !start {
		return e
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatalf("starting engine: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.StopAndCancel(ctx); err != nil {
			t.Errorf("stopping engine: %v", err)
		}
	})
	return e
}
