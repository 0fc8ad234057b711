package commands

import (
	"context"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// minScrubbed is the shortest secret scrubbed from output: shorter ones
// would mangle ordinary words, and connection strings are redacted anyway.
const minScrubbed = 4

// secrets are what no error or log line may show: the database password
// (of the URL or key=value connection string), the API token and the
// password of serve's OTLP endpoint.
func (g *global) secrets() []string {
	var out []string
	if cfg, err := pgconn.ParseConfig(g.dbURL()); err == nil && cfg.Password != "" {
		out = append(out, cfg.Password)
	}
	if g.apiToken != "" {
		out = append(out, g.apiToken)
	}
	if g.otlpPassword != "" {
		out = append(out, g.otlpPassword)
	}
	return out
}

// scrub replaces every secret in s (of at least minScrubbed bytes).
func scrub(s string, secrets []string) string {
	for _, sec := range secrets {
		if len(sec) >= minScrubbed {
			s = strings.ReplaceAll(s, sec, "xxxxx")
		}
	}
	return s
}

// logger wraps h so that no record carries a secret: the message, string
// attributes and errors are scrubbed (River and pgx log what connections
// report).
func (g *global) logger(h slog.Handler) *slog.Logger {
	return slog.New(&scrubHandler{Handler: h, secrets: g.secrets})
}

type scrubHandler struct {
	slog.Handler
	secrets func() []string
}

func (h *scrubHandler) Handle(ctx context.Context, r slog.Record) error {
	secrets := h.secrets()
	out := slog.NewRecord(r.Time, r.Level, scrub(r.Message, secrets), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(scrubAttr(a, secrets))
		return true
	})
	return h.Handler.Handle(ctx, out)
}

func scrubAttr(a slog.Attr, secrets []string) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, scrub(v.String(), secrets))
	case slog.KindGroup:
		var attrs []any
		for _, x := range v.Group() {
			attrs = append(attrs, scrubAttr(x, secrets))
		}
		return slog.Group(a.Key, attrs...)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			return slog.String(a.Key, scrub(err.Error(), secrets))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

func (h *scrubHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	secrets := h.secrets()
	scrubbed := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		scrubbed[i] = scrubAttr(a, secrets)
	}
	return &scrubHandler{Handler: h.Handler.WithAttrs(scrubbed), secrets: h.secrets}
}

func (h *scrubHandler) WithGroup(name string) slog.Handler {
	return &scrubHandler{Handler: h.Handler.WithGroup(name), secrets: h.secrets}
}
