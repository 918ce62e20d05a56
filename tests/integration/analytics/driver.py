"""A Spark driver process running analytics jobs with ``trigger(availableNow=True)``, each job
pausing inside its stores' commit of one batch (data written, not committed) so the test can
``kill -9`` the process there.

Run as ``python -m tests.integration.analytics.driver CONFIG_JSON``: ``jobs`` to run,
``pause_batch``; the driver writes ``<marker_dir>/<job>`` when a job reaches the pause point.
"""

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from connectors.kafka import KafkaConfig
from spark_streaming.session import spark_session
from spark_streaming.view_job import ViewJob
from tests.integration.analytics.lab import lab_config, views_by_job
from tests.jvm import SPARK_CLASS_ARCHIVE, SPARK_JAVA_OPTIONS
from tributary.view_store import CommitHooks
from views.catalog import JobOptions


def main(raw: str) -> None:
    cfg = json.loads(raw)
    kafka = KafkaConfig(
        cfg["bootstrap_servers"], client_id="analytics-driver", extra=cfg.get("kafka_extra", {})
    )
    views = views_by_job(lab_config(kafka, cfg["dsn"], cfg["unique"], cfg["registry_url"]))
    markers = Path(cfg["marker_dir"])
    spark = spark_session(
        "local[2]",
        "analytics-driver",
        driver_memory="1g",
        local_dir=cfg["local_dir"],
        java_options=SPARK_JAVA_OPTIONS,
        class_archive=SPARK_CLASS_ARCHIVE,
    )
    options = JobOptions(
        checkpoint_root=Path(cfg["checkpoint_root"]),
        max_offsets_per_trigger=cfg["max_offsets_per_trigger"],
    )

    def pause(job: str) -> Callable[[int], None]:
        def hook(batch_id: int) -> None:
            if batch_id == cfg["pause_batch"]:
                (markers / job).write_text(str(batch_id))
                time.sleep(3600)

        return hook

    queries = []
    for name in cfg["jobs"]:
        job = ViewJob(spark, views[name], kafka, options, hooks=CommitHooks(pause(name)))
        queries.append(job.start(available_now=True))
    for query in queries:
        query.awaitTermination()


if __name__ == "__main__":
    main(sys.argv[1])
