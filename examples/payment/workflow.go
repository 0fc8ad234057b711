package payment

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgdurable/pgdurable/activities"
	"github.com/pgdurable/pgdurable/compensation"
	"github.com/pgdurable/pgdurable/engine"
)

// WorkflowName is the payment workflow's stored name.
const WorkflowName = "payment"

// QueueName is the flow-controlled queue the workflow's runs go through:
// its key is the order's customer, and one customer's payments run one
// at a time (QueueOpts.KeyConcurrency 1), in the order they were started,
// so two payments of one customer never race.
const QueueName = "payments"

// ChargeRateLimit is the rate limit the gateway's charges and refunds
// share, across every process: the card processor's own limit, kept
// below so that its 429s stay rare.
const ChargeRateLimit = "card_processor"

// DefaultChargeRate is Config.ChargeRate's default: 100 calls a second,
// Stripe's default limit for a live account, in bursts of up to 10.
var DefaultChargeRate = engine.Rate{Limit: 100, Period: time.Second, Burst: 10}

// Registrations are what a process that works payments registers
// (engine.Engine.Register): the workflow (New), its queue (QueueName,
// one run per customer at a time) and the charge rate limit
// (ChargeRateLimit, cfg.ChargeRate). Register them all, in every process:
// the workflow alone would run without the per-customer order, and its
// charges would fail for want of the rate limit.
func Registrations(g *Gateway, cfg *Config) []engine.Registration {
	return append([]engine.Registration{New(g, cfg)}, Definitions(cfg)...)
}

// Definitions are Registrations without the workflow, for a program that
// keeps the *engine.Workflow that New returns (to call its Start): the
// queue and the charge rate limit, as Registrations defines them.
func Definitions(cfg *Config) []engine.Registration {
	rate := DefaultChargeRate
	if cfg != nil && cfg.ChargeRate != (engine.Rate{}) {
		rate = cfg.ChargeRate
	}
	return []engine.Registration{
		engine.DefineQueue(QueueName, engine.QueueOpts{KeyConcurrency: 1}),
		engine.DefineRateLimit(ChargeRateLimit, rate),
	}
}

// New defines the payment workflow over gateway g:
//
//	validate → fraud check (behind engine.Patched: added under runs in flight)
//	→ claim the order (tx step; undo: release the order and its reservations)
//	→ reserve each item, in SKU order (a tx step per item, sharing the claim's transaction) → charge (activity;
//	undo: refund) → record payment in the ledger (tx step, one row per order; undo: remove
//	the row) → send receipt (activity)
//
// One order is one charge whatever workflow ID a client picks: the first
// run claims the order, and a second run for it fails at the claim
// (ErrOrderTaken, class order_taken) without reserving, charging or
// refunding anything. Clients should use the order ID as the workflow ID:
// a repeated start then returns the first run.
//
// A customer the fraud check stops fails the run (ErrFraudSuspected,
// class fraud_suspected) before anything is claimed or charged.
// A decline (402) or a sold-out item fails permanently and the completed
// steps are undone: the run ends compensated with the decline in its error.
// A receipt that cannot be sent does not undo a paid order: the receipt is
// reported as not sent.
//
// Runs go through QueueName keyed by the customer, and charges and
// refunds take turns of ChargeRateLimit: register the workflow with
// Registrations, which defines both.
func New(g *Gateway, cfg *Config) *engine.Workflow[Order, Receipt] {
	retry := &engine.RetryPolicy{InitialInterval: 200 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: 10 * time.Second, MaximumAttempts: 8}
	if cfg != nil && cfg.Retry != nil {
		retry = cfg.Retry
	}
	charge := &activities.Activity[Order, Charge]{Name: "charge", Fn: g.Charge, RetryPolicy: retry, StartToCloseTimeout: 30 * time.Second,
		RateLimit: ChargeRateLimit}
	receipt := &activities.Activity[receiptReq, bool]{
		Name: "send_receipt",
		Fn: func(ctx context.Context, call activities.Call, r receiptReq) (bool, error) {
			return true, g.SendReceipt(ctx, call, r.Order, r.Charge)
		},
		RetryPolicy: retry, StartToCloseTimeout: 30 * time.Second,
	}
	return engine.Define(WorkflowName, func(ctx *engine.Context, o Order) (Receipt, error) {
		if _, err := engine.Step(ctx, "validate", func(context.Context) (bool, error) {
			return true, engine.Permanent(o.Validate()) // also checked at start; here for runs stored before a rule changed
		}, nil); err != nil {
			return Receipt{}, err
		}
		// Added after runs were in flight: a run that passed this point
		// before the deploy replays without it (testdata/histories holds
		// such runs, which TestPaymentReplaysRecordedRuns replays).
		if engine.Patched(ctx, "fraud-check") {
			if _, err := engine.Step(ctx, "fraud_check", func(context.Context) (bool, error) {
				return true, screen(o)
			}, nil); err != nil {
				return Receipt{}, err
			}
		}
		saga := compensation.New(ctx)
		// The claim's undo releases whatever the run reserved (it may have
		// reserved some items when another sells out) and gives the order
		// back.
		if _, err := compensation.TxStep(saga, "claim_order", func(sctx context.Context, tx pgx.Tx) (bool, error) {
			return true, claimOrder(sctx, tx, o.OrderID, ctx.RunID(), ctx.WorkflowID())
		}, compensation.TxUndo[bool]{Name: "release_inventory", Fn: func(sctx context.Context, tx pgx.Tx, _ bool) error {
			return release(sctx, tx, o.OrderID, ctx.RunID())
		}}, nil); err != nil {
			return Receipt{}, err
		}
		// Each item is reserved in a tx step of its own, in SKU order: the
		// steps share the claim's transaction (one commit for the claim and
		// every reservation), and orders that want the same SKUs lock their
		// inventory rows in the same order, so they never deadlock.
		items := slices.Clone(o.Items)
		slices.SortStableFunc(items, func(a, b Item) int { return strings.Compare(a.SKU, b.SKU) })
		for _, it := range items {
			if _, err := engine.TxStep(ctx, "reserve_item", func(sctx context.Context, tx pgx.Tx) (int, error) {
				return reserveItem(sctx, tx, ctx.RunID(), o.OrderID, it)
			}, nil); err != nil {
				return Receipt{}, err // out of stock: the claim's undo releases what was reserved
			}
		}
		ch, err := compensation.Activity(saga, charge, o, compensation.Undo[Charge]{
			Name: "refund", Fn: g.Refund, RetryPolicy: retry, StartToCloseTimeout: 30 * time.Second, RateLimit: ChargeRateLimit,
		})
		if err != nil {
			return Receipt{}, err
		}
		if _, err := compensation.TxStep(saga, "record_payment", func(sctx context.Context, tx pgx.Tx) (bool, error) {
			_, err := tx.Exec(sctx, `INSERT INTO payment_ledger (order_id, payment_intent, amount, currency, run_id)
				VALUES ($1, $2, $3, $4, $5)`, o.OrderID, ch.PaymentIntent, ch.Amount, ch.Currency, ctx.RunID())
			if isUniqueViolation(err) {
				return false, engine.Permanent(fmt.Errorf("order %s is already paid by another run", o.OrderID))
			}
			return err == nil, err
		}, compensation.TxUndo[bool]{Name: "unrecord_payment", Fn: func(sctx context.Context, tx pgx.Tx, _ bool) error {
			// A run cancelled after it paid is refunded: its ledger row
			// goes too, so the ledger agrees with the gateway.
			_, err := tx.Exec(sctx, `DELETE FROM payment_ledger WHERE order_id = $1 AND run_id = $2`, o.OrderID, ctx.RunID())
			return err
		}}, nil); err != nil {
			return Receipt{}, err
		}
		sent, err := activities.Execute(ctx, receipt, receiptReq{Order: o, Charge: ch})
		var failed *engine.StepError
		if errors.As(err, &failed) {
			// A receipt that could not be sent does not undo a paid order.
			ctx.Logger().Warn("receipt not sent; the order stays paid", "error", err)
			err = nil
		}
		return Receipt{OrderID: o.OrderID, PaymentIntent: ch.PaymentIntent, Amount: ch.Amount, Currency: ch.Currency, ReceiptSent: sent}, err
	}, &engine.WorkflowOpts{Version: 2, Queue: QueueName, QueueKey: engine.KeyOf(func(o Order) string { return o.CustomerID })})
}

// Config tunes the workflow. A nil *Config takes the defaults.
type Config struct {
	// Retry is the gateway calls' retry policy. Default: 200ms doubling to
	// 10s, 8 attempts.
	Retry *engine.RetryPolicy
	// ChargeRate is ChargeRateLimit's rate, which Registrations defines.
	// Default DefaultChargeRate.
	ChargeRate engine.Rate
}

type receiptReq struct {
	Order  Order
	Charge Charge
}

// ErrFraudSuspected is in the error of a run whose order the fraud check
// stopped, before anything was claimed, reserved or charged (class
// fraud_suspected; the run fails).
var ErrFraudSuspected = errors.New("payment: fraud suspected")

// blockedCustomers are the customers the fraud check stops: the
// example's stand-in for a fraud service's verdict.
var blockedCustomers = map[string]bool{"cus_blocked": true}

// screen is the fraud check's verdict on o: nil, or ErrFraudSuspected
// (permanent: trying again changes nothing).
func screen(o Order) error {
	if blockedCustomers[o.CustomerID] {
		return engine.WithClass(engine.Permanent(fmt.Errorf("%w: customer %s", ErrFraudSuspected, o.CustomerID)), "fraud_suspected")
	}
	return nil
}

// ErrOrderTaken is in the error of a run refused because another run is
// paying (or has paid) the same order: one order is one charge, whatever
// workflow ID a client picked. Use the order ID as the workflow ID, and a
// repeated start returns the first run instead.
var ErrOrderTaken = errors.New("payment: order is paid by another run")

// Registered, so errors.Is(err, ErrOrderTaken) answers the same on the
// run's result (Workflow.Wait) in any process that imports this package.
var _ = func() error {
	if err := engine.RegisterSentinel("payment.ErrOrderTaken", ErrOrderTaken); err != nil {
		panic(err) // a name clash within this module: a programming error
	}
	if err := engine.RegisterSentinel("payment.ErrFraudSuspected", ErrFraudSuspected); err != nil {
		panic(err)
	}
	return nil
}()

// claimOrder makes this run the one that pays o, in the reservation's
// transaction: a second run for the order fails here, before it reserves
// or charges anything. DO UPDATE (to the same value) returns the claim's
// run under concurrency too, where DO NOTHING would return nothing.
func claimOrder(ctx context.Context, tx pgx.Tx, orderID string, runID uuid.UUID, workflowID string) error {
	var owner uuid.UUID
	if err := tx.QueryRow(ctx, `INSERT INTO payment_orders (order_id, run_id) VALUES ($1, $2)
		ON CONFLICT (order_id) DO UPDATE SET run_id = payment_orders.run_id RETURNING run_id`, orderID, runID).Scan(&owner); err != nil {
		return err
	}
	if owner != runID {
		hint := ""
		if workflowID != orderID {
			hint = " (start orders with the order ID as the workflow ID: a repeated start then returns the first run)"
		}
		return engine.WithClass(engine.Permanent(fmt.Errorf("%w: order %s is run %s's%s", ErrOrderTaken, orderID, owner, hint)), "order_taken")
	}
	return nil
}

// reserveItem takes one item of an order from stock, for run runID.
func reserveItem(ctx context.Context, tx pgx.Tx, runID uuid.UUID, orderID string, it Item) (int, error) {
	tag, err := tx.Exec(ctx, `UPDATE payment_inventory SET reserved = reserved + $2
		WHERE sku = $1 AND stock - reserved >= $2`, it.SKU, it.Qty)
	if err != nil {
		return 0, err
	}
	if tag.RowsAffected() == 0 {
		return 0, engine.WithClass(engine.Permanent(fmt.Errorf("%s: unknown SKU or not enough stock for %d", it.SKU, it.Qty)), "out_of_stock")
	}
	if _, err := tx.Exec(ctx, `INSERT INTO payment_reservations (order_id, sku, qty, run_id) VALUES ($1, $2, $3, $4)
		ON CONFLICT (order_id, sku) DO UPDATE SET qty = payment_reservations.qty + excluded.qty`,
		orderID, it.SKU, it.Qty, runID); err != nil {
		return 0, err
	}
	return it.Qty, nil
}

// release returns this run's reservations for an order to stock and gives
// the order's claim back, so the order can be tried again; another run's
// reservations and claim are never touched.
func release(ctx context.Context, tx pgx.Tx, orderID string, runID uuid.UUID) error {
	if _, err := tx.Exec(ctx, `WITH gone AS (DELETE FROM payment_reservations WHERE order_id = $1 AND run_id = $2 RETURNING sku, qty)
		UPDATE payment_inventory i SET reserved = i.reserved - gone.qty FROM gone WHERE i.sku = gone.sku`, orderID, runID); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `DELETE FROM payment_orders WHERE order_id = $1 AND run_id = $2`, orderID, runID)
	return err
}
