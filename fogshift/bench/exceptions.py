"""Errors of the bench."""

from __future__ import annotations

from fogshift.exceptions import FogshiftError, InvalidInput, Unavailable


class BenchError(FogshiftError):
    """An experiment could not be carried out (a cluster, a pipeline or a step failed)."""

    code = "bench"


class IsolationUnavailable(Unavailable):
    """A delayed link was asked for, but ``fogshift up --isolate`` does not exist here."""

    code = "isolation_unavailable"


class BadBenchOption(InvalidInput):
    """A bench option that cannot be used as given."""

    code = "bad_bench_option"
    default_hint = "`fogshift bench EXPERIMENT --help` gives each option's form"


def refuse_options_with_report_only(given: list[str], what: str) -> None:
    """Refuse the options ``given`` beside ``--report-only`` (they shape a ``what``:
    ignoring them would mislead).

    Raises:
        BadBenchOption: Some were given.
    """
    if given:
        raise BadBenchOption(
            f"--report-only {'runs' if what == 'run' else 'measures'} nothing, so it takes no "
            f"options of a {what}",
            expected="--out DIR --report-only",
            received=", ".join(given),
            hint="drop them, or drop --report-only to "
            + ("run anew" if what == "run" else "measure anew"),
        )
