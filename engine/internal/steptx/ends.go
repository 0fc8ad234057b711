package steptx

import (
	"errors"
	"strings"
)

// ErrEndsTransaction is what a statement that would end the step's
// transaction returns, unsent: its transaction commits with the step's
// record (and with the steps before it that share it), so a COMMIT or a
// ROLLBACK of the function's own would commit writes without their
// records, or lose the records' writes, whatever the form (COMMIT AND
// CHAIN, END, "COMMIT; SELECT 1").
var ErrEndsTransaction = errors.New("pgdurable: a tx step's function may not end its transaction " +
	"(COMMIT, ROLLBACK, END, ABORT, BEGIN, START or PREPARE TRANSACTION): it commits with the step's record; " +
	"return an error to roll it back, and use tx.Begin for a savepoint")

// endsTransaction reports whether sql holds a statement that ends (or
// begins) a transaction: each statement's first keyword, outside quotes,
// dollar quotes and comments. ROLLBACK TO and RELEASE (savepoints) do not.
func endsTransaction(sql string) bool {
	stmtStart := 0
	for i := 0; i < len(sql); i++ {
		switch c := sql[i]; {
		case c == '\'' || c == '"':
			j := strings.IndexByte(sql[i+1:], c)
			if j < 0 {
				return ends(sql[stmtStart:])
			}
			i += j + 1
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				return ends(sql[stmtStart:])
			}
			i += j
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			j := strings.Index(sql[i+2:], "*/")
			if j < 0 {
				return ends(sql[stmtStart:])
			}
			i += j + 3
		case c == '$':
			k := i + 1
			for k < len(sql) && (sql[k] == '_' || sql[k] >= 'a' && sql[k] <= 'z' || sql[k] >= 'A' && sql[k] <= 'Z' || sql[k] >= '0' && sql[k] <= '9') {
				k++
			}
			if k < len(sql) && sql[k] == '$' && (k == i+1 || sql[i+1] < '0' || sql[i+1] > '9') {
				tag := sql[i : k+1]
				j := strings.Index(sql[k+1:], tag)
				if j < 0 {
					return ends(sql[stmtStart:])
				}
				i = k + j + len(tag)
			}
		case c == ';':
			if ends(sql[stmtStart:i]) {
				return true
			}
			stmtStart = i + 1
		}
	}
	return ends(sql[stmtStart:])
}

// ends reports whether one statement ends or begins a transaction.
func ends(stmt string) bool {
	for {
		stmt = strings.TrimLeft(stmt, " \t\r\n(")
		switch {
		case strings.HasPrefix(stmt, "--"):
			i := strings.IndexByte(stmt, '\n')
			if i < 0 {
				return false
			}
			stmt = stmt[i:]
			continue
		case strings.HasPrefix(stmt, "/*"):
			i := strings.Index(stmt, "*/")
			if i < 0 {
				return false
			}
			stmt = stmt[i+2:]
			continue
		}
		break
	}
	f := strings.Fields(strings.ToLower(stmt))
	if len(f) == 0 {
		return false
	}
	second := ""
	if len(f) > 1 {
		second = f[1]
	}
	switch f[0] {
	case "commit", "end", "abort", "begin":
		return true
	case "rollback":
		return second != "to"
	case "start", "prepare":
		return second == "transaction"
	}
	return false
}
