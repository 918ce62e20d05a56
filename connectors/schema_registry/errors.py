"""Errors of the schema registry, each with Confluent's ``error_code`` (and its HTTP status)."""

from connectors.errors import ConnectorError


class SchemaRegistryError(ConnectorError):
    """A registry request failed; ``error_code`` is Confluent's code (40401, 409, 42201, ...)."""

    error_code: int = 50001

    def __init__(self, message: str, error_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if error_code is not None:
            self.error_code = error_code

    @property
    def http_status(self) -> int:
        """The HTTP status Confluent answers with: the code's first three digits."""
        code = str(self.error_code)
        return int(code[:3]) if len(code) > 3 else self.error_code

    def body(self) -> dict[str, object]:
        return {"error_code": self.error_code, "message": self.message}


class SubjectNotFoundError(SchemaRegistryError):
    error_code = 40401


class VersionNotFoundError(SchemaRegistryError):
    error_code = 40402


class SchemaNotFoundError(SchemaRegistryError):
    error_code = 40403


class SubjectSoftDeletedError(SchemaRegistryError):
    error_code = 40404


class SubjectNotSoftDeletedError(SchemaRegistryError):
    error_code = 40405


class VersionSoftDeletedError(SchemaRegistryError):
    error_code = 40406


class VersionNotSoftDeletedError(SchemaRegistryError):
    error_code = 40407


class SubjectLevelNotConfiguredError(SchemaRegistryError):
    error_code = 40408


class IncompatibleSchemaError(SchemaRegistryError):
    """The schema breaks the subject's compatibility level (``details``: each reason)."""

    error_code = 409

    def __init__(self, message: str, details: list[str] | None = None) -> None:
        super().__init__(message)
        self.details = details or []


class InvalidSchemaError(SchemaRegistryError):
    error_code = 42201


class InvalidVersionError(SchemaRegistryError):
    error_code = 42202


class InvalidCompatibilityLevelError(SchemaRegistryError):
    error_code = 42203


class RegistryStoreError(SchemaRegistryError):
    """The ``_schemas`` topic could not be read or written (retry once Kafka answers)."""

    error_code = 50001


class RegistryTimeoutError(SchemaRegistryError):
    error_code = 50002


class RegistryUnavailableError(SchemaRegistryError):
    """The registry does not answer (code 50002): try again later; not the request's fault."""

    error_code = 50002
