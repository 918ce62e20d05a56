"""Who may do what: with ``TRIBUTARY_API_TOKEN`` set, ``POST /commands`` needs ``Authorization:
Bearer <token>``; with ``TRIBUTARY_API_READ_TOKEN`` set, so do the query routes (the read token,
or the command token). A missing token is 401 (with ``WWW-Authenticate: Bearer``), a wrong one
403."""

import hmac
from collections.abc import Sequence
from typing import Annotated

from fastapi import Depends
from fastapi.params import Depends as DependsParam
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from infra.settings import Settings


def bearer_guard(
    scheme_name: str, description: str, tokens: Sequence[str], what: str
) -> DependsParam:
    """A route dependency that requires ``Authorization: Bearer`` with one of ``tokens``
    (401 with ``WWW-Authenticate: Bearer`` when missing, 403 when wrong); FastAPI declares it
    in the OpenAPI schema as the bearer security scheme ``scheme_name``."""
    scheme = HTTPBearer(auto_error=False, scheme_name=scheme_name, description=description)
    expected = [token.encode() for token in tokens]

    async def guard(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(scheme)],
    ) -> None:
        if credentials is None:
            raise HTTPException(
                401,
                f"{what} need a bearer token: send the header Authorization: Bearer <token>",
                headers={"WWW-Authenticate": "Bearer"},
            )
        given = credentials.credentials.encode()
        valid = False
        for token in expected:  # compare with every token: the time says nothing
            valid |= hmac.compare_digest(given, token)
        if not valid:
            raise HTTPException(403, f"the bearer token is not valid for {what}")

    return DependsParam(guard)


def command_guard(settings: Settings) -> DependsParam | None:
    """What ``POST /commands`` requires (None: open)."""
    if settings.api_token is None:
        return None
    return bearer_guard(
        "commandToken",
        "TRIBUTARY_API_TOKEN: required by POST /commands and POST /forget (also reads the"
        " queries).",
        [settings.api_token.get_secret_value()],
        "commands and forget requests",
    )


def read_guard(settings: Settings) -> DependsParam | None:
    """What the query routes require (None: open): the read token or the command token."""
    if settings.api_read_token is None:
        return None
    tokens = [settings.api_read_token.get_secret_value()]
    if settings.api_token is not None:
        tokens.append(settings.api_token.get_secret_value())
    return bearer_guard(
        "readToken",
        "TRIBUTARY_API_READ_TOKEN (or the command token): required by the query routes.",
        tokens,
        "view queries",
    )
