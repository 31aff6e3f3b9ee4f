"""Reading users' YAML: each key once, no aliases, UTF-8 (specs and topologies)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from fogshift.common.yamltext import load_yaml, read_utf8
from fogshift.spec.exceptions import InvalidSpec
from fogshift.spec.loader import load_spec, load_spec_text

SPEC = """\
pipeline: dup
elements:
  - {id: source, kind: csv-source, node: cloud, options: {path: /etc/hostname}}
  - id: aggregate
    kind: window-aggregate
    node: fog-a
    inputs: [source]
    options: {field: value, window: 3, function: avg}
    options: {field: value, window: 3, function: max}
"""


def test_a_key_given_twice_is_refused_naming_it() -> None:
    # safe_load kept the last: the aggregate computed max, and the spec said valid.
    assert yaml.safe_load(SPEC)["elements"][1]["options"]["function"] == "max"
    with pytest.raises(yaml.YAMLError, match="found key 'options' twice"):
        load_yaml(SPEC)
    with pytest.raises(InvalidSpec, match="found key 'options' twice") as refused:
        load_spec_text(SPEC, Path("/"))
    assert "each key once" in (refused.value.expected or "")
    assert load_yaml("a: 1\nb: {a: 2}\n") == {"a": 1, "b": {"a": 2}}  # other mappings may


def test_an_alias_is_refused_at_once_however_much_it_would_expand() -> None:
    levels = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 9) + "]" for n in range(1, 9)]
    bomb = "pipeline: bomb\nelements: []\nextra:\n" + "".join(f"  {line}\n" for line in levels)
    started = time.monotonic()
    with pytest.raises(InvalidSpec, match="anchors and aliases are not accepted"):
        load_spec_text(bomb, Path("/"))
    assert time.monotonic() - started < 5  # (9**9 values, expanded, took minutes)


def test_a_file_that_is_not_utf8_is_refused_saying_so(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("# capteur température\npipeline: x\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"not UTF-8 text \(byte 0xe9 at offset 14\)"):
        read_utf8(latin1)
    with pytest.raises(InvalidSpec, match="not UTF-8") as refused:
        load_spec(latin1)
    assert refused.value.hint == "save the file as UTF-8"


@pytest.mark.parametrize(
    ("value", "said"),
    [("9" * 5000, "4300 digits"), ("2026-13-45", "month must be in 1..12"),
     ("[1, {b: 2026-02-30}]", "day is out of range")],
)  # fmt: skip
def test_a_value_yaml_cannot_construct_is_refused_not_raised(value: str, said: str) -> None:
    # PyYAML's constructors raise ValueError for these, not a YAMLError: the dashboard's
    # deploy and PUT /topology answered 500, `fogshift deploy` printed a traceback.
    with pytest.raises(yaml.YAMLError, match=said):
        load_yaml(f"x: {value}\n")
    with pytest.raises(InvalidSpec, match=said) as refused:
        load_spec_text(f"pipeline: p\nelements: []\nx: {value}\n", Path("/"))
    assert refused.value.expected and refused.value.received and refused.value.hint
