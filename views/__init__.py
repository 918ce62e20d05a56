"""The view layer around the engine, without Spark: which views are configured
(:mod:`views.catalog`), where each stands (:mod:`views.status`, :mod:`views.lag`), waiting
for a command's events to reach them (:mod:`views.read_your_writes`), and their dead letters
(:mod:`views.dead_letters`, :mod:`views.redrive`).

``projections`` says what each view computes, ``spark_streaming`` runs the views on Spark, the
stores are adapters in ``connectors.stores``; this package is what the CLI, the HTTP API and
the demo use to read and operate views, and imports no Spark.
"""
