package payment

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Order is the payment workflow's input. Amount is in minor
// units of Currency (ISO 4217, lowercase).
type Order struct {
	OrderID       string `json:"order_id"`
	CustomerID    string `json:"customer_id"`
	Amount        int64  `json:"amount"`
	Currency      string `json:"currency"`
	PaymentMethod string `json:"payment_method"`
	Items         []Item `json:"items"`
}

// Item is one order line.
type Item struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

// Receipt is the payment workflow's output.
type Receipt struct {
	OrderID       string `json:"order_id"`
	PaymentIntent string `json:"payment_intent"`
	Amount        int64  `json:"amount"`
	Currency      string `json:"currency"`
	ReceiptSent   bool   `json:"receipt_sent"`
}

var (
	idPattern       = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	currencyPattern = regexp.MustCompile(`^[a-z]{3}$`)
)

// maxAmount bounds an order (Stripe's limit is 99,999,999 minor units).
const maxAmount = 99_999_999

// Validate reports everything wrong with o at once. The engine calls it at
// start (engine.Validator), so the HTTP API answers 400 and no run exists.
func (o Order) Validate() error {
	var errs []string
	if !idPattern.MatchString(o.OrderID) {
		errs = append(errs, fmt.Sprintf("order_id %q must be 1-64 letters, digits, _ or -", o.OrderID))
	}
	if !idPattern.MatchString(o.CustomerID) {
		errs = append(errs, fmt.Sprintf("customer_id %q must be 1-64 letters, digits, _ or -", o.CustomerID))
	}
	if o.Amount <= 0 || o.Amount > maxAmount {
		errs = append(errs, fmt.Sprintf("amount %d must be between 1 and %d (minor units)", o.Amount, maxAmount))
	}
	if !currencyPattern.MatchString(o.Currency) {
		errs = append(errs, fmt.Sprintf("currency %q must be a lowercase ISO 4217 code", o.Currency))
	}
	if !strings.HasPrefix(o.PaymentMethod, "pm_") {
		errs = append(errs, fmt.Sprintf("payment_method %q must be a payment method ID (pm_...)", o.PaymentMethod))
	}
	if len(o.Items) == 0 || len(o.Items) > 50 {
		errs = append(errs, "items must hold 1 to 50 lines")
	}
	for i, it := range o.Items {
		if !idPattern.MatchString(it.SKU) || it.Qty <= 0 || it.Qty > 1000 {
			errs = append(errs, fmt.Sprintf("items[%d]: sku %q with qty %d is not a valid line", i, it.SKU, it.Qty))
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}
