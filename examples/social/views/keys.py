"""The fold options that point a social view at the subject keys (event_store.personal)."""


def key_options(keys: tuple[str, str] | None) -> dict[str, str]:
    """``keys_dsn`` and ``keys_schema`` of (DSN, event store schema); none without keys
    (personal fields then read redacted)."""
    if keys is None:
        return {}
    return {"keys_dsn": keys[0], "keys_schema": keys[1]}
