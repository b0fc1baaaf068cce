"""experiments/README.md's generated tables and verdicts (experiments/report.py) against the stored results: a
verdict cannot outlive its numbers."""

import json
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import report  # experiments/ is not a package: its scripts import each other by name
import stats


def test_the_readme_is_what_the_stored_results_give():
    text = report.README.read_text(encoding="utf-8")
    assert report.render(text) == text, "experiments/README.md is stale: run python experiments/report.py"


def test_every_generated_part_of_the_readme_is_known_and_present():
    names = [m.group("name") for m in report.MARKER.finditer(report.README.read_text(encoding="utf-8"))]
    assert sorted(names) == sorted(report.SECTIONS)


def test_a_changed_number_changes_the_readme(tmp_path, monkeypatch):
    # copy one stored study, change one seed's BLEU, and the generated part must change with it
    study = tmp_path / "averaging"
    study.mkdir()
    payload = json.loads((report.RESULTS / "averaging" / "results.json").read_text(encoding="utf-8"))
    text = "<!-- BEGIN GENERATED averaging -->\n<!-- END GENERATED averaging -->"
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    (study / "results.json").write_text(json.dumps(payload), encoding="utf-8")
    before = report.render(text)
    payload["results"]["runs"][0]["bleu"]["1000"]["5"] -= 30.0
    import averaging

    payload["results"] = averaging.summarize(payload["results"]["runs"], payload["settings"])
    (study / "results.json").write_text(json.dumps(payload), encoding="utf-8")
    after = report.render(text)
    assert before != after


def _shift_extrapolation(p):
    import extrapolation

    p["results"]["runs"][0]["exact_match"][p["settings"]["L"]] += 0.5
    return extrapolation.summarize(p["results"]["runs"], p["settings"])


def _shift_no_softmax(p):
    import no_softmax

    p["results"]["runs"][0]["final_accuracy"] -= 0.5
    return {**p["results"], "comparisons": no_softmax.comparisons(p["results"]["runs"], p["settings"])}


def _shift_restricted_attention(p):
    import restricted_attention

    p["results"]["runs"][0]["final_accuracy"] += 0.1
    return restricted_attention.summarize(p["results"]["runs"], p["settings"])


def _shift_table1(p):
    import table1

    p["results"]["cost"]["self_attention"][str(p["settings"]["ns"][-1])]["best_ms"] *= 10
    return {**p["results"], "claims": table1.claims(p["results"], p["settings"])}


@pytest.mark.parametrize("name, part, shift", [("table1", "table1", _shift_table1),
                                               ("extrapolation", "extrapolation", _shift_extrapolation),
                                               ("no_softmax", "no-softmax", _shift_no_softmax),
                                               ("restricted_attention", "restricted-attention",
                                                _shift_restricted_attention)])
def test_a_changed_run_changes_the_generated_tables(tmp_path, monkeypatch, name, part, shift):
    # one run's figure changed and the summaries recomputed from the runs: the generated part changes with it
    (tmp_path / name).mkdir()
    payload = json.loads((report.RESULTS / name / "results.json").read_text(encoding="utf-8"))
    text = f"<!-- BEGIN GENERATED {part} -->\n<!-- END GENERATED {part} -->"
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    (tmp_path / name / "results.json").write_text(json.dumps(payload), encoding="utf-8")
    before = report.render(text)
    payload["results"] = shift(payload)
    (tmp_path / name / "results.json").write_text(json.dumps(payload), encoding="utf-8")
    assert report.render(text) != before


def test_a_study_without_results_is_marked_pending(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    out = report.render("<!-- BEGIN GENERATED multi30k-table3 -->\nold\n<!-- END GENERATED multi30k-table3 -->")
    assert "Running / pending" in out and "old" not in out


def test_an_unknown_part_is_refused():
    with pytest.raises(ValueError, match="unknown generated part 'nope'"):
        report.render("<!-- BEGIN GENERATED nope -->\n<!-- END GENERATED nope -->")


def test_stored_comparisons_are_recomputable_from_their_differences():
    # every comparison stored in a results.json: its interval, verdict, p-values and Holm-corrected verdict follow
    # from its per-seed differences, and a reading at a bound from the arms' means and the protocol's bound
    import common

    for path in sorted(report.RESULTS.glob("*/results.json")):
        comparisons = json.loads(path.read_text(encoding="utf-8"))["results"].get("comparisons", {})
        protocol = common.PROTOCOLS / f"{path.parent.name}.json"
        bounds = common.protocol(path.parent.name).get("bounds", {}) if protocol.exists() else {}
        for name, c in comparisons.items():
            readings = []
            for metric, m in c["metrics"].items():
                if len(m["diffs"]) >= 2:
                    mean, sd = stats.mean_sd(m["diffs"])
                    half = stats.t975(len(m["diffs"]) - 1) * sd / len(m["diffs"]) ** 0.5
                    assert m["ci95"] == pytest.approx([mean - half, mean + half]), (path, name, metric)
                reading = stats.side(m["ci95"], m["expected"], m["margin"])
                if m["reading"].startswith("at "):
                    kind, bound, distance = bounds[metric]
                    assert m["reading"] == f"at {kind}" and all(abs(x - bound) <= distance for x in m["means"])
                    reading = m["reading"]
                readings.append(reading)
            assert c["verdict"] == stats.verdict(readings), (path, name)
        family = {k: c for k, c in comparisons.items() if c.get("status", "complete") == "complete"}
        again = stats.correct(json.loads(json.dumps(family)))
        for name, c in family.items():
            assert (c["p"], c["p_holm"], c["verdict_holm"]) == pytest.approx(
                (again[name]["p"], again[name]["p_holm"], again[name]["verdict_holm"])), (path, name)


def test_the_tuning_note_names_choices_at_the_grid_edge_and_ties():
    grid = [0.5, 1.0, 2.0]
    inside = {"a": (1.0, {0.5: 500, 1.0: 450, 2.0: 900})}
    assert report.tuning_note(inside, grid, "factor", "BLEU") == "Tuning: every factor chosen inside the grid, without a tie."
    edge = {"a": (1.0, {0.5: 500, 1.0: 450, 2.0: 900}), "b": (0.5, {0.5: 400, 1.0: 400, 2.0: 900}),
            "c": (2.0, {0.5: 600, 1.0: 500, 2.0: 300})}
    note = report.tuning_note(edge, grid, "factor", "BLEU")
    assert "1 of 3 chose the smallest factor tried, 0.5 (b)" in note
    assert "1 of 3 chose the largest factor tried, 2 (c)" in note
    assert note.endswith("Tied in the tuning, settled by BLEU: b.")
    named = report.tuning_note(inside, grid, "factor", "the smaller", ties=["a"])
    assert named == "Tuning: Tied in the tuning, settled by the smaller: a."
    single = report.tuning_note({"a": (1.0, {1.0: 450}), "b": (1.0, {1.0: 500})}, [1.0], "factor", "BLEU")
    assert single == "Tuning: every factor chosen inside the grid, without a tie."


def test_the_resumable_studies_results_follow_from_their_finished_runs():
    # multi30k_table3 computes results.json from the run files it stores: recompute and compare
    import multi30k_table3
    import resumable

    folder = report.RESULTS / "multi30k_table3"
    stored = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    s = stored["settings"]
    finished = resumable.collect(folder, [multi30k_table3.run_key(row, seed) for row in s["rows"]
                                          for seed in s["seeds"]])
    again = multi30k_table3.aggregate(s, finished)
    fresh = json.loads(json.dumps({**again, "wall_seconds_of_runs": resumable.wall_seconds(folder)}, default=str))
    assert fresh["comparisons"] == stored["results"]["comparisons"]
    assert fresh == stored["results"]


def test_the_stored_table3_differences_are_those_of_its_run_files():
    # the stored Table 3 run: each row's per-seed differences from the base are those of the run files its
    # protocol's folder holds, results/table3/runs-HASH/finished
    import table3

    stored = json.loads((report.RESULTS / "table3" / "results.json").read_text(encoding="utf-8"))
    s = stored["settings"]
    folder = report.RESULTS / "table3" / f"runs-{stored['protocol']['sha256'][:12]}"

    def files(row):
        found = {}
        for seed in s["seeds"]:
            r = json.loads((folder / "finished" / f"{table3._key(row, seed)}.json").read_text(encoding="utf-8"))
            found[seed] = (table3.steps_or_censored(r, s), r["ppl_at"])
        return found

    base = files("base")
    for row, c in stored["results"]["comparisons"].items():
        mine = files(row)
        for i, metric in enumerate(("steps", "ppl")):
            assert c["metrics"][metric]["diffs"] == pytest.approx([mine[k][i] - base[k][i] for k in s["seeds"]]), row


def test_the_protocol_line_says_which_protocol_a_run_followed(tmp_path, monkeypatch):
    import common

    monkeypatch.setattr(common, "PROTOCOLS", tmp_path)
    (tmp_path / "s.json").write_text('{"settings": {"x": 1}}', encoding="utf-8")
    sha = common.protocol("s")["sha256"]
    assert "fixed before the run." in report.protocol_line({"protocol": {"sha256": sha}}, "s")
    assert "has changed since" in report.protocol_line({"protocol": {"sha256": "0" * 64}}, "s")
    assert "run before its protocol was written down" in report.protocol_line({"settings": {"x": 1}}, "s")
    assert "an earlier one" in report.protocol_line({"settings": {"x": 2}}, "s")
