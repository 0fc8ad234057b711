package engine

import (
	"context"
	"log/slog"

	"github.com/google/uuid"
)

// Context is what workflow code receives: the delivery's context.Context
// (cancelled when the lease is lost or the engine shuts down) and a handle
// on the delivery that replays and records the run's steps. Pass it to
// Step, TxStep, RunActivity, Sleep and AwaitSignal; step functions get a
// plain context.Context so they cannot start steps themselves.
//
// A Context belongs to one delivery and one goroutine: do not keep it after
// the workflow function returns or share it between goroutines.
type Context struct {
	context.Context
	d *delivery
}

// RunID returns the run's ID.
func (c *Context) RunID() uuid.UUID { return c.d.runID }

// WorkflowID returns the run's workflow ID (the start's idempotency key).
func (c *Context) WorkflowID() string { return c.d.workflowID }

// Logger returns the engine's logger with run_id, workflow and workflow_id set.
func (c *Context) Logger() *slog.Logger { return c.d.log }

// IsReplaying reports whether the next step is already recorded, so its
// function will not run. Use it to skip logging on replay.
func (c *Context) IsReplaying() bool { return c.d.pos.replaying() }
