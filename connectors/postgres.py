"""PostgreSQL access: SQLAlchemy 2 engines over psycopg 3."""

from dataclasses import dataclass

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url


@dataclass(frozen=True)
class PostgresConfig:
    """A SQLAlchemy URL (``postgresql+psycopg://user[:password]@host:port/db``)."""

    url: str
    pool_size: int = 5

    @property
    def dsn(self) -> str:
        """The libpq form, for psycopg directly and for tools."""
        return self.url.replace("postgresql+psycopg://", "postgresql://", 1)

    @property
    def host(self) -> str:
        return make_url(self.url).host or "127.0.0.1"

    @property
    def port(self) -> int:
        return make_url(self.url).port or 5432

    @property
    def user(self) -> str:
        return make_url(self.url).username or "postgres"

    @property
    def password(self) -> str:
        return make_url(self.url).password or ""

    @property
    def database(self) -> str:
        return make_url(self.url).database or "postgres"


def make_engine(config: PostgresConfig) -> Engine:
    """An engine with a small pool, pre-ping on checkout, and psycopg 3 as the driver."""
    url = make_url(config.url)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return create_engine(url, pool_size=config.pool_size, pool_pre_ping=True)
