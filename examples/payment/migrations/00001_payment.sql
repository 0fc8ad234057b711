-- The payment example's own tables: inventory with reservations, and the
-- payments ledger (one row per order).

-- +goose Up
CREATE TABLE payment_inventory (
    sku      text    NOT NULL,
    stock    integer NOT NULL,
    reserved integer NOT NULL DEFAULT 0,
    CONSTRAINT payment_inventory_pkey PRIMARY KEY (sku),
    CONSTRAINT payment_inventory_reserved_check CHECK (reserved >= 0 AND reserved <= stock)
);

CREATE TABLE payment_reservations (
    order_id text    NOT NULL,
    sku      text    NOT NULL,
    qty      integer NOT NULL,
    run_id   uuid    NOT NULL,
    CONSTRAINT payment_reservations_pkey PRIMARY KEY (order_id, sku),
    CONSTRAINT payment_reservations_qty_check CHECK (qty > 0)
);

CREATE TABLE payment_ledger (
    order_id       text        NOT NULL,
    payment_intent text        NOT NULL,
    amount         bigint      NOT NULL,
    currency       text        NOT NULL,
    run_id         uuid        NOT NULL,
    recorded_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT payment_ledger_pkey PRIMARY KEY (order_id)
);

-- +goose Down
DROP TABLE payment_ledger;
DROP TABLE payment_reservations;
DROP TABLE payment_inventory;
