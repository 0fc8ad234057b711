package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// RetryPolicy says how often and how far apart a failing step is retried.
// Zero fields take the engine's defaults (Config.RetryPolicy, then
// DefaultRetryPolicy). The shape is Temporal's. A policy that makes no sense
// (a negative interval or attempt count, a coefficient below 1, a maximum
// interval below the initial one) is refused where it is given: Define's
// error (reported by Register and Start), New's, or the step's own
// (ErrInvalidArgument, recorded nowhere). An initial interval above an
// inherited maximum raises the maximum to it.
//
// The wait before attempt n+1 is drawn uniformly from [d, 2d) where
// d = min(InitialInterval * BackoffCoefficient^(n-1), MaximumInterval):
// full jitter above a floor, so a retry never comes sooner than the computed
// interval and retries of many runs spread out. DisableJitter makes it d.
type RetryPolicy struct {
	InitialInterval    time.Duration // wait after the first failure; default 100ms
	BackoffCoefficient float64       // growth per attempt, >= 1; default 2
	MaximumInterval    time.Duration // cap on d; default 1m
	MaximumAttempts    int           // attempts in all, including the first; default 5; 1 = no retry
	DisableJitter      bool          // wait exactly d: a predictable schedule
}

// DefaultRetryPolicy is used where neither the step, the workflow nor the
// engine config sets a field.
var DefaultRetryPolicy = RetryPolicy{
	InitialInterval:    100 * time.Millisecond,
	BackoffCoefficient: 2,
	MaximumInterval:    time.Minute,
	MaximumAttempts:    5,
}

// validate refuses a policy that makes no sense, naming the field: a
// negative interval or attempt count, a coefficient below 1 (0 takes the
// default), a maximum interval below the initial one. Zero fields are
// fine: they take the defaults.
func (p *RetryPolicy) validate() error {
	if p == nil {
		return nil
	}
	switch c := p.BackoffCoefficient; {
	case p.InitialInterval < 0:
		return fmt.Errorf("RetryPolicy.InitialInterval %s is negative", p.InitialInterval)
	case p.MaximumInterval < 0:
		return fmt.Errorf("RetryPolicy.MaximumInterval %s is negative", p.MaximumInterval)
	case math.IsNaN(c) || math.IsInf(c, 0) || (c != 0 && c < 1):
		return fmt.Errorf("RetryPolicy.BackoffCoefficient %v is below 1 (0 takes the default, 2)", c)
	case p.MaximumAttempts < 0:
		return fmt.Errorf("RetryPolicy.MaximumAttempts %d is negative (0 takes the default, 1 means no retry)", p.MaximumAttempts)
	case p.InitialInterval > 0 && p.MaximumInterval > 0 && p.MaximumInterval < p.InitialInterval:
		return fmt.Errorf("RetryPolicy.MaximumInterval %s is below InitialInterval %s", p.MaximumInterval, p.InitialInterval)
	}
	return nil
}

// merge fills p's zero fields from fallbacks, in order. A maximum interval
// taken from a fallback never cuts an initial interval set above it: it is
// raised to the initial interval.
func (p RetryPolicy) merge(fallbacks ...*RetryPolicy) RetryPolicy {
	for _, f := range fallbacks {
		if f == nil {
			continue
		}
		if p.InitialInterval <= 0 {
			p.InitialInterval = f.InitialInterval
		}
		if p.BackoffCoefficient < 1 {
			p.BackoffCoefficient = f.BackoffCoefficient
		}
		if p.MaximumInterval <= 0 {
			p.MaximumInterval = f.MaximumInterval
		}
		if p.MaximumAttempts <= 0 {
			p.MaximumAttempts = f.MaximumAttempts
		}
		p.DisableJitter = p.DisableJitter || f.DisableJitter
	}
	if p.MaximumInterval < p.InitialInterval {
		p.MaximumInterval = p.InitialInterval
	}
	return p
}

// Interval is the computed floor d before the attempt after attempt
// (attempt counts from 1).
func (p RetryPolicy) Interval(attempt int) time.Duration {
	d := float64(p.InitialInterval) * math.Pow(p.BackoffCoefficient, float64(attempt-1))
	if d > float64(p.MaximumInterval) || math.IsInf(d, 0) || math.IsNaN(d) {
		return p.MaximumInterval
	}
	return time.Duration(d)
}

// backoff is the actual wait after attempt: the floor plus jitter.
func (p RetryPolicy) backoff(attempt int) time.Duration {
	d := p.Interval(attempt)
	if p.DisableJitter || d <= 0 {
		return d
	}
	return d + rand.N(d)
}
