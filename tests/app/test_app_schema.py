"""Property-based: schemathesis generates requests from the OpenAPI document and sends them to the
running API (tests/conftest.py's api_url).

Every operation but infer: no request may get a 5xx; responses must match their documented schemas,
status codes and content types; schema-violating requests must be rejected. Left out there: "schema-valid
data must be accepted", since no schema can say that a binary is a picture of a digit (a blank PNG is a 422).

The Open Inference Protocol's infer, one operation per served graph (its own request schema): every
request the schema describes must be answered 200, JSON and binary alike; a 4xx fails the test. Two
rules no JSON Schema can state are written by the hooks below, as every client writes them: a JSON
request's shape[0] is the number of rows in its data, and a binary request (application/octet-stream)
is its JSON part, Inference-Header-Content-Length long, followed by the tensor's bytes.
Bounded (max_examples per operation, no coverage phase for infer: its boundary cases of 28x28 nested
arrays took minutes) so that the suite stays quick on two CPU cores.
"""

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from app.routes.inference_protocol import HEADER_LENGTH

INFER = r"^/v2/models/[^/]+/infer$"


@pytest.fixture(scope="module")
def api_schema(api_url):
    return schemathesis.openapi.from_url(f"{api_url}/openapi.json")


@pytest.fixture(scope="module")
def infer_schema(api_url):
    schema = schemathesis.openapi.from_url(f"{api_url}/openapi.json")  # its own config and hooks
    schema.config.generation.modes = [GenerationMode.POSITIVE]
    schema.config.phases.coverage.enabled = False
    schema.hook("map_case")(rows_in_shape)
    schema.hook("flatmap_case")(binary_form)
    return schema


schema = schemathesis.pytest.from_fixture("api_schema").exclude(path_regex=INFER)
infer = schemathesis.pytest.from_fixture("infer_schema").include(path_regex=INFER)


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_and_has_no_5xx(case):
    case.call_and_validate(excluded_checks=[positive_data_acceptance])


@infer.parametrize()
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
def test_infer_takes_every_request_its_schema_describes(case):
    response = case.call_and_validate()
    assert response.status_code == 200, (case.media_type, response.text[:500])


def request_schema(case) -> dict:
    return case.operation.definition.raw["requestBody"]["content"]["application/json"]["schema"]


def rows_in_shape(context, case):
    """A JSON request's shape[0] is the number of rows in its data (JSON Schema has no way to say it)."""
    if case.media_type == "application/json":
        (tensor,) = case.body["inputs"]
        tensor["shape"][0] = len(tensor["data"])
    return case


def binary_form(context, case):
    """A binary request as the extension defines it, drawn from what the operation's JSON schema says: the
    JSON request with the input's binary_data_size, Inference-Header-Content-Length long, then the tensor's
    float32 bytes; outputs asked for or not, each as JSON or binary."""
    if case.media_type != "application/octet-stream":
        return st.just(case)
    properties = request_schema(case)["properties"]
    tensor = properties["inputs"]["items"]["properties"]
    dims = [d["const"] for d in tensor["shape"]["prefixItems"][1:]]
    value = tensor["data"]
    while value["type"] == "array":
        value = value["items"]
    names = properties["outputs"]["items"]["properties"]["name"]["enum"]
    outputs = st.lists(
        st.fixed_dictionaries(
            {"name": st.sampled_from(names)},
            optional={"parameters": st.fixed_dictionaries({}, optional={"binary_data": st.booleans()})},
        ),
        min_size=properties["outputs"]["minItems"],
        max_size=len(names),
    )
    values = st.integers(1, 3).flatmap(
        lambda rows: arrays("<f4", (rows, *dims), elements=st.floats(value["minimum"], value["maximum"], width=32))
    )

    def fill(drawn) -> object:
        x, asked, binary_output = drawn
        request = {
            "inputs": [
                {
                    "name": tensor["name"]["const"],
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ]
        }
        if asked is not None:
            request["outputs"] = asked
        if binary_output is not None:
            request["parameters"] = {"binary_data_output": binary_output}
        header = json.dumps(request).encode()
        case.body = header + x.tobytes()
        case.headers = {**(case.headers or {}), HEADER_LENGTH: str(len(header))}
        return case

    return st.tuples(values, st.none() | outputs, st.none() | st.booleans()).map(fill)
