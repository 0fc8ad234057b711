// Package payment is pgdurable's example: a checkout workflow that claims
// the order, reserves its items (tx steps that share the claim's
// transaction), charges a card through
// Stripe's API, records the payment and sends a receipt, undoing what it
// did when the card is declined or an item sells out.
//
// It runs unchanged against Stripe test mode, stripe-mock, or the fake
// gateway in package fakegateway (set PAYMENT_GATEWAY_URL and
// STRIPE_API_KEY). Its tables come from its own migrations (Migrate) and
// Seed fills the inventory.
package payment
