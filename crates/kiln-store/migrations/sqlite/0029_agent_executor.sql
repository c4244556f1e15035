-- Placement follows trust and isolation (issue 39, invariant 12): the
-- executor an agent said it runs (`host` or `container`). An agent that did
-- not say (older agents) counts as a host executor.
ALTER TABLE agents ADD COLUMN executor TEXT NOT NULL DEFAULT 'host';
