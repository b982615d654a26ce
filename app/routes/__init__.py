"""One router per resource: predict, reconstruct, health (health, ready, model)."""
