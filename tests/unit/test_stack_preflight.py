from pathlib import Path

import pytest

from infra.errors import MissingBinaryError
from infra.settings import load_settings
from infra.stack import LocalStack


def test_a_missing_binary_names_the_fix_and_starts_nothing(tmp_path: Path) -> None:
    stack = LocalStack(
        load_settings(home=tmp_path / "state", postgres_bin_dir=tmp_path / "no-such-dir")
    )
    with pytest.raises(MissingBinaryError) as err:
        stack.up()
    assert "no-such-dir/postgres" in str(err.value)
    assert "make setup" in str(err.value)
    assert not (tmp_path / "state").exists()
    assert all(s.pid is None for s in stack.status())
