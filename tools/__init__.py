"""Tools around trained models that do not train: fp16 compact checkpoints, the int8 graph, a Triton
model repository."""
