"""The image a request carries, as /predict and /explain take it: a multipart `file` field or JSON
`{"image": base64}`; the OpenAPI request body that says so and the errors such a route can answer.

A multipart body is parsed as it streams in by `multipart`'s push parser, which reads a small upload in
about a third of the time of Starlette's form parser (python-multipart's state machine):
benchmarks/cpu_profile.py times both.
"""

import re
from contextlib import aclosing

import multipart
from fastapi import HTTPException, Request

from app import imaging
from app.deps import JSON, json_body, validated_json
from app.schemas import PredictRequest, errors

MAX_FIELDS = 16  # a multipart body's fields beside its `file`
MAX_BOUNDARY = 70  # characters of a multipart boundary (RFC 2046)
# RFC 2046's boundary: 1 to 70 of its characters (bchars), the last not a space
BOUNDARY = re.compile(rf"[0-9A-Za-z'()+_,./:=? -]{{0,{MAX_BOUNDARY - 1}}}[0-9A-Za-z'()+_,./:=?-]")

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
            **json_body(PredictRequest)["content"],
        },
    }
}
IMAGE_ERRORS = errors(
    {
        400: "malformed multipart body",
        404: "no such model",
        413: "body or image too large",
        415: "neither multipart nor JSON, or sent compressed (Content-Encoding)",
        422: "not a usable image, a bad option or one given twice, iterations of a model whose graph has none",
        503: "the model is not ready, or too many requests are waiting",
        504: "the request waited past its deadline (CAPSNET_REQUEST_DEADLINE_S)",
    }
)


async def read_file_field(request: Request, boundary: str) -> bytes:
    """The `file` field of a multipart/form-data body: its one file upload, beside at most MAX_FIELDS other
    fields (read past). A malformed or incomplete body is a 400, as is a second file; a body
    without the `file` upload a 422."""
    names: list[str] = []
    file: list[bytes] | None = None  # the `file` upload's chunks, from its first
    reading = False  # the parser is in the `file` upload
    files = 0
    try:
        with multipart.PushMultipartParser(boundary, max_segment_count=MAX_FIELDS + 1) as parser:
            async with aclosing(request.stream()) as stream:
                async for chunk in stream:
                    if not chunk:  # Starlette's end of the body; the parser's end is its close()
                        continue
                    for event in parser.parse(chunk):
                        if isinstance(event, multipart.MultipartSegment):
                            names.append(str(event.name))
                            files += event.filename is not None
                            if files > 1:
                                raise HTTPException(400, "the multipart body holds more than one file; send one image")
                            if event.name == "file" and event.filename is None:
                                raise HTTPException(422, "`file` must be a file upload, not a text field")
                            reading = event.name == "file"
                            if reading:
                                file = []
                        elif event is None:
                            reading = False
                        elif reading and file is not None:
                            file.append(event)
    except multipart.ParserLimitReached as exc:
        if "segment count" not in str(exc):  # a part's header line over 4 kB, or over 8 headers
            raise HTTPException(400, f"a part of the multipart body has too long or too many headers ({exc})") from None
        raise HTTPException(
            400, f"the multipart body has more than {MAX_FIELDS + 1} parts: send `file` and at most {MAX_FIELDS} fields"
        ) from None
    except multipart.MultipartError as exc:  # its first argument says what, a second may be the error under it
        why = exc.args[0] if exc.args and isinstance(exc.args[0], str) else "unreadable"
        raise HTTPException(400, f"the multipart body is malformed or incomplete ({why})") from None
    if file is None:
        raise HTTPException(
            422,
            f"the multipart body has no `file` field (it has: {', '.join(n[:64] for n in names) or 'nothing'}); "
            "send -F file=@digit.png",
        )
    return b"".join(file)


async def read_image_bytes(request: Request) -> bytes:
    """The image file from a multipart `file` field or a JSON {"image": base64}."""
    sent, options = multipart.parse_options_header(request.headers.get("content-type", ""))
    if sent == "multipart/form-data":
        if not BOUNDARY.fullmatch(options.get("boundary", "")):
            raise HTTPException(
                400,
                f"multipart/form-data needs a boundary= of 1 to {MAX_BOUNDARY} ASCII letters, digits or '()+_,-./:=? "
                "and inner spaces (RFC 2046; curl -F sets it)",
            )
        return await read_file_field(request, options["boundary"])
    if sent == JSON:
        return imaging.from_base64(validated_json(await request.body(), PredictRequest).image)
    raise HTTPException(
        415,
        f"send the image as multipart/form-data (field `file`) or as application/json "
        f'{{"image": "<base64>"}}, not {sent or "a body without Content-Type"}',
    )
