"""The thesis's published figures the bench compares with — the only typed-in numbers.

Source: D. Gomm, *Adapting Stream Processing Pipelines in Fog Infrastructures*, bachelor
thesis, KIT (AIFB), chapter 6 "Evaluation". Pages are the thesis's own page numbers (its
table of contents and list of figures). Its setup: Apache StreamPipes with Kafka; the
aggregating PE in a container on a Raspberry Pi 4 (4 x 1.5 GHz Cortex-A72, 4 GiB), everything
else on a 6-core Ryzen 3600 desktop (16 GiB), gigabit Ethernet between them (§6.1, p. 43-44).

Everything else the bench reports is measured by it; nothing here is ever written to a CSV.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Anchor:
    """One published number and where it is printed.

    Attributes:
        value: The number as printed.
        unit: Its unit ("ms", "%", "ms/event", "events/s", "runs").
        source: Figure or section, and page.
    """

    value: float
    unit: str
    source: str

    def cite(self) -> str:
        """``value unit`` with its source, for a table cell."""
        number = f"{self.value:g}"
        unit = self.unit if self.unit in ("%",) else f" {self.unit}"
        return f"{number}{unit} ({self.source})"


# -- the common test case (§6.1, §6.2.1-6.2.2) ------------------------------------------------

#: "The events were fed into the pipeline with an average frequency of one event every 300ms"
#: (§6.2.1, p. 44-46; §6.2.2, p. 47-48).
EVENT_INTERVAL_MS = Anchor(300, "ms", "§6.2.1 p. 44-46")
#: "the aggregating PE was configured to aggregate the last ten values" (§6.2.1, p. 44-46).
WINDOW = 10
#: "Each test was performed ten times" (§6.2.1, p. 44-46).
E1_RUNS_PER_SERIES = 10
#: Added state of the test series s0, s1, s5 (§6.2.1, p. 44-46) and of the follow-up series
#: for the CPU load (Fig. 21b, p. 47), in MiB.
E1_STATE_MIB = (0, 1, 5, 50)

# -- E1: PE live migration (Fig. 20, p. 46; text §6.2.1, p. 44-46) ---------------------

#: Downtime (sum of phases 1-3, "an upper limit for the PE downtime") by link profile and
#: added state in MiB, as printed in the text around Fig. 20.
E1_DOWNTIME_MS: dict[tuple[str, int], Anchor] = {
    ("n0", 0): Anchor(48, "ms", "Fig. 20a p. 46"),
    ("n0", 1): Anchor(112, "ms", "Fig. 20a p. 46"),
    ("n0", 5): Anchor(308, "ms", "Fig. 20a p. 46"),
    ("n100", 0): Anchor(243, "ms", "Fig. 20b p. 46"),
    ("n100", 1): Anchor(911, "ms", "Fig. 20b p. 46"),
    ("n100", 5): Anchor(1278, "ms", "Fig. 20b p. 46"),
    ("n500", 0): Anchor(1057, "ms", "Fig. 20c p. 46"),
    ("n500", 1): Anchor(2571, "ms", "Fig. 20c p. 46"),
    ("n500", 5): Anchor(3823, "ms", "Fig. 20c p. 46"),
}
#: "In a total of 110 evaluated runs, the result was always consistent" (§6.2.1, p. 47).
E1_CONSISTENT_RUNS = Anchor(110, "runs", "§6.2.1 p. 47")
#: Average CPU load of the PE's container during a migration with 50 MiB of state
#: ("an increase of the CPU load to 50% can be seen", Fig. 21b, p. 47).
E1_CPU_MIGRATION_PCT = Anchor(50, "%", "Fig. 21b p. 47")
#: CPU load outside checkpoints and migration ("under 10% for most of the time", Fig. 21a, p. 47).
E1_CPU_IDLE_PCT = Anchor(10, "%", "Fig. 21a p. 47")

# -- E2: PE restoration (Fig. 22, p. 48; Fig. 23, p. 49) --------------------------------------

#: "a total of 100 test runs were conducted" (§6.2.2, p. 47-48).
E2_RUNS = Anchor(100, "runs", "§6.2.2 p. 47-48")
#: "The state-size was artificially increased by 1MiB" (§6.2.2, p. 47-48).
E2_STATE_MIB = 1
#: "the PE-level checkpointing was configured to a frequency of checkpointing once every five
#: seconds" (§6.2.2, p. 47-48).
E2_CHECKPOINT_INTERVAL_S = 5.0
#: "The average time per reprocessed event is 0.608ms" (Fig. 22a, p. 48).
E2_REPROCESS_MS_PER_EVENT = Anchor(0.608, "ms/event", "Fig. 22a p. 48")
#: "... per intermediary processed event, which takes 1.109ms on average" (Fig. 22b, p. 48).
E2_INTERMEDIATE_MS_PER_EVENT = Anchor(1.109, "ms/event", "Fig. 22b p. 48")
#: CPU load of the restored PE's container while reprocessing and processing intermediate
#: events ("increased to around 90%", Fig. 23, p. 49).
E2_CPU_RESTORE_PCT = Anchor(90, "%", "Fig. 23 p. 49")

# -- E3: checkpointing (Fig. 24, p. 50; text §6.2.3, p. 49-50) -------------------------------

#: Average duration of checkpointing the aggregator's operator state, by added MiB.
E3_CHECKPOINT_MS: dict[int, Anchor] = {
    0: Anchor(3.1, "ms", "Fig. 24 p. 50"),
    1: Anchor(23.8, "ms", "Fig. 24 p. 50"),
    5: Anchor(84.1, "ms", "Fig. 24 p. 50"),
}
#: Share of the serialisation time in the checkpoint duration, by added MiB (§6.2.3, p. 49-50).
E3_SERIALISATION_SHARE_PCT: dict[int, Anchor] = {
    0: Anchor(0.3, "%", "§6.2.3 p. 49-50"),
    1: Anchor(32.3, "%", "§6.2.3 p. 49-50"),
    5: Anchor(40.6, "%", "§6.2.3 p. 49-50"),
}


def thesis_rate_per_s() -> float:
    """The thesis's event rate in events/s (one event every 300 ms)."""
    return 1000.0 / EVENT_INTERVAL_MS.value
