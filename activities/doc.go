// Package activities runs calls to the outside world — a card charge, an
// email, a webhook — as durable steps with stored request IDs.
//
// Before an activity's first attempt the engine stores a request ID (a UUID
// v7) with the run. Every attempt sends that same ID as its idempotency key:
// retries, redeliveries after a crash, and an operator's replay of a dead
// run. An idempotent API (Stripe and anything following its idempotency
// rules) therefore applies the effect once, however often the call is made.
// The key never depends on the request's contents, so a volatile field (a
// timestamp, a nonce) cannot turn a retry into a second charge.
//
// Define an Activity once, call it from workflow code with Execute:
//
//	var charge = &activities.Activity[ChargeReq, ChargeResp]{
//		Name: "charge",
//		Fn: func(ctx context.Context, call activities.Call, req ChargeReq) (ChargeResp, error) {
//			httpReq, _ := http.NewRequestWithContext(ctx, "POST", url, body(req))
//			resp, err := client.Do(httpReq) // client: activities.NewHTTPClient; sends Idempotency-Key
//			if err := activities.Classify(resp, err); err != nil {
//				return ChargeResp{}, err // transient: retried with the same key; 4xx: permanent
//			}
//			defer resp.Body.Close()
//			return decode(resp.Body)
//		},
//		StartToCloseTimeout: 30 * time.Second,
//	}
//
//	resp, err := activities.Execute(ctx, charge, ChargeReq{Amount: 4999})
//
// Costs: two round trips per activity, one to store the request ID (shared
// with the previous step's record) and one to record the outcome.
package activities
