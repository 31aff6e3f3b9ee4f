"""Pipeline specs: YAML, validated with pydantic, checked as a graph."""

from fogshift.spec.exceptions import InvalidSpec
from fogshift.spec.loader import load_spec, parse_spec, validate_spec
from fogshift.spec.models import KINDS, AnyElement, ElementSpec, PipelineSpec, RecoverySpec

__all__ = [
    "KINDS",
    "AnyElement",
    "ElementSpec",
    "InvalidSpec",
    "PipelineSpec",
    "RecoverySpec",
    "load_spec",
    "parse_spec",
    "validate_spec",
]
