package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
)

// errNULInJSON: Postgres jsonb cannot store the NUL character (SQLSTATE
// 22P05), so a payload holding "\u0000" is rejected before it reaches the
// database rather than failing a write after a step's side effect.
var errNULInJSON = errors.New(`JSON contains a NUL character (\u0000), which PostgreSQL jsonb cannot store`)

// jsonSyntax returns nil for valid JSON b, and otherwise encoding/json's
// *json.SyntaxError for it, said with where it breaks (see syntaxAt).
func jsonSyntax(b []byte) error {
	if json.Valid(b) {
		return nil
	}
	var v any
	err := json.Unmarshal(b, &v)
	if err == nil {
		err = errors.New("invalid JSON")
	}
	return syntaxAt(err)
}

// syntaxAt is err with, when it is a *json.SyntaxError, its Offset (the
// bytes encoding/json had read when it found the error, so the offending
// byte is the Offset-th) said as "at byte offset N"; the *json.SyntaxError
// stays in the chain for errors.As.
func syntaxAt(err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("%w at byte offset %d", err, se.Offset)
	}
	return err
}

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

// maxJSONDepth bounds how deeply a client's JSON (a run's input, a signal's
// payload) may nest: deeper values cost quadratic time or space in the
// tools that print them, and no workflow needs them.
const maxJSONDepth = 128

// checkJSONShape checks valid JSON b from a client: nesting at most
// maxJSONDepth deep and, with foldKeys, no object holding two keys that
// differ only in case. encoding/json matches field names regardless of
// case and keeps the last match, and PostgreSQL's jsonb reorders keys, so
// such an input would be validated as one value at start and run as
// another ({"amount": 1, "AMOUNT": 5000}).
func checkJSONShape(b []byte, foldKeys bool) error {
	type frame struct {
		object, key bool // key: the next string token is a key
		keys        map[string]string
	}
	var stack []frame
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		top := len(stack) - 1
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				if len(stack) >= maxJSONDepth {
					return fmt.Errorf("JSON nests deeper than %d levels", maxJSONDepth)
				}
				stack = append(stack, frame{object: t == '{', key: t == '{'})
				continue
			default:
				stack = stack[:top]
				top--
			}
		case string:
			if top >= 0 && stack[top].object && stack[top].key {
				stack[top].key = false
				if !foldKeys {
					continue
				}
				f := foldedKey(t)
				if stack[top].keys == nil {
					stack[top].keys = map[string]string{}
				}
				if other, ok := stack[top].keys[f]; ok && other != t {
					return fmt.Errorf("an object has the keys %q and %q, which decode as one field: use one", other, t)
				}
				stack[top].keys[f] = t
				continue
			}
		}
		if top >= 0 && stack[top].object {
			stack[top].key = true // a value ended: a key comes next
		}
	}
}

// foldedKey maps s to one representative of the strings equal to it under
// Unicode simple case folding (strings.EqualFold's and encoding/json's).
func foldedKey(s string) string {
	return strings.Map(func(r rune) rune {
		m := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			m = min(m, f)
		}
		return m
	}, s)
}
