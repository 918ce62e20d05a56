"""View queries without services: declarations the API refuses, command-line arguments, and
which failure each error stands for."""

from typing import Any

import pytest

from connectors.errors import StoreError, StoreUnavailableError
from infra.errors import QueryArgumentError, QueryDeclarationError
from infra.view_queries import (
    cli_arguments,
    declared_queries,
    failure_of,
    find_query,
)
from projections.view import Query, QueryParam, View


def echo(**kwargs: Any) -> dict[str, Any]:
    return kwargs


TIMELINE = Query(
    "timeline",
    "/timeline/{user_id}",
    (
        QueryParam("user_id", int, where="path", required=True, minimum=1),
        QueryParam("limit", int, default=20, minimum=1, maximum=100),
        QueryParam("before", str, maximum=8),
    ),
    echo,
    "A user's home timeline.",
)
SEARCH = Query(
    "search",
    "/search",
    (QueryParam("q", str, required=True), QueryParam("limit", int, default=10)),
    echo,
)


def view(name: str, *queries: Query) -> View:
    return View(name, (), lambda df: df, None, queries=queries)  # type: ignore[arg-type]


def test_positional_words_fill_required_params_and_options_the_rest() -> None:
    entry = declared_queries([view("timeline", TIMELINE)])["timeline"]
    assert cli_arguments(entry, ["42"]) == {"user_id": 42, "limit": 20}
    assert cli_arguments(entry, ["42", "--limit", "5", "--before=x"]) == {
        "user_id": 42,
        "limit": 5,
        "before": "x",
    }
    assert cli_arguments(entry, ["--user-id", "7"]) == {"user_id": 7, "limit": 20}
    assert cli_arguments(entry, ["--limit", "3", "9"]) == {"user_id": 9, "limit": 3}


def test_a_positional_optional_param_takes_a_bare_word_after_the_required_ones() -> None:
    ctr = Query(
        "ctr",
        "/ctr/{day}",
        (
            QueryParam("day", int, where="path", required=True),
            QueryParam("query", str, default="", positional=True),
            QueryParam("limit", int, default=5),
        ),
        echo,
    )
    entry = declared_queries([view("ctr", ctr)])["ctr"]
    assert entry.usage() == "tributary query ctr DAY [QUERY] [--limit INT]"
    assert cli_arguments(entry, ["1"]) == {"day": 1, "query": "", "limit": 5}
    assert cli_arguments(entry, ["1", "kafka spark"]) == {
        "day": 1,
        "query": "kafka spark",
        "limit": 5,
    }
    assert cli_arguments(entry, ["--query", "x", "1"]) == {"day": 1, "query": "x", "limit": 5}
    with pytest.raises(QueryArgumentError, match="unexpected argument"):
        cli_arguments(entry, ["1", "kafka", "3"])


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ([], "missing USER_ID; usage: tributary query timeline USER_ID [--limit INT]"),
        (["x"], "user_id: expected an integer, got 'x'"),
        (["0"], "user_id: must be at least 1, got 0"),
        (["1", "--limit", "101"], "limit: must be at most 100, got 101"),
        (["1", "--before", "toolongvalue"], "before: must be at most 8 characters"),
        (["1", "2"], "unexpected argument(s) '2'"),
        (["1", "--nope", "2"], "query timeline has no parameter --nope"),
        (["1", "--limit"], "--limit needs a value"),
        (["1", "--limit", "2", "--limit", "3"], "limit is given twice"),
        (["--user-id", "1", "2"], "unexpected argument(s) '2'"),
    ],
)
def test_bad_command_line_arguments_say_what_is_wrong(args: list[str], reason: str) -> None:
    entry = declared_queries([view("timeline", TIMELINE)])["timeline"]
    with pytest.raises(QueryArgumentError) as caught:
        cli_arguments(entry, args)
    assert reason in str(caught.value)


@pytest.mark.parametrize(
    ("views", "reason"),
    [
        ([view("a", SEARCH), view("b", SEARCH)], "'search' is declared by views a and b"),
        (
            [
                view(
                    "a",
                    TIMELINE,
                    Query("other", "/timeline/{id}", (QueryParam("id", int, "path"),), echo),
                )
            ],
            "same path",
        ),
        ([view("a", Query("q", "/q/{x}", (), echo))], "placeholders ['x']"),
        ([view("a", Query("q", "/q", (QueryParam("timeout", int),), echo))], "reserved"),
        ([view("a", Query("q", "/health", (), echo))], "must start with '/' and not be one of"),
        ([view("a", Query("q", "/q", (QueryParam("n", int, default="1"),), echo))], "default"),
        ([view("a", Query("q", "/q", (QueryParam("a-b", str),), echo))], "not an identifier"),
        ([view("a", Query("q q", "/q", (), echo))], "the name must be"),
    ],
)
def test_declarations_that_cannot_be_served_are_refused(views: list[View], reason: str) -> None:
    with pytest.raises(QueryDeclarationError) as caught:
        declared_queries(views)
    assert reason in str(caught.value)


def test_an_unknown_query_lists_the_known_ones() -> None:
    queries = declared_queries([view("t", TIMELINE), view("s", SEARCH)])
    with pytest.raises(Exception, match="available: search, timeline"):
        find_query(queries, "nope")


class Lagging(Exception):
    def __init__(self, lagging: Any) -> None:
        super().__init__("late")
        self.lagging = lagging


def test_each_error_stands_for_one_failure() -> None:
    by_name = failure_of(Lagging({"timeline": "behind", "search": "down"}))
    assert by_name is not None and by_name.kind == "lagging"
    assert by_name.lagging == ("timeline", "search")
    assert failure_of(Lagging(("search",))).lagging == ("search",)  # type: ignore[union-attr]
    for unreachable in (StoreUnavailableError("down"), StoreError("refused"), ConnectionError()):
        assert failure_of(unreachable).kind == "unavailable"  # type: ignore[union-attr]
    missing = failure_of(KeyError("no user 4"))
    assert missing is not None and missing.kind == "not_found" and missing.reason == "no user 4"
    assert failure_of(ValueError("bad")).kind == "invalid"  # type: ignore[union-attr]
    assert failure_of(RuntimeError("bug")) is None
