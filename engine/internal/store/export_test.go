package store

import "github.com/pgdurable/pgdurable/storage/migrations"

// ClaimStatements is the claims' statements, for the plan test: each
// one's SQL and its parameters' names in $n order.
var ClaimStatements = map[string]struct {
	SQL   string
	Names []string
}{
	"claimRuns":  {claimRuns.sql, claimRuns.names},
	"admitClaim": {admitClaim.sql, admitClaim.names},
}

// PlusMS is plusMS, for its test.
var PlusMS = plusMS

// RoutedStatements are the statements of a run's hot path (a start by
// direct dispatch, a claim, a step record, a tx step's record, a
// heartbeat, a run's end, a signal), the sweep and a parent's close
// (cancelChildren), for the Citus plan test: each one's SQL with $n
// parameters.
var RoutedStatements = map[string]string{
	"insertRun":             insertRunStmt.sql,
	"insertRuns":            insertRuns.sql,
	"insertContinuedRun":    insertContinuedRun.sql,
	"claimRuns":             claimRuns.sql,
	"loadStepsOfRuns":       loadStepsOfRuns,
	"claimMisses":           claimMisses,
	"freshRecordValues":     freshRecordValues.sql,
	"upsertRecordValues":    upsertRecordValues.sql,
	"recordForUpdate":       recordForUpdate.sql,
	"recordsForUpdate":      recordsForUpdate.sql,
	"recordsForShareStrict": recordsForShareStrict.sql,
	"writeFence":            writeFence.sql,
	"writeFences":           writeFences.sql,
	"batchRecords":          batchRecords[true].sql,
	"batchRecords upsert":   batchRecords[false].sql,
	"writeStepsFence":       writeStepsFence.sql,
	"commitGuard":           commitGuard.sql,
	"commitGuardKept":       commitGuardKept.sql,
	"commitGuardExtending":  commitGuardExtending.sql,
	"heartbeat":             heartbeat,
	"heartbeats":            heartbeats,
	"suspendRun":            suspendRun.sql,
	"lockSignalled":         lockSignalled,
	"signalTotals":          signalTotals,
	"keyedSignal":           keyedSignal,
	"insertSignal":          insertSignal.sql,
	"wakeSignalled":         wakeSignalled.sql,
	"parkRun":               parkRun.sql,
	"insertDeadJob":         insertDeadJob.sql,
	"suspendAwaitingRun":    suspendAwaitingRun.sql,
	"sweep":                 sweep.sql,
	"cancelChildren":        cancelChildren.sql,
	"insertFlowRuns":        insertFlowRunsStmt.sql,
	"insertFlowRun":         insertFlowRunStmt.sql,
	"dedupHolder":           dedupHolder,
	"markReady":             markReady.sql,
	"insertDebounced":       insertDebouncedStmt.sql,
	"readyExpired":          readyExpired,
	"anyExpired":            anyExpired,
	"runningByKey":          runningByKey,
	"admitClaim":            admitClaim.sql,
}

// PlannedStatements are statements that read or write runs together with
// the tables that stay on the coordinator (a queue's), for the Citus plan
// test: Citus may split them into several tasks or subplans, but must run
// them.
var PlannedStatements = map[string]string{
	"freshCandidates": freshCandidates.sql,
	"agedCandidates":  agedCandidates.sql,
	"peekQueue":       peekQueue,
	"listQueues":      listQueues,
	"keyWait":         keyWait,
}

// QueueVTimes and NoteVTime are queueVTimes and noteVTime, for their
// tests.
var QueueVTimes, NoteVTime = queueVTimes, noteVTime

// Jitter is jitter, for its test.
var Jitter = jitter

// PinnedWorkflowRoute is workflowRoute on an installation whose route
// pins are pins.
func PinnedWorkflowRoute(pins *migrations.Pins, name, id string, routes int) int {
	srv := &server{}
	srv.pins.Store(pins)
	return workflowRoute(bound{s: Default, srv: srv}, name, id, routes)
}
