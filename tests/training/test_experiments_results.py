"""The results table is rebuilt from the experiments' JSON and says what the JSON says."""

import json
import shutil

from tests.harness import REPO
from training.experiments import common, results


def test_committed_results_doc_is_rebuilt_from_the_json():
    assert results.main(["--check"]) == 0


def test_every_row_of_every_result_is_in_the_table_with_its_numbers():
    records = results.load()
    assert {r["experiment"] for r in records} >= {"multimnist", "affine", "ablation", "fashion"}
    doc = (REPO / "docs" / "results.md").read_text()
    lines = doc.splitlines()
    for rec in records:
        assert rec["command"] in doc
        for row in rec["rows"]:
            ours = f"{row['ours']:.2f}" + (f" ± {row['std']:.2f}" if row.get("std") is not None else "")
            matches = [line for line in lines if f"| {row['model']} | {row['metric']} | {ours} |" in line]
            assert len(matches) == 1, (rec["experiment"], row)
            assert ("| reduced |" in matches[0]) == row["reduced"] and row.get("hardware", rec["hardware"]) in matches[
                0
            ]


def test_a_changed_number_makes_the_table_stale_and_is_rewritten(tmp_path):
    shutil.copytree(common.RESULTS_DIR, tmp_path / "results")
    argv = ["--results-dir", str(tmp_path / "results"), "--doc", str(tmp_path / "results.md")]
    assert results.main(argv) == 0 and results.main([*argv, "--check"]) == 0
    path = tmp_path / "results" / "multimnist.json"
    record = json.loads(path.read_text())
    record["rows"][0]["ours"] = 12.34
    path.write_text(json.dumps(record))
    assert results.main([*argv, "--check"]) == 1
    results.main(argv)
    assert "| 12.34 |" in (tmp_path / "results.md").read_text()
    record["rows"][0]["std"] = 0.056  # several trials: mean ± sample std
    path.write_text(json.dumps(record))
    results.main(argv)
    assert "| 12.34 ± 0.06 |" in (tmp_path / "results.md").read_text()
