"""Options of the Kafka source: Spark's names and meanings."""

import pytest

from spark_streaming.errors import SourceOptionError
from spark_streaming.kafka_options import KafkaSourceOptions

BASE = {"kafka.bootstrap.servers": "h:9092"}


def test_spark_option_names_are_understood() -> None:
    opts = KafkaSourceOptions.parse(
        {
            **BASE,
            "kafka.security.protocol": "SSL",
            "subscribe": "a, b",
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": "500",
            "failOnDataLoss": "false",
        }
    )
    assert opts.subscribe == ("a", "b") and opts.starting == "earliest"
    assert opts.max_offsets_per_trigger == 500 and not opts.fail_on_data_loss
    assert opts.client == {"bootstrap.servers": "h:9092", "security.protocol": "SSL"}
    assert opts.matches("a") and not opts.matches("c")


def test_pattern_and_json_starting_offsets() -> None:
    opts = KafkaSourceOptions.parse(
        {**BASE, "subscribePattern": "cdc\\..*", "startingOffsets": '{"t": {"0": 5, "1": -2}}'}
    )
    assert opts.matches("cdc.public.users") and not opts.matches("events.user")
    assert opts.starting == {"t": {"0": 5, "1": -2}}
    assert KafkaSourceOptions.parse({**BASE, "subscribe": "t"}).starting == "latest"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t"}, "kafka.bootstrap.servers"),
        (BASE, "exactly one"),
        ({**BASE, "subscribe": "t", "subscribePattern": "x"}, "exactly one"),
        ({**BASE, "subscribe": "t", "maxOffsetsPerTrigger": "0"}, "positive"),
        ({**BASE, "subscribe": "t", "failOnDataLoss": "maybe"}, "true or false"),
        ({**BASE, "subscribe": "t", "startingOffsets": "{bad"}, "earliest, latest or JSON"),
        ({**BASE, "subscribe": "t", "startingOffsets": '{"t": {"0": -7}}'}, "bad offset"),
    ],
)
def test_bad_options_say_what_is_wrong(options: dict[str, str], message: str) -> None:
    with pytest.raises(SourceOptionError, match=message):
        KafkaSourceOptions.parse(options)


def test_stop_at_is_offsets_json() -> None:
    base = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t"}
    assert KafkaSourceOptions.parse(base).stop_at is None
    parsed = KafkaSourceOptions.parse({**base, "tributary.stopAt": '{"t": {"0": 5, "1": 0}}'})
    assert parsed.stop_at == {"t": {"0": 5, "1": 0}}
    with pytest.raises(SourceOptionError, match=r"tributary\.stopAt must be offsets JSON"):
        KafkaSourceOptions.parse({**base, "tributary.stopAt": "[1]"})
