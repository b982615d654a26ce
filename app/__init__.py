"""CapsNet inference service: FastAPI on ONNX Runtime with dynamic batching (docs/ARCHITECTURE.md).

Never imports torch: the serving path needs onnxruntime, numpy, pillow and fastapi only.
"""

VERSION = "0.1.0"  # the service's, as OpenAPI and the Open Inference Protocol's server metadata give it
