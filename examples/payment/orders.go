package payment

import (
	"bufio"
	"bytes"
	_ "embed"
)

//go:embed testdata/orders.jsonl
var ordersJSONL []byte

// DemoOrders returns the demo's orders, one raw JSON document per line as
// submitted to the API: valid orders, declines (pm_card_chargeDeclined),
// orders for an item that sells out, invalid ones (bad amounts,
// currencies, items, IDs, and a line that is not JSON), exact duplicates
// of an order ID and conflicting reuses of one.
func DemoOrders() [][]byte {
	var out [][]byte
	sc := bufio.NewScanner(bytes.NewReader(ordersJSONL))
	for sc.Scan() {
		if line := bytes.TrimSpace(sc.Bytes()); len(line) > 0 {
			out = append(out, append([]byte(nil), line...))
		}
	}
	return out
}
