package flow

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// Admitter serves one flow-controlled queue in one process: it claims the
// queue's ready runs that fit the queue's limits and this process's free
// workers for the queue, and hands each to Run. It admits when poked (a
// run of the queue was started or made ready here, or one of its runs
// here ended), when the rate limit allows the next run, and every Poll
// otherwise (runs made ready and slots freed by other processes).
type Admitter struct {
	Queue   string
	Workers int
	Lease   time.Duration
	Poll    time.Duration
	Now     func() time.Time
	Log     *slog.Logger
	// Tx runs fn in a transaction on the engine's database.
	Tx func(ctx context.Context, fn func(store.DBTX) error) error
	// DB answers the idle poll's read.
	DB store.DBTX
	// Versions are the workflow versions this process takes.
	Versions func() []store.VersionRange
	// Run executes a claimed run (on a goroutine of its own) and calls
	// done when the delivery ends; false when it cannot (the engine is
	// stopping: the claim is left to expire, as a dead process's would).
	Run func(c *store.ClaimedRun, token uuid.UUID, sent time.Time, done func()) bool

	busy   atomic.Int64
	pokeCh chan struct{}
	once   sync.Once
	// held is what held the queue's runs back at the last admission
	// (Reason), for the metrics and "why is it waiting".
	held atomic.Value
}

func (a *Admitter) init() {
	a.once.Do(func() {
		a.pokeCh = make(chan struct{}, 1)
		a.held.Store(HeldNone)
	})
}

// Poke asks for an admission soon.
func (a *Admitter) Poke() {
	a.init()
	select {
	case a.pokeCh <- struct{}{}:
	default:
	}
}

// Busy is how many runs of the queue this process executes now.
func (a *Admitter) Busy() int { return int(a.busy.Load()) }

// Held is what held the queue's ready runs back at the latest admission.
func (a *Admitter) Held() Reason {
	a.init()
	return a.held.Load().(Reason)
}

// Serve admits until ctx ends.
func (a *Admitter) Serve(ctx context.Context) {
	a.init()
	timer := time.NewTimer(0)
	defer timer.Stop()
	failures := 0
	for {
		poked := false
		select {
		case <-ctx.Done():
			return
		case <-a.pokeCh:
			poked = true
		case <-timer.C:
		}
		next := a.Poll
		for ctx.Err() == nil {
			free := a.Workers - a.Busy()
			if free <= 0 {
				a.held.Store(HeldWorkers)
				break // a delivery that ends pokes
			}
			if !poked && !a.anyReady(ctx) {
				a.held.Store(HeldNone)
				break
			}
			plan, room, err := a.admit(ctx, free)
			if err != nil {
				failures++
				if failures == 1 || failures%100 == 0 {
					a.Log.Warn("admitting runs failed; trying again", "queue", a.Queue, "error", err, "failures", failures)
				}
				next = min(a.Poll<<min(failures, 6), 5*time.Second)
				break
			}
			failures = 0
			a.held.Store(plan.Held)
			if plan.Held == HeldRate && !plan.RetryAt.IsZero() {
				next = min(next, max(time.Until(plan.RetryAt), time.Millisecond))
			}
			if len(plan.Picks) == 0 || len(plan.Picks) < room || plan.Held != HeldNone && plan.Held != HeldWorkers {
				break
			}
			poked = true // room was filled: there may be more
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// anyReady reads whether the queue has a ready run due; a failed read
// says yes (the admission will say what failed).
func (a *Admitter) anyReady(ctx context.Context) bool {
	ok, err := store.AnyReady(ctx, a.DB, a.Queue, a.Now())
	return ok || err != nil
}

// admit runs one admission with free workers: lock the queue, read the
// candidates, choose, claim, commit, and hand the claimed runs to Run. It
// returns the plan and the room it had.
func (a *Admitter) admit(ctx context.Context, free int) (Plan, int, error) {
	var plan Plan
	var room int
	var claimed []*store.ClaimedRun
	var sent time.Time
	tokens := map[uuid.UUID]uuid.UUID{}
	err := a.Tx(ctx, func(tx store.DBTX) error {
		plan, room, claimed, tokens = Plan{}, 0, nil, map[uuid.UUID]uuid.UUID{}
		state, err := store.LockQueue(ctx, tx, a.Queue, a.Now())
		if errors.Is(err, store.ErrNotFound) {
			plan.Held = HeldPaused // undefined: nothing to admit by
			return nil
		}
		if err != nil {
			return err
		}
		now := a.Now()
		var why Reason
		var retryAt time.Time
		room, why, retryAt = Room(state, free, now)
		if room == 0 {
			plan = Plan{Held: why, RetryAt: retryAt}
			return nil
		}
		p := store.CandidateParams{Queue: a.Queue, Now: now, Versions: a.Versions(), Full: Full(state),
			Limit: min(2*room+16, 1000)}
		if aging := state.Def.PriorityAging; aging > 0 {
			before := now.Add(-aging)
			p.AgedBefore = &before
		}
		cands, err := store.Candidates(ctx, tx, p)
		if err != nil {
			return err
		}
		var keyTATs map[string]time.Time
		if state.Def.KeyRate.Limit > 0 && len(cands) > 0 {
			keys := make([]string, 0, len(cands))
			for _, c := range cands {
				keys = append(keys, c.Key)
			}
			if keyTATs, err = store.KeyRates(ctx, tx, a.Queue, keys); err != nil {
				return err
			}
		}
		plan = Choose(state, cands, room, keyTATs, now)
		if len(plan.Picks) == room {
			plan.Held, plan.RetryAt = why, retryAt
		}
		if len(plan.Picks) == 0 {
			return nil
		}
		fences := make([]store.Fence, len(plan.Picks))
		for i, c := range plan.Picks {
			fences[i] = store.Fence{RunID: c.RunID, Token: uuid.New(), Lease: a.Lease}
			tokens[c.RunID] = fences[i].Token
		}
		sent = time.Now()
		claimed, err = store.Admit(ctx, tx, store.Admission{Queue: a.Queue, Now: now, Claims: fences, VTime: plan.VTime,
			RateTAT: plan.RateTAT, KeyTATs: plan.KeyTATs})
		return err
	})
	if err != nil {
		return Plan{}, 0, err
	}
	for _, c := range claimed {
		a.busy.Add(1)
		if !a.Run(c, tokens[c.RunID], sent, a.done) {
			a.busy.Add(-1)
		}
	}
	return plan, room, nil
}

// done frees the worker of a delivery that ended, and asks for an
// admission: its slot may be the one the queue waits for.
func (a *Admitter) done() {
	a.busy.Add(-1)
	a.Poke()
}
