"""The local stack: real PostgreSQL, SeaweedFS + Tansu broker, and Redis under a state folder."""

from infra.stack.stack import ComponentStatus, LocalStack

__all__ = ["ComponentStatus", "LocalStack"]
