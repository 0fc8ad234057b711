-- One order, one charge: the run paying an order claims it, whatever
-- workflow ID a client started it under. A second run for the order is
-- refused before it reserves or charges anything; a run that compensates
-- gives the claim back, so the order can be tried again.

-- +goose Up
CREATE TABLE payment_orders (
    order_id   text        NOT NULL,
    run_id     uuid        NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT payment_orders_pkey PRIMARY KEY (order_id)
);

-- +goose Down
DROP TABLE payment_orders;
