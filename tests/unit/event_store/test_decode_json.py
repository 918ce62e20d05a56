"""Events' JSON decodes as json's scanner decodes it, with orjson where it can."""

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from event_store.event import decode_json

# What jsonb's text can hold: no NaN nor infinities; integers of any size (numeric).
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_any_json_value_decodes_as_jsons_scanner_decodes_it(value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False)
    decoded = decode_json(text)
    assert decoded == json.loads(text)
    assert json.dumps(decoded) == json.dumps(json.loads(text))  # same types: int stays int


def test_an_integer_beyond_64_bits_in_a_block_decodes_exactly() -> None:
    texts = ['{"n": 1}', '{"n": 1180591620717411303424}', '{"n": -9223372036854775809}']
    assert decode_json("[" + ",".join(texts) + "]") == [
        {"n": 1},
        {"n": 2**70},
        {"n": -(2**63) - 1},
    ]
