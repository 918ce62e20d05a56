"""TRIBUTARY_VIEWS_READ_URL reaches the serving side: the configured views' PostgreSQL queries
read through it, while the stores keep writing through the main URL."""

from pathlib import Path

import pytest

from connectors.errors import StoreUnavailableError
from infra.settings import load_settings
from infra.stack.isolated import free_port_block
from infra.views import views_config
from views.catalog import configured_views


def test_the_timeline_query_reads_through_the_read_url(tmp_path: Path) -> None:
    main, read = free_port_block(1), free_port_block(1, low=60001, high=65000)
    settings = load_settings(
        home=tmp_path,
        postgres_url=f"postgresql+psycopg://app:main-Pw-1@127.0.0.1:{main}/db",
        views_read_url=f"postgresql+psycopg://reader:read-Pw-2@127.0.0.1:{read}/db",
    )
    config = views_config(settings)
    assert config.read_dsn == f"postgresql://reader:read-Pw-2@127.0.0.1:{read}/db"
    assert config.postgres_dsn.startswith("postgresql://app:")  # the view jobs write there
    [query] = configured_views(config)["timeline"].queries
    with pytest.raises(StoreUnavailableError, match=f"port {read} failed"):
        query.run(user_id=1)


def test_without_a_read_url_queries_read_through_the_main_url(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path)
    config = views_config(settings)
    assert config.read_dsn is None and config.query_dsn == config.postgres_dsn
    assert settings.views_read_database_url == settings.database_url
