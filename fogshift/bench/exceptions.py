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
