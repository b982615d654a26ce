"""Named dependencies: the app's settings and its engine (created once, in the lifespan)."""
from typing import Annotated

from fastapi import Depends, Request

from app.engine import Engine
from app.settings import Settings


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_engine(request: Request) -> Engine:
    return request.app.state.engine


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
EngineDep = Annotated[Engine, Depends(get_engine)]
