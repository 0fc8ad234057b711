package commands

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"
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
		return x.String()
	}
	return fmt.Sprint(v)
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		s = s[:max-1] + "…"
	}
	return s
}

// redact hides a URL's password in messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}
