"""Malformed run configs, generated: a valid setup with one key set to a wrong type, an out-of-range
value, a key that does not exist or sits at the wrong depth, a value that is not YAML; and YAML files
that are broken or shaped wrongly.

The invariant: `load_config` returns a config or raises `ConfigError`, never anything else, and every
problem is one line ``<key>: <what is wrong>`` whose key is the one given (or its section, or the
override or file it came in); a rule that involves another key names the given one in its message.
"""

from __future__ import annotations

import math
import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz._keys import override_list, schema_keys, valid_setup
from trainer.config import CONFIG_DIR, ConfigError, RunConfig, config_to_dict, load_config

KEYS = schema_keys()
LEAVES = sorted(key for key, is_section in KEYS.items() if not is_section)
SECTIONS = sorted(key for key, is_section in KEYS.items() if is_section)
OPTIONAL_SECTIONS = {name for name, value in config_to_dict(RunConfig()).items() if value is None}
# A fixed sequence of examples (no database, no random seed), so that CI sees the same cases each run;
# a load_config call takes 0.1-0.3 s, most of it in OmegaConf.
FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

NAME = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
# Characters that mean something to YAML, OmegaConf or the override syntax.
AWKWARD = st.text("ab1.-_ =:,[]{}$'\"#!&*|>%@`\\\n\t", max_size=12)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=10),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAME, inner, max_size=3),
    max_leaves=6,
)


def _typo(key: str, data: st.DataObject) -> str:
    """``key`` with one character of its last part dropped, doubled or replaced."""
    section, _, name = key.rpartition(".")
    at = data.draw(st.integers(0, len(name) - 1))
    edit = data.draw(st.sampled_from(["drop", "double", "replace"]))
    char = data.draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz_"))
    name = {
        "drop": name[:at] + name[at + 1 :],
        "double": name[: at + 1] + name[at:],
        "replace": name[:at] + char + name[at + 1 :],
    }[edit] or "x"
    return f"{section}.{name}" if section else name


@st.composite
def fuzzed_keys(draw: st.DrawFn) -> str:
    """A known leaf or section, a typo of one, or a key nested under a leaf (wrong depth)."""
    kind = draw(st.sampled_from(["leaf", "section", "typo", "under_leaf", "unknown_section"]))
    if kind == "section":
        return draw(st.sampled_from(SECTIONS))
    if kind == "typo":
        return _typo(draw(st.sampled_from(LEAVES)), draw(st.data()))
    if kind == "under_leaf":
        return f"{draw(st.sampled_from(LEAVES))}.{draw(NAME)}"
    if kind == "unknown_section":
        return draw(NAME)
    return draw(st.sampled_from(LEAVES))


def as_yaml(value: object) -> str:
    """``value`` as the one-line YAML an override carries."""
    return yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip().removesuffix("\n...").strip()


@st.composite
def override_values(draw: st.DrawFn) -> str:
    """A value as an override writes it: typed YAML, or raw text that may not parse."""
    if draw(st.booleans()):
        return as_yaml(draw(VALUES))
    return draw(AWKWARD)


def _stem(key: str) -> str:
    """``key`` without list indices: ``data.train_files[1]`` -> ``data.train_files``."""
    return re.sub(r"\[\d+\]", "", key)


def names_key(problem: str, key: str, where: str) -> bool:
    """Whether ``problem`` is about ``key``: under it, above it (its section or the value it was
    nested under), naming it in the message, or the override or file ``where`` it came in. A key of
    an optional section creates the section, so a required key beside it may be what is named."""
    location, _, message = problem.partition(": ")
    stem = _stem(location)
    section = key.split(".")[0]
    return (
        stem == key
        or key.startswith(f"{stem}.")
        or stem.startswith(f"{key}.")
        or (section in OPTIONAL_SECTIONS and stem.startswith(f"{section}."))
        or re.search(rf"(^|[^\w.]){re.escape(key)}($|[^\w])", message) is not None
        or problem.startswith(where)
    )


def assert_clear(error: ConfigError, keys: list[str], where: str) -> None:
    """Every problem is one line ``<key>: <problem>`` about one of ``keys`` (the only ones changed
    from a valid setup) or the override or file ``where`` they came in."""
    assert error.problems, "a ConfigError without problems"
    for problem in error.problems:
        location, sep, message = problem.partition(": ")
        assert sep and location.strip() and message.strip(), f"not '<key>: <problem>': {problem!r}"
        assert "\n" not in problem and "Traceback" not in problem, problem
        assert not location.startswith("<"), f"no key named: {problem!r}"
        assert any(names_key(problem, key, where) for key in keys), (keys, problem)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return valid_setup(tmp_path_factory.mktemp("fuzz_config"))


def test_the_setup_is_valid(setup):
    config = load_config(None, override_list(setup))
    assert config.data.max_prompt_length == 8


@FUZZ
@given(key=fuzzed_keys(), value=override_values())
def test_a_bad_override_is_a_config_error_naming_its_key(setup, key, value):
    item = f"{key}={value}"
    try:
        load_config(None, [*override_list(setup), item])
    except ConfigError as error:
        assert_clear(error, [key], f"override {item!r}")


@FUZZ
@given(data=st.dictionaries(fuzzed_keys(), VALUES, min_size=1, max_size=4))
def test_a_yaml_file_of_wrong_shapes_is_a_config_error_naming_its_keys(setup, tmp_path_factory, data):
    """Keys at the wrong depth and values of the wrong type, written as nested YAML mappings."""
    tree: dict = {}
    for key, value in data.items():
        node, *parts, last = [tree, *key.split(".")]
        for part in parts:
            child = node.get(part)
            node = node.setdefault(part, {}) if child is None or isinstance(child, dict) else None
            if node is None:
                break
        if node is not None:
            node[last] = value
    path = tmp_path_factory.mktemp("yaml") / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    # The setup's overrides come after the file: what the file set for those keys is replaced.
    changed = [key for key in data if key not in setup]
    try:
        load_config(path, override_list(setup))
    except ConfigError as error:
        assert_clear(error, changed, str(path))


SHIPPED = (CONFIG_DIR / "grpo.yaml").read_text()


@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(SHIPPED)), st.integers(0, 3), st.text("[]{}:-#'\"\n\t &*!|>%@`,", max_size=3)),
        min_size=1,
        max_size=3,
    )
)
def test_a_corrupted_yaml_file_is_a_config_error_naming_the_file_or_a_key(setup, tmp_path_factory, edits):
    """The shipped grpo.yaml with a few characters cut or inserted: a syntax error names the file, line
    and column; a file that still parses is checked key by key."""
    text = SHIPPED
    for at, cut, insert in edits:
        text = text[:at] + insert + text[at + cut :]
    path = tmp_path_factory.mktemp("yaml") / "grpo.yaml"
    path.write_text(text)
    try:
        load_config(path, override_list(setup))
    except ConfigError as error:
        for problem in error.problems:
            location, sep, message = problem.partition(": ")
            assert sep and location.strip() and message.strip(), problem
            assert "\n" not in problem and not location.startswith("<"), problem
            # The file (with line and column for a syntax error), or a key of the file, known or not.
            if location.startswith(str(path)):
                assert re.fullmatch(rf"{re.escape(str(path))}(:\d+:\d+)?", location), problem


# Keys naming something on disk, and how a path is written into each.
PATH_KEYS = {
    "model.path": "{}",
    "model.tokenizer": "{}",
    "reward_model.path": "{}",
    "reward_model.tokenizer": "{}",
    "data.train_files": "[{}]",
    "data.val_files": "[{}]",
    "reward.default_fn": "{}:score",
    "trainer.resume": "{}",
}


@FUZZ
@given(key=st.sampled_from(sorted(PATH_KEYS)), name=st.text("abc_-./ é1", min_size=1, max_size=12), file=st.booleans())
def test_a_path_that_is_missing_or_a_file_is_named_by_its_key(setup, tmp_path_factory, key, name, file):
    """A path that does not exist (or, where a folder is expected, a file) is a config error naming the
    key, not a failure after the workers started."""
    root = tmp_path_factory.mktemp("paths")
    path = root / "missing" / name.strip("/")
    if file and key in ("model.path", "model.tokenizer", "reward_model.path", "reward_model.tokenizer"):
        path = root / "a_file"
        path.write_text("not a model")
    with pytest.raises(ConfigError) as info:
        load_config(None, [*override_list(setup), f"{key}={PATH_KEYS[key].format(path)}"])
    assert any(_stem(problem.partition(": ")[0]) == key for problem in info.value.problems), info.value.problems
