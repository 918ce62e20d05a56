"""Shared test configuration: keep the developer's own settings out of the tests."""

import os

for _key in [
    k for k in os.environ if k.startswith("TRIBUTARY_") and not k.startswith("TRIBUTARY_TEST_")
]:
    del os.environ[_key]
