package paymentcmd

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/examples/payment/fakegateway"
)

func uuidMust(s string) uuid.UUID { return uuid.MustParse(s) }

// printSummary prints what the demo's runs did; databaseFlag is
// --database-url as the demo used it, repeated in the commands it suggests;
// fromEnv: the database came from DATABASE_URL instead, which those
// commands read too (its URL, which may hold a password, is not printed).
func printSummary(ctx context.Context, out io.Writer, databaseFlag string, fromEnv bool, pool *pgxpool.Pool, gw *fakegateway.Gateway,
	tag string, runs map[string]*engine.Run, elapsed time.Duration) error {
	counts := map[engine.RunStatus]int{}
	var compensated, dead, completed []*engine.Run
	for _, r := range runs {
		counts[r.Status]++
		switch r.Status {
		case engine.StatusCompensated:
			compensated = append(compensated, r)
		case engine.StatusDead:
			dead = append(dead, r)
		case engine.StatusCompleted:
			completed = append(completed, r)
		}
	}
	ledger := gw.Ledger()
	net := ledger.NetByOrder()
	var paid int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payment_ledger WHERE starts_with(order_id, $1)`, tag+"_").Scan(&paid); err != nil {
		return err
	}
	mismatches := 0
	for _, r := range completed {
		if net[r.WorkflowID] <= 0 {
			mismatches++
		}
	}
	for _, r := range compensated {
		if net[r.WorkflowID] != 0 {
			mismatches++
		}
	}

	fmt.Fprintf(out, "\n== summary\n")
	fmt.Fprintf(out, "runs by final status:\n")
	statuses := slices.Sorted(maps.Keys(counts))
	for _, s := range statuses {
		fmt.Fprintf(out, "  %-12s %d\n", s, counts[s])
	}
	fmt.Fprintf(out, "gateway: %d charges, %d refunds; requests %v\n", len(ledger.Charges), len(ledger.Refunds), ledger.Requests)
	fmt.Fprintf(out, "paid orders (ledger rows): %d\n", paid)
	fmt.Fprintf(out, "double charges: %d\n", ledger.DoubleCharges())
	fmt.Fprintf(out, "net charge mismatches (completed ≠ charged, compensated ≠ 0): %d\n", mismatches)
	fmt.Fprintf(out, "elapsed %s, %.1f runs/s\n", elapsed.Round(time.Millisecond), float64(len(runs))/elapsed.Seconds())
	db := ""
	if databaseFlag != "" {
		db = " --database-url '" + databaseFlag + "'"
	}
	if db == "" && fromEnv {
		fmt.Fprintf(out, "the commands below read DATABASE_URL: run them with it set as for this demo\n")
	}
	if len(compensated) > 0 {
		fmt.Fprintf(out, "a compensated run:  go run ./cmd/engine%s runs show %s\n", db, compensated[0].RunID)
	}
	if len(dead) > 0 {
		fmt.Fprintf(out, "a dead run:         go run ./cmd/engine%s runs show %s\n", db, dead[0].RunID)
	} else {
		fmt.Fprintf(out, "no dead runs (see them with: go run ./cmd/engine%s dead list)\n", db)
	}
	if ledger.DoubleCharges() != 0 || mismatches != 0 {
		return fmt.Errorf("the demo found %d double charges and %d net charge mismatches", ledger.DoubleCharges(), mismatches)
	}
	return nil
}
