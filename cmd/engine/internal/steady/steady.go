// Package steady times a benchmark workload by its steady state: the
// completions between its first and last tenth, so that neither the
// ramp-up (workers fetching their first work, connections opening) nor
// the tail (the last few runs draining) weighs on its rate. A row timed
// so moves by a few percent from run to run where the whole-workload time
// of a short row moved by 20-40%.
package steady

import (
	"context"
	"sync/atomic"
	"time"
)

// Result is a workload's timing.
type Result struct {
	// Elapsed is from the call to the last completion.
	Elapsed time.Duration
	// Window is from the completion that ends the first tenth to the one
	// that ends the ninth, and Units the completions within it.
	Window time.Duration
	Units  int
}

// Rate is Units per second of Window.
func (r Result) Rate() float64 { return float64(r.Units) / r.Window.Seconds() }

// Wait returns once done reaches n, or with ctx's error, timing the
// completions as done counts them. For n under 10 the window is the
// whole workload.
func Wait(ctx context.Context, done *atomic.Int64, n int) (Result, error) {
	start := time.Now()
	lo, hi := int64(n/10), int64(n-n/10)
	var tLo, tHi time.Time
	if lo == 0 {
		tLo = start
	}
	for {
		d := done.Load()
		now := time.Now()
		if tLo.IsZero() && d >= lo {
			tLo = now
		}
		if tHi.IsZero() && d >= hi {
			tHi = now
		}
		if d >= int64(n) {
			if tHi.Sub(tLo) <= 0 { // all at once: take the whole
				tLo, tHi, lo, hi = start, now, 0, int64(n)
			}
			return Result{Elapsed: now.Sub(start), Window: tHi.Sub(tLo), Units: int(hi - lo)}, nil
		}
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-time.After(200 * time.Microsecond):
		}
	}
}

// While runs work (the starts of a workload of n units) and times the
// workload's steady state as done counts its completions (Wait), from
// before work starts.
func While(ctx context.Context, done *atomic.Int64, n int, work func() error) (Result, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type waited struct {
		r   Result
		err error
	}
	ch := make(chan waited, 1)
	go func() {
		r, err := Wait(wctx, done, n)
		ch <- waited{r, err}
	}()
	if err := work(); err != nil {
		return Result{}, err
	}
	w := <-ch
	return w.r, w.err
}
