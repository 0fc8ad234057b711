package engine

import "errors"

// errNULInJSON: Postgres jsonb cannot store the NUL character (SQLSTATE
// 22P05), so a payload holding "\u0000" is rejected before it reaches the
// database rather than failing a write after a step's side effect.
var errNULInJSON = errors.New(`JSON contains a NUL character (\u0000), which PostgreSQL jsonb cannot store`)

// checkStorable reports whether b, valid JSON, can be stored as jsonb.
func checkStorable(b []byte) error {
	// In valid JSON a backslash only appears inside a string as an escape,
	// so scanning escapes from left to right is exact.
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 >= len(b) {
			continue
		}
		if b[i+1] == 'u' && i+5 < len(b) && string(b[i+2:i+6]) == "0000" {
			return errNULInJSON
		}
		i++ // skip the escaped character
	}
	return nil
}
