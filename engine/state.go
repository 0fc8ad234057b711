package engine

// RunStatus is a run's status, as stored in workflow_runs.status (a CHECK
// constraint keeps it to these values) and shown by GetRun, ListRuns, the
// HTTP API and the CLI.
type RunStatus string

// Run statuses.
const (
	StatusPending      RunStatus = "pending"      // started, not yet delivered
	StatusRunning      RunStatus = "running"      // a delivery holds (or held) the lease
	StatusWaiting      RunStatus = "waiting"      // waiting for a retry backoff, a timer, a signal, a crash backoff (see Config.MaxDeliveries), or its delayed start (StartOpts.StartAt)
	StatusCompleted    RunStatus = "completed"    // terminal: output recorded
	StatusFailed       RunStatus = "failed"       // terminal: the workflow returned an error
	StatusCompensating RunStatus = "compensating" // undoing completed steps
	StatusCompensated  RunStatus = "compensated"  // terminal: failed, and its steps were undone
	StatusCancelled    RunStatus = "cancelled"    // terminal: cancelled
	StatusDead         RunStatus = "dead"         // terminal until an operator replays it: parked in dead_jobs
	StatusContinued    RunStatus = "continued"    // terminal: ended by ContinueAsNew; Run.ContinuedRunID took over its workflow ID
	StatusTerminated   RunStatus = "terminated"   // terminal: ended at once by an operator (Engine.Terminate), no compensations run
)

// RunStatuses returns every run status, those of open runs first (pending,
// running, waiting, compensating), then dead, then those of closed runs:
// for tools that list or check them (the CLI's flags, the web UI's
// filters), as rivertype.JobStates does for River's. A new slice each call.
func RunStatuses() []RunStatus {
	return []RunStatus{StatusPending, StatusRunning, StatusWaiting, StatusCompensating, StatusDead, StatusCompleted,
		StatusFailed, StatusCompensated, StatusCancelled, StatusTerminated, StatusContinued}
}

// Open reports whether a run in status s may still change: it is active
// (pending, running, waiting, compensating) or dead (an operator may
// replay it). Its negation is a closed run: it ended for good.
func (s RunStatus) Open() bool { return s.active() || s == StatusDead }

// Terminal reports whether a run in status s has ended: completed, failed,
// compensated, cancelled, dead, continued or terminated. Only an
// operator's replay of a dead run makes it run again.
func (s RunStatus) Terminal() bool {
	switch s {
	case StatusCompleted, StatusFailed, StatusCompensated, StatusCancelled, StatusDead, StatusContinued, StatusTerminated:
		return true
	}
	return false
}

// active reports whether a run in status s is still to run or running:
// pending, running, waiting or compensating.
func (s RunStatus) active() bool {
	switch s {
	case StatusPending, StatusRunning, StatusWaiting, StatusCompensating:
		return true
	}
	return false
}

// closed reports whether a run in status s has ended for good: terminal
// and not dead (an operator may replay a dead run, which then runs on).
func (s RunStatus) closed() bool { return s.Terminal() && s != StatusDead }

// valid reports whether s is one of the run statuses.
func (s RunStatus) valid() bool { return s.Terminal() || s.active() }

// StepKind is what kind of step a record is, as stored in
// workflow_steps.kind: the call that made it.
type StepKind string

// Step kinds.
const (
	KindStep         StepKind = "step"         // Step, Now, NewUUID
	KindTx           StepKind = "tx"           // TxStep
	KindActivity     StepKind = "activity"     // RunActivity (package activities)
	KindSleep        StepKind = "sleep"        // Sleep, SleepUntil
	KindSignal       StepKind = "signal"       // AwaitSignal, SelectSignal
	KindChild        StepKind = "child"        // StartChild, ChildWorkflow
	KindSelect       StepKind = "select"       // Select, First
	KindCompensation StepKind = "compensation" // an undo registered with Context.Compensate
	KindPatch        StepKind = "patch"        // Patched: a change the run took, as its own marker (before a parallel step; see Patched)
)

// StepStatus is a step record's status, as stored in workflow_steps.status.
type StepStatus string

// Step statuses.
const (
	StepStarted   StepStatus = "started"   // an attempt announced (activities, retries), or a wait begun (sleep, signal)
	StepCompleted StepStatus = "completed" // the outcome is recorded; replays return it
	StepFailed    StepStatus = "failed"    // failed for good, returned to the workflow as a *StepError
	StepRetrying  StepStatus = "retrying"  // failed an attempt; NextAttemptAt says when the next is due
	StepParked    StepStatus = "parked"    // failed in a way that parked the run as dead
	StepCancelled StepStatus = "cancelled" // stopped by the run's cancellation before it finished
)

// DeadReason is why a run was parked in dead_jobs.
type DeadReason string

// Dead-job reasons, as stored in dead_jobs.reason.
const (
	ReasonRetriesExhausted   DeadReason = "retries_exhausted"   // a step failed MaximumAttempts times
	ReasonPermanentError     DeadReason = "permanent_error"     // an unrecoverable error outside a step (an output that does not encode)
	ReasonPanic              DeadReason = "panic"               // a step or the workflow function panicked
	ReasonNonDeterminism     DeadReason = "nondeterminism"      // the code no longer replays the recorded steps
	ReasonPoisonInput        DeadReason = "poison_input"        // the stored input does not decode as the workflow's input type
	ReasonCrashLoop          DeadReason = "crash_loop"          // MaxDeliveries deliveries in a row crashed without progress
	ReasonCompensationFailed DeadReason = "compensation_failed" // an undo step failed (reserved for compensations)
	ReasonChildDead          DeadReason = "child_dead"          // a child run the workflow waits for is parked as dead
)

// DeadReasons returns every reason a run is parked for, in the order of
// their constants: for tools that list or check them (the CLI's flags, the
// web UI's filters). A new slice each call.
func DeadReasons() []DeadReason {
	return []DeadReason{ReasonRetriesExhausted, ReasonPermanentError, ReasonPanic, ReasonNonDeterminism,
		ReasonPoisonInput, ReasonCrashLoop, ReasonCompensationFailed, ReasonChildDead}
}

// valid reports whether r is a reason a dead job can have. "timeout" is
// accepted in filters: it is reserved for run timeouts.
func (r DeadReason) valid() bool {
	switch r {
	case ReasonRetriesExhausted, ReasonPermanentError, ReasonPanic, ReasonNonDeterminism,
		ReasonPoisonInput, ReasonCrashLoop, ReasonCompensationFailed, ReasonChildDead, "timeout":
		return true
	}
	return false
}
