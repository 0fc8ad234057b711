package store

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
// heartbeat, a run's end, a signal) and the sweep, for the Citus plan test: each one's
// SQL with $n parameters. Not yet among them: insertRuns, the batched
// start, which Citus pulls through the coordinator (an INSERT ... SELECT
// from unnest), and writeRecords, the group commit's batch, whose records
// are INSERTs in CTEs.
var RoutedStatements = map[string]string{
	"insertRun":             insertRunStmt.sql,
	"claimRuns":             claimRuns.sql,
	"loadStepsOfRuns":       loadStepsOfRuns,
	"claimMisses":           claimMisses,
	"freshRecordValues":     freshRecordValues.sql,
	"upsertRecordValues":    upsertRecordValues.sql,
	"recordForUpdate":       recordForUpdate.sql,
	"recordsForUpdate":      recordsForUpdate.sql,
	"recordsForShareStrict": recordsForShareStrict.sql,
	"writeFence":            writeFence.sql,
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
}

// Jitter is jitter, for its test.
var Jitter = jitter
