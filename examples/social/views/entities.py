"""The entity collections the social views hold (what :mod:`examples.social.views.folds`
folds the topics into). Apart from the folds: a view's definition names its collections
without importing what folding needs (Arrow, the Avro decoder, the domain's events)."""

USERS, POSTS, FOLLOWS = "users", "posts", "follows"
#: Subjects forgotten (``<type>:<id>``, from ``events.subject``): no personal data, only
#: what each view purges on.
FORGOTTEN = "forgotten"
#: The subject type of the social domain's people (event_store.personal).
USER = "user"
