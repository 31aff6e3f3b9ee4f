"""Spark's progress reports of a session's queries, pushed to the node instead of polled.

The agent counts a PE's input and keeps its state-store metrics from Spark's
``StreamingQueryProgress``. Polling ``query.recentProgress`` for that fetched up to 100
reports a second per query, one py4j round trip each (and PySpark's own listener wrapper
builds every report field by field, dozens of round trips). This listener is called by
Spark once per report and takes the report's JSON in one call; the agent drains the queue
when it looks at its queries. Nothing is lost between two looks, however long they are.
"""

from __future__ import annotations

import json
import logging
import queue
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class _Listener:
    """The Python side of Spark's ``PythonStreamingQueryListener`` (a py4j callback)."""

    def __init__(self, reports: queue.SimpleQueue[str]) -> None:
        self._reports = reports

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 - Spark's names
        pass

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        self._reports.put(jevent.progress().json())

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802
        pass

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


class ProgressFeed:
    """Every progress report of a session's queries, in the order Spark made them."""

    def __init__(self) -> None:
        self._reports: queue.SimpleQueue[str] = queue.SimpleQueue()

    def attach(self, spark: SparkSession) -> None:
        """Listen to ``spark``'s streaming queries (the session's, from now on)."""
        from pyspark.java_gateway import ensure_callback_server_started

        context = spark.sparkContext
        ensure_callback_server_started(context._gateway)
        jvm = context._jvm
        assert jvm is not None
        wrapper = jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper
        spark._jsparkSession.streams().addListener(wrapper(_Listener(self._reports)))

    def drain(self) -> dict[str, list[dict[str, Any]]]:
        """The reports queued since the last call, by query name, oldest first."""
        out: dict[str, list[dict[str, Any]]] = {}
        while True:
            try:
                text = self._reports.get_nowait()
            except queue.Empty:
                return out
            try:
                report = json.loads(text)
            except ValueError:  # never expected from Spark; one bad report changes no count
                log.warning("ignored a progress report that is not JSON: %.200s", text)
                continue
            out.setdefault(str(report.get("name")), []).append(report)
