"""Where the demo listens and which API it asks: typed settings read from CAPSNET_DEMO_* once."""

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class DemoSettings(BaseSettings):
    """Where the demo listens and which API it asks (env: CAPSNET_DEMO_API_URL, ...)."""

    model_config = SettingsConfigDict(env_prefix="CAPSNET_DEMO_", env_ignore_empty=True, extra="ignore")

    api_url: str = "http://localhost:8000"
    # the API's address as a person's browser reaches it, which the footer links to (default: api_url; in
    # compose the demo reaches the API as http://api:8000, a name only the containers know)
    public_api_url: str = ""
    host: str = "127.0.0.1"  # 0.0.0.0 in a container
    port: int = 7860
    timeout_s: float = 10.0  # per API call; a CPU predict takes tens of milliseconds
    # At start the demo asks the API which models it serves (GET /models), one tab each; `make demo` starts
    # both at once and the API loads and warms every model before it listens (a minute on a busy 2-core CPU).
    wait_s: float = 180.0
    # Browser sessions whose state the demo keeps, the least recently used dropped first: Gradio keeps each
    # page load's copy of the page's settings (about 1.6 MB here) until this many are held (its own default
    # is 10,000), and an answer on screen for an hour after the page is closed
    sessions: int = Field(default=256, ge=1)


@lru_cache
def get_settings() -> DemoSettings:
    return DemoSettings()
