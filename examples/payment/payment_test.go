package payment_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/examples/payment"
	"github.com/pgdurable/pgdurable/examples/payment/fakegateway"
	"github.com/pgdurable/pgdurable/internal/crashtest"
)

func TestMain(m *testing.M) {
	// A worker process of TestPaymentTraceSurvivesAKilledWorker: the
	// payment workflow against the gateway the test serves.
	crashtest.RunWorkerIfChild(func(*pgxpool.Pool) []engine.Registration {
		client, err := payment.NewGateway(payment.GatewayConfig{Timeout: time.Minute}, os.Getenv)
		if err != nil {
			panic(err)
		}
		return payment.Registrations(client, nil)
	})
	goleak.VerifyTestMain(m)
}

type fixture struct {
	e   *engine.Engine
	gw  *fakegateway.Gateway
	db  *enginetest.DB
	wf  *engine.Workflow[payment.Order, payment.Receipt]
	ctx context.Context
}

func setup(t *testing.T, faults fakegateway.Faults) *fixture {
	return setupWith(t, faults, nil)
}

func setupWith(t *testing.T, faults fakegateway.Faults, cfg *payment.Config) *fixture {
	return setupBehind(t, faults, cfg, nil)
}

// setupBehind is setupWith with the gateway's handler wrapped by wrap
// (nil: not wrapped).
func setupBehind(t *testing.T, faults fakegateway.Faults, cfg *payment.Config, wrap func(http.Handler) http.Handler) *fixture {
	t.Helper()
	db := enginetest.NewDB(t)
	ctx := context.Background()
	require.NoError(t, payment.Migrate(ctx, db.Pool))
	require.NoError(t, payment.Seed(ctx, db.Pool))
	gw := fakegateway.New(faults)
	var h http.Handler = gw
	if wrap != nil {
		h = wrap(gw)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	client, err := payment.NewGateway(payment.GatewayConfig{BaseURL: srv.URL, APIKey: "sk_test_fake", Timeout: 5 * time.Second}, func(string) string { return "" })
	require.NoError(t, err)
	wf := payment.New(client, cfg)
	e := enginetest.NewEngine(t, db, &engine.Config{RetryPolicy: &engine.RetryPolicy{InitialInterval: 20 * time.Millisecond, MaximumInterval: 200 * time.Millisecond}}, true,
		append([]engine.Registration{wf}, payment.Definitions(cfg)...)...)
	return &fixture{e: e, gw: gw, db: db, wf: wf, ctx: ctx}
}

func order(id string, amount int64, method string, items ...payment.Item) payment.Order {
	if len(items) == 0 {
		items = []payment.Item{{SKU: "sku_tee", Qty: 2}}
	}
	return payment.Order{OrderID: id, CustomerID: "cus_1", Amount: amount, Currency: "usd", PaymentMethod: method, Items: items}
}

func TestPaymentCompletesAndRecordsOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegateway.Faults{})
	res, err := f.wf.Start(f.ctx, f.e, order("ord_1", 4999, "pm_card_visa"), &engine.StartOpts{WorkflowID: "ord_1"})
	require.NoError(t, err)
	rcpt, err := f.wf.Wait(f.ctx, f.e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, int64(4999), rcpt.Amount)
	require.True(t, rcpt.ReceiptSent)
	l := f.gw.Ledger()
	require.Equal(t, int64(4999), l.NetByOrder()["ord_1"])
	var rows int
	require.NoError(t, f.db.Pool.QueryRow(f.ctx, `SELECT count(*) FROM payment_ledger WHERE order_id = 'ord_1'`).Scan(&rows))
	require.Equal(t, 1, rows)
}

func TestDeclineCompensates(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegateway.Faults{})
	res, err := f.wf.Start(f.ctx, f.e, order("ord_2", 1500, fakegateway.DeclineMethod), nil)
	require.NoError(t, err)
	_, err = f.wf.Wait(f.ctx, f.e, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	require.ErrorAs(t, err, &runErr)
	require.Equal(t, engine.StatusCompensated, runErr.Status)
	require.Contains(t, runErr.Info.Message, "declined")
	require.Equal(t, "card_declined_generic_decline", string(runErr.Info.Class))
	var reserved int
	require.NoError(t, f.db.Pool.QueryRow(f.ctx, `SELECT reserved FROM payment_inventory WHERE sku = 'sku_tee'`).Scan(&reserved))
	require.Zero(t, reserved, "the reservation was released")
	require.Zero(t, f.gw.Ledger().NetByOrder()["ord_2"])
}

func TestSoldOutCompensatesWithoutCharging(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegateway.Faults{})
	// Items are reserved in SKU order: the tee's reservation commits with
	// the claim before the limited item sells out; the claim's undo
	// releases it.
	res, err := f.wf.Start(f.ctx, f.e, order("ord_3", 100, "pm_card_visa", payment.Item{SKU: "sku_tee", Qty: 1},
		payment.Item{SKU: "sku_limited", Qty: 5}), nil)
	require.NoError(t, err)
	_, err = f.wf.Wait(f.ctx, f.e, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	require.ErrorAs(t, err, &runErr)
	require.Equal(t, engine.StatusCompensated, runErr.Status, "the claim (and any item reserved) was undone")
	require.Equal(t, "out_of_stock", string(runErr.Info.Class))
	require.Empty(t, f.gw.Ledger().Charges)
	var reserved, reservations, claims int
	require.NoError(t, f.db.Pool.QueryRow(f.ctx, `SELECT (SELECT coalesce(sum(reserved), 0) FROM payment_inventory),
		(SELECT count(*) FROM payment_reservations), (SELECT count(*) FROM payment_orders)`).Scan(&reserved, &reservations, &claims))
	require.Zero(t, reserved, "every reserved item released")
	require.Zero(t, reservations)
	require.Zero(t, claims, "the order is given back")
}

func TestInvalidOrderIsRejectedAtStart(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegateway.Faults{})
	_, err := f.wf.Start(f.ctx, f.e, order("bad id!", -5, "visa"), nil)
	require.ErrorIs(t, err, engine.ErrInvalidInput)
	require.ErrorContains(t, err, "order_id")
	require.ErrorContains(t, err, "amount -5")
	_, err = f.e.StartJSON(f.ctx, payment.WorkflowName, []byte(`{"order_id": "o", "amount": "12"}`), nil)
	require.ErrorIs(t, err, engine.ErrInvalidInput)
}

// Every order under faults (10% 5xx, 5% 429, 5% drop after processing,
// declines): a completed run's net charge is its amount, a compensated
// one's is 0, nobody is charged twice.
func TestPaymentsUnderGatewayFaults(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegateway.Faults{ServerError: 0.10, RateLimit: 0.05, DropAfter: 0.05, RandomSource: rand.New(rand.NewPCG(7, 7))})
	const n = 60
	orders := map[string]payment.Order{}
	runs := map[string]engine.StartResult{}
	for i := range n {
		method := "pm_card_visa"
		if i%7 == 3 {
			method = fakegateway.DeclineMethod
		}
		o := order(fmt.Sprintf("ord_%03d", i), int64(1000+i), method)
		res, err := f.wf.Start(f.ctx, f.e, o, &engine.StartOpts{WorkflowID: o.OrderID})
		require.NoError(t, err)
		orders[o.OrderID], runs[o.OrderID] = o, *res
	}
	deadline := time.Now().Add(60 * time.Second)
	var net map[string]int64
	for id, res := range runs {
		var run *engine.Run
		for {
			var err error
			run, err = f.e.GetRun(f.ctx, res.RunID)
			require.NoError(t, err)
			if run.Status == engine.StatusCompleted || run.Status == engine.StatusCompensated || run.Status == engine.StatusDead || run.Status == engine.StatusFailed {
				break
			}
			require.True(t, time.Now().Before(deadline), "%s still %s", id, run.Status)
			time.Sleep(20 * time.Millisecond)
		}
		net = f.gw.Ledger().NetByOrder()
		switch run.Status {
		case engine.StatusCompleted:
			require.Equal(t, orders[id].Amount, net[id], "%s completed", id)
			var r payment.Receipt
			require.NoError(t, json.Unmarshal(run.Output, &r))
		case engine.StatusCompensated:
			require.Zero(t, net[id], "%s compensated: %+v", id, run.Error)
		default:
			t.Errorf("%s ended %s: %+v", id, run.Status, run.Error)
		}
	}
	l := f.gw.Ledger()
	require.Zero(t, l.DoubleCharges())
	t.Logf("gateway: %d charges, %d refunds, requests %v", len(l.Charges), len(l.Refunds), l.Requests)
}

// fastRetry exhausts a gateway call in well under a second.
var fastRetry = &payment.Config{Retry: &engine.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaximumInterval: 20 * time.Millisecond, MaximumAttempts: 4}}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(10 * time.Millisecond)
	}
}

// The charge is made but its answer is lost, then the gateway fails every
// retry: the charge's outcome is unknown, so the run must not compensate
// (it would skip the refund of a charge it cannot see). It parks, and an
// operator's replay settles it with the same key.
func TestLostChargeAnswerThenExhaustedRetriesParks(t *testing.T) {
	t.Parallel()
	f := setupWith(t, fakegateway.Faults{DropAfter: 1}, fastRetry)
	res, err := f.wf.Start(f.ctx, f.e, order("amb1", 100, "pm_card_visa"), &engine.StartOpts{WorkflowID: "amb1"})
	require.NoError(t, err)
	waitFor(t, "the dropped charge", func() bool { return len(f.gw.Ledger().Charges) == 1 })
	f.gw.SetFaults(fakegateway.Faults{ServerError: 1})
	_, err = f.wf.Wait(f.ctx, f.e, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	require.ErrorAs(t, err, &runErr)
	require.Equal(t, engine.StatusDead, runErr.Status, "not compensated: the charge may have happened")
	require.Equal(t, int64(100), f.gw.Ledger().NetByOrder()["amb1"], "the customer is charged; the run is parked for that")

	f.gw.SetFaults(fakegateway.Faults{})
	jobs, _, err := f.e.ListDeadJobs(f.ctx, engine.ListDeadJobsParams{RunID: res.RunID})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.Equal(t, "charge", jobs[0].StepName)
	_, err = f.e.ReplayDeadJob(f.ctx, jobs[0].ID, nil)
	require.NoError(t, err)
	rcpt, err := f.wf.Wait(f.ctx, f.e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, int64(100), rcpt.Amount)
	l := f.gw.Ledger()
	require.Len(t, l.Charges, 1, "the replay got the stored answer for the same key")
	require.Equal(t, int64(100), l.NetByOrder()["amb1"])
}

// Cancelled while the charge retries after a lost answer: the charge runs
// to a definite outcome (it succeeded), its refund runs, the run ends
// cancelled with nothing kept.
func TestCancelWhileChargeRetriesRefundsIt(t *testing.T) {
	t.Parallel()
	f := setupWith(t, fakegateway.Faults{DropAfter: 1}, &payment.Config{Retry: &engine.RetryPolicy{InitialInterval: 50 * time.Millisecond, MaximumInterval: 100 * time.Millisecond, MaximumAttempts: 50}})
	res, err := f.wf.Start(f.ctx, f.e, order("amb2", 555, "pm_card_visa"), &engine.StartOpts{WorkflowID: "amb2"})
	require.NoError(t, err)
	waitFor(t, "the dropped charge", func() bool { return len(f.gw.Ledger().Charges) == 1 })
	f.gw.SetFaults(fakegateway.Faults{ServerError: 1})
	require.NoError(t, f.e.Cancel(f.ctx, res.RunID))
	// The charge keeps retrying, cancelled or not: wait for a retry after
	// the cancel to fail (a count, not a sleep: in 300 ms a fast machine
	// made the 3 settling attempts a cancelled run gets, and parked it).
	const charges = "POST /v1/payment_intents"
	tried := f.gw.Ledger().Requests[charges]
	waitFor(t, "a charge retried after the cancel", func() bool { return f.gw.Ledger().Requests[charges] > tried })
	f.gw.SetFaults(fakegateway.Faults{})
	_, err = f.wf.Wait(f.ctx, f.e, res.RunID, 10*time.Millisecond)
	var runErr *engine.RunError
	require.ErrorAs(t, err, &runErr)
	require.Equal(t, engine.StatusCancelled, runErr.Status)
	l := f.gw.Ledger()
	require.Zero(t, l.NetByOrder()["amb2"], "charged once, refunded once")
	require.Len(t, l.Refunds, 1)
}

// One order is one charge whatever workflow ID a client picks: five runs
// for the same order, started at once under five workflow IDs, charge the
// card once; the other four are refused (ErrOrderTaken) before they
// reserve or charge anything, and the order stays paid: no refund. Before,
// each run charged the card and four refunds corrected the net.
func TestOneOrderIsOneChargeWhateverTheWorkflowID(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegateway.Faults{})
	o := order("ord_same", 2500, "pm_card_visa")
	ids := make([]uuid.UUID, 5)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			res, err := f.wf.Start(f.ctx, f.e, o, &engine.StartOpts{WorkflowID: fmt.Sprintf("client-pick-%d", i)})
			require.NoError(t, err)
			ids[i] = res.RunID
		})
	}
	wg.Wait()
	completed, taken := 0, 0
	for _, id := range ids {
		_, err := f.wf.Wait(f.ctx, f.e, id, 10*time.Millisecond)
		switch {
		case err == nil:
			completed++
		case errors.Is(err, payment.ErrOrderTaken):
			taken++
			var runErr *engine.RunError
			require.ErrorAs(t, err, &runErr)
			require.Equal(t, engine.StatusFailed, runErr.Status, "nothing to undo: it never reserved")
		default:
			t.Fatalf("run %s: %v", id, err)
		}
	}
	require.Equal(t, 1, completed)
	require.Equal(t, 4, taken)
	l := f.gw.Ledger()
	require.Len(t, l.Charges, 1, "one charge")
	require.Empty(t, l.Refunds, "the order stays paid")
	require.Equal(t, int64(2500), l.NetByOrder()["ord_same"])
	var reserved int
	require.NoError(t, f.db.Pool.QueryRow(f.ctx, `SELECT reserved FROM payment_inventory WHERE sku = 'sku_tee'`).Scan(&reserved))
	require.Equal(t, 2, reserved, "the paid order's reservation stays; no other run reserved")
}

// A declined order gives its claim back when it compensates, so the
// customer can pay it with another card under a new workflow ID.
func TestACompensatedOrderCanBeTriedAgain(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegateway.Faults{})
	res, err := f.wf.Start(f.ctx, f.e, order("ord_retry", 900, fakegateway.DeclineMethod), &engine.StartOpts{WorkflowID: "ord_retry"})
	require.NoError(t, err)
	_, err = f.wf.Wait(f.ctx, f.e, res.RunID, 10*time.Millisecond)
	require.Error(t, err)
	res, err = f.wf.Start(f.ctx, f.e, order("ord_retry", 900, "pm_card_visa"), &engine.StartOpts{WorkflowID: "ord_retry-2"})
	require.NoError(t, err)
	_, err = f.wf.Wait(f.ctx, f.e, res.RunID, 10*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, int64(900), f.gw.Ledger().NetByOrder()["ord_retry"])
}

// A run cancelled after it paid (its receipt is on its way) is refunded,
// and its ledger row goes with the refund: the ledger agrees with the
// gateway, and the order can be paid again (found by an attack pass: the
// row stayed, and the order could never be paid again).
func TestCancelAfterPaymentRefundsAndUnrecords(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegateway.Faults{Latency: 700 * time.Millisecond})
	res, err := f.wf.Start(f.ctx, f.e, order("ord_paid_cancel", 1234, "pm_card_visa"), &engine.StartOpts{WorkflowID: "ord_paid_cancel"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, f.db.Pool.QueryRow(f.ctx, `SELECT count(*) FROM payment_ledger WHERE order_id = 'ord_paid_cancel'`).Scan(&n))
		return n == 1
	}, 20*time.Second, 20*time.Millisecond, "the payment recorded")
	require.NoError(t, f.e.Cancel(f.ctx, res.RunID))
	_, err = f.wf.Wait(f.ctx, f.e, res.RunID, 10*time.Millisecond)
	require.ErrorIs(t, err, engine.ErrCancelled)
	var rows int
	require.NoError(t, f.db.Pool.QueryRow(f.ctx, `SELECT count(*) FROM payment_ledger WHERE order_id = 'ord_paid_cancel'`).Scan(&rows))
	require.Zero(t, rows, "the ledger row went with the refund")
	require.Zero(t, f.gw.Ledger().NetByOrder()["ord_paid_cancel"], "refunded")

	again, err := f.wf.Start(f.ctx, f.e, order("ord_paid_cancel", 1234, "pm_card_visa"), &engine.StartOpts{WorkflowID: "ord_paid_cancel-2"})
	require.NoError(t, err)
	_, err = f.wf.Wait(f.ctx, f.e, again.RunID, 10*time.Millisecond)
	require.NoError(t, err, "the order can be paid again")
	require.Equal(t, int64(1234), f.gw.Ledger().NetByOrder()["ord_paid_cancel"])
}

// The fraud check stops a blocked customer before anything is claimed,
// reserved or charged; the check's step shows the run took the change.
func TestFraudCheckStopsABlockedCustomer(t *testing.T) {
	t.Parallel()
	f := setup(t, fakegateway.Faults{})
	o := order("ord_fraud", 4999, "pm_card_visa")
	o.CustomerID = "cus_blocked"
	res, err := f.wf.Start(f.ctx, f.e, o, &engine.StartOpts{WorkflowID: o.OrderID})
	require.NoError(t, err)
	_, err = f.wf.Wait(f.ctx, f.e, res.RunID, 10*time.Millisecond)
	require.ErrorIs(t, err, payment.ErrFraudSuspected)
	enginetest.RequireRunStatus(f.ctx, t, f.e, res.RunID, engine.StatusFailed, 0)
	steps := enginetest.RequireSteps(f.ctx, t, f.e, res.RunID, []string{"validate", "fraud_check"})
	require.Equal(t, []string{"fraud-check"}, steps[1].Patches)
	require.Empty(t, f.gw.Ledger().Charges)
}

// One customer's payments run one at a time, in the order they were
// started, while other customers' run beside them; and every charge, of
// every customer, takes a turn of the shared charge rate limit.
func TestOneCustomerPaysOneAtATimeWithinTheChargeRate(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var charges []time.Time
	const rate = 20 // charges a second, one at a time
	f := setupBehind(t, fakegateway.Faults{}, &payment.Config{ChargeRate: engine.Rate{Limit: rate, Period: time.Second, Burst: 1}},
		func(gw http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/payment_intents") {
					mu.Lock()
					charges = append(charges, time.Now())
					mu.Unlock()
				}
				gw.ServeHTTP(w, r)
			})
		})
	ctx, e, wf, db := f.ctx, f.e, f.wf, f.db

	var runs []uuid.UUID
	var mine []uuid.UUID // cus_a's, in start order
	for i := range 8 {
		for _, cus := range []string{"cus_a", fmt.Sprintf("cus_%c", 'b'+i)} {
			o := order(fmt.Sprintf("ord_%s_%d", cus, i), 1000, "pm_card_visa")
			o.CustomerID = cus
			res, err := wf.Start(ctx, e, o, &engine.StartOpts{WorkflowID: o.OrderID})
			require.NoError(t, err)
			runs = append(runs, res.RunID)
			if cus == "cus_a" {
				mine = append(mine, res.RunID)
			}
		}
	}
	for _, id := range runs {
		_, err := wf.Wait(ctx, e, id, 10*time.Millisecond)
		require.NoError(t, err)
	}

	// Each run's steps, first start to last end: cus_a's never overlap.
	type span struct{ from, to time.Time }
	spans := map[uuid.UUID]span{}
	rows, err := db.Pool.Query(ctx, db.SQL(`SELECT run_id, min(started_at), max(completed_at) FROM pgdurable.workflow_steps
		WHERE run_id = ANY($1) GROUP BY run_id`), runs)
	require.NoError(t, err)
	for rows.Next() {
		var id uuid.UUID
		var s span
		require.NoError(t, rows.Scan(&id, &s.from, &s.to))
		spans[id] = s
	}
	require.NoError(t, rows.Err())
	for i := 1; i < len(mine); i++ {
		prev, next := spans[mine[i-1]], spans[mine[i]]
		require.False(t, next.from.Before(prev.to), "cus_a's payment %d started at %s, before its payment %d ended at %s",
			i, next.from.Format(time.StampMicro), i-1, prev.to.Format(time.StampMicro))
	}
	overlapping := false
	for _, id := range runs {
		for _, m := range mine {
			if s := spans[id]; !slices.Contains(mine, id) && s.from.Before(spans[m].to) && spans[m].from.Before(s.to) {
				overlapping = true
			}
		}
	}
	require.True(t, overlapping, "another customer's payment ran while cus_a's waited their turns")

	// 16 charges at 20 a second, one at a time: the first and the last
	// are 15 turns apart where the rate limit hands them out, and at
	// least 14 as the gateway sees them (a request's way there varies).
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, charges, len(runs))
	slices.SortFunc(charges, time.Time.Compare)
	spread := charges[len(charges)-1].Sub(charges[0])
	require.GreaterOrEqual(t, spread, time.Duration(len(charges)-2)*time.Second/rate,
		"16 charges at %d a second took %s", rate, spread)
	t.Logf("16 charges in %s", spread)
}
