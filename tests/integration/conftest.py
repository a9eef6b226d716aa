"""Fixtures shared by the integration tests."""

from tests.integration.orchestrator_env import env

__all__ = ["env"]
