"""The OpenAPI pages work without the internet: GET / leads to /docs, and /docs and /redoc load every script,
style and icon from the service itself (tests/conftest.py's api_url)."""

import re

import httpx
import pytest

ASSET = re.compile(r'(?:src|href)="([^"]+)"')
TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png"}


def test_the_service_address_leads_to_its_docs(api_url):
    response = httpx.get(f"{api_url}/", follow_redirects=False)
    assert response.status_code == 307 and response.headers["location"] == "/docs"
    assert "Swagger UI" in httpx.get(f"{api_url}/", follow_redirects=True).text


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_load_everything_from_the_service(api_url, page):
    html = httpx.get(api_url + page)
    assert html.status_code == 200
    assets = ASSET.findall(html.text)
    assert any(a.endswith(".js") for a in assets), "the page's script is among its assets"
    for asset in assets:
        assert asset.startswith("/") and not asset.startswith("//"), f"{page} loads {asset} from elsewhere"
        response = httpx.get(api_url + asset)
        kind = TYPES.get(asset[asset.rfind(".") :])
        assert kind is not None, f"{page} loads {asset}, of a kind this test does not know"
        assert response.status_code == 200 and kind in response.headers["content-type"], asset
        assert len(response.content) > 500, asset
