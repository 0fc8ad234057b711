// Package flow admits the runs of flow-controlled queues: the runs that
// fit a queue's limits, claimed in one transaction that holds the queue's
// row lock. Plan is the policy (which ready runs fit, in what order);
// Admitter is the loop that serves one queue in one process.
//
// Nothing here counts up and down. Concurrency is the number of the
// queue's rows whose lease is live when the lock is held; rate limits are
// times (GCRA) that pass by themselves. A process that dies holds its
// slots until its leases expire, and not a moment longer.
package flow

import (
	"math"
	"time"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// Reason says what holds a queue's ready runs back.
type Reason string

// The reasons an admission claims fewer runs than it has room for.
const (
	// HeldNone: nothing held the runs back (or there were none).
	HeldNone Reason = ""
	// HeldPaused: the queue is paused.
	HeldPaused Reason = "paused"
	// HeldConcurrency: the queue's runs fill its concurrency limit.
	HeldConcurrency Reason = "concurrency"
	// HeldRate: the queue's rate limit is spent until RetryAt.
	HeldRate Reason = "rate"
	// HeldWorkers: this process's workers for the queue are all busy.
	HeldWorkers Reason = "workers"
)

// Plan is what one admission claims and writes.
type Plan struct {
	// Picks are the runs to claim, in admission order.
	Picks []store.Candidate
	// VTime is the queue's virtual time after the picks (the largest tag
	// admitted); RateTAT and KeyTATs its rate state and its keys'.
	VTime   float64
	RateTAT *time.Time
	KeyTATs map[string]time.Time
	// Held says why no more could be claimed (HeldNone: room was left),
	// and RetryAt, for HeldRate, when the rate allows the next.
	Held    Reason
	RetryAt time.Time
}

// Room is how many runs an admission of a queue in state s may claim at
// now with free workers, and if that is fewer, why (and, for the rate
// limit, until when).
func Room(s *store.QueueState, free int, now time.Time) (int, Reason, time.Time) {
	room, why := free, HeldWorkers
	if s.Paused {
		return 0, HeldPaused, time.Time{}
	}
	if c := s.Def.Concurrency; c > 0 && c-s.Running < room {
		room, why = max(c-s.Running, 0), HeldConcurrency
	}
	if s.Def.Rate.Limit > 0 {
		n, at := conforming(s.Def.Rate, s.RateTAT, now)
		if n < room {
			return n, HeldRate, at
		}
	}
	return room, why, time.Time{}
}

// Full is the keys of s at their concurrency limit.
func Full(s *store.QueueState) []string {
	var out []string
	if k := s.Def.KeyConcurrency; k > 0 {
		for key, n := range s.RunningByKey {
			if n >= k {
				out = append(out, key)
			}
		}
	}
	return out
}

// Choose picks from cands (aged ones first, then in admission order; a
// run may appear twice) at most room runs, at most the key limit of each
// key counting those running, within each key's rate, and returns the
// plan. keyTATs is the keys' rate state (a key without one has none).
func Choose(s *store.QueueState, cands []store.Candidate, room int, keyTATs map[string]time.Time, now time.Time) Plan {
	p := Plan{VTime: s.VTime, RateTAT: s.RateTAT}
	running := make(map[string]int, len(s.RunningByKey))
	for k, n := range s.RunningByKey {
		running[k] = n
	}
	seen := make(map[[16]byte]bool, len(cands))
	keyRate := s.Def.KeyRate.Limit > 0
	if keyRate {
		p.KeyTATs = map[string]time.Time{}
	}
	for _, c := range cands {
		if len(p.Picks) >= room {
			break
		}
		if seen[c.RunID] {
			continue
		}
		if k := s.Def.KeyConcurrency; k > 0 && running[c.Key] >= k {
			continue
		}
		if keyRate {
			tat, ok := p.KeyTATs[c.Key]
			if !ok {
				if t, had := keyTATs[c.Key]; had {
					tat, ok = t, true
				}
			}
			var prev *time.Time
			if ok {
				prev = &tat
			}
			n, _ := conforming(s.Def.KeyRate, prev, now)
			if n == 0 {
				continue
			}
			p.KeyTATs[c.Key] = advance(s.Def.KeyRate, prev, now, 1)
		}
		seen[c.RunID] = true
		running[c.Key]++
		p.Picks = append(p.Picks, c)
		p.VTime = math.Max(p.VTime, c.Tag)
	}
	if s.Def.Rate.Limit > 0 && len(p.Picks) > 0 {
		t := advance(s.Def.Rate, s.RateTAT, now, len(p.Picks))
		p.RateTAT = &t
	}
	return p
}

// The rate limits are GCRA (the generic cell rate algorithm): a limit of
// L per period P emits one run every P/L, and Burst runs may go at once.
// Its state is one time per queue (or key), the theoretical arrival time
// of the next run (TAT); a run conforms at now when TAT - (Burst-1)·P/L is
// not after now, and moves TAT to max(TAT, now) + P/L. Chosen over a
// sliding window of recent starts because it keeps one value rather than
// a row per start, answers "when may the next go" exactly (an admission
// sleeps until then), and paces a backlog evenly instead of letting a
// whole window's worth through at each window's start.

// interval is r's emission interval, P/L.
func interval(r store.Rate) time.Duration {
	return max(r.Period/time.Duration(r.Limit), time.Nanosecond)
}

// base is where r's schedule stands at now with state tat: tat, unless
// it is further behind than CatchUp or one interval (the queue was idle).
// An admission runs a little after the time its timer was set for, and
// later on a loaded machine; taking now as the base, as plain GCRA does,
// would lose that delay at every run (at 50 a second, a millisecond late
// each time is 5% fewer; under a loaded test suite, 8%), so a schedule
// that is behind by less than that keeps going from where it stands: a
// late admission may claim the runs whose time has come meanwhile, at
// most CatchUp's worth at once.
func base(r store.Rate, tat *time.Time, now time.Time) time.Time {
	if tat != nil && tat.After(now.Add(-max(interval(r), CatchUp))) {
		return *tat
	}
	return now
}

// CatchUp is how far behind its schedule a rate limit's admissions may
// fall and still keep it (see base).
const CatchUp = 100 * time.Millisecond

// conforming is how many runs r lets go at now with state tat, and, when
// none, when the next may.
func conforming(r store.Rate, tat *time.Time, now time.Time) (int, time.Time) {
	t := interval(r)
	tolerance := time.Duration(max(r.Burst, 1)-1) * t
	base := base(r, tat, now)
	if ahead := base.Sub(now) - tolerance; ahead > 0 {
		return 0, now.Add(ahead)
	}
	return int((now.Sub(base)+tolerance)/t) + 1, time.Time{}
}

// advance is r's state after n runs go at now from state tat.
func advance(r store.Rate, tat *time.Time, now time.Time, n int) time.Time {
	return base(r, tat, now).Add(time.Duration(n) * interval(r))
}
