// Package engine is pgdurable's durable workflow engine: workflows are plain
// Go functions whose steps record their outcome in PostgreSQL, so a run that
// is delivered again (a crash, a lost lease, a deploy, a retry) replays its
// completed steps from their records instead of running them again.
//
// # Defining and starting
//
// A workflow is defined once, by a stable name, and registered with every
// engine process that shares the database:
//
//	wf := engine.Define("greet", func(ctx *engine.Context, name string) (string, error) {
//		return engine.Step(ctx, "format", func(context.Context) (string, error) {
//			return "hello " + name, nil
//		}, nil)
//	}, nil)
//	e, _ := engine.New(pool, nil)
//	_ = e.Register(wf)
//	_ = e.Start(ctx)
//	res, _ := wf.Start(ctx, e, "ada", &engine.StartOpts{WorkflowID: "greet-ada"})
//
// The workflow ID is the start's idempotency key: the same ID with the same
// input returns the same run, with another input ErrWorkflowIDConflict.
//
// # Delivery and leases
//
// A run started in a process whose engine is started, registers its
// workflow and has a free worker slot is executed there at once: the start
// inserts it already leased to that process, and no River job is made. Any
// other run is delivered by River (at least once). If the process running
// a run dies, its lease expires and the sweep gives the run a River
// delivery. A delivery holds the run's
// lease, a fencing token on the run row that every record write checks in
// the same statement (under a share lock on the row, so a claim by another
// delivery waits for the write to commit), so a delivery that lost its
// lease (a paused process, a duplicate ticket) stops with ErrLeaseLost and
// never starts another step.
// The records of all of a process's deliveries are written together:
// whatever records, starts, claims and heartbeats queued while the
// previous batch committed go out as one statement in one transaction,
// each row fenced by its own run's token, so a batch holding a zombie's
// write lands every other row. Deliveries heartbeat the lease during long steps; a sweeper in every
// engine hands runs whose lease expired to another delivery within about
// Config.LeaseDuration (default 10s) of the crash.
//
// # Failures
//
// A step error is transient unless wrapped with Permanent. Transient errors
// retry per RetryPolicy (exponential backoff, jitter, attempts counted in
// Postgres, an attempt that died with its worker included). A permanent
// error is recorded and returned to the workflow as a *StepError; a
// workflow that returns an error ends the run failed. What needs an
// operator parks the run as dead with a dead_jobs row: retries exhausted
// (unless StepOpts.ReturnExhausted), a panic, non-determinism, poison
// input, or a run that crashed its worker Config.MaxDeliveries times in a
// row. Operators list, replay and discard dead jobs with ListDeadJobs,
// ReplayDeadJob and DiscardDeadJob.
//
// # Errors that survive replay
//
// A recorded error keeps its Go type name, message, code, JSON details and
// cause chain, and a step returns the error decoded from its record, live
// and on every replay: errors.As finds types registered with RegisterError,
// errors.Is finds sentinels registered with RegisterSentinel and the
// engine's own (ErrTimeout, ErrRetriesExhausted, ErrWorkerLost,
// ErrCancelled, context.DeadlineExceeded, ...), and any other error is an
// *ApplicationError with the original's type name and message, the same on
// every delivery. Workflow.Wait's *RunError wraps the run's error decoded
// the same way.
//
// # Cancellation
//
// Cancel always wins: once recorded, no new attempt of a forward step
// starts, the registered compensations run newest first and the run ends
// cancelled: at once when Cancel is called in the process running it,
// within about Config.SweepInterval in another. Only an activity that does not
// heartbeat and may already have taken effect (see NoEffect) is retried
// with its request ID until its outcome is known.
//
// # Waiting: timers and signals
//
// Sleep, SleepUntil, AwaitSignal, SelectSignal, Select and a child's Get
// record what the run waits for and end the delivery: a waiting run holds no goroutine, connection, worker slot
// or River job. The sweep wakes it when its time comes; Engine.Signal wakes
// it at once. Now and NewUUID record their values so replays see the same
// ones. Time comes from Config.Clock.
//
// # Composition
//
// Go, GoTx and GoActivity start steps without waiting and return a
// *Future (Get, All, First); positions are taken in call order, so a
// replay lines up whatever order they finished in. StartChild and
// ChildWorkflow start another workflow as a child run, exactly once, and
// return its result or a *ChildError; its ParentClosePolicy says what the
// parent's close does to it. Select waits for the first ready of futures,
// child runs, signals and timers, recorded so a replay takes the same
// branch. ContinueAsNew ends a run by starting the next run of its
// workflow under the same workflow ID, so an endless loop keeps its
// history, and its replay, to one iteration.
//
// # Schedules
//
// CreateSchedule saves a cron expression (robfig/cron/v3 syntax) in an
// IANA time zone; every engine's sweep starts one run per fire time, with
// the workflow ID "schedule:<name>:<fire time, UTC RFC 3339>", under row
// locks that let any number of processes share the work. Overlap policies,
// a catch-up window after downtime and ISC cron's daylight saving rule are
// described on ScheduleSpec and in docs/time.md.
//
// # Determinism
//
// Steps are numbered in call order. Workflow code between steps must be
// deterministic: the same input and the same step results must lead to the
// same step calls (use Now and NewUUID, not time.Now or uuid.New). A different step name at a recorded position parks the
// run as dead with reason nondeterminism rather than guessing.
package engine
