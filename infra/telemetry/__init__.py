"""Prometheus metrics of every long-running part, written by ``prometheus-client``.

Each process serves its own ``GET /metrics`` (what a Prometheus operator scrapes, one target per
process): ``tributary serve`` on its API port, and ``tributary run cdc|commands|views`` each on a
port of its own from the settings (:mod:`infra.telemetry.endpoint`); ``tributary status`` lists
them. Every process also has the client's ``process_*`` and ``python_*`` metrics.

The views process (:mod:`~infra.telemetry.batches`, from each micro-batch's report):
``tributary_view_batches_total{view,applied}``, ``tributary_view_records_in_total{view}``
(offsets read), ``tributary_view_rows_out_total{view}`` (folded rows written),
``tributary_view_dead_letters_total{view}``, ``tributary_view_batch_duration_seconds{view,stage}``
(histogram; stage ``fold``: source read + fold + transfer, ``write``: the store's atomic apply),
``tributary_view_last_batch_duration_seconds{view,stage}``,
``tributary_view_last_batch_timestamp_seconds{view}`` and, from Spark's progress of each trigger
(:mod:`spark_streaming.progress`), ``tributary_view_trigger_phase_seconds{view,phase}``
(histogram; Spark's phases: ``latestOffset``, ``queryPlanning``, ``addBatch``, ``walCommit``,
``commitOffsets``, ``triggerExecution``, ...).

The command processor and ``serve`` (:mod:`~infra.telemetry.commands`, label ``entry`` =
``topic`` or ``http``): ``tributary_commands_total{entry,outcome}`` (accepted, rejected,
conflicting), ``tributary_command_duration_seconds{entry,outcome}`` (histogram) and
``tributary_command_conflicts_total{entry}`` (optimistic-concurrency conflicts, each retried).

CDC (:mod:`~infra.telemetry.cdc`): ``tributary_cdc_events_total{connector}``,
``tributary_cdc_batches_total``, ``tributary_cdc_handler_seconds_total{connector,stage}``,
``tributary_cdc_last_change_timestamp_seconds``, ``tributary_cdc_up``; with ``serve``, the slot:
``tributary_cdc_slot_retained_wal_bytes{slot}``, ``tributary_cdc_slot_wal_budget_bytes{slot}``,
``tributary_cdc_slot_active{slot}``.

``tributary serve`` also reads the stores, topics and files at each scrape
(:mod:`~infra.telemetry.overview`), so what it shows holds while a part is down: per view
``tributary_view_up``, ``tributary_view_batch_id``, ``tributary_view_lag_records``,
``tributary_view_lag_seconds``, ``tributary_view_dead_letters`` (records on ``dlq.<view>``),
``tributary_view_redriven_dead_letters``, each view's own counters; ``tributary_verify_ok``,
``tributary_verify_last_run_timestamp_seconds`` and ``tributary_verify_findings{kind}``.
"""
