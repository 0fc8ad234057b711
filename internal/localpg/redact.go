package localpg

import (
	"net/url"
	"regexp"
	"strings"
)

// Redact hides a connection string's password in messages, in URL form
// (postgres://user:password@host/db, and ?password= or ?sslpassword= in
// its query) and key=value form (password=...).
func Redact(raw string) string {
	if scheme, _, ok := strings.Cut(raw, "://"); ok && (strings.EqualFold(scheme, "postgres") || strings.EqualFold(scheme, "postgresql")) {
		u, err := url.Parse(raw)
		if err != nil {
			return "(unparseable URL)"
		}
		q := u.Query()
		for _, k := range []string{"password", "sslpassword"} {
			if q.Has(k) {
				q.Set(k, "xxxxx")
			}
		}
		u.RawQuery = q.Encode()
		return u.Redacted()
	}
	return kvPassword.ReplaceAllString(raw, "${1}=xxxxx")
}

// kvPassword matches a key=value connection string's password, quoted
// ('...' with \' escapes) or not.
var kvPassword = regexp.MustCompile(`((?:ssl)?password)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)`)
