"""CapsNet inference service: FastAPI on ONNX Runtime with dynamic batching (DESIGN.md, "HTTP contract").

Never imports torch: the serving path needs onnxruntime, numpy, pillow and fastapi only.
"""
