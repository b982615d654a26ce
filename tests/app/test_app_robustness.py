"""Real-world inputs through /predict: the committed sample of the robustness suite
(tests/fixtures/robustness/: `python -m benchmarks.robustness --n 6 --photo-size 384x288 --save ...`,
seed 0, the first 6 images of each kind, photos at 384x288)."""

from collections import defaultdict

import pytest

from tests.harness import REAL_WORLD

# Floors for the sample: every photo, 5 of the 6 low-resolution digits (an 8 shrunk to 8x8 is read as 4)
# and 95% of all (a DejaVu Sans "1" with a foot is read as 7).
FLOORS = {"photo": 1.0, "lowres": 5 / 6}
OVERALL = 0.95


@pytest.fixture(scope="module")
def answers(client) -> dict[str, list[tuple[str, int, int]]]:
    """kind -> (file, label, prediction) for every image of the sample (label: the name's last part)."""
    by_kind = defaultdict(list)
    for path in sorted(REAL_WORLD.glob("*/*")):
        label = int(path.stem.rsplit("-", 1)[1])
        r = client.post("/predict", params={"include": ""}, files={"file": (path.name, path.read_bytes())})
        assert r.status_code == 200, (path.name, r.text)
        by_kind[path.parent.name].append((path.name, label, r.json()["prediction"]))
    return by_kind


def test_the_sample_has_every_kind(answers):
    assert len(answers) == 11 and all(len(rows) == 6 for rows in answers.values())


def test_photos_and_the_rest_are_read(answers):
    wrong = {kind: [(name, p) for name, label, p in rows if p != label] for kind, rows in answers.items()}
    for kind, floor in FLOORS.items():
        rows = answers[kind]
        assert 1 - len(wrong[kind]) / len(rows) >= floor, (kind, wrong[kind])
    total = sum(len(rows) for rows in answers.values())
    assert 1 - sum(len(w) for w in wrong.values()) / total >= OVERALL, wrong
