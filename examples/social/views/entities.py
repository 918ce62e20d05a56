"""The entity collections the social views hold (what :mod:`examples.social.views.folds`
folds the topics into). Apart from the folds: a view's definition names its collections
without importing what folding needs (Arrow, the Avro decoder, the domain's events)."""

USERS, POSTS, FOLLOWS = "users", "posts", "follows"
