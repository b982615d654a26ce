"""The baseline of the serving benchmark: what a user would write to serve the same graph in fifteen lines.
Pillow decodes the PNG and resizes it to 28x28, one session.run per request, no batching.

$ uvicorn benchmarks.template_app:app --port 8000
"""

import io

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, UploadFile
from PIL import Image

from model import contract

session = ort.InferenceSession(
    str(contract.SHIPPED["mnist"] / contract.CAPSNET_INT8_ONNX), providers=["CPUExecutionProvider"]
)
app = FastAPI()


@app.post("/predict")
async def predict(file: UploadFile) -> dict:
    image = Image.open(io.BytesIO(await file.read())).convert("L").resize((contract.IMAGE_SIZE, contract.IMAGE_SIZE))
    x = np.asarray(image, np.float32)[None, None] / 255.0
    (lengths,) = session.run([contract.LENGTHS], {contract.IMAGE: x})
    return {"prediction": int(lengths[0].argmax())}
