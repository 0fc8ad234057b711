package paymentcmd

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/examples/payment"
	"github.com/pgdurable/pgdurable/examples/payment/fakegateway"
)

func openRuns(ctx context.Context, pool *pgxpool.Pool, tag string) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM workflow_runs WHERE starts_with(workflow_id, $1)
		AND status NOT IN ('completed', 'failed', 'compensated', 'cancelled', 'dead')`, tag+"_").Scan(&n)
	return n, err
}

// verifyChaos checks every run's effects against the gateway and the
// database, prints the counts, and fails on any violation.
func verifyChaos(ctx context.Context, out io.Writer, pool *pgxpool.Pool, gw *fakegateway.Gateway, tag string, orders []payment.Order) error {
	type runRow struct {
		WorkflowID string
		Status     string
		Deliveries int
	}
	rows, err := pool.Query(ctx, `SELECT workflow_id, status, deliveries FROM workflow_runs WHERE starts_with(workflow_id, $1)`, tag+"_")
	if err != nil {
		return err
	}
	runs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[runRow])
	if err != nil {
		return err
	}
	ledgerRows := map[string]int{}
	rows, err = pool.Query(ctx, `SELECT order_id, count(*) FROM payment_ledger WHERE starts_with(order_id, $1) GROUP BY order_id`, tag+"_")
	if err != nil {
		return err
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return err
		}
		ledgerRows[id] = n
	}
	reserved := map[string]bool{}
	rows, err = pool.Query(ctx, `SELECT DISTINCT order_id FROM payment_reservations WHERE starts_with(order_id, $1)`, tag+"_")
	if err != nil {
		return err
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		reserved[id] = true
	}
	var retries, badDead int
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(greatest(attempts - 1, 0)), 0) FROM workflow_steps s JOIN workflow_runs r USING (run_id)
		WHERE starts_with(r.workflow_id, $1)`, tag+"_").Scan(&retries); err != nil {
		return err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM dead_jobs WHERE starts_with(workflow_id, $1)
		AND (error_class = '' OR error_message = '' OR input IS NULL OR reason = '')`, tag+"_").Scan(&badDead); err != nil {
		return err
	}

	amount := map[string]int64{}
	for _, o := range orders {
		amount[o.OrderID] = o.Amount
	}
	l := gw.Ledger()
	net := l.NetByOrder()
	counts := map[string]int{}
	redeliveries := 0
	var violations []string
	for _, r := range runs {
		counts[r.Status]++
		redeliveries += max(r.Deliveries-1, 0)
		switch r.Status {
		case "completed":
			if net[r.WorkflowID] != amount[r.WorkflowID] || ledgerRows[r.WorkflowID] != 1 {
				violations = append(violations, fmt.Sprintf("%s completed: net charge %d (want %d), %d ledger rows", r.WorkflowID, net[r.WorkflowID], amount[r.WorkflowID], ledgerRows[r.WorkflowID]))
			}
		case "compensated", "failed", "cancelled":
			if net[r.WorkflowID] != 0 || ledgerRows[r.WorkflowID] != 0 || reserved[r.WorkflowID] {
				violations = append(violations, fmt.Sprintf("%s %s: net charge %d, %d ledger rows, inventory still reserved %v", r.WorkflowID, r.Status, net[r.WorkflowID], ledgerRows[r.WorkflowID], reserved[r.WorkflowID]))
			}
		}
	}
	if len(runs) != len(orders) {
		violations = append(violations, fmt.Sprintf("%d runs for %d orders", len(runs), len(orders)))
	}
	if d := l.DoubleCharges(); d > 0 {
		violations = append(violations, fmt.Sprintf("%d orders charged more than once", d))
	}
	if badDead > 0 {
		violations = append(violations, fmt.Sprintf("%d dead jobs without their metadata", badDead))
	}
	fmt.Fprintf(out, "runs by status %v; gateway %d charges, %d refunds; double charges %d; retries %d; redeliveries %d (recorded steps replayed, not re-run)\n",
		counts, len(l.Charges), len(l.Refunds), l.DoubleCharges(), retries, redeliveries)
	for _, v := range violations {
		fmt.Fprintln(out, "VIOLATION:", v)
	}
	if len(violations) > 0 {
		return fmt.Errorf("%w: %d", errViolations, len(violations))
	}
	fmt.Fprintln(out, "chaos: no violations")
	return nil
}
