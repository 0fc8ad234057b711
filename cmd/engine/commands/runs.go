package commands

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/engine"
	"github.com/pgdurable/pgdurable/engine/httpapi"
)

func (g *global) runsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "runs", Short: "List, inspect, follow, prune and bulk-cancel runs"}
	var p engine.ListRunsParams
	var createdAfter, createdBefore, finishedAfter, finishedBefore string
	var listTags []string
	list := &cobra.Command{
		Use: "list", Short: "List runs, newest first", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkLimit(p.Limit); err != nil {
				return err
			}
			for flag, v := range map[string]struct {
				s   string
				dst *time.Time
			}{"--created-after": {createdAfter, &p.CreatedAfter}, "--created-before": {createdBefore, &p.CreatedBefore},
				"--finished-after": {finishedAfter, &p.FinishedAfter}, "--finished-before": {finishedBefore, &p.FinishedBefore}} {
				t, err := timeFlag(flag, v.s, time.Now())
				if err != nil {
					return err
				}
				*v.dst = t
			}
			var err error
			if p.Tags, err = tagFlags(listTags); err != nil {
				return err
			}
			if err := checkOneOf("--status", p.Status, append(engine.RunStatuses(), engine.StatusOpenRuns)...); err != nil {
				return err
			}
			e, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			runs, next, err := e.ListRuns(cmd.Context(), p)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, httpapi.NewRunList(runs, next))
			}
			t := newTable(g.opts.Stdout, "RUN ID", "WORKFLOW", "VERSION", "WORKFLOW ID", "STATUS", "TAGS", "DELIVERIES", "CREATED", "ERROR")
			for _, r := range runs {
				msg := ""
				if r.Error != nil {
					msg = string(r.Error.Class) + ": " + r.Error.Message
				}
				t.row(r.RunID, r.WorkflowName, r.WorkflowVersion, r.WorkflowID, r.Status, tagText(r.Tags), r.Deliveries, r.CreatedAt, msg)
			}
			t.flush()
			if next != "" {
				fmt.Fprintf(g.opts.Stdout, "more: --cursor %s\n", serverText(next, 400))
			}
			return nil
		},
	}
	list.Flags().StringVar(&p.Workflow, "workflow", "", "only this workflow")
	list.Flags().IntVar(&p.Version, "workflow-version", 0, "only runs of this workflow version: with --workflow and an open --status, the runs still on it")
	list.Flags().StringVar(&p.WorkflowIDPrefix, "workflow-id-prefix", "", "only runs whose workflow ID starts with this (case-sensitive)")
	list.Flags().BoolVar(&p.TopLevel, "top-level", false, "only runs no other run started: child runs are left out")
	list.Flags().StringVar(&p.Patched, "patched", "", "only runs that took this change (engine.Patched)")
	list.Flags().StringVar(&p.Unpatched, "unpatched", "", "only runs that did not take this change: with --workflow and --status open, the runs that may still replay the code before it")
	list.Flags().StringArrayVar(&listTags, "tag", nil, "only runs with this tag, key=value (repeatable: all must match)")
	list.Flags().StringVar((*string)(&p.Status), "status", "", `only this status, or "open" for every status a run has not finished in (pending, running, waiting, compensating, dead)`)
	list.Flags().IntVar(&p.Limit, "limit", 50, "page size (1..1000)")
	list.Flags().StringVar(&p.Cursor, "cursor", "", "the next page's cursor")
	list.Flags().StringVar(&createdAfter, "created-after", "", "only runs created at or after this RFC 3339 time, or this long ago (24h)")
	list.Flags().StringVar(&createdBefore, "created-before", "", "only runs created before this time (as --created-after)")
	list.Flags().StringVar(&finishedAfter, "finished-after", "", "only runs that finished at or after this time (as --created-after)")
	list.Flags().StringVar(&finishedBefore, "finished-before", "", "only runs that finished before this time (as --created-after)")

	var followRun bool
	show := &cobra.Command{
		Use: "show RUN", Short: "Show a run (by run ID or workflow ID) and its step timeline", Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, e backend, args []string) error {
			var id uuid.UUID
			find := func() (err error) { id, err = e.FindRun(ctx, args[0]); return err }
			var err error
			if followRun {
				// A server not up yet is waited for, as one that restarts
				// while the run is followed.
				err = g.untilAnswered(ctx, anyUnreachable, find)
			} else {
				err = find()
			}
			if err != nil {
				return err
			}
			if followRun {
				run, err := g.follow(ctx, e, id)
				if err != nil {
					return err
				}
				return g.endFollow(run)
			}
			run, err := e.GetRun(ctx, id)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, run)
			}
			g.printRun(run)
			return nil
		}),
	}
	show.Flags().BoolVar(&followRun, "follow", false, "print the run's steps as they are recorded until it ends; exit 0 if it completed, 1 otherwise\n"+
		"(over --address, a server that does not answer, not up yet or restarting, is asked again for a minute)")
	var exportTo string
	export := &cobra.Command{
		Use:   "export RUN",
		Short: "Write a run's recorded history as JSON, for replay tests (enginetest.Replay, ReplayDir)",
		Long: `Writes the run (by run ID or workflow ID) as it is recorded: its workflow and version, input,
status, output or error, and every step with its kind, name, status, output and error. Keep the file
next to the workflow's tests: enginetest.ReplayDir replays every such file against the current code,
so a change that would strand runs in flight fails CI before it is deployed. Inputs, outputs and
step results are written as they are stored: scrub what must not leave production first.`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, e backend, args []string) error {
			id, err := e.FindRun(ctx, args[0])
			if err != nil {
				return err
			}
			run, err := e.GetRun(ctx, id)
			if err != nil {
				return err
			}
			h, err := engine.NewHistory(run)
			if err != nil {
				return err
			}
			b, err := json.MarshalIndent(h, "", "  ")
			if err != nil {
				return err
			}
			b = append(b, '\n')
			if exportTo == "" || exportTo == "-" {
				_, err = g.opts.Stdout.Write(b)
				return err
			}
			if err := os.WriteFile(exportTo, b, 0o600); err != nil {
				return err
			}
			fmt.Fprintf(g.opts.Stderr, "wrote the history of run %s (%s, %d steps) to %s\n", run.RunID, run.WorkflowName, len(run.Steps), exportTo)
			return nil
		}),
	}
	export.Flags().StringVarP(&exportTo, "output", "o", "", "write to this file instead of stdout")
	var prune engine.PruneParams
	var pruneCmd *cobra.Command
	pruneCmd = &cobra.Command{
		Use:   "prune [--older-than DURATION]",
		Short: "Delete finished runs that ended longer ago than --older-than (default: the retention; engines also do it for their Retention)",
		Long: `Deletes the runs that ended more than --older-than ago (completed, failed, compensated,
cancelled, continued, terminated, and dead runs whose dead jobs were all resolved as long ago) with their
steps, signals and dead-job rows, and schedule fires recorded as long ago, in batches of 500
that never wait for a worker. It keeps every run with an unresolved dead job, and a child run
whose parent still runs. Every engine prunes like this once a minute for its retention; this is
for a one-off, or with --dry-run to count what the engines will delete. --older-than defaults to
the retention serve resolves without flags: ENGINE_RETENTION, else this binary's
Options.Config.Retention, else 168h (7 days); a retention of "forever" needs --older-than. A
long prune prints how many runs it has deleted, once a second, on stderr (not over --address:
there the server prunes in one request).`,
		Args: cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, e backend, _ []string) error {
			why := ""
			if !pruneCmd.Flags().Changed("older-than") {
				d, from, err := g.retention()
				if err != nil {
					return err
				}
				if d < 0 {
					return &usageError{fmt.Errorf("the retention is forever (%s): give --older-than, such as 720h", from)}
				}
				prune.OlderThan, why = d, " (the retention: "+from+")"
			}
			if prune.OlderThan <= 0 {
				return &usageError{fmt.Errorf("--older-than must be a duration above 0, such as 720h")}
			}
			if prune.OlderThan < engine.MinRetention {
				return &usageError{fmt.Errorf("--older-than %s is below the %s minimum: a run that just ended is kept at least that long", prune.OlderThan, engine.MinRetention)}
			}
			last := time.Now()
			prune.Progress = func(so engine.PruneResult) {
				// A long prune says how far it got, once a second, on stderr.
				if time.Since(last) >= time.Second {
					last = time.Now()
					fmt.Fprintf(g.opts.Stderr, "pruning: %d runs deleted so far\n", so.Runs)
				}
			}
			res, err := e.Prune(ctx, prune)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, res)
			}
			verb := "deleted"
			if prune.DryRun {
				verb = "would delete"
			}
			fmt.Fprintf(g.opts.Stdout, "%s %d runs (%d steps, %d signals, %d dead jobs) and %d schedule fires that ended over %s ago%s\n",
				verb, res.Runs, res.Steps, res.Signals, res.DeadJobs, res.ScheduleFires, prune.OlderThan, why)
			return nil
		}),
	}
	pruneCmd.Flags().DurationVar(&prune.OlderThan, "older-than", 0, "delete runs that ended longer ago than this, such as 720h (default: the retention, see above)")
	pruneCmd.Flags().BoolVar(&prune.DryRun, "dry-run", false, "count what would be deleted; delete nothing")
	var bulk engine.ListRunsParams
	var bulkAfter, bulkBefore string
	var bulkDry bool
	var bulkTags []string
	cancelMatching := &cobra.Command{
		Use:   "cancel-matching",
		Short: "Cancel every active run the filters match (at most 10,000; --dry-run counts them)",
		Args:  cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, e backend, _ []string) error {
			if bulk.Workflow == "" && bulk.WorkflowIDPrefix == "" && bulkAfter == "" && bulkBefore == "" && len(bulkTags) == 0 {
				return &usageError{fmt.Errorf("give --workflow, --workflow-id-prefix, --tag, --created-after or --created-before: cancel-matching cancels every active run they match")}
			}
			var err error
			if bulk.Tags, err = tagFlags(bulkTags); err != nil {
				return err
			}
			if bulk.CreatedAfter, err = timeFlag("--created-after", bulkAfter, time.Now()); err != nil {
				return err
			}
			if bulk.CreatedBefore, err = timeFlag("--created-before", bulkBefore, time.Now()); err != nil {
				return err
			}
			res, err := e.CancelRuns(ctx, engine.CancelRunsParams{Filter: bulk, DryRun: bulkDry})
			if err != nil {
				return err
			}
			return g.printBulk(res, "cancelled", "runs")
		}),
	}
	cancelMatching.Flags().StringVar(&bulk.Workflow, "workflow", "", "only runs of this workflow")
	cancelMatching.Flags().IntVar(&bulk.Version, "workflow-version", 0, "only runs of this workflow version")
	cancelMatching.Flags().StringVar(&bulk.Patched, "patched", "", "only runs that took this change (engine.Patched)")
	cancelMatching.Flags().StringVar(&bulk.Unpatched, "unpatched", "", "only runs that did not take this change")
	cancelMatching.Flags().StringArrayVar(&bulkTags, "tag", nil, "only runs with this tag, key=value (repeatable)")
	cancelMatching.Flags().StringVar((*string)(&bulk.Status), "status", "", "only runs in this status (pending, running, waiting)")
	cancelMatching.Flags().StringVar(&bulk.WorkflowIDPrefix, "workflow-id-prefix", "", "only runs whose workflow ID starts with this")
	cancelMatching.Flags().BoolVar(&bulk.TopLevel, "top-level", false, "only runs no other run started: child runs are left out")
	cancelMatching.Flags().StringVar(&bulkAfter, "created-after", "", "only runs created at or after this time (RFC 3339, or a duration ago)")
	cancelMatching.Flags().StringVar(&bulkBefore, "created-before", "", "only runs created before this time")
	cancelMatching.Flags().BoolVar(&bulkDry, "dry-run", false, "count what would be cancelled; cancel nothing")
	cmd.AddCommand(list, show, export, pruneCmd, cancelMatching)
	return cmd
}

func (g *global) printRun(run *engine.Run) {
	w := g.opts.Stdout
	fmt.Fprintf(w, "run %s\n  workflow     %s (version %d)\n  workflow id  %s\n  status       %s\n  deliveries   %d\n  created      %s\n",
		run.RunID, cell(run.WorkflowName), run.WorkflowVersion, text(run.WorkflowID), cell(run.Status), run.Deliveries, cell(run.CreatedAt))
	if run.CompletedAt != nil {
		fmt.Fprintf(w, "  finished     %s\n", cell(run.CompletedAt))
	}
	if len(run.Tags) > 0 {
		fmt.Fprintf(w, "  tags         %s\n", text(tagText(run.Tags)))
	}
	fmt.Fprintf(w, "  input        %s\n", oneLine(string(run.Input), 200))
	if len(run.Output) > 0 {
		fmt.Fprintf(w, "  output       %s\n", oneLine(string(run.Output), 200))
	}
	if run.CancelRequestedAt != nil {
		fmt.Fprintf(w, "  cancel       requested %s\n", cell(run.CancelRequestedAt))
	}
	switch {
	case run.DeadlineAt != nil:
		fmt.Fprintf(w, "  timeout      %s, at %s\n", time.Duration(run.RunTimeoutMS)*time.Millisecond, cell(run.DeadlineAt))
	case run.RunTimeoutMS > 0:
		fmt.Fprintf(w, "  timeout      %s from its first pick-up\n", time.Duration(run.RunTimeoutMS)*time.Millisecond)
	}
	if run.Error != nil {
		fmt.Fprintf(w, "  error        %s: %s\n", cell(run.Error.Class), oneLine(run.Error.Message, 200))
	}
	died := run.StalledDeliveries
	if run.Status == engine.StatusRunning {
		died-- // the delivery in flight
	}
	if !run.Status.Open() || run.Status == engine.StatusDead {
		died = 0 // finished, or dead: its error tells
	}
	if died > 0 {
		fmt.Fprintf(w, "  crashes      %d deliveries in a row died without progress (a worker crashed or was killed)\n", died)
	}
	if run.Status == engine.StatusWaiting || run.Status == engine.StatusCompensating {
		var what []string // a Select's children and signals, or one of them
		if len(run.AwaitChildren) > 0 {
			what = append(what, awaitedChildren(run.AwaitChildren))
		}
		if run.AwaitSignal != "" {
			what = append(what, awaited(run))
		}
		switch {
		case len(what) > 0 && run.WakeAt != nil:
			fmt.Fprintf(w, "  waiting for  %s, or until %s\n", strings.Join(what, ", or "), cell(run.WakeAt))
		case len(what) > 0:
			fmt.Fprintf(w, "  waiting for  %s\n", strings.Join(what, ", or "))
		case run.WakeAt != nil && run.StartedAt == nil && run.Deliveries == 0:
			fmt.Fprintf(w, "  starts at    %s (delayed; engine start-now starts it now)\n", cell(run.WakeAt))
		case run.WakeAt != nil:
			fmt.Fprintf(w, "  waiting until %s\n", cell(run.WakeAt))
		}
	}
	if run.Queue != "" {
		q := text(run.Queue)
		if run.QueueKey != "" {
			q += ", key " + text(run.QueueKey)
		}
		if run.Priority != 0 {
			q += fmt.Sprintf(", priority %d", run.Priority)
		}
		fmt.Fprintf(w, "  queue        %s\n", q)
	}
	switch {
	case run.WaitingFor != "" && run.WaitingSince != nil && run.Queue != "":
		fmt.Fprintf(w, "  waiting for  %s, ready since %s (%s)\n",
			text(run.WaitingFor), cell(run.WaitingSince), time.Since(*run.WaitingSince).Round(time.Second))
	case run.WaitingFor != "" && run.WaitingSince != nil:
		fmt.Fprintf(w, "  waiting for  %s, since %s (%s); processes that do not register it hand it back\n",
			text(run.WaitingFor), cell(run.WaitingSince), time.Since(*run.WaitingSince).Round(time.Second))
	case run.WaitingFor != "" && run.Queue != "":
		fmt.Fprintf(w, "  waiting for  %s\n", text(run.WaitingFor))
	case run.WaitingFor != "":
		fmt.Fprintf(w, "  waiting for  %s: no live engine process on its queue registers it\n", text(run.WaitingFor))
	}
	if run.ScheduleName != "" {
		fmt.Fprintf(w, "  schedule     %s\n", cell(run.ScheduleName))
	}
	if run.ContinuedRunID != nil {
		fmt.Fprintf(w, "  continued    as run %s (ContinueAsNew: it holds the workflow ID now)\n", *run.ContinuedRunID)
	}
	if run.FirstRunID != nil {
		fmt.Fprintf(w, "  chain        started by run %s (continued as new since)\n", *run.FirstRunID)
	}
	if run.ParentRunID != nil && run.ParentSeq != nil {
		fmt.Fprintf(w, "  parent       %s (its step %d; when it closes first: %s)\n", *run.ParentRunID, *run.ParentSeq, cell(run.ParentClosePolicy))
	}
	g.printInFlight(run)
	fmt.Fprintln(w)
	t := newTable(w, "SEQ", "NAME", "KIND", "STATUS", "ATTEMPTS", "REQUEST ID", "DURATION", "ERROR")
	for _, s := range run.Steps {
		dur := "-"
		if s.CompletedAt != nil {
			dur = s.CompletedAt.Sub(s.StartedAt).Round(time.Millisecond).String()
		}
		msg := ""
		if s.Error != nil {
			msg = string(s.Error.Class) + ": " + s.Error.Message
		}
		if s.TimedOut {
			msg = "timed out (AwaitSignal returned ErrTimeout)"
		}
		var req any
		if s.RequestID != nil {
			req = *s.RequestID
		}
		name := s.Name
		if s.CompensationOf != nil {
			name = fmt.Sprintf("%s (undoes %d)", s.Name, *s.CompensationOf)
		}
		if len(s.Patches) > 0 {
			name = fmt.Sprintf("%s (took change %s)", name, strings.Join(s.Patches, ", "))
		}
		t.row(s.Seq, name, s.Kind, s.Status, s.Attempts, req, dur, msg)
	}
	t.flush()
	g.printFailedAttempts(run.Steps)
	if len(run.Children) > 0 {
		fmt.Fprintln(w)
		// A child that continued as new shows at its chain's latest run,
		// with the chain's first run (runs show <it> walks the chain).
		t = newTable(w, "CHILD OF STEP", "RUN ID", "WORKFLOW", "WORKFLOW ID", "STATUS", "ON PARENT CLOSE", "CHAIN'S FIRST RUN")
		for _, c := range run.Children {
			var first any
			if c.FirstRunID != nil {
				first = *c.FirstRunID
			}
			t.row(c.Seq, c.RunID, c.WorkflowName, text(c.WorkflowID), c.Status, c.ParentClosePolicy, first)
		}
		t.flush()
	}
	if len(run.Signals) == 0 {
		return
	}
	fmt.Fprintln(w)
	t = newTable(w, "SIGNAL", "SENT", "RECEIVED BY STEP", "PAYLOAD")
	for _, sig := range run.Signals {
		var by any = "buffered"
		if sig.ConsumedSeq != nil {
			by = *sig.ConsumedSeq
		}
		t.row(sig.Name, sig.SentAt, by, string(sig.Payload))
	}
	t.flush()
}

// printInFlight warns, for a terminated run, of the steps it was
// terminated in the middle of (engine.Run.UnsettledSteps): each may have
// taken effect, and nothing undoes it; it lists them with their request
// IDs, by which an operator checks them with the services they called.
func (g *global) printInFlight(run *engine.Run) {
	if run.Status != engine.StatusTerminated {
		return
	}
	steps := run.UnsettledSteps()
	if len(steps) == 0 {
		return
	}
	w := g.opts.Stdout
	fmt.Fprintf(w, "\nwarning: terminated with %d step(s) in flight (recorded started). Each may have taken effect (a call that\n"+
		"went through, its answer never recorded), and no undo runs: check each with the service it called, by its request ID.\n", len(steps))
	t := newTable(w, "SEQ", "NAME", "KIND", "REQUEST ID", "STARTED")
	for _, s := range steps {
		var req any = "(none)"
		if s.RequestID != nil {
			req = *s.RequestID
		}
		t.row(s.Seq, s.Name, s.Kind, req, s.StartedAt)
	}
	t.flush()
}

// printFailedAttempts prints the steps' failed attempts (the latest 20 of
// each, as recorded), if any: the attempt, what it made of the step, when
// it was recorded and its error.
func (g *global) printFailedAttempts(steps []engine.StepInfo) {
	var t *table
	for _, s := range steps {
		for _, f := range s.FailedAttempts {
			if t == nil {
				fmt.Fprintln(g.opts.Stdout)
				t = newTable(g.opts.Stdout, "FAILED ATTEMPT OF STEP", "NAME", "ATTEMPT", "OUTCOME", "RECORDED", "ERROR")
			}
			if f.Replayed {
				t.row(s.Seq, s.Name, nil, "replayed (the attempts count from 1 again)", f.At, nil)
				continue
			}
			t.row(s.Seq, s.Name, f.Attempt, f.Status, f.At, string(f.Class)+": "+f.Message)
		}
	}
	if t != nil {
		t.flush()
	}
}

func (g *global) startCmd() *cobra.Command {
	var id, input, startAt string
	var tags []string
	var delay, runTimeout time.Duration
	var wait bool
	var flow engine.StartOpts
	cmd := &cobra.Command{
		Use:   "start WORKFLOW",
		Short: "Start a run of a workflow this binary registers",
		Long: `Starts a run of WORKFLOW with --input. With --delay or --start-at the run waits (status
waiting, no worker held) until then; "engine start-now RUN" starts it earlier, "engine cancel RUN"
cancels it.

A run of a flow-controlled queue (the workflow's, or --queue) waits ready until a process that
serves the queue admits it within the queue's limits: --queue-key, --priority and --key-weight
place it there, and --deduplication-id refuses a second start (exit 1, "duplicate") while a run
of the queue holding the ID is open, or with --return-duplicate answers with that run
("already exists").`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkJSON("--input", []byte(input)); err != nil {
				return err
			}
			opts := &engine.StartOpts{WorkflowID: id, Delay: delay, RunTimeout: runTimeout, Queue: flow.Queue, QueueKey: flow.QueueKey,
				Priority: flow.Priority, KeyWeight: flow.KeyWeight, DeduplicationID: flow.DeduplicationID, ReturnDuplicate: flow.ReturnDuplicate}
			var err error
			if opts.Tags, err = tagFlags(tags); err != nil {
				return err
			}
			if startAt != "" {
				t, err := time.Parse(time.RFC3339, startAt)
				if err != nil {
					return &usageError{fmt.Errorf("--start-at %q is not an RFC 3339 time such as 2026-12-24T18:00:00Z", startAt)}
				}
				opts.StartAt = t
			}
			e, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			var res *engine.StartResult
			start := func() (err error) {
				res, err = e.StartJSON(cmd.Context(), args[0], json.RawMessage(input), opts)
				return err
			}
			if wait {
				// Over --address, a server not up yet is waited for: the
				// start is sent again when it never reached the server, or
				// when --id makes it idempotent (a start that did land
				// then returns its run).
				err = g.untilAnswered(cmd.Context(), func(down *unreachableError) bool { return notSent(down) || id != "" }, start)
			} else {
				err = start()
			}
			if errors.Is(err, engine.ErrUnknownWorkflow) && g.address() == "" {
				// Over the database, this process's registrations check the
				// input; a running engine that registers the workflow can.
				return fmt.Errorf("%w; start it through an engine that registers it: --address host:port (or ENGINE_ADDRESS) of its HTTP API", err)
			}
			if err != nil {
				return err
			}
			if g.jsonOut && !wait {
				return writeJSON(g.opts.Stdout, httpapi.NewStartResponse(args[0], res))
			}
			verb := "started"
			switch {
			case res.Deduplicated:
				verb = "already exists: it holds the deduplication ID"
			case res.Existing:
				verb = "already exists"
			}
			if !g.jsonOut {
				fmt.Fprintf(g.opts.Stdout, "run %s %s (workflow id %s, status %s)\n", res.RunID, verb, text(res.WorkflowID), cell(res.Status))
			}
			if !wait {
				return nil
			}
			run, err := g.follow(cmd.Context(), e, res.RunID)
			if err != nil {
				return err
			}
			return g.endFollow(run)
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "workflow ID: the start's idempotency key (default: the run ID)")
	cmd.Flags().StringArrayVar(&tags, "tag", nil, "label the run: key=value (repeatable; lists filter by it)")
	cmd.Flags().StringVar(&input, "input", "null", "the run's input, as JSON")
	cmd.Flags().DurationVar(&delay, "delay", 0, "start the run this long from now (90s, 1h30m)")
	cmd.Flags().StringVar(&startAt, "start-at", "", "start the run at this RFC 3339 time")
	cmd.Flags().StringVar(&flow.Queue, "queue", "", "put the run in this flow-controlled queue instead of its workflow's")
	cmd.Flags().StringVar(&flow.QueueKey, "queue-key", "", "the run's key in its queue (a customer ID), instead of the one the workflow computes")
	cmd.Flags().IntVar(&flow.Priority, "priority", 0, fmt.Sprintf("the run's priority in its queue, higher first (%d to %d)", engine.MinPriority, engine.MaxPriority))
	cmd.Flags().Float64Var(&flow.KeyWeight, "key-weight", 0, "the share of the queue the run's key gets against other keys (default 1)")
	cmd.Flags().StringVar(&flow.DeduplicationID, "deduplication-id", "", "refuse the start while a run of the queue holding this ID is open")
	cmd.Flags().BoolVar(&flow.ReturnDuplicate, "return-duplicate", false, "with --deduplication-id: answer with the open run that holds the ID instead of refusing")
	cmd.Flags().DurationVar(&runTimeout, "run-timeout", 0, "cancel the run this long after a worker first picks it up (compensations run)")
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the run: print its steps as they are recorded, and exit 0 once it completes, 1 if it ends otherwise (--json: the run as it ended);\n"+
		"over --address, a server that does not answer is asked again for a minute (the start itself only if it never reached the server, or with --id)")
	return cmd
}

func (g *global) startNowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "start-now RUN",
		Short: "Start a delayed run (by run ID or workflow ID) at once instead of at its start time",
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, e backend, args []string) error {
			return g.runAction(ctx, e, args[0], e.StartNow, "started now")
		}),
	}
}

func (g *global) cancelCmd() *cobra.Command {
	return &cobra.Command{
		Use: "cancel RUN", Short: "Cancel a run (by run ID or workflow ID): compensations run, it ends cancelled", Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, e backend, args []string) error {
			id, err := e.FindRun(ctx, args[0])
			if err != nil {
				return err
			}
			if err := e.Cancel(ctx, id); err != nil {
				return err
			}
			if g.jsonOut {
				run, err := e.GetRun(ctx, id)
				if err != nil {
					return err
				}
				return writeJSON(g.opts.Stdout, httpapi.NewCancelResponse(run))
			}
			fmt.Fprintf(g.opts.Stdout, "run %s: cancellation requested\n", id)
			return nil
		}),
	}
}

func (g *global) workflowsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "workflows", Short: "What the live engine processes register"}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the workflows live engine processes register, with their versions and processes",
		Long: `Lists each workflow that a started engine process registers (one seen in the last 30 s, on
any queue), with the versions registered and the processes (host, pid, queue): what can run
where. A process records itself when its engine starts and every 10 s after.`,
		Args: cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, e backend, _ []string) error {
			wfs, err := e.ListWorkflows(ctx)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, httpapi.WorkflowList{Workflows: wfs})
			}
			t := newTable(g.opts.Stdout, "WORKFLOW", "VERSIONS", "PROCESSES")
			for _, w := range wfs {
				versions := make([]string, len(w.Versions))
				for i, v := range w.Versions {
					versions[i] = fmt.Sprint(v)
				}
				procs := make([]string, len(w.Processes))
				for i, p := range w.Processes {
					procs[i] = fmt.Sprintf("%s:%d (queue %s, v%d)", p.Hostname, p.PID, p.Queue, p.Version)
				}
				t.row(w.Name, strings.Join(versions, ", "), strings.Join(procs, "; "))
			}
			t.flush()
			if len(wfs) == 0 {
				fmt.Fprintln(g.opts.Stdout, "no live engine process: start one (engine serve or engine dev)")
			}
			return nil
		}),
	}
	cmd.AddCommand(list)
	return cmd
}

func (g *global) terminateCmd() *cobra.Command {
	var opts engine.TerminateOpts
	cmd := &cobra.Command{
		Use:   "terminate RUN --reason TEXT",
		Short: "End a run (by run ID or workflow ID) at once, without compensations: it ends terminated",
		Long: `Ends the run at once: its status becomes terminated and its error records --reason and --by.
Unlike cancel, nothing more of it runs, not even its compensations: use it when you know why
(a run stuck on a bug you will not fix, a test run). Its open dead job is resolved as discarded;
its parent, if it waits for it, is woken; its children of policies cancel and wait are cancelled.

An activity in flight when the run is terminated is not undone: its call may still go through
(a card charged) while its outcome is never recorded, and no compensation runs. Its step stays
recorded as started, with its request ID: terminate, and runs show on the terminated run, list
such steps; check each with the service it called, by its request ID, and undo it by hand if
need be. Use cancel when the run's undos must run.

--reason (1 to 1,000 bytes) and --by (up to 200) are one line of text: no control characters,
newlines, bidi controls or line separators.`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, e backend, args []string) error {
			if opts.Reason == "" {
				return &usageError{fmt.Errorf("--reason is required: say why the run is terminated")}
			}
			id, err := e.FindRun(ctx, args[0])
			if err != nil {
				return err
			}
			if err := e.Terminate(ctx, id, &opts); err != nil {
				return err
			}
			run, err := e.GetRun(ctx, id)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, run)
			}
			fmt.Fprintf(g.opts.Stdout, "run %s: terminated\n", id)
			g.printInFlight(run)
			return nil
		}),
	}
	cmd.Flags().StringVar(&opts.Reason, "reason", "", "why the run is terminated (required; kept in its error; one line)")
	cmd.Flags().StringVar(&opts.By, "by", "", "who terminates it (kept with the reason; one line)")
	return cmd
}

// runAction applies act to the run target names (a run ID or a workflow
// ID), then prints the run (--json) or that it is done.
func (g *global) runAction(ctx context.Context, e backend, target string, act func(context.Context, uuid.UUID) error, done string) error {
	id, err := e.FindRun(ctx, target)
	if err != nil {
		return err
	}
	if err := act(ctx, id); err != nil {
		return err
	}
	if g.jsonOut {
		run, err := e.GetRun(ctx, id)
		if err != nil {
			return err
		}
		return writeJSON(g.opts.Stdout, run)
	}
	fmt.Fprintf(g.opts.Stdout, "run %s: %s\n", id, done)
	return nil
}

// timeFlag parses a time flag: an RFC 3339 time, or a duration meaning
// that long before now; "" is the zero time (no bound).
func timeFlag(flag, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, &usageError{fmt.Errorf("%s %q is neither an RFC 3339 time (2026-12-01T00:00:00Z) nor a duration ago (24h)", flag, v)}
}

func parseID(what, s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, &usageError{fmt.Errorf("%s %q is not a UUID", what, s)}
	}
	return id, nil
}

func (g *global) signalCmd() *cobra.Command {
	var payloadFile, key, start, input string
	cmd := &cobra.Command{
		Use:   "signal RUN NAME [PAYLOAD_JSON]",
		Short: "Send a signal to a run (by run ID or workflow ID); its AwaitSignal receives it",
		Long: `Sends signal NAME with PAYLOAD_JSON (one JSON value; default null, or read from --payload-file,
"-" for stdin) to the run RUN, a run ID or a workflow ID. Signals are buffered in order until the
run's AwaitSignal for NAME takes them; a run waiting for NAME wakes at once. A finished run
refuses it (exit 1). With --start WORKFLOW, RUN is a workflow ID: the run of WORKFLOW with that
ID is signalled, and started first with --input if there is none, in one transaction.`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			payload := []byte("null")
			switch {
			case len(args) == 3 && payloadFile != "":
				return &usageError{errors.New("give the payload as an argument or --payload-file, not both")}
			case len(args) == 3:
				payload = []byte(args[2])
			case payloadFile == "-":
				b, err := io.ReadAll(g.opts.Stdin)
				if err != nil {
					return fmt.Errorf("reading the payload from stdin: %w", err)
				}
				payload = b
			case payloadFile != "":
				b, err := os.ReadFile(payloadFile)
				if err != nil {
					return fmt.Errorf("reading the payload: %w", err)
				}
				payload = b
			}
			if err := checkJSON("the payload", payload); err != nil {
				return err
			}
			if start == "" && cmd.Flags().Changed("input") {
				return &usageError{errors.New("--input is for --start")}
			}
			if err := checkJSON("--input", []byte(input)); err != nil {
				return err
			}
			e, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			var opts *engine.SignalOpts
			if key != "" {
				opts = &engine.SignalOpts{Key: key}
			}
			if start != "" {
				res, err := e.SignalWithStartJSON(cmd.Context(), engine.SignalWithStartJSONParams{Workflow: start, Input: json.RawMessage(input),
					Opts: &engine.StartOpts{WorkflowID: args[0]}, Signal: args[1], Payload: payload, SignalOpts: opts})
				if err != nil {
					return err
				}
				if g.jsonOut {
					return writeJSON(g.opts.Stdout, httpapi.NewStartResponse(start, res))
				}
				verb := "started"
				if res.Existing {
					verb = "existed"
				}
				fmt.Fprintf(g.opts.Stdout, "run %s %s (workflow id %s): signal %q sent\n", res.RunID, verb, text(res.WorkflowID), args[1])
				return nil
			}
			if err := e.SignalJSON(cmd.Context(), args[0], args[1], payload, opts); err != nil {
				return err
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, httpapi.SignalResponse{Run: args[0], Signal: args[1], Status: "accepted"})
			}
			fmt.Fprintf(g.opts.Stdout, "run %s: signal %q sent\n", args[0], args[1])
			return nil
		},
	}
	cmd.Flags().StringVar(&payloadFile, "payload-file", "", `read the payload from this file ("-": stdin)`)
	cmd.Flags().StringVar(&start, "start", "", "signal-with-start: RUN is a workflow ID of this workflow, started with --input if it has no run")
	cmd.Flags().StringVar(&input, "input", "null", "with --start: the input of a run it starts, as JSON")
	cmd.Flags().StringVar(&key, "key", "", "idempotency key (1 to 200 bytes): sending again with the same key, name and payload\ndelivers the signal once")
	return cmd
}

// checkOneOf refuses a flag value outside its set ("" means unset).
func checkOneOf[T ~string](flag string, v T, allowed ...T) error {
	if v == "" || slices.Contains(allowed, v) {
		return nil
	}
	names := make([]string, len(allowed))
	for i, a := range allowed {
		names[i] = string(a)
	}
	return &usageError{fmt.Errorf("%s %q is not one of %s", flag, v, strings.Join(names, ", "))}
}

// checkLimit refuses a page size outside 1..1000 (0 is not "no limit").
func checkLimit(n int) error {
	if n < 1 || n > 1000 {
		return &usageError{fmt.Errorf("--limit %d is outside 1..1000", n)}
	}
	return nil
}

// awaitedChildren names the children a waiting run waits for by the
// steps that started them.
func awaitedChildren(seqs []int) string {
	steps := make([]string, len(seqs))
	for i, s := range seqs {
		steps[i] = fmt.Sprint(s)
	}
	if len(seqs) == 1 {
		return "the child run of step " + steps[0] + " to end"
	}
	return "one of the child runs of steps " + strings.Join(steps, ", ") + " to end"
}

// awaited names the signals a waiting run waits for: `signal "a"`, or
// `one of signals "a", "b"` for a SelectSignal.
func awaited(run *engine.Run) string {
	if len(run.AwaitSignals) == 0 {
		return fmt.Sprintf("signal %q", run.AwaitSignal)
	}
	quoted := make([]string, len(run.AwaitSignals))
	for i, n := range run.AwaitSignals {
		quoted[i] = fmt.Sprintf("%q", n)
	}
	return "one of signals " + strings.Join(quoted, ", ")
}

// tagText is a run's tags as "key=value" pairs by key, space-separated
// ("" for none).
func tagText(tags map[string]string) string {
	kv := make([]string, 0, len(tags))
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		kv = append(kv, k+"="+tags[k])
	}
	return strings.Join(kv, " ")
}

// tagFlags turns --tag key=value flags into tags (nil for none).
func tagFlags(specs []string) (map[string]string, error) {
	tags, err := httpapi.ParseTags(specs)
	if err != nil {
		return nil, &usageError{fmt.Errorf("--tag: %w", err)}
	}
	return tags, nil
}
