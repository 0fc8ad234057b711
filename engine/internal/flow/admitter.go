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
	// Conn takes a connection of the engine's pool (out of any
	// transaction), and release gives it back. The admitter keeps it while
	// it serves, and takes another after a failure: admissions are on the
	// path of every run of the queue, and waiting for a connection of a
	// pool that the queue's own deliveries keep busy made each one take
	// 18 ms where its two round trips take under one.
	Conn func(ctx context.Context) (db store.DBTX, release func(), err error)
	// DB answers the idle poll's read.
	DB store.DBTX
	// Versions are the workflow versions this process takes.
	Versions func() []store.VersionRange
	// Run executes a claimed run (on a goroutine of its own) and calls
	// done when the delivery ends; false when it cannot (the engine is
	// stopping: the claim is left to expire, as a dead process's would).
	Run func(c *store.ClaimedRun, token uuid.UUID, sent time.Time, done func()) bool

	busy    atomic.Int64
	paused  atomic.Bool
	db      store.DBTX // the admitter's connection, nil when it holds none
	release func()
	pokeCh  chan struct{}
	once    sync.Once
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
	defer a.dropConn()
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
			if !poked {
				// A poll: runs made ready and slots freed elsewhere, and
				// the pause, which deliveries here check at each step.
				if !a.anyReady(ctx) {
					a.held.Store(HeldNone)
					break
				}
				if a.Paused() {
					a.held.Store(HeldPaused)
					break
				}
			}
			free := a.Workers - a.Busy()
			if free <= 0 {
				a.held.Store(HeldWorkers)
				break // a delivery that ends pokes
			}
			plan, room, err := a.admit(ctx, free)
			if err != nil && ctx.Err() != nil {
				return // stopping: the admission was cut short, nothing failed
			}
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

// anyReady reads whether the queue has a ready run (and whether it is
// paused); a failed read says yes (the admission will say what failed).
func (a *Admitter) anyReady(ctx context.Context) bool {
	peek, err := store.PeekQueue(ctx, a.DB, a.Queue)
	if err == nil {
		a.paused.Store(peek.Paused)
	}
	return peek.Ready || err != nil
}

// Paused reports whether the queue was paused when this process last
// looked (every admission and every Poll): its deliveries hand their runs
// back at their next step.
func (a *Admitter) Paused() bool { return a.paused.Load() }

// SetPaused tells the admitter of a pause (or a resume) this process made,
// so that its deliveries act on it at once.
func (a *Admitter) SetPaused(paused bool) {
	a.paused.Store(paused)
	a.Poke()
}

// admit runs one admission with free workers, in two round trips on the
// admitter's connection: lock the queue and read its state and candidates
// (store.AdmitRead), choose, then claim and commit (store.AdmitWrite); a
// queue with a key rate limit reads its keys' state in between. It hands
// the claimed runs to Run, and returns the plan and the room it had.
func (a *Admitter) admit(ctx context.Context, free int) (Plan, int, error) {
	if a.db == nil {
		db, release, err := a.Conn(ctx)
		if err != nil {
			return Plan{}, 0, err
		}
		a.db, a.release = db, release
	}
	plan, room, err := a.admitOn(ctx, a.db, free)
	if err != nil {
		a.dropConn() // it may be left in the transaction: the pool closes it
	}
	return plan, room, err
}

// dropConn gives the admitter's connection back to the pool.
func (a *Admitter) dropConn() {
	if a.db != nil {
		a.release()
		a.db, a.release = nil, nil
	}
}

// admitOn is admit on db.
func (a *Admitter) admitOn(ctx context.Context, db store.DBTX, free int) (Plan, int, error) {
	now := a.Now()
	view, err := store.AdmitRead(ctx, db, store.ReadParams{Queue: a.Queue, Now: now, Versions: a.Versions(),
		Limit: min(2*free+16, 1000)})
	if errors.Is(err, store.ErrNotFound) {
		_, err = db.Exec(ctx, "ROLLBACK")
		return Plan{Held: HeldPaused}, 0, err // undefined: nothing to admit by
	}
	if err != nil {
		return Plan{}, 0, err
	}
	state, cands := view.State, view.Candidates
	a.paused.Store(state.Paused)
	room, why, retryAt := Room(state, free, now)
	var plan Plan
	if room == 0 {
		plan = Plan{Held: why, RetryAt: retryAt}
		_, err := db.Exec(ctx, "ROLLBACK")
		return plan, 0, err
	}
	var keyTATs map[string]time.Time
	if state.Def.KeyRate.Limit > 0 && len(cands) > 0 {
		keys := make([]string, 0, len(cands))
		for _, c := range cands {
			keys = append(keys, c.Key)
		}
		if keyTATs, err = store.KeyRates(ctx, db, a.Queue, keys); err != nil {
			return Plan{}, 0, err
		}
	}
	plan = Choose(state, cands, room, keyTATs, now)
	if len(plan.Picks) == room {
		plan.Held, plan.RetryAt = why, retryAt
	}
	fences := make([]store.Fence, len(plan.Picks))
	tokens := make(map[uuid.UUID]uuid.UUID, len(plan.Picks))
	for i, c := range plan.Picks {
		fences[i] = store.Fence{RunID: c.RunID, Token: uuid.New(), Lease: a.Lease}
		tokens[c.RunID] = fences[i].Token
	}
	sent := time.Now()
	claimed, err := store.AdmitWrite(ctx, db, store.Admission{Queue: a.Queue, Now: now, Claims: fences, VTime: plan.VTime,
		RateTAT: plan.RateTAT, KeyTATs: plan.KeyTATs})
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
