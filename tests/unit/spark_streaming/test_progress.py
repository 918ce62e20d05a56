"""Which query a trigger's phases belong to: a view's generation, never a warm-up."""

from spark_streaming.progress import view_of_query


def test_a_generations_query_names_its_view_even_when_the_view_name_has_dots() -> None:
    assert view_of_query("mirror.public.users.g1a2b3c4d5e") == "mirror.public.users"
    assert view_of_query("timeline.g0123456789") == "timeline"


def test_warm_ups_and_unnamed_queries_belong_to_no_view() -> None:
    assert view_of_query("timeline.warm-up") is None
    assert view_of_query(None) is None
    assert view_of_query("") is None
    assert view_of_query("adhoc") is None
