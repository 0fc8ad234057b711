package commands

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pgdurable/pgdurable/engine/httpapi"
)

// writeJSON prints v as the HTTP API does: compact (indentation costs
// quadratic space in a value's nesting; pipe it through jq to read it), C1
// controls, DEL and bidi controls escaped (\u009b, \u202e), so that text
// from a step or a server cannot drive or reorder the terminal it is
// printed on.
func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(escapeBidiJSON(httpapi.EscapeC1(b)), '\n'))
	return err
}

// escapeBidiJSON writes the bidi controls in JSON text b as \u escapes,
// which encoding/json leaves raw (it escapes U+2028 and U+2029 itself).
// They can only stand inside strings, where an escape means the same
// character.
func escapeBidiJSON(b []byte) []byte {
	if !bytes.ContainsFunc(b, bidiControl) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if bidiControl(r) {
			out = fmt.Appendf(out, `\u%04x`, r)
		} else {
			out = append(out, b[i:i+n]...)
		}
		i += n
	}
	return out
}

// table prints aligned columns for people.
type table struct{ w *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{w: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	fmt.Fprintln(t.w, strings.Join(header, "\t"))
	return t
}

func (t *table) row(cells ...any) {
	s := make([]string, len(cells))
	for i, c := range cells {
		s[i] = cell(c)
	}
	fmt.Fprintln(t.w, strings.Join(s, "\t"))
}

func (t *table) flush() { _ = t.w.Flush() }

// checkJSON returns a usage error when b, given as what (a flag, "the
// payload"), is not valid JSON, saying where it breaks: the byte offset
// encoding/json reports (*json.SyntaxError's Offset, the bytes it had read
// when it found the error). It does not echo b, which may hold what no
// log should (card data, a customer's address).
func checkJSON(what string, b []byte) error {
	if json.Valid(b) {
		return nil
	}
	var v any
	err := json.Unmarshal(b, &v)
	var syntax *json.SyntaxError
	if errors.As(err, &syntax) {
		return &usageError{fmt.Errorf("%s is not valid JSON: %v at byte offset %d", what, err, syntax.Offset)}
	}
	return &usageError{fmt.Errorf("%s is not valid JSON", what)}
}

func cell(v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case *time.Time:
		if x == nil {
			return "-"
		}
		return x.UTC().Format(time.RFC3339)
	case time.Time:
		return x.UTC().Format(time.RFC3339)
	case string:
		if x == "" {
			return "-"
		}
		return oneLine(x, 80)
	case fmt.Stringer:
		if x == nil {
			return "-"
		}
		return oneLine(x.String(), 200)
	}
	return oneLine(fmt.Sprint(v), 200)
}

// oneLine fits s on one line of at most max bytes, with control
// characters escaped: names, inputs and error messages come from clients
// and steps, and a raw terminal escape must never reach an operator.
func oneLine(s string, max int) string {
	return cutText(escapeControls(strings.Join(strings.Fields(s), " "), false), max)
}

// serverText is text a server sent (an error message, a cursor, a status)
// as the CLI prints it: on one line (a newline shows as \n, so a server
// cannot forge a line of output), every character escapeControls escapes
// escaped, at most max bytes.
func serverText(s string, max int) string {
	return cutText(escapeControls(s, false), max)
}

// cutText cuts s to at most max bytes on a character boundary, ending
// with "…" when it cut.
func cutText(s string, max int) string {
	if len(s) > max {
		cut := max - 1
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// escapeControls writes control characters (and invalid UTF-8), bidi
// controls and line and paragraph separators (see escaped) as Go escapes
// (\x1b, \u009b, \u202e); with lines, newlines and tabs stay (a stack).
func escapeControls(s string, lines bool) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return escaped(r) || r == utf8.RuneError }) {
		return s
	}
	var b strings.Builder
	for i, w := 0, 0; i < len(s); i += w {
		r, n := utf8.DecodeRuneInString(s[i:])
		w = n
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case lines && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case escaped(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// escaped reports the characters the CLI never prints raw for people:
// control characters (terminal escapes, newlines that forge a line), bidi
// controls, which reorder what is around them ("evil\u202egnp.exe" reads
// as "evilexe.png"), and line and paragraph separators (U+2028, U+2029).
func escaped(r rune) bool {
	return unicode.IsControl(r) || bidiControl(r) || r == '\u2028' || r == '\u2029'
}

// bidiControl reports the bidi formatting characters: the marks (U+061C,
// U+200E, U+200F), embeddings and overrides (U+202A to U+202E) and
// isolates (U+2066 to U+2069).
func bidiControl(r rune) bool {
	return r == '\u061c' || r == '\u200e' || r == '\u200f' || r >= '\u202a' && r <= '\u202e' || r >= '\u2066' && r <= '\u2069'
}

// checkConnString refuses a URL with more than one @ before its query:
// its parsers disagree on where the password ends, and the part after the
// first @ would appear in errors as a host or database name.
func checkConnString(raw string) error {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || !(strings.EqualFold(scheme, "postgres") || strings.EqualFold(scheme, "postgresql")) {
		return nil
	}
	rest, _, _ = strings.Cut(rest, "?")
	if strings.Count(rest, "@") > 1 {
		return &usageError{errors.New("the database URL has more than one @: percent-encode an @ in the user name, password or database name as %40")}
	}
	return nil
}

// normalizeScheme lower-cases a URL's scheme (POSTGRES://), which the
// driver would otherwise read as a key=value string and send, password
// and all, to the server as a parameter name.
func normalizeScheme(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if ok && (strings.EqualFold(scheme, "postgres") || strings.EqualFold(scheme, "postgresql")) {
		return strings.ToLower(scheme) + "://" + rest
	}
	return raw
}

// text is a whole name or ID for people: control characters escaped, "-"
// for none.
func text(s string) string {
	if s == "" {
		return "-"
	}
	return escapeControls(s, false)
}

// c1Escaper writes JSON log records with C1 controls, DEL and bidi
// controls escaped (see httpapi.EscapeC1 and escapeBidiJSON), which
// encoding/json leaves raw: an error message in a log line tailed on a
// terminal cannot drive it or reorder it. slog's JSON handler
// writes one whole record per Write.
type c1Escaper struct{ w io.Writer }

func (e c1Escaper) Write(p []byte) (int, error) {
	if _, err := e.w.Write(escapeBidiJSON(httpapi.EscapeC1(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
