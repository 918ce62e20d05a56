"""View logic, engine-free: how changes and events update a view, with per-key position guards.

A view is three parts: a :class:`~projections.view.Decoder` (Kafka record -> domain value), a
:class:`~projections.view.Projection` (decoded values of one batch -> writes) and a
:class:`~projections.view.Sink` (applies a batch's writes atomically with its batch id). Nothing
here imports an engine; ``spark_streaming`` runs views, tests run them directly.
"""
