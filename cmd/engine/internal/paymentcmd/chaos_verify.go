package paymentcmd

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/examples/payment"
	"github.com/pgdurable/pgdurable/examples/payment/fakegateway"
)

// runsTagged lists every run whose workflow ID starts with tag+"_", a
// page of 1,000 at a time.
func runsTagged(ctx context.Context, e *engine.Engine, tag string) ([]*engine.Run, error) {
	var all []*engine.Run
	p := engine.ListRunsParams{WorkflowIDPrefix: tag + "_", Limit: 1000}
	for {
		runs, next, err := e.ListRuns(ctx, p)
		if err != nil {
			return nil, err
		}
		all = append(all, runs...)
		if next == "" {
			return all, nil
		}
		p.Cursor = next
	}
}

// openRuns counts the chaos runs not yet finished. Pages are read one
// after another, but a finished run stays finished, so a count of 0 means
// that every run (each read once, as run IDs do not change) has finished.
func openRuns(ctx context.Context, e *engine.Engine, tag string) (int, error) {
	runs, err := runsTagged(ctx, e, tag)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range runs {
		if !r.Status.Terminal() {
			n++
		}
	}
	return n, nil
}

// verifyChaos checks every run's effects against the gateway and the
// database, prints the counts, and fails on any violation. It reads the
// runs, their steps and the dead jobs through e, and the example's ledger
// and reservations with SQL on pool.
func verifyChaos(ctx context.Context, out io.Writer, e *engine.Engine, pool *pgxpool.Pool, gw *fakegateway.Gateway, tag string, orders []payment.Order) error {
	runs, err := runsTagged(ctx, e, tag)
	if err != nil {
		return err
	}
	ledgerRows := map[string]int{}
	rows, err := pool.Query(ctx, `SELECT order_id, count(*) FROM payment_ledger WHERE starts_with(order_id, $1) GROUP BY order_id`, tag+"_")
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
	if err := rows.Err(); err != nil {
		return err // a partial read would let the checks below pass on missing rows
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
	if err := rows.Err(); err != nil {
		return err
	}
	// Retries: every attempt of a recorded step after its first.
	var retries int
	for _, r := range runs {
		run, err := e.GetRun(ctx, r.RunID)
		if err != nil {
			return err
		}
		for _, s := range run.Steps {
			retries += max(s.Attempts-1, 0)
		}
	}
	badDead, err := deadWithoutMetadata(ctx, e, tag)
	if err != nil {
		return err
	}

	amount := map[string]int64{}
	for _, o := range orders {
		amount[o.OrderID] = o.Amount
	}
	l := gw.Ledger()
	net := l.NetByOrder()
	counts := map[engine.RunStatus]int{}
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

// deadWithoutMetadata counts the dead jobs of the chaos runs that lack
// what an operator needs: an error class and message, the input, a reason.
func deadWithoutMetadata(ctx context.Context, e *engine.Engine, tag string) (int, error) {
	n := 0
	p := engine.ListDeadJobsParams{Workflow: payment.WorkflowName, Limit: 1000}
	for {
		jobs, next, err := e.ListDeadJobs(ctx, p)
		if err != nil {
			return 0, err
		}
		for _, d := range jobs {
			if strings.HasPrefix(d.WorkflowID, tag+"_") && (d.ErrorClass == "" || d.ErrorMessage == "" || d.Input == nil || d.Reason == "") {
				n++
			}
		}
		if next == "" {
			return n, nil
		}
		p.Cursor = next
	}
}
