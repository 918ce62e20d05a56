"""A Spark driver process running one mirror view with trigger(availableNow=True).

Run as ``python -m tests.integration.spark_streaming.mirror_driver CONFIG_JSON``. With
``pause_at`` ("before_commit": inside the sink's transaction, data written, not committed;
"after_commit": just after the commit) and ``pause_batch``, the driver writes ``marker`` when it
reaches that point in that batch and waits there, so the test can ``kill -9`` it exactly then.
"""

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from connectors.kafka import KafkaConfig
from spark_streaming.session import spark_session
from spark_streaming.view_job import BatchReport, ViewJob
from tests.jvm import SPARK_CLASS_ARCHIVE, SPARK_JAVA_OPTIONS
from tributary.view_store import CommitHooks
from views.catalog import ViewsConfig, configured_views


def main(raw: str) -> None:
    cfg = json.loads(raw)
    config = ViewsConfig(
        kafka=KafkaConfig(
            cfg["bootstrap_servers"], client_id="mirror-driver", extra=cfg.get("kafka_extra", {})
        ),
        postgres_dsn=cfg["dsn"],
        views_schema=cfg["views_schema"],
        checkpoint_root=Path(cfg["checkpoint_root"]),
        mirror_tables=(cfg["table"],),
        max_offsets_per_trigger=cfg["max_offsets_per_trigger"],
    )
    pause_batch = cfg.get("pause_batch")
    marker = Path(cfg.get("marker", "/nonexistent"))

    def pause_if(point: str) -> Callable[[int], None]:
        def hook(batch_id: int) -> None:
            if cfg.get("pause_at") == point and batch_id == pause_batch:
                # written whole, then renamed: the test polls for the name and reads at once
                partial = marker.with_suffix(".partial")
                partial.write_text(f"{point} {batch_id}")
                partial.replace(marker)
                time.sleep(3600)

        return hook

    reports = Path(cfg["reports"]) if cfg.get("reports") else None

    def report(batch: BatchReport) -> None:
        if reports is not None:
            with reports.open("a") as out:
                line = {
                    "batch_id": batch.batch_id,
                    "applied": batch.applied,
                    "records": batch.records,
                }
                out.write(json.dumps(line) + "\n")

    [spec] = configured_views(config).values()
    spark = spark_session(
        "local[2]",
        "mirror-driver",
        driver_memory="1g",
        local_dir=str(Path(cfg["checkpoint_root"]).parent / "spark-scratch"),
        java_options=SPARK_JAVA_OPTIONS,
        class_archive=SPARK_CLASS_ARCHIVE,
    )
    job = ViewJob(
        spark,
        spec,
        config.kafka,
        config.job_options(),
        hooks=CommitHooks(pause_if("before_commit"), pause_if("after_commit")),
        on_batch=report,
    )
    query = job.start(available_now=True)
    query.awaitTermination()
    job.close()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
