package commands

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/cmd/engine/internal/enginebench"
	"github.com/pgdurable/pgdurable/internal/localpg"
	"github.com/pgdurable/pgdurable/storage/migrations"
)

func (g *global) benchCmd() *cobra.Command {
	var opts enginebench.Options
	var cpuProfile string
	var scale bool
	var scaleShare int
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the engine next to hand-written River on this database",
		Long: `Runs, in one process against one database: River no-op jobs and jobs writing 3 (and 10) rows in
3 (and 10) transactions (the references), 3- and 10-step no-op workflows and 3 tx steps that each
insert a row, with their starts (workflows/s, steps/s, the ratio to River, commits, round trips
and WAL per workflow), one-at-a-time latency, the cost of replaying 1,000 recorded steps, ` + g.benchRowsHelp() + `and the process's memory with
--waiting-runs runs asleep. Each throughput row's rate is its steady state's (the completions
between the first and the last tenth); the rows with targets are measured --rounds times in turn
and their medians reported, with their range. It prints each row as it is measured, then the
table (or, with --json, only the JSON). Use a database of its own: it migrates it and adds
tables and jobs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.localOnly("bench"); err != nil {
				return err
			}
			if scaleShare > 0 {
				return scaleWorker(cmd.Context(), g.dbURL(), scaleShare, cmd.InOrStdin(), g.opts.Stdout)
			}
			if err := g.ownDatabase("bench"); err != nil {
				return err
			}
			for flag, v := range map[string]int{"--workflows": opts.Workflows, "--rounds": opts.Rounds, "--latency-samples": opts.LatencySamples, "--waiting-runs": opts.WaitingRuns} {
				if v < 1 {
					return &usageError{fmt.Errorf("%s must be at least 1, got %d", flag, v)}
				}
			}
			pool, err := g.pool(cmd.Context(), 4)
			if err != nil {
				return err
			}
			if _, err := migrations.Migrate(cmd.Context(), pool, migrations.Up, nil); err != nil {
				pool.Close()
				return err
			}
			pool.Close()
			if !g.jsonOut {
				opts.Progress = g.opts.Stdout
				fmt.Fprintf(g.opts.Stdout, "engine bench on %s (%d workflows per row)\n", localpg.Redact(g.dbURL()), opts.Workflows)
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				opts.CPUProfile = f
			}
			rep, err := enginebench.Run(cmd.Context(), g.dbURL(), opts)
			if err != nil {
				return err
			}
			var extra []enginebench.Row
			for _, measure := range g.opts.BenchRows {
				r, err := measure(cmd.Context(), g.dbURL(), opts.Workflows)
				if err != nil {
					return err
				}
				if opts.Progress != nil {
					fmt.Fprintf(opts.Progress, "  %-48s %12.2f %s\n", r.Name, r.Value, r.Unit)
				}
				extra = append(extra, enginebench.Row(r))
			}
			last := rep.Rows[len(rep.Rows)-1] // the memory row stays last
			rep.Rows = append(append(rep.Rows[:len(rep.Rows)-1], extra...), last)
			if scale {
				rows, err := benchScale(cmd.Context(), g.dbURL(), opts.Workflows)
				if err != nil {
					return err
				}
				for _, r := range rows {
					if opts.Progress != nil {
						fmt.Fprintf(opts.Progress, "  %-48s %12.2f %s\n", r.Name, r.Value, r.Unit)
					}
				}
				rep.Rows = append(rep.Rows, rows...)
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, rep)
			}
			t := newTable(g.opts.Stdout, "ROW", "VALUE", "UNIT", "NOTE")
			for _, r := range rep.Rows {
				v := fmt.Sprintf("%.2f", r.Value)
				if r.Skipped {
					v = "-"
				}
				t.row(r.Name, v, r.Unit, r.Note)
			}
			t.flush()
			return nil
		},
	}
	cmd.Flags().IntVar(&opts.Workflows, "workflows", 10000, "workflows (and reference jobs) per throughput row; each row's rate is its steady state's")
	cmd.Flags().IntVar(&opts.Rounds, "rounds", 3, "rounds of the rows with targets (the 3-transaction River reference, the 3-step workflow, 3 tx steps), measured in turn; their medians are reported")
	cmd.Flags().IntVar(&opts.LatencySamples, "latency-samples", 200, "one-at-a-time starts for the latency rows")
	cmd.Flags().IntVar(&opts.WaitingRuns, "waiting-runs", 10000, "runs asleep at once for the memory row")
	cmd.Flags().BoolVar(&scale, "scale", false, "also measure 1, 2 and 4 engine processes on the database, each starting and working its share of --workflows runs")
	cmd.Flags().IntVar(&scaleShare, "scale-worker", 0, "run as one process of --scale (internal)")
	_ = cmd.Flags().MarkHidden("scale-worker")
	cmd.Flags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the 3-step throughput row to this file (go tool pprof)")
	return cmd
}

// benchRowsHelp names, for bench's help, the rows Options.BenchRows add
// (cmd/engine's: the payment workflow on the fake gateway).
func (g *global) benchRowsHelp() string {
	switch n := len(g.opts.BenchRows); n {
	case 0:
		return ""
	case 1:
		return "the row this binary adds, "
	default:
		return fmt.Sprintf("the %d rows this binary adds, ", n)
	}
}
