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
