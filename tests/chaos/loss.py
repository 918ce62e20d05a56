"""The broker's lost tail: what ``kill -9`` of a broker loses, made to happen on every kill.

``../shared/ENVIRONMENT.md`` measured the local broker (Tansu on SeaweedFS) losing the last
acknowledged records on ``kill -9`` (7 of 33,161). The build on these machines did not do it
again: 9 kills of a broker under a producer at 20 to 8,000 records/s and flat out lost none,
nor did 46 broker and object-store kills of the chaos harness (``repair`` republished nothing).
So the ``broker-loss`` part makes the loss happen: after ``kill -9`` of the broker and before
it starts again, the record batches written to the data topics (``events.*`` and the CDC
topics: what ``verify`` covers) in the last ``window`` seconds before the kill are deleted from
the object store -- the acknowledged records a broker loses when its last writes never reached
the disk. The broker keeps its offsets (its ``watermark.json``), so the loss is a gap that
readers skip, as they skip the offsets compaction removed.

Tansu keeps each batch as one object, in Kafka's record-batch format:
``<bucket>/clusters/tansu_cluster/topics/<topic>/partitions/<10 digits>/records/<base offset,
20 digits>.batch``. Listing and deleting go through SeaweedFS's filer HTTP API.
"""

import json
import struct
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

TOPICS = "clusters/tansu_cluster/topics"
RECORD_COUNT_AT = 57  # v2 record batch: the int32 record count follows a 57-byte header


@dataclass(frozen=True)
class LostBatch:
    topic: str
    partition: int
    offset: int
    records: int


@dataclass
class TailLoss:
    """Deletes the batches the data topics received in a time window, as a lossy broker would."""

    filer: str
    bucket: str
    prefixes: tuple[str, ...]
    cursors: dict[str, str] = field(default_factory=dict)  # records folder -> last name seen

    def _entries(self, path: str, after: str = "") -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            query = urllib.parse.urlencode({"limit": 1000, "lastFileName": after})
            request = urllib.request.Request(
                f"{self.filer}{path}?{query}", headers={"Accept": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                page = json.load(response)
            entries = page.get("Entries") or []
            out += entries
            if not entries or not page.get("ShouldDisplayLoadMore"):
                return out
            after = entries[-1]["FullPath"].rsplit("/", 1)[-1]

    def _folders(self) -> list[tuple[str, int, str]]:
        """(topic, partition, records folder) of every data topic."""
        root = f"/buckets/{self.bucket}/{TOPICS}/"
        out = []
        for topic_entry in self._entries(root):
            topic = topic_entry["FullPath"].rsplit("/", 1)[-1]
            if not topic.startswith(self.prefixes):
                continue
            for part in self._entries(f"{root}{topic}/partitions/"):
                name = part["FullPath"].rsplit("/", 1)[-1]
                out.append((topic, int(name), f"{root}{topic}/partitions/{name}/records/"))
        return out

    def lose(self, since: float) -> list[LostBatch]:
        """Delete every data-topic batch written at or after ``since`` (epoch seconds)."""
        lost = []
        for topic, partition, folder in self._folders():
            entries = self._entries(folder, self.cursors.get(folder, ""))
            if entries:
                self.cursors[folder] = entries[-1]["FullPath"].rsplit("/", 1)[-1]
            for entry in entries:
                written = max((c["modified_ts_ns"] for c in entry.get("chunks") or []), default=0)
                if written < since * 1e9:
                    continue
                url = self.filer + urllib.parse.quote(entry["FullPath"])
                with urllib.request.urlopen(url, timeout=30) as response:
                    batch = response.read()
                request = urllib.request.Request(url, method="DELETE")
                with urllib.request.urlopen(request, timeout=30):
                    pass
                name = entry["FullPath"].rsplit("/", 1)[-1]
                lost.append(LostBatch(topic, partition, int(name.split(".")[0]), count(batch)))
        return lost


def count(batch: bytes) -> int:
    """The number of records in one stored record batch."""
    (records,) = struct.unpack_from(">i", batch, RECORD_COUNT_AT)
    return int(records)
