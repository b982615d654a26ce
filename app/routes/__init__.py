"""One router per resource: predict, reconstruct, models, health (health, ready, model) and the Open Inference
Protocol's /v2 routes (inference_protocol)."""
