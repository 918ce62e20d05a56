"""Subscriber examples for downstream teams (docs/downstream.md); a test runs both as written."""
