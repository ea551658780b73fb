"""scripts/reproductions.py: every generated table of docs/reproductions/*.md matches its
stored results, a changed stored number is caught, and the readings behind the tables
(time to target, accuracy at 3× it, unrouted serving-weighted accuracy) by hand."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import REPO, load_script

rep = load_script("reproductions")


def test_every_page_matches_its_stored_results() -> None:
    """What CI runs: `python scripts/reproductions.py check` finds no difference."""
    assert rep.check() == []
    assert rep.main(["check"]) == 0
    stored = sorted(p.stem for p in (rep.PAGES / "results").glob("*.csv"))
    assert stored, "no table is generated from stored results"
    for name in stored:  # every stored table has its blocks on its page
        page = (rep.PAGES / rep.TABLES[name].page).read_text()
        for block in rep.TABLES[name].blocks:
            assert f"<!-- generated: {name}/{block} " in page, (name, block)


def _copy_pages(tmp_path: Path) -> Path:
    pages = tmp_path / "reproductions"
    shutil.copytree(rep.PAGES, pages)
    return pages


def test_a_changed_stored_number_fails_the_check(tmp_path: Path) -> None:
    pages = _copy_pages(tmp_path)
    assert rep.check(pages) == []
    name = sorted(p.stem for p in (pages / "results").glob("*.csv"))[0]
    res = rep.load(name, pages)
    page = rep.TABLES[name].page
    # change one number that a block prints until the page text changes
    for key, value in sorted(res.values.items()):
        if math.isnan(value):
            continue
        changed = rep.Results(name, {**res.values, key: value + 0.37}, res.meta)
        rep.save(changed, pages)
        problems = rep.check(pages)
        if problems:
            break
    else:
        pytest.fail("no stored number changes the page")
    assert problems[0] == f"{page}: generated blocks differ from the stored results"
    assert any("results give" in p for p in problems)
    # `write` brings the page back in line, and then `check` passes again
    assert rep.check(pages, write=True) == []
    assert rep.check(pages) == []


def test_a_hand_edited_block_and_a_broken_marker_fail_the_check(tmp_path: Path) -> None:
    pages = _copy_pages(tmp_path)
    page = next(p for p in sorted(pages.glob("*.md")) if "<!-- generated: " in p.read_text())
    text = page.read_text()
    lines = text.split("\n")
    i = next(n for n, line in enumerate(lines) if line.startswith("<!-- generated: "))
    page.write_text("\n".join([*lines[: i + 1], "typed by hand", *lines[i + 1 :]]))
    assert rep.check(pages)[0].endswith("generated blocks differ from the stored results")
    page.write_text(text.replace("\n" + rep.END + "\n", "\n\n", 1))  # the first end line
    assert any("has no" in p for p in rep.check(pages))
    page.write_text(text + "\n<!-- generated: no-such-table/table (x) -->\n" + rep.END + "\n")
    assert any("names no stored table" in p for p in rep.check(pages))


def _run(folder: Path, rows: list[tuple[float, float, int]], end: float, **summary) -> Path:
    folder.mkdir(parents=True)
    lines = ["virtual_time,aggregation,test_accuracy"]
    lines += [f"{t},{a},{acc}" for t, acc, a in rows]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    (folder / "summary.json").write_text(
        json.dumps({"status": "completed", "virtual_time": end, **summary})
    )
    return folder


def test_fedraa_reading_by_the_papers_protocol(tmp_path: Path) -> None:
    """Time to 93 % = the first evaluation at or above it; the accuracy at 3× that time is
    the last evaluation at or before it (the model held then); at 1200 s likewise; a run
    that ended before 3× its time gives no reading (NaN), not its last accuracy."""
    rows = [(0.0, 0.1, 0), (20.0, 0.90, 1), (40.0, 0.931, 2), (100.0, 0.95, 3),
            (119.0, 0.96, 4), (121.0, 0.97, 5), (1200.0, 0.98, 6)]  # fmt: skip
    _run(tmp_path / "t5p-fedavg" / "runs" / "fedavg" / "seed-1", rows, end=1200.0)
    _run(tmp_path / "t5p-x@one" / "runs" / "fed-raa" / "seed-1", rows[:5], end=119.0)
    got = rep.TABLES["fedraa-t5-paper"].collect(tmp_path)
    assert got[("fedavg", 1, "t93")] == 40.0
    assert got[("fedavg", 1, "acc@3t")] == 0.96  # at 120 s: the evaluation of 119 s
    assert got[("fedavg", 1, "steps@3t")] == 4
    assert got[("fedavg", 1, "acc@common")] == 0.98
    assert got[("fedavg", 1, "acc@100")] == 0.95
    assert math.isnan(got[("fed-raa@one", 1, "acc@3t")])  # ended at 119 s < 120 s
    assert got[("fed-raa@one", 1, "acc@100")] == 0.95


def test_client_drift_reading_by_hand(tmp_path: Path) -> None:
    """Accuracy at t = the last evaluation at or before t; time to 90 % / 95 % = the first
    evaluation at or above; loss and server steps from the last row; a seed minus FedAvg's
    same seed in the paired block."""
    rows = [(0.0, 0.1, 0, 2.3), (40.0, 0.91, 20, 0.4), (120.0, 0.94, 60, 0.2),
            (260.0, 0.951, 130, 0.15), (400.0, 0.96, 200, 0.13)]  # fmt: skip
    for name, shift in (("fedavg", 0.0), ("scaffold", 0.01)):
        run = tmp_path / "noniid" / "runs" / name / "seed-1"
        run.mkdir(parents=True)
        lines = ["virtual_time,aggregation,test_accuracy,test_loss"]
        lines += [f"{t},{a},{acc + shift},{loss}" for t, acc, a, loss in rows]
        (run / "metrics.csv").write_text("\n".join(lines) + "\n")
        (run / "summary.json").write_text(
            json.dumps({"status": "completed", "virtual_time": 400.0})
        )
    got = rep.TABLES["client-drift"].collect(tmp_path)
    assert got[("fedavg", 1, "acc@50")] == 0.91 and got[("fedavg", 1, "acc@200")] == 0.94
    assert got[("fedavg", 1, "time@0.9")] == 40.0 and got[("fedavg", 1, "time@0.95")] == 260.0
    assert got[("scaffold", 1, "time@0.95")] == 120.0  # 0.94 + 0.01
    assert got[("fedavg", 1, "loss@end")] == 0.13 and got[("fedavg", 1, "steps")] == 200
    paired = rep.drift_paired(rep.Results("client-drift", got))
    assert "| `scaffold` | +1.00 | +1.00 | +1.00 | +1.00 | holds |" in paired


def test_cis_unrouted_serving_weighted_accuracy_by_hand(tmp_path: Path) -> None:
    """Σ_e s_e·acc_e with each exit's accuracy on the whole test set; an Equal run is read
    at both serving rates (its routed 5-15-80 value from cis_accuracy_5-15-80)."""
    exits = {"exit1_accuracy": 0.5, "exit2_accuracy": 0.7, "exit3_accuracy": 0.9}
    base = tmp_path / "cis-t1-root" / "runs"
    _run(base / "cis-equal" / "cis.serving=80-15-5" / "seed-9", [], end=1.0,
         cis_accuracy=0.61, **{"cis_accuracy_5-15-80": 0.83}, **exits)  # fmt: skip
    _run(base / "cis-serving" / "cis.serving=5-15-80" / "seed-9", [], end=1.0,
         cis_accuracy=0.85, **exits)  # fmt: skip
    got = rep.TABLES["cis-t1"].collect(tmp_path)
    assert got[("root/cis-equal/80-15-5", 9, "cis")] == 0.61
    assert got[("root/cis-equal/5-15-80", 9, "cis")] == 0.83
    assert got[("root/cis-serving/5-15-80", 9, "cis")] == 0.85
    assert ("root/cis-serving/80-15-5", 9, "cis") not in got
    assert got[("root/cis-equal/80-15-5", 9, "unrouted")] == pytest.approx(
        0.8 * 0.5 + 0.15 * 0.7 + 0.05 * 0.9, abs=1e-12
    )
    assert got[("root/cis-equal/5-15-80", 9, "unrouted")] == pytest.approx(
        0.05 * 0.5 + 0.15 * 0.7 + 0.8 * 0.9, abs=1e-12
    )


@given(st.lists(st.floats(-50, 50, allow_nan=False), min_size=1))
def test_sign_verdict(diffs: list[float]) -> None:
    v = rep.sign_verdict(diffs, 1)
    if all(abs(d) < 0.005 for d in diffs):
        assert v == "level"
    elif all(d > 0 for d in diffs):
        assert v == "holds"
    elif all(d < 0 for d in diffs):
        assert v == "fails"
    else:
        assert v == "mixed"
    assert rep.sign_verdict([math.nan], 1) == "not measured"


def test_a_verdict_that_rests_on_rerun_noise_says_so() -> None:
    """Fed-RAA − FedAvg at 3× (paper mode, seeds 1–3): −0.08, −0.07, −0.25 points against the
    table's ±0.2 rerun tolerance — the paper's sign in every seed, two of them within noise."""
    assert rep.sign_verdict([-0.08, -0.07, -0.25], -1) == "holds"
    assert rep.sign_verdict([-0.08, -0.07, -0.25], -1, 0.2) == (
        "holds in sign only (2 of 3 within ±0.2)"
    )
    assert rep.sign_verdict([-0.06, -0.01, -0.12], -1, 0.2) == "level within ±0.2"
    assert rep.sign_verdict([0.45, 0.51, 0.85], -1, 0.2) == "fails"
    assert rep.sign_verdict([0.3, -0.5], 1, 0.2) == "mixed"
    # CIS Table 1, root_in_place, Serving − Equal at 80-15-5: the one seed against is within
    # the ±1.1 rounding spread, and so are the ones for in the unrouted paper-mode reading
    assert rep.sign_verdict([-0.11, 3.81, 1.92], 1, 1.1) == "mixed (1 of 3 against, within ±1.1)"
    assert rep.sign_verdict([-2.43, 0.66, 0.81], 1, 1.1) == "mixed (2 of 3 for, within ±1.1)"
    assert rep.sign_verdict([-0.11, 3.81, 1.92], 1) == "mixed"
    assert 100 * rep.FEDRAA_TOLERANCE["acc"] == rep.FEDRAA_NOISE


def test_rerun_reports_drift_per_cell_against_the_tolerance() -> None:
    table = rep.TABLES["fedraa-t5-paper"]
    stored = rep.Results("x", {("fedavg", 1, "acc@3t"): 0.95, ("fedavg", 1, "t93"): 40.0})
    rows, over = rep.drift(
        table, stored, {("fedavg", 1, "acc@3t"): 0.951, ("fedavg", 1, "t93"): 40.0}
    )
    assert not over and [r[2] for r in rows] == ["acc@3t"]  # 0.001 ≤ 0.002: drift, within
    rows, over = rep.drift(table, stored, {("fedavg", 1, "acc@3t"): 0.96})
    assert over and rows[0][-1] == "over"
    # a target not reached in either (NaN both times) is no drift; reached in one only is
    nan = rep.Results("x", {("fedavg", 1, "t93"): math.nan})
    assert rep.drift(table, nan, {("fedavg", 1, "t93"): math.nan}) == ([], False)
    rows, over = rep.drift(table, nan, {("fedavg", 1, "t93"): 40.0})
    assert over and rows[0][-1] == "over"


def test_steps_to_target_move_with_the_time_to_target() -> None:
    """Server steps read at the time to 93 % follow that time: stored 327 steps at 53 s
    (6.17 steps/s) may move by 2 + 327 / 53 × 2 s = 14.34 steps; steps at a fixed time keep
    their 2. A rerun at 54 s and 335 steps is within; 342 steps is over."""
    table = rep.TABLES["fedraa-t5-reference"]
    stored = rep.Results(
        "x", {("m", 1, "t93"): 53.0, ("m", 1, "steps@t93"): 327.0, ("m", 1, "steps@100"): 600.0}
    )
    assert table.tolerance_at(stored, ("m", 1, "steps@t93")) == pytest.approx(2 + 2 * 327 / 53)
    assert table.tolerance_at(stored, ("m", 1, "steps@100")) == 2.0
    assert table.tolerance_at(stored, ("m", 1, "t93")) == 2.0
    new = {("m", 1, "t93"): 54.0, ("m", 1, "steps@t93"): 335.0, ("m", 1, "steps@100"): 600.0}
    rows, over = rep.drift(table, stored, new)
    assert not over and [r[2] for r in rows] == ["steps@t93", "t93"]
    rows, over = rep.drift(table, stored, {**new, ("m", 1, "steps@t93"): 342.0})
    assert over and rows[0][2] == "steps@t93" and rows[0][-1] == "over"
    # not reached (NaN): the plain tolerance
    nan = rep.Results("x", {("m", 1, "t93"): math.nan, ("m", 1, "steps@t93"): math.nan})
    assert table.tolerance_at(nan, ("m", 1, "steps@t93")) == 2.0


def test_a_rerun_on_other_kernels_says_so() -> None:
    avx2 = "x86_64, AMD EPYC, 2 cores, torch kernels AVX2, Linux 6.18"
    avx512 = "x86_64, AMD EPYC, 2 cores, torch kernels AVX512, Linux 6.18"
    assert rep.kernels_note(avx2, avx2) is None  # same kernels: bit for bit, nothing to say
    note = rep.kernels_note(avx512, avx2)
    assert note is not None and "AVX512 kernels" in note and avx2 in note
    old = rep.kernels_note("x86_64, 2 cores, Linux 6.18.44", avx2)  # made before it was named
    assert old is not None and "does not name" in old
    assert rep.kernels_note("x86_64, torch kernels AVX2", "x86_64") is not None


def test_forced_kernels_are_another_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in rep.KERNEL_ENV:
        monkeypatch.delenv(k, raising=False)
    plain = rep.machine()
    assert "forced" not in plain
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "SSE4_2")
    forced = rep.machine()
    assert forced != plain and "(forced: MKL_ENABLE_INSTRUCTIONS=SSE4_2)" in forced
    if "torch kernels" in plain:  # the same ISA, other MKL kernels: they may round otherwise
        note = rep.kernels_note(plain, forced)
        assert note is not None and "forced" in note
        assert rep.kernels_note(forced, forced) is None


def test_stored_results_name_their_commit_and_commands() -> None:
    for path in sorted((REPO / "docs" / "reproductions" / "results").glob("*.json")):
        meta = json.loads(path.read_text())
        assert {"commit", "date", "machine", "commands", "fedclock"} <= set(meta), path
        assert meta["commands"] == rep.TABLES[path.stem].command_text(), path


def test_results_older_than_a_golden_change_must_be_rerun_or_marked_stale(tmp_path: Path) -> None:
    """A table whose results were made before a commit that changed tests/golden fails the
    check until it is marked stale (the page then says so, with that commit)."""
    if rep.goldens_moved_since("f4c7ae6~1") is None:
        pytest.skip("no git history here (a shallow clone or an export)")
    pages = _copy_pages(tmp_path)
    name = next(  # (a table not already marked stale)
        n for n in sorted(p.stem for p in (pages / "results").glob("*.csv"))
        if not rep.load(n, pages).meta.get("stale_since")
    )  # fmt: skip
    res = rep.load(name, pages)
    res.meta["commit"] = "f4c7ae6~1"  # the parent of a commit that re-recorded a golden
    rep.save(res, pages)
    problems = rep.check(pages)
    assert any("changed tests/golden" in p and "mark-stale" in p for p in problems)
    res.meta["stale_since"] = rep.goldens_moved_since("f4c7ae6~1")
    rep.save(res, pages)
    assert rep.check(pages, write=True) == []
    page = (pages / rep.TABLES[name].page).read_text()
    assert (
        f"**Stale:** `tests/golden` changed after these results were made (commit `{res.meta['stale_since']}`)"
        in page
    )
    # a measured cause other than a golden change (mark-stale --why): the page says that one
    res.meta["stale_why"] = "commit `8a1c9d1` changed the float order of these runs, measured."
    rep.save(res, pages)
    assert rep.check(pages, write=True) == []
    page = (pages / rep.TABLES[name].page).read_text()
    assert "**Stale:** commit `8a1c9d1` changed the float order of these runs, measured; " in page


def test_fedraa_table3_reading_and_verdicts_by_hand(tmp_path: Path) -> None:
    """Table 3: time to 93 % per run, the cell from the strategy and the folder's @suffix,
    the paired ratio slower ÷ Gre-RAA; a variant that never reached 93 % counts as slower
    ("> end ÷ Gre-RAA's time"), and a claim holds only when every seed agrees."""
    reached = [(0.0, 0.1, 0), (50.0, 0.93, 10), (100.0, 0.94, 20), (300.0, 0.96, 60)]
    late = [(0.0, 0.1, 0), (100.0, 0.92, 5), (150.0, 0.93, 8), (300.0, 0.95, 12)]
    never = [(0.0, 0.1, 0), (100.0, 0.90, 2), (300.0, 0.92, 6)]
    for seed in (1, 2):
        _run(tmp_path / "t3p-gre" / "runs" / "fed-raa" / f"seed-{seed}", reached, end=300.0)
        _run(tmp_path / "t3p-gre" / "runs" / "fed-raa-random" / f"seed-{seed}", late, end=300.0)
        _run(tmp_path / "t3p-sync" / "runs" / "fed-raa-sync" / f"seed-{seed}", never, end=300.0)
    # MP-RAA: faster than Gre-RAA in seed 1, slower in seed 2 (mixed)
    _run(tmp_path / "t3p-mp" / "runs" / "fed-raa-mp" / "seed-1", [*reached[:1], (40.0, 0.93, 9)],
         end=300.0)  # fmt: skip
    _run(tmp_path / "t3p-mp" / "runs" / "fed-raa-mp" / "seed-2", late, end=300.0)
    _run(tmp_path / "t3p-c@completed" / "runs" / "fed-raa" / "seed-1", late, end=300.0)
    got = rep.TABLES["fedraa-t3-paper"].collect(tmp_path)
    assert got[("fed-raa", 1, "t93")] == 50.0 and got[("fed-raa-random", 2, "t93")] == 150.0
    assert got[("fed-raa@completed", 1, "t93")] == 150.0  # the folder's suffix
    assert got[("fed-raa", 1, "acc@100")] == 0.94 and got[("fed-raa", 1, "steps@300")] == 60
    assert math.isnan(got[("fed-raa-sync", 1, "t93")])
    res = rep.Results("fedraa-t3-paper", got)
    verdicts = rep.fedraa_t3_verdicts(res)
    assert "| Gre-RAA faster than Random | 1.13 | 3.00 / 3.00 | **holds** |" in verdicts
    assert "| Gre-RAA faster than MP-RAA | 1.16 | 0.80 / 3.00 | **mixed** |" in verdicts
    assert "| Gre-RAA faster than Sync | 2.34 | > 6.00 / > 6.00 | **holds** |" in verdicts
    table = rep.fedraa_t3_table(res)
    assert "| Sync | — / — | not reached in 300 s | — |" in table
    assert "| Random | 150 / 150 | 150.0 ± 0.0 | 3.00 (3.00 / 3.00) |" in table


def test_fleet_reading_by_hand(tmp_path: Path) -> None:
    """The fleet table: accuracy at each read-out, time to 90 %, the wasted share of the
    compute spent and the offline losses from summary.json, each method − FedAvg paired."""
    rows = [(0.0, 0.1, 0), (1800.0, 0.85, 5), (3600.0, 0.91, 10), (10800.0, 0.93, 30)]
    for name, shift in (("fedavg", 0.0), ("fedbuff", 0.02)):
        run = _run(
            tmp_path / "fleet" / "runs" / name / "seed-1",
            [(t, acc + shift, a) for t, acc, a in rows],
            end=10800.0,
            compute_s_spent=7200.0, compute_s_wasted=720.0, aggregations=30,
            updates_used=300, updates_discarded=0, updates_lost=12,
        )  # fmt: skip
        assert run.is_dir()
    got = rep.TABLES["fleet"].collect(tmp_path)
    assert got[("fedavg", 1, "acc@7200")] == 0.91 and got[("fedavg", 1, "t90")] == 3600.0
    assert got[("fedbuff", 1, "t90")] == 3600.0  # 0.85 + 0.02 < 0.9 at 1800 s
    assert got[("fedavg", 1, "wasted")] == 0.1 and got[("fedavg", 1, "spent_h")] == 2.0
    assert got[("fedavg", 1, "updates_lost")] == 12
    paired = rep.fleet_paired(rep.Results("fleet", got))
    assert (
        "| FedBuff (m = 10), every device | +2.00 | +2.00 | +2.00 | +2.00 | holds | holds |"
        in paired
    )


def test_collect_merge_keeps_the_seeds_not_rerun(tmp_path: Path) -> None:
    """collect --merge: the cells and seeds found under ROOT replace the stored ones, the
    others keep their stored numbers."""
    pages = _copy_pages(tmp_path)
    rows = [(0.0, 0.1, 0, 2.3), (400.0, 0.96, 200, 0.13)]
    run = tmp_path / "root" / "noniid" / "runs" / "fedavg" / "seed-1"
    run.mkdir(parents=True)
    lines = ["virtual_time,aggregation,test_accuracy,test_loss"]
    lines += [f"{t},{a},{acc},{loss}" for t, acc, a, loss in rows]
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")
    (run / "summary.json").write_text(json.dumps({"status": "completed", "virtual_time": 400.0}))
    before = rep.load("client-drift", pages)
    res = rep.collect("client-drift", tmp_path / "root", "abc1234", None, pages, merge=True)
    assert res.values[("fedavg", 1, "acc@400")] == 0.96
    for key, value in before.values.items():
        if key[:2] != ("fedavg", 1):
            assert res.values[key] == value or (math.isnan(value) and math.isnan(res.values[key]))
    only = rep.collect("client-drift", tmp_path / "root", "abc1234", None, pages)
    assert {k[:2] for k in only.values} == {("fedavg", 1)}


def test_authors_loop_lines_become_cells_by_hand(tmp_path: Path) -> None:
    """The SALF loop's JSON lines: a run's cell is its method at its ρ (vanilla alone); an
    init-swap run at seed s from seed 1234's initial model is ``init1234/…`` at s, and seed
    1234's draws from seed s's initial model ``draws1234/…`` at s; re-drawn runs ``redraw/…``."""
    d = tmp_path / "authors-rng"
    d.mkdir()

    def line(method: str, ratio: float, seed: int, acc: float, **extra: object) -> str:
        row = {"model": "mlp", "method": method, "ratio": ratio, "seed": seed,
               "val_best_test_accuracy": acc, "final_test_accuracy": acc - 0.01, **extra}  # fmt: skip
        return json.dumps(row)

    (d / "authors-rng-mlp.jsonl").write_text(
        "\n".join([line("vanilla", 0.0, 1234, 0.9), line("drop", 0.7, 1, 0.8)]) + "\n"
    )
    (d / "init-swap.jsonl").write_text(
        "\n".join(
            [line("salf", 0.9, 3, 0.85, init_seed=1234), line("salf", 0.9, 1234, 0.84, init_seed=3)]
        )
    )
    (d / "redraw-mlp.jsonl").write_text(line("drop", 0.9, 2, 0.5, redraw=True))
    got = rep.salf_loop_collect("mlp")(tmp_path)
    assert got == {
        ("vanilla", 1234, "acc"): 0.9,
        ("vanilla", 1234, "final"): 0.9 - 0.01,
        ("drop-stragglers@0.7", 1, "acc"): 0.8,
        ("drop-stragglers@0.7", 1, "final"): 0.8 - 0.01,
        ("init1234/salf@0.9", 3, "acc"): 0.85,
        ("init1234/salf@0.9", 3, "final"): 0.85 - 0.01,
        ("draws1234/salf@0.9", 3, "acc"): 0.84,
        ("draws1234/salf@0.9", 3, "final"): 0.84 - 0.01,
        ("redraw/drop-stragglers@0.9", 2, "acc"): 0.5,
        ("redraw/drop-stragglers@0.9", 2, "final"): 0.5 - 0.01,
    }
    # the CNN table reads only its own model's files
    assert rep.salf_loop_collect("cnn")(tmp_path) == {}


def test_fedraa_loop_verdict_by_hand(tmp_path: Path) -> None:
    """The Fed-RAA loop against fedclock's reference mode: mean times to 93 % and the FedAvg ÷
    Gre-RAA ratios (hand-computed: 180/90 → 2.0, 176/88 → 2.0)."""
    (tmp_path / "fedraa-loop").mkdir()
    rows = [
        {"method": "gre-raa", "seed": 1, "time_to_target": 90.0, "accuracy_at_end": 0.95},
        {"method": "fedavg", "seed": 1, "time_to_target": 180.0, "accuracy_at_end": 0.96},
    ]
    (tmp_path / "fedraa-loop" / "fedraa-loop.jsonl").write_text(
        "\n".join(map(json.dumps, rows)) + "\n"
    )
    res = rep.Results("fedraa-authors-loop", rep.fedraa_loop_collect(tmp_path))
    ours = rep.Results(
        "fedraa-t5-reference", {("fed-raa", 1, "t93"): 88.0, ("fedavg", 1, "t93"): 176.0}
    )
    saved = rep.load
    try:
        rep.load = lambda name, pages=rep.PAGES: ours  # type: ignore[assignment]
        text = rep.fedraa_loop_verdict(res)
        table = rep.fedraa_loop_table(res)
    finally:
        rep.load = saved
    assert "Gre-RAA 90.0 s in the loop, 88.0 s in fedclock; FedAvg 180.0 s" in text
    assert "2.00× in the loop, 2.00× in fedclock" in text
    assert "**The two implementations agree**" in text
    assert "| authors' loop (script) | 90.0 | 180.0 | 2.00 |" in table


def test_the_100_round_summary_reads_the_end_and_the_last_stretch() -> None:
    """Two seeds, four rounds, paper mode only: seed 1's Serving leads from round 3 on, seed
    2's Equal leads at the end; the verdict at round 4 is read by sign, and the seeds within
    the rounding spread (cis-rounding's stored ±1.1) are counted."""
    cis = {1: ([0.80, 0.70, 0.90, 0.95], [0.70, 0.75, 0.85, 0.94])}
    cis[2] = ([0.80, 0.82, 0.85, 0.90], [0.81, 0.80, 0.84, 0.92])
    values = {}
    for seed, (sv, eq) in cis.items():
        for r in range(1, 5):
            for cell, acc in (("paper/cis-serving", sv), ("paper/cis-equal", eq)):
                values[(cell, seed, f"cis@{r}")] = acc[r - 1]
                for i in (1, 2, 3):
                    values[(cell, seed, f"exit{i}@{r}")] = acc[r - 1] - 0.01 * i
    text = rep.cis_rounds_summary(rep.Results("cis-100r", values))
    assert text.count("\n") == 0 and text.startswith("- **paper mode")
    assert "seed 1: +1.0 at round 4 (exits 1 / 3 at round 4: Serving's 94.0 / 92.0 %" in text
    assert "Serving ahead at every round from round 3 to 4" in text
    assert "seed 2: −2.0 at round 4" in text and "Equal ahead or level at round 4" in text
    noise = rep.cis_noise()
    within = f"{sum(abs(d) <= noise for d in (1.0, 2.0))} of 2"
    assert f"Serving > Equal at round 4, by sign: **mixed** ({within} seeds within" in text


def _rounds_values(gaps: dict[int, list[float]], equal: float = 0.9) -> dict:
    """cis-100r numbers, paper mode: Equal at ``equal`` every round, Serving ``gap`` points
    above it at each round (one list per seed)."""
    values = {}
    for seed, per_round in gaps.items():
        for r, gap in enumerate(per_round, 1):
            for cell, acc in (("paper/cis-serving", equal + gap / 100), ("paper/cis-equal", equal)):
                values[(cell, seed, f"cis@{r}")] = acc
                for i in (1, 2, 3):
                    values[(cell, seed, f"exit{i}@{r}")] = acc
    return values


def test_keep_earlier_moves_the_stored_results_and_the_block_reads_the_drift(
    tmp_path: Path,
) -> None:
    """collect --keep-earlier: the stored files go to results/earlier/; the earlier block and
    the summary read how far each seed's Serving − Equal moved, by hand: 15 rounds, seed 1's
    gap +1.0 → +1.5 at round 5 and +0.2 → +0.25 at the end (its last-10 largest change 0.3
    at round 14), seed 2's gap −0.5 → −0.5 throughout."""
    pages = _copy_pages(tmp_path)
    shutil.rmtree(pages / "results" / "earlier")  # (the page's own)
    old = {1: [1.0] * 13 + [0.2, 0.2], 2: [-0.5] * 15}
    new = {1: [1.0] * 4 + [1.5] + [1.0] * 8 + [0.5, 0.25], 2: [-0.5] * 15}
    stored = rep.Results("cis-100r", _rounds_values(old), {"commit": "aaaaaaa", "machine": "M1"})
    rep.save(stored, pages)
    runs = tmp_path / "root"
    for seed, per_round in new.items():
        for strategy, gap in (("cis-serving", per_round), ("cis-equal", [0.0] * 15)):
            run = (
                runs / "cis-100r-paper" / "runs" / strategy / "cis.serving=80-15-5" / f"seed-{seed}"
            )
            run.mkdir(parents=True)
            lines = [
                "virtual_time,wall_time,aggregation,cis_accuracy,"
                "exit1_accuracy,exit2_accuracy,exit3_accuracy",
                "0,0,0,0.1,0.1,0.5,0.5",
            ]
            for r, g in enumerate(gap, 1):
                lines.append(f"{r},{r},{r},{0.9 + g / 100},{0.9 + g / 100},0.5,0.5")
            (run / "metrics.csv").write_text("\n".join(lines) + "\n")
    res = rep.collect("cis-100r", runs, "bbbbbbb", None, pages, keep_earlier=True)
    with pytest.raises(SystemExit, match="already keeps earlier results"):  # (not replaced)
        rep.collect("cis-100r", runs, "ccccccc", None, pages, keep_earlier=True)
    kept = rep.earlier(res)
    assert kept is not None and kept.meta["commit"] == "aaaaaaa"
    assert kept.values == stored.values
    assert rep.load("cis-100r", pages).meta["commit"] == "bbbbbbb"
    table = rep.cis_rounds_earlier(res)
    assert table.startswith("Earlier: commit `aaaaaaa` on ? (M1)")
    # (round 15 is the last: its column and the end's agree)
    row1 = "| 1 | +1.00 → +1.50 | +0.20 → +0.25 | +0.20 → +0.25 (round 15) | 0.30 | 0.50 / 0.30 |"
    row2 = "| 2 | −0.50 → −0.50 | −0.50 → −0.50 | −0.50 → −0.50 (round 15) | 0.00 | 0.00 / 0.00 |"
    assert f"| paper mode (Algorithm 1) {row1}" in table
    assert f"| paper mode (Algorithm 1) {row2}" in table
    assert rep.cis_end_rounding(res) == 0.3
    summary = rep.cis_rounds_summary(res)
    # (each run's wall clock steps 1 s a round: 4 runs of 15 rounds, 60 s)
    assert "A round took a median 1 s of wall time per run" in summary
    assert "the 4 runs' 60 rounds take about 0.0 hours one after the other" in summary
    assert (
        "1 of 2 within ±0.3, the largest change of a seed's Serving − Equal over the last"
        in summary
    )
    # nothing kept: the block says so and the summary reads the 5-round spread alone
    bare = rep.Results("cis-100r", res.values, {}, tmp_path / "nowhere")
    assert rep.cis_rounds_earlier(bare) == "No earlier results of these runs are kept."
    assert rep.cis_end_rounding(bare) is None
    assert "between two machines" not in rep.cis_rounds_summary(bare)


def _fedraa_run(root: Path, folder: str, strategy: str, seed: int, curve: list[tuple]) -> None:
    """A finished Fed-RAA-table run: (virtual time, server steps, accuracy) rows."""
    run = root / folder / "runs" / strategy / f"seed-{seed}"
    run.mkdir(parents=True)
    lines = ["virtual_time,aggregation,test_accuracy"]
    lines += [f"{t},{a},{acc}" for t, a, acc in curve]
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")
    end = curve[-1][0]
    (run / "summary.json").write_text(json.dumps({"status": "completed", "virtual_time": end}))


def test_a_chaotic_cell_is_held_to_the_spread_between_two_machines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """collect --merge --keep-earlier re-stores the chaotic ablation rows from another
    machine and keeps the whole earlier table; their tolerance is then the largest move over
    the seeds, by hand: a = s's time to 93 % 107 → 84 s (seed 1) and 92 → 95 s (seed 2),
    so 23 s; an ordinary cell keeps the table's 2 s."""
    pages = _copy_pages(tmp_path)
    for suffix in (".csv", ".json"):  # (as before the page's own re-store)
        (pages / "results" / "earlier" / f"fedraa-t5-reference{suffix}").unlink(missing_ok=True)
    table = rep.TABLES["fedraa-t5-reference"]
    assert table.chaotic == ("fed-raa@discount", "fed-raa@one")
    before = rep.load("fedraa-t5-reference", pages)
    before.meta.pop("merged", None)
    for seed, t, acc in ((1, 107.0, 0.91), (2, 92.0, 0.88), (3, 46.0, 0.86)):
        before.values[("fed-raa@discount", seed, "t93")] = t
        before.values[("fed-raa@discount", seed, "acc@100")] = acc
    rep.save(before, pages)
    root = tmp_path / "root"
    for seed, t in ((1, 84), (2, 95)):  # 93 % reached at t, 0.95 at 150 s
        curve = [(0, 0, 0.1), (t - 1, 10 * t - 10, 0.9), (t, 10 * t, 0.93), (150, 1500, 0.95)]
        _fedraa_run(root, "t5r-fed-raa@discount", "fed-raa", seed, curve)
    res = rep.collect(
        "fedraa-t5-reference", root, "bbbbbbb", "on AVX2", pages, merge=True, keep_earlier=True
    )
    kept = rep.earlier(res)
    assert kept is not None and kept.values.keys() == before.values.keys()
    for key, value in before.values.items():  # the whole table, unmerged
        assert kept.values[key] == value or (math.isnan(value) and math.isnan(kept.values[key]))
    assert res.get("fed-raa@discount", 1, "t93") == 84 and res.get("fed-raa", 1, "t93") == 89
    assert res.meta["commit"] == before.meta["commit"]  # the rest's provenance kept
    assert res.meta["merged"][-1]["cells"] == ["fed-raa@discount"]
    assert res.meta["merged"][-1]["seeds"] == [1, 2]
    spread = rep.machine_spread(table, res)
    assert spread[("fed-raa@discount", "t93")] == 23.0
    assert ("fed-raa", "t93") not in spread  # (an ordinary cell)
    assert "Re-stored since, with the other numbers kept: fed-raa@discount (seeds 1, 2)" in (
        rep.provenance(res, pages)
    )
    rows, over = rep.drift(table, res, {("fed-raa@discount", 1, "t93"): 107.0})
    assert not over and rows[0][-2:] == ["23", "ok"]  # (the other machine's number)
    rows, over = rep.drift(table, res, {("fed-raa@discount", 1, "t93"): 108.0})
    assert over
    rows, over = rep.drift(table, res, {("fed-raa", 1, "t93"): 92.0})
    assert over and rows[0][-2:] == ["2", "over"]
    block = rep.fedraa_machines(res)
    assert "| a = s (no data share) | 1 | 107 → 84 |" in block
    assert "| a = s (no data share) | 2 | 92 → 95 |" in block
    assert "a = s (no data share): time to 93 % 23," in block
    assert "a = s (no data share) † |" in rep.fedraa_ablation(res)
    # both machines' six runs against each machine's own authors' update (89 / 88 / 94 s,
    # the stored table's): 107/89 = 1.20 the largest; at 100 s a = s's 0.93 is below
    line = next(x for x in rep.fedraa_ablation_summary(res).splitlines() if "a = s" in x)
    assert "On the earlier machine 107 / 92 / 46 s; over both machines' 6 runs " in line
    assert "0.49–1.20× the authors' time" in line  # (46 / 94 the lowest)
    assert line.endswith("below their accuracy at 100 s in 6 of 6.")  # (0.93 < 0.9312 …)
    # once an earlier machine is kept, a chaotic cell's rerun is that comparison, not a record
    with pytest.raises(SystemExit, match="re-measures a number"):
        rep.record("fedraa-t5-reference", [root], None, pages)
    # a cell merged from this machine's runs is not compared with those same runs
    curve = [(0, 0, 0.1), (42, 60, 0.92), (43, 65, 0.93), (150, 230, 0.96)]
    _fedraa_run(root, "t5r-fedasync", "fedasync", 1, curve)
    rep.collect("fedraa-t5-reference", root, "ccccccc", None, pages, merge=True)
    with pytest.raises(SystemExit, match="re-measures a number"):
        rep.record("fedraa-t5-reference", [root], None, pages)
    # a third machine's rounding: the chaotic rerun is kept, held to the two machines' spread
    third = "x86_64, 2 cores, torch kernels DEFAULT (forced: MKL_ENABLE_INSTRUCTIONS=SSE4_2), L"
    monkeypatch.setattr(rep, "machine", lambda: third)
    rows = rep.record("fedraa-t5-reference", [root], None, pages, cells=["fed-raa@discount"])
    t93 = {r["seed"]: r for r in rows if r["metric"] == "t93"}
    assert float(t93["1"]["tolerance"]) == 23.0 and rep.rerun_outcome(t93["1"]) == "equal"
    block = rep.reruns_block(("fedraa-t5-reference",))(rep.load("fedraa-t5-reference", pages))
    assert "| fedraa-t5-reference | DEFAULT (forced) | 1, 2 |" in block


def test_record_keeps_each_rerun_comparison_and_the_block_counts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """record: one row per stored number re-measured, by hand: FedAsync seed 1 stored at
    t93 = 43 s re-measured at 43 (equal), its accuracy at 100 s 0.9459 → 0.9469 (within 0.2
    points) and at 150 s → 0.96 (over); a later record of the same number replaces its row."""
    pages = _copy_pages(tmp_path)
    monkeypatch.setattr(rep, "machine", lambda: "x86_64, 2 cores, torch kernels AVX512, Linux")
    shutil.rmtree(pages / "results" / "reruns", ignore_errors=True)
    for suffix in (".csv", ".json"):  # (no earlier machine: every cell is recorded)
        (pages / "results" / "earlier" / f"fedraa-t5-reference{suffix}").unlink(missing_ok=True)
    stored = rep.load("fedraa-t5-reference", pages)
    assert stored.get("fedasync", 1, "t93") == 43 and stored.get("fedasync", 1, "acc@100") == 0.9459
    root = tmp_path / "root"
    curve = [(0, 0, 0.1), (42, 60, 0.92), (43, 65, 0.93), (100, 150, 0.9469), (150, 230, 0.96)]
    _fedraa_run(root, "t5r-fedasync", "fedasync", 1, curve)
    rows = rep.record("fedraa-t5-reference", [root], "ccccccc", pages)
    got = {r["metric"]: rep.rerun_outcome(r) for r in rows}
    assert got["t93"] == "equal" and got["acc@100"] == "within" and got["acc@150"] == "over"
    kept = rep.load_reruns("fedraa-t5-reference", pages)
    assert {r["commit"] for r in kept} == {"ccccccc"} and len(kept) == len(rows)
    block = rep.reruns_block(("fedraa-t5-reference",))(stored)
    assert "| fedraa-t5-reference | AVX512 | 1 |" in block
    assert "| fedraa-t5-reference | fedasync | 1 | acc@150 | 0.9549 | 0.96 | 0.002 |" in block
    assert "| fedraa-t5-reference | AVX512 | 1 | " + str(len(rows)) + " |" in block
    assert "- fedraa-t5-reference: seeds 1, 2, 3 of fed-raa, fed-raa@share," in block
    # (cells a merge stored from another machine than the table's: listed apart)
    assert (
        "seeds 1, 2, 3 of fed-raa@discount, fed-raa@m1, fed-raa@mix, fed-raa@mix-mp, "
        "fed-raa@mix-random, fed-raa@one (stored " in block
    )
    assert ": they wait for another machine)" in block
    assert "- fedraa-t5-reference: seeds 2, 3 of fedasync\n" in block + "\n"
    # re-recorded: the row is replaced, not added
    rep.record("fedraa-t5-reference", [root], "ddddddd", pages, seeds=[1])
    again = rep.load_reruns("fedraa-t5-reference", pages)
    assert len(again) == len(kept) and {r["commit"] for r in again} == {"ddddddd"}
    with pytest.raises(SystemExit, match="re-measures a number"):
        rep.record("fedraa-t5-reference", [root], None, pages, seeds=[2])
    with pytest.raises(SystemExit, match="re-measures a number"):
        rep.record("fedraa-t5-reference", [root], None, pages, cells=["fedavg"])


def test_the_mixing_ablation_reads_against_the_authors_and_fedasync_by_hand() -> None:
    """The ``mix`` line: its times against the authors' update's and FedAsync's against its,
    paired per seed: 54 / 45 / 60 s against 90 s each → 0.60 / 0.50 / 0.67×; FedAsync's
    45 s → 0.83 / 1.00 / 0.75 of its time; a table without the cell has no row for it."""
    values = {}
    for seed, (mine, theirs) in enumerate(((54.0, 45.0), (45.0, 45.0), (60.0, 45.0)), 1):
        values[("fed-raa", seed, "t93")] = 90.0
        values[("fed-raa@mix", seed, "t93")] = mine
        values[("fedasync", seed, "t93")] = theirs
    res = rep.Results("fedraa-t5-reference", values, {}, Path("/nowhere"))
    (line,) = [x for x in rep.fedraa_ablation_summary(res).splitlines() if "mixing" in x]
    assert "93 % at 54 / 45 / 60 s, 0.60 / 0.50 / 0.67× the time with the authors'" in line
    assert line.endswith("FedAsync reaches 93 % in 0.83 / 1.00 / 0.75 of its time.")
    assert "mixing" in rep.fedraa_ablation(res)
    del_mix = {k: v for k, v in values.items() if k[0] != "fed-raa@mix"}
    bare = rep.Results("fedraa-t5-reference", del_mix, {}, Path("/nowhere"))
    assert "mixing" not in rep.fedraa_ablation(bare)


def test_another_choice_of_parts_reads_against_the_mixing_line_by_hand() -> None:
    """Random's and MP-RAA's parts with the mixing update, against Gre-RAA's with it, paired
    per seed: Random 55 / 50 / 66 s over mixing's 50 / 50 / 60 s → 1.10 / 1.00 / 1.10×;
    MP-RAA 45 / 40 / 60 → 0.90 / 0.80 / 1.00×."""
    values = {}
    for seed, (mix, rnd, mp) in enumerate(
        ((50.0, 55.0, 45.0), (50.0, 50.0, 40.0), (60.0, 66.0, 60.0)), 1
    ):
        values[("fed-raa", seed, "t93")] = 100.0
        values[("fed-raa@mix", seed, "t93")] = mix
        values[("fed-raa@mix-random", seed, "t93")] = rnd
        values[("fed-raa@mix-mp", seed, "t93")] = mp
        values[("fedasync", seed, "t93")] = 45.0
    res = rep.Results("fedraa-t5-reference", values, {}, Path("/nowhere"))
    lines = rep.fedraa_ablation_summary(res).splitlines()
    (rnd,) = [x for x in lines if "Random's fragments" in x]
    (mp,) = [x for x in lines if "MP-RAA's fragments" in x]
    assert "93 % at 55 / 50 / 66 s, 0.55 / 0.50 / 0.66× the time with the authors'" in rnd
    assert rnd.endswith("Gre-RAA's parts): 1.10 / 1.00 / 1.10× its time.")
    assert mp.endswith("Gre-RAA's parts): 0.90 / 0.80 / 1.00× its time.")
    assert "Random's fragments" in rep.fedraa_ablation(res)


def test_the_one_fragment_ablation_is_compared_with_fedasync_number_for_number() -> None:
    """The M = 1 line: stored from the table's own machine, its numbers are held to the
    stored FedAsync's one by one (NaN, a read past the end, equals NaN); one number off and
    the line says how many differ."""
    values = {}
    for seed in (1, 2, 3):
        for cell in ("fed-raa", "fed-raa@m1", "fedasync"):
            values[(cell, seed, "t93")] = 90.0 if cell == "fed-raa" else 43.0
            values[(cell, seed, "acc@100")] = 0.9459
            values[(cell, seed, "acc@common")] = math.nan
    res = rep.Results("fedraa-t5-reference", values, {"machine": "m"}, Path("/nowhere"))
    (line,) = [x for x in rep.fedraa_ablation_summary(res).splitlines() if "M = 1" in x]
    assert "93 % at 43 / 43 / 43 s, 0.48 / 0.48 / 0.48× the time" in line
    assert line.endswith(
        "All 9 of its numbers equal FedAsync's on the same machine: the same run, so what "
        "separates the mixing variant from FedAsync is the fragments."
    )
    values[("fed-raa@m1", 2, "acc@100")] = 0.9460
    res = rep.Results("fedraa-t5-reference", values, {"machine": "m"}, Path("/nowhere"))
    (line,) = [x for x in rep.fedraa_ablation_summary(res).splitlines() if "M = 1" in x]
    assert line.endswith("1 of its 9 numbers differ from FedAsync's on the same machine.")
