"""Property-based: schemathesis generates requests from the OpenAPI document (in-process ASGI).

No request may get a 5xx; responses must match their documented schemas, status codes and
content types; schema-violating requests must be rejected. Left out: "schema-valid data must be
accepted", since no schema can say that a binary is a picture of a digit (a blank PNG is a 422).
Bounded (max_examples per operation) so that the suite stays quick on two CPU cores.
"""
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance


@pytest.fixture(scope="module")
def api_schema(app, client):  # `client` has run the lifespan: the engine is loaded and warm
    return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_and_has_no_5xx(case):
    case.call_and_validate(excluded_checks=[positive_data_acceptance])
