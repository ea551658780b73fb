"""The generated bad-input corpus (docs/reliability.md): cases built from the pydantic models,
so a new config field or strategy option is covered without writing a case by hand.

- every numeric field of every config section and every strategy's options (and the items
  of population.classes and cis.nodes) × the values its constraints rule out: negative,
  zero, NaN, ±inf, huge, above its upper bound, a string, a list;
- every Literal and bool field × a value not allowed; every section × an unknown field and
  a value that is not a mapping; every section given twice; YAML that must stay bounded;
- every command × misuse of its options; damaged run folders (plot, run --resume).

Each case passes when the exit status is neither 0 nor 1, the output is one sentence
(``error: …``) with no traceback, and every file that existed before is unchanged. Nothing
trains: ``run_experiment`` is replaced by a stub that fails the case if a command accepts
its input (these are all refused by validation, before any compute).
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import annotated_types as at
import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from fedclock.cli import app
from fedclock.config import STRATEGY_OPTIONS, ExperimentConfig, readers_of
from tests.conftest import tiny_raw

runner = CliRunner()
Setup = Callable[[Path], list[str]]


# ---------------------------------------------------------------- walking the models


def _strip(ann: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None is allowed)."""
    args = typing.get_args(ann)
    if typing.get_origin(ann) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True  # noqa: UP007
    return ann, False


def _bounds(field: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in field.metadata:
        for kind in (at.Ge, at.Gt, at.Le, at.Lt):
            if isinstance(m, kind):
                out[kind.__name__.lower()] = float(getattr(m, kind.__name__.lower()))
    return out


def _section_models() -> list[tuple[str, type[BaseModel]]]:
    """(dotted path, model) of every section, nested section and list item model."""
    out: list[tuple[str, type[BaseModel]]] = []

    def walk(prefix: str, model: type[BaseModel]) -> None:
        for name, field in model.model_fields.items():
            ann, _ = _strip(field.annotation)
            origin = typing.get_origin(ann)
            inner = typing.get_args(ann)[0] if origin is list else ann
            if name == "strategy" or not (isinstance(inner, type) and issubclass(inner, BaseModel)):
                continue
            path = f"{prefix}{name}" + ("[0]" if origin is list else "")
            out.append((path, inner))
            walk(f"{path}.", inner)

    walk("", ExperimentConfig)
    return out


#: a valid context for the fields of a nested list item and of each strategy
_ITEM_BASE = {
    "population.classes[0]": {"fraction": 1.0, "speed": 1.0e6},
    "cis.nodes[0]": {"parent": -1, "exit": 1},
}


def _bad_numbers(field: Any, kind: type) -> list[tuple[str, Any]]:
    b = _bounds(field)
    low = b.get("ge", b.get("gt"))
    out: list[tuple[str, Any]] = [
        ("NaN", math.nan), ("inf", math.inf), ("-inf", -math.inf),
        ("huge", 10**30), ("string", "abc"), ("list", [1, 2]),
    ]  # fmt: skip
    if low is not None and low >= 0:
        out.append(("negative", -1 if kind is int else -0.5))
    if ("gt" in b and b["gt"] >= 0) or ("ge" in b and b["ge"] > 0):
        out.append(("zero", 0))
    if "le" in b or "lt" in b:
        high = b.get("le", b.get("lt"))
        above = high + 1 if kind is int or high >= 1 else high * 2 + 0.5
        out.append(("above", int(above) if kind is int else above))
    if kind is float and low is not None and low >= 0:
        pass  # (covered by negative)
    return out


def _field_values(model: type[BaseModel]) -> list[tuple[str, str, Any]]:
    """(field, variant, bad value) for every field of ``model`` this corpus can judge."""
    out: list[tuple[str, str, Any]] = []
    for name, field in model.model_fields.items():
        ann, _ = _strip(field.annotation)
        origin = typing.get_origin(ann)
        args = typing.get_args(ann)
        if ann in (int, float):
            out += [(name, v, x) for v, x in _bad_numbers(field, ann)]
        elif origin is list and args and args[0] in (int, float):
            out += [(name, f"list item {v}", [x]) for v, x in _bad_numbers(field, args[0])
                    if v not in ("list", "zero", "negative", "above")]  # fmt: skip
            out.append((name, "not a list", "abc"))
        elif origin is tuple and args and all(a in (int, float) for a in args):
            out += [(name, "NaN member", [math.nan] * len(args)), (name, "short", [1.0])]
        elif origin is typing.Literal:
            out += [(name, "unknown choice", "no-such-choice"), (name, "number", 3)]
        elif ann is bool:
            out += [(name, "not a bool", "maybe"), (name, "list", [True])]
    return out


def _nest(path: str, value: Any) -> dict[str, Any]:
    """``{"population": {"classes": [value]}}`` for ``population.classes[0]``, and so on."""
    head, _, rest = path.partition(".")
    if head.endswith("[0]"):
        inner = _nest(rest, value) if rest else value
        return {head[:-3]: [inner]}
    return {head: _nest(rest, value) if rest else value}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _with(section: str, field: str, value: Any) -> dict[str, Any]:
    """The tiny config with ``section.field`` set to ``value`` (in a valid item if a list)."""
    if section in _ITEM_BASE:
        item = {**_ITEM_BASE[section], field: value}
        head, _, _ = section.partition("[")
        sec, _, key = head.partition(".")
        raw = tiny_raw()
        extra = {"classes": [item], "scenario": "classes"} if key == "classes" else None
        if key == "nodes":
            return _merge(raw, {"cis": {"tree": "custom", "nodes": [item]},
                                "partition": {"num_clients": 1}})  # fmt: skip
        return _merge(raw, {sec: extra})
    return _merge(tiny_raw(), _nest(f"{section}.{field}" if section else field, value))


def _strategy_context(name: str) -> dict[str, Any]:
    """What a valid config of strategy ``name`` needs besides its own section."""
    if name.startswith("cis-"):
        return {"cis": {"tree": "4-2-1"}, "partition": {"num_clients": 7},
                "model": {"arch": "ee_cnn", "channels": [4, 4, 4]}}  # fmt: skip
    return {}


# ---------------------------------------------------------------- the cases


def _config_case(raw: dict[str, Any] | str, *, via_set: str | None = None) -> Setup:
    def setup(tmp: Path) -> list[str]:
        path = tmp / "bad.yaml"
        if via_set is not None:  # the tiny config, the bad value given by --set
            path.write_text(yaml.safe_dump(tiny_raw()))
            return ["run", str(path), "--set", via_set]
        path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw))
        return ["run", str(path)]

    return setup


def _yaml_text(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _generated() -> list[tuple[str, Setup]]:
    cases: list[tuple[str, Setup]] = []
    # numeric, choice and bool fields of every section
    for i, (section, model) in enumerate([("", ExperimentConfig), *_section_models()]):
        for j, (field, variant, value) in enumerate(_field_values(model)):
            path = f"{section}.{field}" if section else field
            name = f"{path} {variant}"
            if "[" not in path and (i + j) % 2:  # every other one by --set
                cases.append((name, _config_case({}, via_set=f"{path}={_yaml_text(value)}")))
            else:
                cases.append((name, _config_case(_with(section, field, value))))
    # every strategy's own options
    for sname, options in STRATEGY_OPTIONS.items():
        for field, variant, value in _field_values(options):
            if field == "name" or readers_of(f"strategy.{field}")[0] != sname:
                continue  # each shared option once, under its first reader
            raw = _merge(tiny_raw(), _strategy_context(sname))
            raw["strategy"] = {"name": sname, field: value}
            cases.append((f"strategy {sname}.{field} {variant}", _config_case(raw)))
    # every section: an unknown field, not a mapping, given twice
    for section, _ in _section_models():
        if section in _ITEM_BASE:
            sec = section.split("[")[0]
            cases.append(
                (f"{section} unknown field", _config_case(_with(section, "no_such_field", 1)))
            )
            cases.append(
                (f"{sec} item not a mapping", _config_case(_merge(tiny_raw(), _nest(sec, [5]))))
            )
            continue
        cases.append(
            (
                f"{section} unknown field",
                _config_case(_merge(tiny_raw(), _nest(f"{section}.no_such_field", 1))),
            )
        )
        cases.append(
            (f"{section} not a mapping", _config_case(_merge(tiny_raw(), _nest(section, [1, 2]))))
        )
        if "." not in section:
            text = yaml.safe_dump(tiny_raw()) + f"{section}:\n  {{}}\n"
            if f"\n{section}:" not in "\n" + yaml.safe_dump(tiny_raw()):
                text = f"{section}: {{}}\n" + text
            cases.append((f"{section} given twice", _config_case(text)))
    for sname in STRATEGY_OPTIONS:
        raw = _merge(tiny_raw(), _strategy_context(sname))
        raw["strategy"] = {"name": sname, "no_such_option": 1}
        cases.append((f"strategy {sname} unknown option", _config_case(raw)))
    return cases  # fmt: skip


def _deep(n: int) -> str:
    return "seed: " + "[" * n + "]" * n + "\n"


YAML_CASES: list[tuple[str, Setup]] = [
    ("yaml billion laughs", _config_case(
        "a: &a [x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n"
                  for p, c in zip("abcdefgh", "bcdefghi", strict=True))
        + "description: *i\n")),
    ("yaml one alias", _config_case("train: &t {lr: 0.1}\ndescription: *t\n")),
    ("yaml merge key", _config_case("base: &b {lr: 0.1}\ntrain:\n  <<: *b\n")),
    ("yaml nested 10000 deep", _config_case(_deep(10_000))),
    ("yaml nested 100 deep", _config_case(_deep(100))),
    ("yaml mapping nested deep", _config_case("a:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(60)))),
    ("yaml integer of 5000 digits", _config_case("seed: " + "9" * 5000 + "\n")),
    ("yaml integer of 100000 digits", _config_case("seed: " + "1" * 100_000 + "\n")),
    ("yaml hex integer beyond int64", _config_case("seed: 0x" + "f" * 40 + "\n")),
    ("yaml duplicate key in a section", _config_case("train:\n  lr: 0.1\n  lr: 0.2\n")),
    ("yaml file over 1 MiB", _config_case("description: '" + "x" * (1 << 21) + "'\n")),
    ("yaml empty file", _config_case("")),
    ("yaml only a comment", _config_case("# nothing\n")),
    ("yaml python tag", _config_case("seed: !!python/object/apply:os.system ['true']\n")),
    ("yaml binary tag", _config_case("name: !!binary aGVsbG8=\n")),
    ("yaml set", _config_case("seed: !!set {1, 2}\n")),
    ("yaml timestamp", _config_case("seed: 2001-12-14\n")),
    ("yaml a string", _config_case("just words\n")),
    ("yaml a number", _config_case("42\n")),
    ("yaml unicode garbage", _config_case("s\u0000e\u202ed: \udcff\n".encode("utf-8", "surrogatepass").decode("utf-8", "replace"))),
    ("yaml tabs", _config_case("train:\n\tlr: 0.1\n")),
    ("yaml unhashable key", _config_case("? [a, b]\n: 1\n")),
    ("yaml null key", _config_case("~: 1\n")),
    ("yaml huge value quoted short", _config_case({"strategy": {"name": "x" * 100_000}})),
    ("--set alias", _config_case({}, via_set="train=*a")),
    ("--set nested deep", _config_case({}, via_set="seed=" + "[" * 5000 + "]" * 5000)),
    ("--set huge integer", _config_case({}, via_set="seed=" + "9" * 5000)),
    ("--set duplicate key", _config_case({}, via_set="train={lr: 1, lr: 2}")),
    ("--set empty path part", _config_case({}, via_set="train..lr=0.1")),
]  # fmt: skip


def _cmd(*argv: str, config: bool = True) -> Setup:
    def setup(tmp: Path) -> list[str]:
        path = tmp / "ok.yaml"
        path.write_text(yaml.safe_dump(tiny_raw()))
        return [argv[0], *([str(path)] if config else []), *argv[1:]]

    return setup


def _file(tmp: Path, name: str, content: bytes | None = None) -> str:
    p = tmp / name
    if content is None:
        p.mkdir()
    else:
        p.write_bytes(content)
    return str(p)


def _tree(files: dict[str, bytes | None], *argv: str) -> Setup:
    """Make ``files`` under the case's folder (None: a folder), then ``argv`` with ``{t}``
    standing for that folder."""

    def setup(tmp: Path) -> list[str]:
        for name, content in files.items():
            _file(tmp, name, content)
        return [a.replace("{t}", str(tmp)) for a in argv]

    return setup


METRICS = b"virtual_time,aggregation,test_accuracy\n0,0,0.5\n"


CLI_CASES: list[tuple[str, Setup]] = [
    ("run: config and preset", _cmd("run", "--preset", "demo")),
    ("run: --out is a file", lambda t: ["run", "--preset", "demo", "--out", _file(t, "f", b"x")]),
    ("run: --resume missing", lambda t: ["run", "--resume", str(t / "none")]),
    ("run: --resume a file", lambda t: ["run", "--resume", _file(t, "f", b"x")]),
    ("run: --resume empty folder", lambda t: ["run", "--resume", _file(t, "d")]),
    ("run: --resume with --set", lambda t: ["run", "--resume", _file(t, "d"), "--set", "seed=1"]),
    ("run: --data-dir a file", _cmd("run", "--data-dir", "/dev/null")),
    ("run: config is a folder", lambda t: ["run", _file(t, "d")]),
    ("run: config binary", lambda t: ["run", _file(t, "c.yaml", bytes(range(256)))]),
    ("run: config NUL bytes", lambda t: ["run", _file(t, "c.yaml", b"seed: 1\x00\x00\n")]),
    ("run: preset path escape", lambda t: ["run", "--preset", "../../etc/passwd"]),
    ("run: huge preset name", lambda t: ["run", "--preset", "p" * 10_000]),
    ("run: --set huge key", _cmd("run", "--set", "k" * 10_000 + "=1")),
    ("run: --set name escape", _cmd("run", "--set", "name=../../x")),
    ("run: --set output_dir a file", lambda t: ["run", "--preset", "demo", "--set", f"output_dir={_file(t, 'f', b'x')}"]),
    ("compare: --jobs 0", _cmd("compare", "--jobs", "0")),
    ("compare: --jobs 2^64", _cmd("compare", "--jobs", str(2**64))),
    ("compare: --batch-runs 0", _cmd("compare", "--batch-runs", "0")),
    ("compare: --batch-runs huge", _cmd("compare", "--batch-runs", "99999999")),
    ("compare: --backend nope", _cmd("compare", "--backend", "nope")),
    ("compare: --address without ray", _cmd("compare", "--address", "x:1")),
    ("compare: --seeds negative", _cmd("compare", "--seeds", "-1")),
    ("compare: --seeds huge", _cmd("compare", "--seeds", "9" * 40)),
    ("compare: --seeds empty entries", _cmd("compare", "--seeds", "1,,x")),
    ("compare: --strategies unknown", _cmd("compare", "--strategies", "fedavg,nope")),
    ("compare: --strategies bad entry", _cmd("compare", "--strategies", "fedfix:delta_t")),
    ("compare: --strategies bad option value", _cmd("compare", "--strategies", "fedfix:delta_t=-1")),
    ("compare: --strategies option of another", _cmd("compare", "--strategies", "fedavg:buffer_size=3")),
    ("compare: --lr-grid nan", _cmd("compare", "--lr-grid", "nan")),
    ("compare: --lr-grid inf", _cmd("compare", "--lr-grid", "0.1,inf")),
    ("compare: --lr-grid zero", _cmd("compare", "--lr-grid", "0")),
    ("compare: --lr-grid and --no-lr-grid", _cmd("compare", "--lr-grid", "0.1", "--no-lr-grid")),
    ("compare: --lr-grid preset without grid", _cmd("compare", "--lr-grid", "preset")),
    ("compare: --lr-tune-on unknown", _cmd("compare", "--lr-grid", "0.1", "--lr-tune-on", "fedbuff")),
    ("compare: --target-accuracy nan", _cmd("compare", "--target-accuracy", "nan")),
    ("compare: --target-accuracy 2", _cmd("compare", "--target-accuracy", "2")),
    ("compare: --target-accuracy negative", _cmd("compare", "--target-accuracy", "-1")),
    ("compare: --out a file", lambda t: ["compare", "--preset", "demo", "--out", _file(t, "f", b"x")]),
    ("compare: foreign table.md", _tree({"o": None, "o/table.md": b"mine"}, "compare", "--preset", "demo", "--out", "{t}/o")),
    ("compare: foreign grid.json", _tree({"o": None, "o/grid.json": b"[1]"}, "compare", "--preset", "demo", "--out", "{t}/o")),
    ("compare: table.csv is a folder", _tree({"o": None, "o/table.csv": None}, "compare", "--preset", "demo", "--out", "{t}/o")),
    ("sweep: no --over", _cmd("sweep", "--strategies", "fedavg")),
    ("sweep: --over bad form", _cmd("sweep", "--over", "=1,2")),
    ("sweep: --over unknown field", _cmd("sweep", "--over", "nope.x=1,2")),
    ("sweep: --over bad values", _cmd("sweep", "--over", "train.lr=-1,0")),
    ("sweep: --over nan", _cmd("sweep", "--over", "train.lr=.nan")),
    ("sweep: --over alias", _cmd("sweep", "--over", "train.lr=*a")),
    ("sweep: --over name escape", _cmd("sweep", "--over", "name=../../x,y")),
    ("sweep: --jobs negative", _cmd("sweep", "--over", "train.lr=0.1", "--jobs", "-3")),
    ("sweep: foreign pivot.md", _tree({"o": None, "o/pivot.md": b"mine"}, "sweep", "--preset", "demo", "--over", "train.lr=0.1", "--out", "{t}/o")),
    ("report: nothing there", lambda t: ["report", str(t / "none")]),
    ("report: a file", lambda t: ["report", _file(t, "f", b"x")]),
    ("report: empty folder", lambda t: ["report", _file(t, "d")]),
    ("report: foreign report.html", _tree({"d": None, "d/metrics.csv": METRICS, "d/report.html": b"<html>mine"}, "report", "{t}/d")),
    ("report: report.html a folder", _tree({"d": None, "d/metrics.csv": METRICS, "d/report.html": None}, "report", "{t}/d")),
    ("report: table.csv binary", _tree({"d": None, "d/table.csv": bytes(range(256))}, "report", "{t}/d")),
    ("report: tour.json garbage", _tree({"d": None, "d/tour.json": b"[1]"}, "report", "{t}/d")),
    ("tour: --out a file", lambda t: ["tour", "--out", _file(t, "f", b"x")]),
    ("tour: foreign tour.json", _tree({"o": None, "o/tour.json": b"mine"}, "tour", "--out", "{t}/o")),
    ("tour: foreign report.html", _tree({"o": None, "o/report.html": b"mine"}, "tour", "--out", "{t}/o")),
    ("tour: foreign table.md of a step", _tree({"o": None, "o/cis": None, "o/cis/table.md": b"mine"}, "tour", "--out", "{t}/o")),
    ("tour: --jobs 0", lambda t: ["tour", "--jobs", "0", "--out", str(t / "o")]),
    ("plot: nothing there", lambda t: ["plot", str(t / "none")]),
    ("plot: a file", lambda t: ["plot", _file(t, "f", b"x")]),
    ("plot: empty folder", lambda t: ["plot", _file(t, "d")]),
    ("plot: metrics.csv a folder", _tree({"d": None, "d/metrics.csv": None}, "plot", "{t}/d")),
    ("plot: metrics.csv empty", _tree({"d": None, "d/metrics.csv": b""}, "plot", "{t}/d")),
    ("plot: metrics.csv binary", _tree({"d": None, "d/metrics.csv": bytes(range(256))}, "plot", "{t}/d")),
    ("plot: metrics.csv NUL", _tree({"d": None, "d/metrics.csv": b"virtual_time,aggregation,test_accuracy\n0,\x000,1\n"}, "plot", "{t}/d")),
    ("plot: metrics.csv words", _tree({"d": None, "d/metrics.csv": b"virtual_time,aggregation,test_accuracy\nx,y,z\n"}, "plot", "{t}/d")),
    ("plot: metrics.csv no time column", _tree({"d": None, "d/metrics.csv": b"test_accuracy\n0.5\n"}, "plot", "{t}/d")),
    ("plot: summary.json garbage", _tree({"d": None, "d/metrics.csv": METRICS, "d/summary.json": b"\xff\xfe"}, "plot", "{t}/d")),
    ("plot: summary.json missing fields", _tree({"d": None, "d/metrics.csv": METRICS, "d/summary.json": b"{}"}, "plot", "{t}/d")),
    ("plot: summary.json wrong types", _tree({"d": None, "d/metrics.csv": METRICS, "d/summary.json": b'{"name": 1, "strategy": [], "seed": "x", "status": 3}'}, "plot", "{t}/d")),
    ("plot: --until nan", _tree({"d": None, "d/metrics.csv": METRICS}, "plot", "{t}/d", "--until", "nan")),
    ("plot: --until -1", _tree({"d": None, "d/metrics.csv": METRICS}, "plot", "{t}/d", "--until", "-1")),
    ("plot: --y-min inf", _tree({"d": None, "d/metrics.csv": METRICS}, "plot", "{t}/d", "--y-min", "inf")),
    ("plot: --metric unknown", _tree({"d": None, "d/metrics.csv": METRICS}, "plot", "{t}/d", "--metric", "nope")),
    ("plot: --out not png", _tree({"d": None, "d/metrics.csv": METRICS}, "plot", "{t}/d", "--out", "{t}/x.pdf")),
    ("plot: --out foreign png", _tree({"d": None, "d/metrics.csv": METRICS, "x.png": b"mine"}, "plot", "{t}/d", "--out", "{t}/x.png")),
    ("plot: foreign accuracy.png", _tree({"d": None, "d/metrics.csv": METRICS, "d/accuracy.png": b"mine"}, "plot", "{t}/d")),
    ("plot: table.csv binary", _tree({"d": None, "d/table.csv": b"\xff\x00" * 50}, "plot", "{t}/d")),
    ("plot: table.csv not a sweep", _tree({"d": None, "d/table.csv": b"a\n1\n"}, "plot", "{t}/d")),
    ("plot: sweep and run mixed", _tree({"d": None, "d/table.csv": b"strategy,x,m_mean,m_std\nf,1,2,0\n", "e": None}, "plot", "{t}/d", "{t}/e")),
    ("presets: unknown", lambda t: ["presets", "nope"]),
    ("presets: path escape", lambda t: ["presets", "../config"]),
    ("unknown command", lambda t: ["train"]),
    ("run: unknown option", lambda t: ["run", "--fast"]),
]  # fmt: skip


CASES = _generated() + YAML_CASES + CLI_CASES


# ---------------------------------------------------------------- the test


@pytest.fixture(autouse=True)
def _no_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each case runs in its own folder; a command that accepted its input fails the case
    instead of training."""
    import fedclock.experiment
    import fedclock.runs.cache

    def accepted(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the bad input was accepted: the run would start")

    monkeypatch.setattr(fedclock.experiment, "run_experiment", accepted)
    monkeypatch.setattr(fedclock.runs.cache, "run_experiment", accepted)
    monkeypatch.chdir(tmp_path)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_the_generated_corpus_is_large_and_covers_every_option() -> None:
    names = [n for n, _ in CASES]
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    assert len(CASES) >= 150
    covered = " ".join(names)
    for sname, options in STRATEGY_OPTIONS.items():
        for field in options.model_fields:
            if field != "name" and readers_of(f"strategy.{field}")[0] == sname:
                assert f"strategy {sname}.{field} " in covered, (sname, field)


@pytest.mark.parametrize(("name", "setup"), CASES, ids=[n for n, _ in CASES])
def test_generated_bad_input_is_one_sentence(tmp_path: Path, name: str, setup: Setup) -> None:
    argv = setup(tmp_path)
    before = _snapshot(tmp_path)
    res = runner.invoke(app, argv)
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        f"{name}: uncaught {res.exception!r}"
    )
    assert res.exit_code not in (0, 1), f"{name}: exit {res.exit_code}\n{res.output[:2000]}"
    assert "Traceback" not in res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    if res.exit_code == 2 and lines and lines[0].startswith("error: "):
        assert len(lines) == 1, f"{name}: {res.stderr[:2000]!r}"
        assert lines[0].rstrip().endswith((".", ".)")), lines[0]
        assert len(lines[0]) < 600, f"{name}: a long sentence ({len(lines[0])} chars)"
    else:  # typer's own usage errors (unknown option or command): a short box, exit 2
        assert res.exit_code == 2 and len(lines) <= 8, f"{name}: {res.output[:2000]}"
    assert _snapshot(tmp_path) == before, f"{name} changed a file"
