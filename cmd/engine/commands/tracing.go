package commands

import (
	"context"
	"fmt"
	"strings"
	"time"

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
// instrumentation joins the runs' traces. stop flushes what is buffered.
func tracingFromEnv(ctx context.Context, getenv func(string) string) (tp trace.TracerProvider, stop func(), err error) {
	endpoint := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if base := getenv("OTEL_EXPORTER_OTLP_ENDPOINT"); endpoint == "" && base != "" {
		endpoint = strings.TrimSuffix(base, "/") + "/v1/traces"
	}
	if endpoint == "" || strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || getenv("OTEL_TRACES_EXPORTER") == "none" {
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
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(endpoint))
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
	return p, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(sctx) // flushes the batch; a collector that is down loses it
	}, nil
}
