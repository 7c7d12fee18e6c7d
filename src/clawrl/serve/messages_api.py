"""PLACEHOLDER: being written."""

from __future__ import annotations

from fastapi import FastAPI

from clawrl.config import ServeConfig
from clawrl.serve.completions import ChatService
from clawrl.serve.metrics import ServeMetrics


def add_routes(app: FastAPI, service: ChatService, config: ServeConfig, metrics: ServeMetrics) -> None:
    """Nothing yet."""
