"""`tributary views` and `status` with a reachable broker but the views' stores at a closed
port behind passwords: each view shows its store's error, and no password."""

import json
from pathlib import Path

from infra.stack.isolated import free_port_block
from tests.integration.conftest import Endpoints
from tests.leaks import PG_ECHOED, cli, leaked, secret_env

SECURITY = (
    "TRIBUTARY_KAFKA_SECURITY_PROTOCOL",
    "TRIBUTARY_KAFKA_SASL_MECHANISM",
    "TRIBUTARY_KAFKA_SASL_USERNAME",
    "TRIBUTARY_KAFKA_SASL_PASSWORD",
    "TRIBUTARY_KAFKA_SSL_KEY_PASSWORD",
    "TRIBUTARY_KAFKA_EXTRA",
)


def env_for(stack: Endpoints, home: Path, pg_password: str | None = None) -> dict[str, str]:
    env = secret_env(home, free_port_block(1), *([pg_password] if pg_password else []))
    for name in SECURITY:  # the session's broker is a plain one
        env.pop(name)
    return {**env, "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers}


def test_views_and_status_show_store_errors_without_passwords(
    stack: Endpoints, tmp_path: Path
) -> None:
    plain = env_for(stack, tmp_path / "plain")
    echoed = env_for(stack, tmp_path / "echoed", PG_ECHOED)
    running = {
        "views --json": cli("views --json", plain),
        "views": cli("views", plain),
        "status --json": cli("status --json", plain),
        "echoed views": cli("views", echoed),
        "echoed status --json": cli("status --json", echoed),
    }
    outputs = {}
    for name, process in running.items():
        out, err = process.communicate(timeout=180)
        outputs[name] = out + err
        assert not leaked(out + err), f"{name} printed {leaked(out + err)}:\n{out + err}"
    views = {v["view"]: v for v in json.loads(outputs["views --json"])}
    assert views["profile"]["error"] and views["timeline"]["error"]  # reached the stores
    rows = {r["name"]: r for r in json.loads(outputs["status --json"])}
    assert "view:profile" in rows and "view:timeline" in rows
    assert "***" in outputs["echoed views"] + outputs["echoed status --json"]
