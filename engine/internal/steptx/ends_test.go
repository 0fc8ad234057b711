package steptx

import "testing"

func TestEndsTransaction(t *testing.T) {
	for sql, want := range map[string]bool{
		"COMMIT":                    true,
		"commit and chain":          true,
		"  /* x */ -- y\n ROLLBACK": true,
		"rollback and chain":        true,
		"END":                       true,
		"abort":                     true,
		"BEGIN":                     true,
		"start transaction isolation level serializable":  true,
		"PREPARE TRANSACTION 'x'":                         true,
		"COMMIT; SELECT 1":                                true,
		"SELECT 1; commit":                                true,
		"insert into t values (1); COMMIT; begin":         true,
		"ROLLBACK TO SAVEPOINT sp":                        false,
		"RELEASE SAVEPOINT sp":                            false,
		"SAVEPOINT sp":                                    false,
		"SELECT 'a; commit'":                              false,
		`SELECT "x;commit" FROM t`:                        false,
		"SELECT 1 -- ; commit":                            false,
		"SELECT 1 /* ; commit */":                         false,
		"DO $$ BEGIN PERFORM 1; END $$":                   false,
		"DO $body$ BEGIN PERFORM 1; END $body$; SELECT 1": false,
		"SELECT $1::int; SELECT 2":                        false,
		"UPDATE t SET ended = true":                       false,
		"prepare p as select 1":                           false,
		"with x as (select 1) select * from x":            false,
		"":                                                false,
	} {
		if got := endsTransaction(sql); got != want {
			t.Errorf("endsTransaction(%q) = %v, want %v", sql, got, want)
		}
	}
}
