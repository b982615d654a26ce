"""The image a request carries, as /predict and /explain take it: a multipart `file` field or JSON
`{"image": base64}`; the OpenAPI request body that says so and the errors such a route can answer."""

from typing import Any

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from app import imaging
from app.schemas import ErrorMessage, PredictRequest

# The route reads its body itself (read_image_bytes): FastAPI is told its two forms for the document
IMAGE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "a PNG, JPEG, BMP, GIF or WebP image: a digit, two "
                            "overlapping digits or a garment, as the model reads",
                        }
                    },
                }
            },
            "application/json": {"schema": PredictRequest.model_json_schema()},
        },
    }
}
IMAGE_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorMessage, "description": text}
    for status, text in {
        400: "malformed multipart body",
        404: "no such model",
        413: "body or image too large",
        415: "neither multipart nor JSON",
        422: "not a usable image, bad option, iterations of a model whose graph has none",
        503: "the model is not ready, or too many requests are waiting",
        504: "the request waited past its deadline (CAPSNET_REQUEST_DEADLINE_S)",
    }.items()
}


async def read_image_bytes(request: Request) -> bytes:
    """The image file from a multipart `file` field or a JSON {"image": base64}."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == "multipart/form-data":
        async with request.form(max_files=1, max_fields=16) as form:
            upload = form.get("file")
            if upload is None:
                raise HTTPException(
                    422,
                    f"the multipart body has no `file` field (it has: "
                    f"{', '.join(form.keys()) or 'nothing'}); send -F file=@digit.png",
                )
            if not isinstance(upload, UploadFile):
                raise HTTPException(422, "`file` must be a file upload, not a text field")
            return await upload.read()
    if media_type == "application/json":
        try:
            payload = PredictRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
        return imaging.from_base64(payload.image)
    raise HTTPException(
        415,
        f"send the image as multipart/form-data (field `file`) or as application/json "
        f'{{"image": "<base64>"}}, not {media_type or "a body without Content-Type"}',
    )
