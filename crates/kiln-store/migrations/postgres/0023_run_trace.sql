-- Trace context (issue 19): the run's W3C traceparent, made when it was
-- accepted (a child of the submitter's, when it sent one), so the claim,
-- the agent's attempt and the completion join the run's trace.
ALTER TABLE runs ADD COLUMN traceparent TEXT;
