package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// Clock tells the engine the time. Timers, signal timeouts, retry backoffs,
// schedules and the timestamps in step records read it; leases use
// PostgreSQL's clock, so a fake clock cannot expire them. Tests inject one
// (enginetest.Clock) to move time; the default is the system clock.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Sleep pauses the run for d, durably: the wake time is recorded as a step
// (named "sleep"), so a replay does not restart the timer. A pause longer
// than Config.MaxInlineBackoff ends the delivery and frees the worker: the
// run waits with no goroutine, connection, worker slot or River job, and
// the sweep re-enqueues it within about Config.SweepInterval of its wake
// time (on any engine, after any restart). Shorter pauses wait in place,
// and so do longer ones while parallel steps of the run (Go) are running:
// ending the delivery would cut them off and the next would run them
// again, so it waits, its wake time recorded, until they have ended (then
// it ends) or the wake time comes.
//
// It returns nil once the time has come, ErrCancelled when the run is
// cancelled meanwhile, or the error that ended the delivery, which the
// workflow should return.
func Sleep(ctx *Context, d time.Duration) error {
	return sleep(ctx, func() time.Time { return ctx.d.e.now().Add(d) })
}

// SleepUntil is Sleep until t (in the engine's Clock). A t in the past
// returns at once; it is still recorded, so replays stay aligned.
//
// A t after 9999-12-31 returns ErrInvalidArgument without recording
// anything (PostgreSQL cannot store it; the check is the same on replay).
func SleepUntil(ctx *Context, t time.Time) error {
	if t.After(maxWake) {
		return fmt.Errorf("%w: SleepUntil %s is after %s", ErrInvalidArgument, t.UTC().Format(time.RFC3339), maxWake.Format(time.DateOnly))
	}
	return sleep(ctx, func() time.Time { return t })
}

// maxWake is the latest wake time SleepUntil takes: 4-digit years.
var maxWake = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

func sleep(ctx *Context, wake func() time.Time) error {
	_, err := ctx.d.runStep(&stepCall{name: "sleep", kind: KindSleep, wake: wake,
		body: func(context.Context, *attemptState) ([]byte, error) { return []byte("null"), nil }})
	return err
}

// Now returns the engine Clock's time, recorded as a step named "now": the
// same value on every replay, where time.Now would differ.
func Now(ctx *Context) (time.Time, error) {
	return Step(ctx, "now", func(context.Context) (time.Time, error) { return ctx.d.e.now(), nil }, nil)
}

// NewUUID returns a random (version 4) UUID recorded as a step named
// "uuid": the same value on every replay, so it can key an entity the
// workflow creates.
func NewUUID(ctx *Context) (uuid.UUID, error) {
	return Step(ctx, "uuid", func(context.Context) (uuid.UUID, error) { return uuid.NewRandom() }, nil)
}

// sleepRecord is the started record of a sleep that waits until wake.
func sleepRecord(seq int, startedAt, wake time.Time) *store.StepRecord {
	return &store.StepRecord{Seq: seq, Name: "sleep", Kind: string(KindSleep), Status: store.StepStarted,
		StartedAt: startedAt, NextAttemptAt: &wake}
}
