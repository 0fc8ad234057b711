package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgdurable/pgdurable/engine/internal/steptx"
	"github.com/pgdurable/pgdurable/engine/internal/store"
)

// StepOpts tunes one step. A nil *StepOpts takes the workflow's and the
// engine's defaults.
type StepOpts struct {
	// RetryPolicy fills the fields it sets; the workflow's, the engine's
	// and DefaultRetryPolicy fill the rest.
	RetryPolicy *RetryPolicy
	// RateLimit names a rate limit (Engine.RegisterRateLimit) that each
	// attempt of the step takes a turn of before it runs: the attempts of
	// every step and activity naming it, in every process, go at its
	// rate. An attempt waiting for its turn holds its worker, and the wait
	// does not count toward StartToCloseTimeout. A limit that some
	// process registered serves every process; a name that none did fails
	// the attempt with ErrInvalidArgument, permanently.
	RateLimit string
	// ReturnExhausted returns a step that ran out of retries to the
	// workflow as a *StepError, which errors.Is finds ErrRetriesExhausted
	// in (and the last attempt's error: ErrTimeout for a timed-out
	// activity), so the workflow can decide (a fallback, a compensation).
	//
	// Without it, a step that runs out of retries is returned only when the
	// run has compensations registered (the run then undoes its work), and
	// parks the run as dead otherwise; an activity that runs out of
	// retries always parks the run, because one of its attempts may have
	// taken effect with its answer lost (a charge made, the connection
	// cut), and only an operator, or a replay with the same request ID once
	// the service is back, can tell.
	ReturnExhausted bool
	// StartToCloseTimeout bounds each attempt (0: no bound). Past it the
	// attempt's context is cancelled and the attempt fails with class
	// "timeout" (transient: retried per the policy; errors.Is finds
	// ErrTimeout in what the workflow gets once retries end). A Step whose
	// function ignores its context is abandoned 100 ms later (it
	// may still finish in the background; its result is dropped). A
	// TxStep's attempt is awaited, since its transaction must end before
	// the next one begins, and rolls back: what committed is what counts.
	StartToCloseTimeout time.Duration
	// ScheduleToCloseTimeout bounds the step as a whole, all attempts and
	// backoffs, from its first attempt's start, across deliveries (0: no
	// bound): an attempt gets at most the time left, and a retry whose
	// backoff would end past it is not made; the step fails as if its
	// retries ran out, with the timeout in its error (ErrTimeout). Each
	// attempt of such a step is announced (recorded started, one write) so
	// the start survives a crash, and an attempt whose worker died counts.
	ScheduleToCloseTimeout time.Duration
	// Input, when set, is the step's input as the workflow gives it (the
	// item a loop reserves, the request an activity sends): a 64-bit hash
	// of its JSON is recorded with the step, and a replay that reaches this
	// position with a different input parks the run as nondeterminism
	// (and fails a replay test), naming the position. That catches what
	// names alone cannot: two steps of one name swapped, or an input the
	// new code computes otherwise. A value json.Marshal rejects returns
	// ErrInvalidArgument, unrecorded. Records from before a step set it
	// are not checked.
	Input any

	// undo builds a parallel step's undo from its output (GoUndo).
	undo func(out []byte) (*Undo, error)
	// activity is a parallel activity's options (GoActivity).
	activity *ActivityOpts
}

// scheduleToClose is o's ScheduleToCloseTimeout (0 for a nil o).
func (o *StepOpts) scheduleToClose() time.Duration {
	if o == nil {
		return 0
	}
	return o.ScheduleToCloseTimeout
}

// inputHash is the hash recorded for o.Input (FNV-1a of its JSON), nil
// when o sets no input.
func (o *StepOpts) inputHash() (*int64, error) {
	if o == nil || o.Input == nil {
		return nil, nil
	}
	b, err := json.Marshal(o.Input)
	if err != nil {
		return nil, fmt.Errorf("StepOpts.Input: %v", err)
	}
	h := fnv.New64a()
	h.Write(b)
	v := int64(h.Sum64())
	return &v, nil
}

func (o *StepOpts) validate() error {
	switch {
	case o == nil:
		return nil
	case o.StartToCloseTimeout < 0 || o.ScheduleToCloseTimeout < 0:
		return errors.New("StartToCloseTimeout and ScheduleToCloseTimeout cannot be negative")
	}
	return o.RetryPolicy.validate()
}

// Step runs fn as the run's next step and records its outcome; when the
// step is already recorded (a replay after a crash, a redelivery) it
// returns the record and fn does not run. Results go through JSON both
// ways, so live runs and replays see the same value.
//
// Outcomes:
//   - fn returns a value: recorded (written before the next step starts,
//     in the same round trip as its announcement, in a next tx step's
//     transaction, or with the run's completion; before the workflow waits
//     for anything, such as a parallel step, when its attempt was announced)
//     and returned.
//   - fn returns an error: retried per the RetryPolicy; attempts are counted
//     in Postgres. A backoff over Config.MaxInlineBackoff ends this delivery
//     and frees the worker until the retry is due.
//   - fn returns Permanent(err), a value that json.Marshal rejects, or one
//     whose JSON is over Config.MaxPayloadBytes (ErrOutputTooLarge, class
//     output_too_large): one attempt, the error is recorded and a *StepError
//     returned, on replay too.
//   - retries exhausted, fn panics, or a different step name is recorded at
//     this position (non-determinism): the run is parked as dead.
//
// After the delivery ends (parked, waiting for a retry, lease lost), Step
// returns an error without running fn; the workflow should return it.
func Step[T any](ctx *Context, name string, fn func(context.Context) (T, error), opts *StepOpts) (T, error) {
	raw, err := ctx.d.runStep(&stepCall{name: name, kind: KindStep, opts: opts, returnExhausted: opts != nil && opts.ReturnExhausted,
		body: func(sctx context.Context, a *attemptState) ([]byte, error) {
			v, err := fn(sctx)
			if err != nil {
				return nil, err
			}
			return encodeOutput(v, a.d.e.cfg.MaxPayloadBytes)
		}})
	return decodeOutput[T](name, raw, err)
}

// encodeOutput encodes a step's (or a workflow's) result for its record;
// an encoding over limit bytes is refused, so nothing oversized is stored
// and loaded again on every replay.
func encodeOutput(v any, limit int) ([]byte, error) {
	b, err := json.Marshal(v)
	if err == nil {
		err = checkStorable(b)
	}
	if err == nil && len(b) > limit {
		err = fmt.Errorf("%w: %d bytes, over the %d-byte limit (Config.MaxPayloadBytes)", ErrOutputTooLarge, len(b), limit)
	}
	if err != nil {
		return nil, &errUnserializableOutput{err: err}
	}
	return b, nil
}

// decodeOutput decodes a step's recorded (or just recorded) result.
func decodeOutput[T any](name string, raw []byte, err error) (T, error) {
	var out T
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return out, fmt.Errorf("pgdurable: decoding recorded output of step %q: %w", name, err)
	}
	return out, nil
}

// stepCall is one call of a step of any kind, as runStep executes it.
type stepCall struct {
	name string
	kind StepKind
	opts *StepOpts
	// requestID: store a request ID before the first attempt (activities).
	requestID bool
	// tx: the body writes its completed record in its own transaction.
	tx bool
	// compensationOf is the forward step an undo step compensates.
	compensationOf *int
	// settle: once begun (its request ID stored), the step runs to a
	// definite outcome even if the run is cancelled — an activity that
	// does not heartbeat may already have taken effect, and only its
	// outcome tells whether there is something to undo.
	settle bool
	// returnExhausted: StepOpts.ReturnExhausted.
	returnExhausted bool
	// parkAs, when set, parks the run with this reason on a permanent
	// failure or exhausted retries instead of returning the error
	// (compensation steps: compensation_failed).
	parkAs DeadReason
	// inputHash is StepOpts.Input's hash (nil: none).
	inputHash *int64
	// wake, set for a sleep, gives the time a new sleep waits until; a
	// recorded sleep waits until its recorded time instead.
	wake func() time.Time
	// body runs one attempt.
	body func(ctx context.Context, a *attemptState) ([]byte, error)
}

// enterStep takes the next step position for a step of any kind (what
// names it in errors: "step", "signal"), or says why none may start. On
// success the caller must clear d.inStep when the step is done.
func (d *delivery) enterStep(what, name string, join bool) (int, error) {
	if !join && !d.ended && !d.settleChain() {
		return 0, d.endErr
	}
	if d.ended {
		return 0, d.endErr
	}
	if err := checkName(what+" name", name, 200); err != nil {
		// Not recorded and no position used: it fails the same way on replay.
		return 0, fmt.Errorf("pgdurable: %w", err)
	}
	if !d.inStep.CompareAndSwap(false, true) {
		return 0, fmt.Errorf("pgdurable: %s %q called while another step runs; steps cannot nest or run concurrently", what, name)
	}
	seq := d.pos.take()
	d.attachPatches(seq)
	return seq, nil
}

// runStep is the replay logic shared by every kind of step.
func (d *delivery) runStep(call *stepCall) ([]byte, error) {
	name, kind, opts := call.name, call.kind, call.opts
	if err := opts.validate(); err != nil {
		// Not recorded and no position used: the same on replay.
		return nil, fmt.Errorf("%w: step %q: %v", ErrInvalidArgument, name, err)
	}
	hash, err := opts.inputHash()
	if err != nil {
		return nil, fmt.Errorf("%w: step %q: %v", ErrInvalidArgument, name, err)
	}
	call.inputHash = hash
	// A tx step may join the open chain: runStep settles it otherwise.
	seq, err := d.enterStep("step", name, true)
	if err != nil {
		return nil, err
	}
	defer d.inStep.Store(false)
	forward := call.compensationOf == nil
	if forward && d.cancelRequested.Load() {
		if rec := d.pos.at(seq); rec == nil || rec.Kind == string(KindCompensation) {
			d.pos.giveBack() // never started: the undos take its place
			return nil, ErrCancelled
		}
	}
	// Replay, the hot path: nothing here allocates.
	rec, ok := d.replay(seq, name, kind)
	if !ok || !d.sameInput(seq, name, call.inputHash, rec) {
		return nil, d.endErr
	}
	if rec != nil && !d.settleChain() {
		return nil, d.endErr
	}
	if rec != nil {
		switch rec.Status {
		case store.StepCompleted:
			d.e.obs.StepReplayed(StepReplayedEvent{Workflow: d.wf.name, Kind: kind})
			return rec.Output, nil
		case store.StepFailed:
			return nil, stepErrorFromRecord(rec)
		case store.StepCancelled:
			return nil, ErrCancelled // stopped by the cancellation, which stands
		}
	}
	l := d.newAttemptLoop(call, seq, rec)
	if d.chain.Load() != nil && !d.mayJoin(l) && !d.settleChain() {
		return nil, d.endErr
	}
	return l.run()
}

// waitUntil waits for a retry or a sleep that is due at t: in place when
// it is close, otherwise by ending the delivery until then, except while
// parallel steps of the run are running: the delivery waits in place
// until they have ended (then it ends) or t comes, so they run once, to
// their end. Whatever wrote t down (the retry's or the sleep's record)
// is written before the delivery waits: a redelivery keeps t. True when
// t came, or the run's cancellation makes stoppable true (the caller's
// stop check follows); false when the delivery ended.
func (d *delivery) waitUntil(t time.Time, stoppable func() bool) bool {
	watchCancel := true
	for {
		if d.parkPanickedBranch() {
			return false
		}
		left := t.Sub(d.e.now())
		switch {
		case left <= 0:
			return true
		case left <= d.e.cfg.MaxInlineBackoff:
			return d.wait(left, stoppable)
		case !d.branchesRunning():
			d.suspend(nil, t)
			return false
		}
		d.pauseForBranches(&t, watchCancel)
		switch {
		case d.ctx.Err() != nil:
			d.interrupted()
			return false
		case watchCancel && d.fwd.Err() != nil:
			if stoppable() {
				return true
			}
			watchCancel = false // a settling step waits out its backoff
		}
	}
}

// wait waits for dur unless the delivery is interrupted first (false), or
// the run's cancellation makes stoppable true, which cuts the wait short
// (true: the caller's stop check follows).
func (d *delivery) wait(dur time.Duration, stoppable func() bool) bool {
	t := time.NewTimer(dur)
	defer t.Stop()
	cancelled := d.fwd.Done()
	for {
		select {
		case <-t.C:
			return true
		case <-cancelled:
			if stoppable() {
				return true
			}
			cancelled = nil // a settling step waits out its backoff
		case <-d.ctx.Done():
			d.interrupted()
			return false
		}
	}
}

// maxSettleAttempts bounds the attempts a cancelled run makes to learn the
// outcome of an activity that may have taken effect (see Cancel): past it
// the run is parked, the outcome left to an operator.
const maxSettleAttempts = 3

// unsettledError parks a cancelled run whose activity's outcome is still
// unknown after maxSettleAttempts attempts.
type unsettledError struct {
	attempts int
	last     error
}

func (e *unsettledError) Error() string {
	last := "no error recorded"
	if e.last != nil {
		last = errorText(e.last)
	}
	return fmt.Sprintf("the run was cancelled, and %d attempts since could not learn whether this activity took effect "+
		"(last: %s): check it with its request ID, then replay the dead job to settle it and compensate, or discard it",
		e.attempts, last)
}
func (e *unsettledError) Unwrap() error        { return e.last }
func (e *unsettledError) Is(target error) bool { return target == ErrRetriesExhausted }

// workerLostError is the failure of an attempt that began and never ended:
// its worker died, or lost its lease, during it.
type workerLostError struct{ attempt int }

func (e *workerLostError) Error() string {
	return fmt.Sprintf("attempt %d did not finish: its worker died or lost its lease during it", e.attempt)
}
func (e *workerLostError) ErrorClass() string   { return string(ClassWorkerLost) }
func (e *workerLostError) Is(target error) bool { return target == ErrWorkerLost }

// stepFailure records a step's failure: err's chain, with the step's name,
// position and attempt.
func stepFailure(err error, class ErrorClass, name string, seq, attempt int) *ErrorInfo {
	info := newErrorInfo(err, class)
	info.Step, info.Seq, info.Attempt = name, &seq, attempt
	return info
}

// stepErrorFromRecord decodes a failed step's record into the error the
// workflow sees: the same for the live delivery that recorded it and for
// every replay.
func stepErrorFromRecord(rec *store.StepRecord) *StepError {
	info := decodeErrorInfo(rec.Error)
	if info == nil {
		info = &ErrorInfo{Class: ClassPermanent, Message: "no error recorded"}
	}
	return &StepError{Step: rec.Name, Seq: rec.Seq, Attempt: rec.Attempts, Class: info.Class,
		Message: info.Message, Err: info.Err()}
}

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

// TxStep runs fn in a transaction on the engine's database and records the
// step in that same transaction: fn's writes and the record commit together
// or not at all, so a tx step takes effect exactly once, however often the
// run is delivered. On replay the recorded result returns and fn does not
// run.
//
// The record's write is fenced by the run's lease: if another delivery took
// the run over while fn ran, the transaction rolls back and this delivery
// stops (ErrLeaseLost). fn must use tx for every write that belongs to the
// step. The transaction commits with the record, or rolls back when fn
// returns an error: tx.Commit and tx.Rollback return an error instead
// (tx.Begin makes a savepoint, as pgx's does), and a statement through tx
// that would end the transaction is refused (ErrEndsTransaction). Errors
// follow Step's rules:
// fn's error rolls back and is retried unless Permanent; serialization
// failures and deadlocks are transient.
//
// The record of a plain Step just before it, if not yet written, commits
// in the same transaction (nothing shows that step started: a crash before
// the commit runs it again, as Step promises). Any other record, an
// activity's outcome among them, is written before fn starts, so a slow
// transaction never holds it back.
//
// Consecutive tx steps of a run share one transaction: when fn succeeds
// and the workflow's next step is a tx step too, the transaction stays
// open and that step runs in it under a savepoint (its failure rolls back
// to the savepoint alone, and the steps before it commit with their
// records). The transaction commits, with every record in it, at the run's
// next durable point: a step of any other kind, a wait, a failed step,
// the workflow's return, or 16 steps. So the writes of a tx step are
// visible to other transactions from then on, not from its return; its
// row locks are held until then; and a crash before then runs every step
// in the transaction again (each still commits once, with its record).
// Transaction-scoped settings (SET LOCAL, set_config(..., true)) carry
// into the steps that share the transaction after the one that set them.
// Steps running in parallel (Go), compensations, a step with a rate limit
// or a ScheduleToCloseTimeout, and a run whose cancellation is requested
// do not share. A step commits the steps before it first, and begins its
// own transaction, when its first statement is new on its connection (a
// statement that fails to parse would abort the shared transaction) or
// SET TRANSACTION, or when fn takes tx.Conn() first.
//
// Cost: fn's statements, the first with BEGIN (or, in a shared
// transaction, with the savepoint), and the fenced records with COMMIT in
// one more round trip, once per shared transaction. The record's fence is
// a share lock on the run's row, which it leaves as it is, except for a
// delivery's first write or when the lease is a heartbeat interval old:
// then it extends the lease.
func TxStep[T any](ctx *Context, name string, fn func(ctx context.Context, tx pgx.Tx) (T, error), opts *StepOpts) (T, error) {
	raw, err := ctx.d.runStep(&stepCall{name: name, kind: KindTx, opts: opts, tx: true, body: txBody(fn),
		returnExhausted: opts != nil && opts.ReturnExhausted})
	return decodeOutput[T](name, raw, err)
}

// txBody runs fn and writes the step's record in one transaction, fenced by
// the lease: exactly once. It is the body of TxStep and GoTx alike; a
// TxStep's transaction also commits the previous step's buffered record
// (a.prev). fn runs in ctx (the attempt's context, which a cancellation
// cancels); the record and COMMIT run in the delivery's, so a cancellation
// never cuts a commit short.
//
// The transaction costs the round trips fn's statements take and one
// more: BEGIN goes with fn's first statement, and the record with COMMIT
// (steptx; store.CommitStep for a fresh record alone, the common case,
// store.CommitSteps otherwise). A record the fence refuses fails its
// statement, so the COMMIT behind it never commits fn's writes alone.
//
// When the commit's outcome is unknown (its reply was lost with the
// connection), the record decides: a completed record is never
// overwritten, so a retry whose own record write finds it rolls back and
// returns the recorded result. A transaction of an earlier attempt still
// committing holds the record's row lock; the retry waits for it.
func txBody[T any](fn func(ctx context.Context, tx pgx.Tx) (T, error)) func(context.Context, *attemptState) ([]byte, error) {
	return func(sctx context.Context, a *attemptState) ([]byte, error) {
		d := a.d
		var out []byte
		var committing, already, chained bool
		keep := true // the record left the lease as it was
		prev := a.prev
		sent := time.Now()
		// The chain the step joins (runStep settled any it may not), the
		// step's own now: it goes back to the delivery if the step leaves
		// the transaction open in turn.
		var ch *txChain
		if !a.parallel {
			ch = d.chain.Swap(nil)
		}
		var conn *pgxpool.Conn
		var tx *steptx.Tx
		var settleErr error // the chain's commit before the step's first statement, when it failed
		if ch != nil {
			conn = ch.conn
			tx = steptx.Join(sctx, conn.Conn(), ch.tx, func(ctx context.Context) error {
				if settleErr = d.commitChain(d.ctx, ch); settleErr == nil {
					ch = nil
				}
				return settleErr
			})
		} else {
			var err error
			if conn, err = d.e.pool.Acquire(d.ctx); err != nil {
				return nil, err
			}
			tx = steptx.New(sctx, conn.Conn())
		}
		// Released before the reads below, which take a connection of
		// their own: parallel tx steps holding every connection of the
		// pool while they waited for one stalled the whole pool.
		released := false
		release := func() {
			if !released && !chained {
				released = true
				rollback(d.ctx, conn.Conn())
				conn.Release()
			}
		}
		defer release()
		refused := false
		var joined []*store.StepRecord // the chain's records, when the step ran in its transaction
		if ch != nil {
			joined = ch.recs
		}
		err := func() error {
			v, err := callTx(sctx, fn, tx)
			tx.Close()
			if tx.Settled() {
				joined = nil
				if settleErr != nil {
					return settleErr
				}
			}
			pc := conn.Conn().PgConn()
			if joined != nil && (tx.Lost() || pc.IsClosed() || pc.IsBusy()) {
				return errChainLost
			}
			if xid := tx.Escaped(); joined != nil && xid != "" {
				// fn had the connection inside the shared transaction:
				// whether it ended it, PostgreSQL says.
				switch status, serr := store.XactStatus(d.ctx, d.e.db, xid); {
				case serr != nil:
					return fmt.Errorf("%w: reading whether the step's function ended it: %v", errChainLost, serr)
				case status == "committed":
					joined, err = nil, d.endedJoined(conn, joined)
					return err
				case status != "in progress":
					return errChainLost
				}
			}
			if tx.Begun() && tx.Err() == nil && !pc.IsClosed() && !pc.IsBusy() && pc.TxStatus() == 'I' {
				if joined != nil {
					// The steps before it were in that transaction too,
					// ended unseen (statements that end it are refused).
					return errChainLost
				}
				// fn committed or rolled back on its own (COMMIT through
				// Exec, or a transaction on tx.Conn()): its writes are not
				// the step's, and trying again could write them twice.
				return Permanent(errEndedTransaction)
			}
			if err == nil {
				err = tx.Err() // a statement failed, and fn swallowed the error
			}
			if errors.Is(err, steptx.ErrEndsTransaction) {
				err = Permanent(err) // it would be refused again
			}
			if err == nil && pc.TxStatus() == 'E' && joined == nil {
				err = errAbortedTransaction // fn swallowed a failed statement's error
			}
			if err == nil && pc.TxStatus() == 'E' && joined != nil && tx.Begun() {
				err = errAbortedTransaction
			}
			if err != nil {
				return err
			}
			var late *timeoutError
			if errors.As(context.Cause(sctx), &late) {
				// The attempt passed its timeout before fn returned: it
				// failed, and what fn wrote rolls back.
				return late
			}
			if out, err = encodeOutput(v, d.e.cfg.MaxPayloadBytes); err != nil {
				return err
			}
			rec, err := a.completed(out)
			if err != nil {
				return Permanent(err)
			}
			recs := joined
			if prev != nil {
				recs = append(recs, prev)
			}
			recs = append(recs, rec)
			open := tx.Underlying()
			if open == nil && joined != nil {
				open = ch.tx // the step wrote nothing: the chain's transaction goes on
			}
			if open != nil && !a.parallel && d.mayChain(a.seq, len(recs)) {
				// Committed at the run's next durable point, with the
				// steps after it that join the transaction.
				d.chain.Store(&txChain{conn: conn, tx: open, recs: recs})
				chained = true
				return nil
			}
			committing = true
			var w store.StepsWritten
			keep, w, err = d.commitRecords(d.ctx, conn.Conn(), tx.Begun() || joined != nil, recs)
			refused = errors.Is(err, store.ErrStepsNotCommitted)
			if err == nil {
				d.noteCancel(w.CancelRequested)
			}
			return err
		}()
		if err != nil && joined != nil && !errors.Is(err, errChainLost) && !committing {
			// The step failed in the chain's transaction: undo its writes
			// alone, then commit the steps before it.
			err = d.unjoin(conn, tx, joined, err)
		}
		release()
		if errors.Is(err, errChainLost) || settleErr != nil && errors.Is(err, settleErr) {
			cause := err
			if ch != nil {
				// Not committed, or not known to be: the steps before it
				// run again on the next delivery, if they did not commit.
				if oerr := d.chainOutcome(ch, cause); oerr != nil {
					return nil, oerr
				}
			}
			if errors.Is(err, errChainLost) {
				return nil, &outcomeUnknownError{err: err}
			}
		}
		if refused {
			owns, oerr := store.OwnsRun(d.ctx, d.e.db, d.fence())
			switch {
			case oerr != nil:
				err = &outcomeUnknownError{err: fmt.Errorf("tx step's record refused; reading the lease: %w", oerr)}
			case !owns:
				err = store.ErrLeaseLost
			default:
				// The previous record always writes: this one is recorded
				// already, and what fn wrote rolled back.
				already, err = true, errAlreadyRecorded
			}
		}
		if err != nil && prev != nil {
			prev.Fresh = false // its insert may have committed: upsert it from now on
		}
		switch {
		case err == nil:
			a.recorded = true
			if chained {
				return out, nil
			}
			if !keep {
				d.extendedAt(sent)
			}
			d.progressed.Store(true)
			return out, nil
		case errors.Is(err, store.ErrLeaseLost):
			return nil, err
		case already || committing:
			var unknown *outcomeUnknownError
			if errors.As(err, &unknown) {
				return nil, err
			}
			rec, gerr := store.GetStep(d.ctx, d.e.db, d.runID, a.seq)
			switch {
			case gerr == nil && rec.Status == store.StepCompleted:
				// The commit that recorded it (this attempt's or an
				// earlier one's) wrote prev too.
				a.recorded = true
				return rec.Output, nil
			case gerr != nil && !errors.Is(gerr, store.ErrNotFound):
				// Cannot tell whether the commit landed: end this delivery
				// like a crash; the next one reads the records.
				return nil, &outcomeUnknownError{err: fmt.Errorf("commit of tx step: %w; reading its record: %v", err, gerr)}
			}
			if joined != nil {
				// The steps it joined were in that commit: not there either.
				d.e.unchained.add(d.runID, joined[0].Seq, a.seq)
				return nil, &outcomeUnknownError{err: fmt.Errorf("%w: %w", errChainLost, err)}
			}
		}
		return nil, err
	}
}

// endedJoined fails a tx step whose function committed the transaction it
// joined, on the connection it took (Conn): the steps before it committed
// with it, without their records. Those are written at once, so that the
// steps never run again, and the step fails for good, as a lone one does.
func (d *delivery) endedJoined(conn *pgxpool.Conn, joined []*store.StepRecord) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), writeTimeout)
	defer cancel()
	rollback(ctx, conn.Conn()) // a transaction the function began after its commit is not the step's
	if _, err := store.CommitSteps(ctx, d.e.on(conn.Conn()), d.fence(), false, joined...); err != nil {
		return fmt.Errorf("%w: writing the records of the steps the function committed: %v", errChainLost, err)
	}
	d.log.Error("a tx step's function committed the transaction it shared with the tx steps before it; "+
		"their records were written after it", "error", errEndedTransaction)
	return Permanent(errEndedTransaction)
}

// ErrEndsTransaction is what a tx step's function gets from a statement
// through its tx that would end or begin a transaction (COMMIT, COMMIT AND
// CHAIN, ROLLBACK, END, ABORT, BEGIN, START or PREPARE TRANSACTION,
// anywhere in a multi-statement string): it is not sent, and the step
// fails for good with nothing of it committed. The transaction commits
// with the step's record (and the records of the tx steps that share it);
// return an error to roll it back.
var ErrEndsTransaction = steptx.ErrEndsTransaction

// callTx calls fn, returning its panic as a *panicError (with its stack):
// a step that panics in a shared transaction must roll back to its
// savepoint and commit the steps before it like one that fails, or they
// would be rolled back with it while the workflow goes on past them.
func callTx[T any](ctx context.Context, fn func(context.Context, pgx.Tx) (T, error), tx pgx.Tx) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &panicError{p: &panicInfo{value: r, stack: debug.Stack()}}
		}
	}()
	return fn(ctx, tx)
}

// unjoin ends a tx step that failed with cause in the transaction of the
// chained steps before it (recs): it rolls back to the step's savepoint
// and commits the rest. cause when that worked (the step failed alone),
// errChainLost when it did not (none of them committed, or it is not
// known).
func (d *delivery) unjoin(conn *pgxpool.Conn, tx *steptx.Tx, recs []*store.StepRecord, cause error) error {
	// Detached: a shutdown that stopped the step keeps the steps before it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), writeTimeout)
	defer cancel()
	if tx.Begun() {
		if _, err := conn.Conn().Exec(ctx, steptx.RollbackToSavepoint); err != nil {
			return fmt.Errorf("%w: rolling back the failed step: %v", errChainLost, err)
		}
	}
	if err := d.commitChain(ctx, &txChain{conn: conn, recs: recs}); err != nil {
		return fmt.Errorf("%w: committing the steps before the failed one: %v", errChainLost, err)
	}
	return cause
}

// rollback ends the transaction left open on conn, if any: one whose
// function failed or whose record was refused. A connection it cannot
// bring back outside a transaction is closed by the pool on release.
func rollback(ctx context.Context, conn *pgx.Conn) {
	if conn.PgConn().TxStatus() != 'I' && !conn.PgConn().IsBusy() {
		_, _ = conn.Exec(ctx, "rollback")
	}
}

var errAlreadyRecorded = errors.New("step already recorded")

// errEndedTransaction fails a tx step whose function ended the step's
// transaction itself.
var errEndedTransaction = errors.New("pgdurable: the tx step's function ended its transaction itself (a COMMIT or ROLLBACK " +
	"through tx.Exec, or a transaction on tx.Conn()): its writes are not the step's; return an error to roll back, use tx.Begin for a savepoint")

// errAbortedTransaction fails a tx step whose function returned nil from
// a transaction a failed statement aborted.
var errAbortedTransaction = errors.New("pgdurable: a statement of the tx step failed and aborted its transaction, " +
	"but the step's function returned no error")

// outcomeUnknownError ends a delivery that cannot learn whether its last
// write committed.
type outcomeUnknownError struct{ err error }

func (e *outcomeUnknownError) Error() string { return e.err.Error() }
func (e *outcomeUnknownError) Unwrap() error { return e.err }
