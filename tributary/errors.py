"""The root exception of Tributary.

Every error Tributary raises derives from :class:`TributaryError`; each package
adds its own subclasses in its ``errors.py`` so callers can catch by package or
by cause.
"""


class TributaryError(Exception):
    """Base of every error Tributary raises. The message says what to do next."""
