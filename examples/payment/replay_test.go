package payment_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/engine/enginetest"
	"github.com/pgdurable/pgdurable/examples/payment"
)

// The payment workflow's current code replays the runs recorded from its
// first version (testdata/histories: exported with `engine runs export`
// before the fraud check was added behind engine.Patched): a paid order,
// one with two items, a declined card and a sold-out item, each
// compensated as it was. No gateway is called: no step runs in a replay.
func TestPaymentReplaysRecordedRuns(t *testing.T) {
	t.Parallel()
	client, err := payment.NewGateway(payment.GatewayConfig{BaseURL: "http://127.0.0.1:1", APIKey: "sk_test_replay"}, func(string) string { return "" })
	require.NoError(t, err)
	enginetest.ReplayDir(t, payment.New(client, nil), "testdata/histories")
}
