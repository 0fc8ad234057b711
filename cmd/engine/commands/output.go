package commands

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"
)

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
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
	s = escapeControls(strings.Join(strings.Fields(s), " "), false)
	if len(s) > max {
		cut := max - 1
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// escapeControls writes control characters (and invalid UTF-8) as Go
// escapes (\x1b, \u009b); with lines, newlines and tabs stay (a stack).
func escapeControls(s string, lines bool) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) || r == utf8.RuneError }) {
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
		case unicode.IsControl(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// redact hides a connection string's password in messages, in URL form
// (postgres://user:password@host/db) and key=value form (password=...).
func redact(raw string) string {
	if strings.HasPrefix(raw, "postgres://") || strings.HasPrefix(raw, "postgresql://") {
		u, err := url.Parse(raw)
		if err != nil {
			return "(unparseable URL)"
		}
		return u.Redacted()
	}
	return kvPassword.ReplaceAllString(raw, "password=xxxxx")
}

// kvPassword matches a key=value connection string's password, quoted
// ('...' with \' escapes) or not.
var kvPassword = regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'|\S*)`)

// checkConnString refuses a URL whose user info holds an unencoded @: its
// parsers disagree on where the password ends, and the part after the
// first @ would appear in errors as a host name.
func checkConnString(raw string) error {
	rest, ok := strings.CutPrefix(raw, "postgres://")
	if !ok {
		rest, ok = strings.CutPrefix(raw, "postgresql://")
	}
	if !ok {
		return nil
	}
	authority, _, _ := strings.Cut(rest, "/")
	authority, _, _ = strings.Cut(authority, "?")
	if strings.Count(authority, "@") > 1 {
		return &usageError{errors.New("the database URL has more than one @ before its host: percent-encode an @ in the user name or password as %40")}
	}
	return nil
}

// text is a whole name or ID for people: control characters escaped, "-"
// for none.
func text(s string) string {
	if s == "" {
		return "-"
	}
	return escapeControls(s, false)
}
