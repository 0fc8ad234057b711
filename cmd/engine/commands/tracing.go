package commands

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// tracingFromEnv builds the OpenTelemetry tracer provider serve exports
// with, from the standard variables: spans go over OTLP/HTTP (protobuf)
// when OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT
// is set, unless OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none; the
// exporter reads the rest (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, ...), the
// SDK the sampler and batching (OTEL_TRACES_SAMPLER, OTEL_BSP_*), the
// resource OTEL_SERVICE_NAME (default "pgdurable") and
// OTEL_RESOURCE_ATTRIBUTES. Without an endpoint it returns nil: nothing is
// recorded or sent. The provider becomes the global one, with W3C trace
// context and baggage as the global propagator, so steps' own
// instrumentation joins the runs' traces, and OpenTelemetry's own logs and
// errors go to log. stop flushes what is buffered.
//
// Each endpoint variable that is set must be an http(s)://host[:port][/path]
// URL, checked here before the exporter reads it (the exporter logs one it
// cannot parse, password and all): a bad one is a usage error that shows
// it with its password redacted. A user and password in the endpoint
// (https://user:password@collector:4318) are sent as HTTP basic
// authentication, unless the headers variables set an Authorization;
// secret is given that password first, for the caller to keep out of its
// logs.
func tracingFromEnv(ctx context.Context, getenv func(string) string, log *slog.Logger, secret func(password string)) (tp trace.TracerProvider, stop func(), err error) {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || getenv("OTEL_TRACES_EXPORTER") == "none" {
		return nil, func() {}, nil
	}
	var endpoint *url.URL
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		raw := getenv(name)
		if raw == "" {
			continue
		}
		u, err := checkEndpoint(name, raw)
		if err != nil {
			return nil, nil, err
		}
		if endpoint == nil && name == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces" // the base URL's traces path
		}
		if endpoint == nil {
			endpoint = u
		}
	}
	if endpoint == nil {
		return nil, func() {}, nil
	}
	if exp := getenv("OTEL_TRACES_EXPORTER"); exp != "" && exp != "otlp" {
		return nil, nil, &usageError{fmt.Errorf("OTEL_TRACES_EXPORTER=%s: this binary exports otlp (or none)", exp)}
	}
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto != "" && proto != "http/protobuf" {
		return nil, nil, &usageError{fmt.Errorf("OTLP protocol %q: this binary sends http/protobuf (point it at the collector's HTTP port, 4318)", proto)}
	}
	// OpenTelemetry logs through log (scrubbed of secrets, JSON) rather
	// than as plain text on stderr.
	otel.SetLogger(logr.FromSlogHandler(log.Handler()))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("opentelemetry", "error", err) }))
	opts := []otlptracehttp.Option{}
	if user := endpoint.User; user != nil {
		password, _ := user.Password()
		if password != "" {
			secret(password)
		}
		if h := otlpHeaders(getenv); !hasKeyFold(h, "Authorization") {
			h["Authorization"] = "Basic " + base64.StdEncoding.EncodeToString([]byte(user.Username()+":"+password))
			opts = append(opts, otlptracehttp.WithHeaders(h))
		}
		endpoint.User = nil // the exporter would drop it
	}
	opts = append(opts, otlptracehttp.WithEndpointURL(endpoint.String()))
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", "pgdurable")),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost(), resource.WithProcessPID())
	if err != nil {
		return nil, nil, fmt.Errorf("OTel resource: %w", err)
	}
	p := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(p)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	log.Info("tracing: exporting spans over OTLP/HTTP", "endpoint", endpoint.String())
	return p, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(sctx) // flushes the batch; a collector that is down loses it
	}, nil
}

// checkEndpoint parses the OTLP endpoint variable name's value raw as the
// exporter will: an http or https URL with a host. A value that is not is
// a usage error showing it with its password redacted (redactEndpoint),
// and the parser's reason only when raw has no user part, which the
// reason could quote.
func checkEndpoint(name, raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	var why string
	switch {
	case err != nil && strings.Contains(raw, "@"):
		why = "it does not parse as a URL"
	case err != nil:
		why = "it does not parse as a URL: " + errors.Unwrap(err).Error()
	case u.Scheme != "http" && u.Scheme != "https":
		why = "its scheme must be http or https"
	case u.Host == "" || u.Hostname() == "":
		why = "it names no host"
	default:
		return u, nil
	}
	return nil, &usageError{fmt.Errorf("%s %s is not an OTLP/HTTP endpoint such as http://collector:4318: %s",
		name, strconv.Quote(redactEndpoint(raw)), why)}
}

// redactEndpoint is an endpoint URL with its password replaced by xxxxx,
// as url.URL.Redacted writes it, also when it does not parse: whatever
// stands between the first ":" after the scheme and the last "@" is
// hidden (a path holding an "@" is hidden with it).
func redactEndpoint(raw string) string {
	prefix, rest := "", raw
	if scheme, after, ok := strings.Cut(raw, "://"); ok {
		prefix, rest = scheme+"://", after
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return raw
	}
	user, _, ok := strings.Cut(rest[:at], ":")
	if !ok {
		return raw // a user name alone, as url.URL.Redacted shows it
	}
	return prefix + user + ":xxxxx" + rest[at:]
}

// otlpHeaders reads the headers the exporter sends, as it does:
// OTEL_EXPORTER_OTLP_TRACES_HEADERS, else OTEL_EXPORTER_OTLP_HEADERS,
// comma-separated key=value pairs with percent-encoded values (pairs it
// cannot read are left out, as the exporter leaves them out).
func otlpHeaders(getenv func(string) string) map[string]string {
	v := getenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
	if v == "" {
		v = getenv("OTEL_EXPORTER_OTLP_HEADERS")
	}
	h := map[string]string{}
	for _, pair := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			continue
		}
		if dec, err := url.PathUnescape(val); err == nil {
			h[k] = strings.TrimSpace(dec)
		}
	}
	return h
}

// hasKeyFold says whether h has key k, whatever its case.
func hasKeyFold(h map[string]string, k string) bool {
	for key := range h {
		if strings.EqualFold(key, k) {
			return true
		}
	}
	return false
}
