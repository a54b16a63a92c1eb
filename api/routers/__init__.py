"""One router per resource: jobs, plans, operations (precompute), coordinator, ops (health, metrics)."""
