"""The local stack runs a schema registry unless TRIBUTARY_SCHEMA_REGISTRY_URL names one."""

from pathlib import Path

from infra.settings import load_settings
from infra.stack import LocalStack


def test_the_stack_runs_its_own_registry_after_the_broker(tmp_path: Path) -> None:
    stack = LocalStack(load_settings(home=tmp_path, schema_registry_port=28081))
    assert [s.name for s in stack.services][-2:] == ["broker", "schema-registry"]
    assert stack.registry is not None
    assert stack.registry.ports() == {28081: "TRIBUTARY_SCHEMA_REGISTRY_PORT"}
    assert stack.settings.registry_url == stack.registry.endpoint() == "http://127.0.0.1:28081"
    assert "--topic" in stack.registry.argv() and "_schemas" in stack.registry.argv()


def test_an_external_registry_is_used_and_none_is_started(tmp_path: Path) -> None:
    url = "http://reader:s3cret@127.0.0.1:1/"
    stack = LocalStack(load_settings(home=tmp_path, schema_registry_url=url))
    assert stack.registry is None
    assert "schema-registry" not in [s.name for s in stack.services]
    assert stack.settings.registry_url == url.rstrip("/")
    [row] = [c for c in stack.status() if c.name == "schema-registry"]
    assert row.state == "down" and row.pid is None and "s3cret" not in row.endpoint
