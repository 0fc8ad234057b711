package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// ErrAmbiguous: a workflow ID names runs of several workflows.
var ErrAmbiguous = errors.New("ambiguous")

// A workflow ID names the latest run of its chain (continue-as-new).
const runByWorkflowID = `SELECT run_id FROM pgdurable.workflow_runs WHERE workflow_id = $1 AND status <> 'continued' LIMIT 2`

// ResolveRun finds the run target names: a run ID, else a workflow ID
// (unique per workflow name; ErrAmbiguous when two workflows use it).
func ResolveRun(ctx context.Context, db DBTX, target string) (uuid.UUID, error) {
	if id, err := uuid.Parse(target); err == nil {
		var found uuid.UUID
		err := at(db, id).QueryRow(ctx, `SELECT run_id FROM pgdurable.workflow_runs WHERE run_id = $1`, id).Scan(&found)
		if err == nil {
			return found, nil
		}
		if translate(err) != ErrNotFound {
			return uuid.Nil, fmt.Errorf("reading run %s: %w", id, err)
		}
	}
	// The workflow's name is not known, so neither is the route: each
	// route is asked, and two runs found anywhere are ambiguous.
	var ids []uuid.UUID
	err := eachRoute(ctx, db, func(db DBTX) error {
		if len(ids) > 1 {
			return nil
		}
		rows, err := db.Query(ctx, runByWorkflowID, target)
		if err != nil {
			return fmt.Errorf("reading runs of workflow ID %q: %w", target, translate(err))
		}
		found, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return fmt.Errorf("reading runs of workflow ID %q: %w", target, translate(err))
		}
		ids = append(ids, found...)
		return nil
	})
	switch {
	case err != nil:
		return uuid.Nil, err
	case len(ids) == 0:
		return uuid.Nil, ErrNotFound
	case len(ids) > 1:
		return uuid.Nil, ErrAmbiguous
	}
	return ids[0], nil
}

// The row lock serializes a signal with the run's AwaitSignal, which locks
// the same row before it looks for signals: a signal either lands before
// the look (and is found) or after the run is suspended waiting for it (and
// wakes it). A run waiting for another name is left asleep. A run that
// ended takes no signal, but a dead one does: it may yet be replayed. The
// lock is taken first (lockSignalled, which reads the run's status before
// the signal), and the signal's INSERT and the run's wake-up are
// statements of their own: Citus routes a statement to the node that
// holds the run only when it has no INSERT in a CTE, and an INSERT into a
// table with an identity column only when it inserts VALUES.
var insertSignal = named(`
INSERT INTO pgdurable.workflow_signals (run_id, name, payload, idempotency_key)
VALUES (@run_id, @name, @payload::jsonb, @key)`)

// takesSignals reports whether a run in status takes a signal: an active
// one (a status not in terminalStatuses), or a dead one, which may yet be
// replayed.
func takesSignals(status string) bool {
	switch status {
	case RunPending, RunRunning, RunWaiting, RunCompensating, RunDead:
		return true
	}
	return false
}

var wakeSignalled = named(`
WITH woken AS (
    UPDATE pgdurable.workflow_runs SET status = 'pending', wake_at = NULL, await_signal = NULL, enqueued_at = now()
    WHERE run_id = @run_id AND status = 'waiting' AND @name = ANY(string_to_array(await_signal, chr(31)))
    RETURNING run_id
)
SELECT count(*) > 0 FROM woken`)

// SignalLimits bound the signals one run holds, consumed ones included
// (they stay, so a replay can read them): a count and their payloads'
// bytes. Zero fields are no bound.
type SignalLimits struct {
	Count int
	Bytes int64
}

// ErrLimit: the run holds as many signals (or bytes of them) as it may.
var ErrLimit = errors.New("limit reached")

// Locking the run first, then counting in a statement of its own, sees
// every signal committed before the lock: the bound holds under
// concurrent senders.
const lockSignalled = `SELECT status, workflow_name FROM pgdurable.workflow_runs WHERE run_id = $1 FOR UPDATE`

const signalTotals = `SELECT count(*), coalesce(sum(octet_length(payload::text)), 0) FROM pgdurable.workflow_signals WHERE run_id = $1`

// keyedSignal finds the signal a key was sent with; the run's lock (taken
// first) makes the check and the insert after it one step for concurrent
// senders of the key.
const keyedSignal = `
SELECT s.name = $3 AND s.payload = $4::jsonb FROM pgdurable.workflow_signals s
WHERE s.run_id = $1 AND s.idempotency_key = $2`

// SignalParams is one signal to send: its name and JSON payload, and its
// idempotency key ("" for none).
type SignalParams struct {
	RunID   uuid.UUID
	Name    string
	Payload []byte
	Key     string
	Limits  SignalLimits
}

// SignalSent is what SendSignal did.
type SignalSent struct {
	// Status is the run's status before the signal; Workflow its name.
	Status, Workflow string
	// Woken: the run was waiting for this name and is now pending; the
	// caller enqueues its delivery in the same transaction.
	Woken bool
	// Duplicate: a signal with this key, name and payload was sent to the
	// run before; nothing was stored.
	Duplicate bool
}

// ErrKeyReused: the idempotency key was sent with another signal (name or
// payload) to this run.
var ErrKeyReused = errors.New("idempotency key reused")

// SendSignal buffers a signal for p.RunID. A finished run (completed,
// failed, compensated, cancelled) gets no signal (Status tells; the caller
// reports it closed). A keyed signal whose key the run has seen is a
// Duplicate when its name and payload (as jsonb) are the same, else
// ErrKeyReused. ErrNotFound when there is no such run; ErrLimit (with the
// totals in its message) when the signal would take the run over limits.
func SendSignal(ctx context.Context, tx DBTX, p SignalParams) (SignalSent, error) {
	tx = at(tx, p.RunID)
	runID := p.RunID
	var key *string
	if p.Key != "" {
		key = &p.Key
	}
	b := &pgx.Batch{}
	b.Queue(lockSignalled, runID)
	b.Queue(signalTotals, runID)
	if key != nil {
		b.Queue(keyedSignal, runID, p.Key, p.Name, string(p.Payload))
	}
	br := tx.SendBatch(ctx, b)
	var count, bytes int64
	var sent SignalSent
	var same *bool
	err := br.QueryRow().Scan(&sent.Status, &sent.Workflow)
	if err == nil {
		err = br.QueryRow().Scan(&count, &bytes)
	}
	if err == nil && key != nil {
		var sameKey bool
		switch err = br.QueryRow().Scan(&sameKey); {
		case err == nil:
			same = &sameKey
		case errors.Is(err, pgx.ErrNoRows):
			err = nil
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return SignalSent{}, translate(err)
	}
	if same != nil {
		if !*same {
			return SignalSent{}, fmt.Errorf("%w: key %q was sent to run %s with another signal", ErrKeyReused, p.Key, runID)
		}
		sent.Duplicate = true
		return sent, nil
	}
	switch limits := p.Limits; {
	case limits.Count > 0 && count >= int64(limits.Count):
		return SignalSent{}, fmt.Errorf("%w: run %s holds %d signals, the most it may", ErrLimit, runID, count)
	case limits.Bytes > 0 && bytes+int64(len(p.Payload)) > limits.Bytes:
		return SignalSent{}, fmt.Errorf("%w: run %s holds %d bytes of signals; %d more would pass the %d-byte bound", ErrLimit, runID, bytes, len(p.Payload), limits.Bytes)
	}
	if !takesSignals(sent.Status) {
		return sent, nil
	}
	b = &pgx.Batch{}
	insertSignal.queue(b, pgx.StrictNamedArgs{"run_id": runID, "name": p.Name, "payload": string(p.Payload), "key": key})
	wakeSignalled.queue(b, pgx.StrictNamedArgs{"run_id": runID, "name": p.Name})
	err = sendBatch(ctx, tx, b, func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		return br.QueryRow().Scan(&sent.Woken)
	})
	if err != nil {
		return SignalSent{}, translate(err)
	}
	return sent, nil
}

const lockOwnedRun = `SELECT cancel_requested_at IS NOT NULL FROM pgdurable.workflow_runs WHERE run_id = $1 AND owner_token = $2 FOR UPDATE`

const nextSignal = `
SELECT id, name, payload FROM pgdurable.workflow_signals
WHERE run_id = $1 AND name = ANY($2) AND consumed_seq IS NULL
ORDER BY id LIMIT 1`

// AwaitSeparator joins the names a run waits for in workflow_runs.await_signal
// (ASCII unit separator: signal names hold no control characters).
const AwaitSeparator = "\x1f"

const consumeSignal = `UPDATE pgdurable.workflow_signals SET consumed_seq = $2, consumed_at = now() WHERE id = $1`

// TakenSignal is what TakeSignal found: the signal it took (Found false
// when none was buffered), and whether the run's cancellation was
// requested.
type TakenSignal struct {
	Name            string
	Payload         []byte
	Found           bool
	CancelRequested bool
}

// TakeSignal, in tx, locks the run (fenced by token: ErrLeaseLost) and
// takes its oldest unconsumed signal named one of names for step seq (the
// first sent wins). The run stays locked until tx ends, so no signal can
// arrive unseen before the caller suspends it. With an error other than
// ErrLeaseLost, CancelRequested is still set once the lock was taken.
func TakeSignal(ctx context.Context, tx DBTX, f Fence, names []string, seq int) (TakenSignal, error) {
	tx = at(tx, f.RunID)
	runID := f.RunID
	var cancel bool
	if err := tx.QueryRow(ctx, lockOwnedRun, runID, f.Token).Scan(&cancel); err != nil {
		if translate(err) == ErrNotFound {
			return TakenSignal{}, ErrLeaseLost
		}
		return TakenSignal{}, fmt.Errorf("locking run %s: %w", runID, translate(err))
	}
	var id int64
	var name string
	var payload []byte
	// A new statement after the lock: its snapshot sees every signal
	// committed before the lock was granted.
	err := tx.QueryRow(ctx, nextSignal, runID, names).Scan(&id, &name, &payload)
	if translate(err) == ErrNotFound {
		return TakenSignal{CancelRequested: cancel}, nil
	}
	if err != nil {
		return TakenSignal{CancelRequested: cancel}, fmt.Errorf("reading signals of run %s: %w", runID, translate(err))
	}
	if _, err := tx.Exec(ctx, consumeSignal, id, seq); err != nil {
		return TakenSignal{CancelRequested: cancel}, fmt.Errorf("consuming signal %d of run %s: %w", id, runID, translate(err))
	}
	return TakenSignal{Name: name, Payload: payload, Found: true, CancelRequested: cancel}, nil
}

var suspendAwaitingRun = named(`
-- pgdurable: a delivery hands its run back to wait
WITH run AS (
    UPDATE pgdurable.workflow_runs SET status = @run_status, wake_at = @wake_at, await_signal = @await_signal, owner_token = NULL,
        lease_expires_at = NULL, stalled_deliveries = 0, long_stalled_deliveries = 0
    WHERE run_id = @run_id AND owner_token = @token
    RETURNING run_id
)
SELECT count(*), false FROM run`)

// AwaitParams says how SuspendAwaiting hands a run back: in Status (waiting, or
// compensating) until one of Awaits (signal names, ChildToken tokens)
// wakes it or WakeAt passes (nil: no timeout), writing Pending (may be
// nil; a wait for a signal writes its started record) in the same
// statement.
type AwaitParams struct {
	Pending *StepRecord
	Status  string
	Awaits  []string
	WakeAt  *time.Time
}

// SuspendAwaiting hands the run f fences back waiting, as w says.
func SuspendAwaiting(ctx context.Context, tx DBTX, f Fence, w AwaitParams) error {
	tx = at(tx, f.RunID)
	var await *string // a wait for a timer alone waits for nothing else
	if len(w.Awaits) > 0 {
		joined := strings.Join(w.Awaits, AwaitSeparator)
		await = &joined
	}
	args := pgx.StrictNamedArgs{"run_id": f.RunID, "token": f.Token, "run_status": w.Status, "wake_at": w.WakeAt, "await_signal": await}
	return fencedWithRecord(ctx, tx, f, w.Pending, "suspending run %s", call{suspendAwaitingRun, args})
}
