package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// txChain is the transaction that consecutive tx steps of a run share.
//
// A tx step commits its writes with its record. Committing each one is a
// commit per step, and a commit (its WAL flush) is what a tx step costs
// most; so when a tx step succeeds and the run goes on, its transaction
// stays open, and the run's next tx step joins it under a savepoint (a
// failed step rolls back to its savepoint alone). The transaction commits,
// with the records of every step in it, fenced by the lease, at the run's
// next durable point: the next step of another kind, a wait, a failed
// step, the run's end, maxChainSteps steps. Until then nothing of it is
// visible to other transactions, and a crash rolls all of it back: the
// next delivery runs those steps again, each in a transaction of its own
// making, so every step's writes still commit once, with its record.
//
// Only the workflow's own goroutine uses it: a tx step run in parallel
// (Go) neither joins nor leaves one.
type txChain struct {
	conn *pgxpool.Conn
	tx   pgx.Tx // open on conn
	recs []*store.StepRecord
}

// maxChainSteps bounds a chain: its savepoints (PostgreSQL caches 64
// subtransactions per transaction) and how long it holds its row locks.
const maxChainSteps = 16

// errChainLost ends a delivery whose chained tx steps' transaction failed
// before it could commit: those steps did not commit, and the next
// delivery runs them again.
var errChainLost = errors.New("the transaction of the tx steps chained in it failed before it committed; " +
	"the next delivery runs those steps again")

// mayChain reports whether a tx step that succeeded may leave its
// transaction open for the run's next tx step, with recs (the records the
// transaction would commit) so far.
//
// Not with half the lease or less left either: the next step's start
// would renew it (see mayStartStep), and a renewal takes a connection of
// the pool while the chain holds one.
func (d *delivery) mayChain(seq, recs int) bool {
	return recs < maxChainSteps && !d.branchesRunning() && !d.compensating && !d.cancelRequested.Load() &&
		d.e.replay == nil && d.leaseLeft() > d.e.cfg.LeaseDuration/2 && !d.e.unchained.has(d.runID, seq)
}

// mayJoin reports whether the next step, l, may join the open chain.
func (d *delivery) mayJoin(l *attemptLoop) bool {
	return l.call.tx && l.forward && !l.announces(1) && !l.settling() &&
		(l.call.opts == nil || l.call.opts.RateLimit == "") && d.mayChain(l.seq, len(d.chain.Load().recs))
}

// settleChain commits the open chain, if any, and gives its connection
// back; an error ends the delivery (its steps may not have committed).
func (d *delivery) settleChain() bool {
	ch := d.chain.Swap(nil)
	if ch == nil {
		return true
	}
	// Detached from the delivery's context, as the record writes are: a
	// shutdown at a step boundary commits the steps done.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), writeTimeout)
	defer cancel()
	err := d.commitChain(ctx, ch)
	rollback(ctx, ch.conn.Conn())
	ch.conn.Release()
	if err = d.chainOutcome(ch, err); err != nil {
		d.end(err)
		return false
	}
	return true
}

// commitChain commits ch's transaction with its records, fenced by the
// lease, in one round trip, leaving the connection to the caller.
func (d *delivery) commitChain(ctx context.Context, ch *txChain) error {
	sent := time.Now()
	keep, w, err := d.commitRecords(ctx, ch.conn.Conn(), true, ch.recs)
	if err == nil {
		if !keep {
			d.extendedAt(sent)
		}
		d.progressed.Store(true)
		d.noteCancel(w.CancelRequested)
	}
	return err
}

// commitRecords writes recs, fenced by the lease, with the COMMIT of the
// transaction open on conn (begun; else on their own), in one round trip:
// one fresh record with the lean statement, which extends the lease unless
// keep (as keepsLease says), several with the multi-record one, which
// leaves it as it is.
func (d *delivery) commitRecords(ctx context.Context, conn *pgx.Conn, begun bool, recs []*store.StepRecord) (keep bool, w store.StepsWritten, err error) {
	if len(recs) == 1 && recs[0].Fresh {
		keep = d.keepsLease()
		w, err = store.CommitStep(ctx, d.e.on(conn), store.StepCommit{Fence: d.fence(), Begun: begun, Keep: keep, Record: recs[0]})
		return keep, w, err
	}
	w, err = store.CommitSteps(ctx, d.e.on(conn), d.fence(), begun, recs...)
	return true, w, err
}

// chainOutcome is what a commit of ch that returned err comes to, read
// from the database once ch's connection is back in the pool: nil when it
// committed after all, ErrLeaseLost, or an error that ends the delivery
// (the records are not there, or cannot be read).
func (d *delivery) chainOutcome(ch *txChain, err error) error {
	if err == nil {
		return nil
	}
	last := ch.recs[len(ch.recs)-1]
	if errors.Is(err, store.ErrStepsNotCommitted) {
		owns, oerr := store.OwnsRun(d.ctx, d.e.db, d.fence())
		switch {
		case oerr != nil:
			return &outcomeUnknownError{err: fmt.Errorf("chained tx steps' commit refused; reading the lease: %w", oerr)}
		case !owns:
			return store.ErrLeaseLost
		}
	}
	rec, gerr := store.GetStep(d.ctx, d.e.db, d.runID, last.Seq)
	switch {
	case gerr == nil && rec.Status == store.StepCompleted:
		return nil // one commit holds them all: the last is there, so are the others
	case gerr != nil && !errors.Is(gerr, store.ErrNotFound):
		return &outcomeUnknownError{err: fmt.Errorf("commit of chained tx steps: %w; reading their records: %v", err, gerr)}
	}
	// Which step the failure belongs to is not known: each of them, and
	// the step after them, runs alone next time.
	d.e.unchained.add(d.runID, ch.recs[0].Seq, last.Seq+1)
	return &outcomeUnknownError{err: fmt.Errorf("%w: %w", errChainLost, err)}
}

// dropChain rolls back a chain the delivery ended with (its end wrote
// nothing after it, or failed): nothing of it committed.
func (d *delivery) dropChain() {
	if ch := d.chain.Swap(nil); ch != nil {
		rollback(context.WithoutCancel(d.ctx), ch.conn.Conn())
		ch.conn.Release()
	}
}

// unchainedRuns remembers, per run, the positions of the steps of a
// chained transaction that was lost or refused at its commit (a deferred
// constraint, a serialization failure, a cut connection): the run's next
// deliveries in this process run each of those steps in a transaction of
// its own, so a step that fails the same way every time fails alone, and
// is retried, recorded or parked, instead of taking the steps before it
// down with it on every delivery. Another process learns it the same way,
// once.
type unchainedRuns struct {
	mu sync.Mutex
	m  map[uuid.UUID][2]int
}

// maxUnchained bounds the map; past it, it starts over.
const maxUnchained = 10000

// add marks the positions from..to of runID.
func (u *unchainedRuns) add(runID uuid.UUID, from, to int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil || len(u.m) >= maxUnchained {
		u.m = map[uuid.UUID][2]int{}
	}
	u.m[runID] = [2]int{from, to}
}

// has reports whether the step at seq of runID must neither join a chain
// nor leave one open.
func (u *unchainedRuns) has(runID uuid.UUID, seq int) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	r, ok := u.m[runID]
	if ok && seq > r[1] {
		delete(u.m, runID) // past them: chains form again
		return false
	}
	return ok && seq >= r[0]
}
