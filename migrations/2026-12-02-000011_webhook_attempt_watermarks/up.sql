-- The delivery log's cursor after retention. A reader pages an endpoint's
-- attempts by id (`GET /v1/webhook-endpoints/{id}/deliveries?after=`), and
-- retention deletes an old delivery together with all of its attempts,
-- whose ids need not be old (a redelivery adds new attempts to an old
-- delivery). Per endpoint, this records the highest attempt id retention
-- has deleted, written in the transaction of the delete: a cursor below it
-- is answered with an error instead of a silent gap.
--
-- Attempts pruned before this migration ran left no record: a cursor
-- handed out before then can still skip them.
CREATE TABLE webhook_attempt_watermarks (
    endpoint_id       uuid        PRIMARY KEY REFERENCES webhook_endpoints (id),
    -- The highest id among the endpoint's deleted attempts.
    last_attempt_id   bigint      NOT NULL,
    -- The latest attempted_at among them.
    last_attempted_at timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE webhook_attempt_watermarks IS
    'distribution: local to the coordinator (one row per endpoint whose delivery log retention pruned, beside webhook_attempts)';
