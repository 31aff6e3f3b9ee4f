"""Spark's progress reports of a session's queries, pushed to the node instead of polled.

The agent counts a PE's input and keeps its state-store metrics from Spark's
``StreamingQueryProgress``. Polling ``query.recentProgress`` for that fetched up to 100
reports a second per query, one py4j round trip each (and PySpark's own listener wrapper
builds every report field by field, dozens of round trips). This listener is called by
Spark once per report and takes the report's JSON in one call; the agent drains the queue
when it looks at its queries. Nothing is lost between two looks, however long they are.

The feed also counts the reports as they come, so that a caller waiting for a query to move
on (the agent's long-polled ``GET .../progress``) sleeps until one comes instead of asking
the query again and again.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class _Listener:
    """The Python side of Spark's ``PythonStreamingQueryListener`` (a py4j callback)."""

    def __init__(self, put: Callable[[str], None]) -> None:
        self._put = put

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 - Spark's names
        pass

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        self._put(jevent.progress().json())

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
        self._arrived = threading.Condition()
        self._count = 0

    def put(self, text: str) -> None:
        """Queue one report (Spark's JSON of it) and wake whoever waits for one."""
        self._reports.put(text)
        with self._arrived:
            self._count += 1
            self._arrived.notify_all()

    @property
    def arrivals(self) -> int:
        """How many reports came so far (never goes down; drained ones count too)."""
        return self._count

    def wait_beyond(self, seen: int, timeout_s: float) -> int:
        """Block until more than ``seen`` reports came, or ``timeout_s`` passed.

        Returns:
            :attr:`arrivals` then: more than ``seen`` if a report came.
        """
        with self._arrived:
            self._arrived.wait_for(lambda: self._count > seen, max(0.0, timeout_s))
            return self._count

    def attach(self, spark: SparkSession) -> None:
        """Listen to ``spark``'s streaming queries (the session's, from now on)."""
        from pyspark.java_gateway import ensure_callback_server_started

        context = spark.sparkContext
        ensure_callback_server_started(context._gateway)
        jvm = context._jvm
        assert jvm is not None
        wrapper = jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper
        spark._jsparkSession.streams().addListener(wrapper(_Listener(self.put)))

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
