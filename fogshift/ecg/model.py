"""The rhythm classifier: a small neural network (scikit-learn's ``MLPClassifier``) trained
deterministically on simulated normal and abnormal rhythms, shipped as ``model.json``.

``python -m fogshift.ecg.model`` trains it again (about a minute) and writes the file; the
training data are simulated with seeds the patients of a pipeline never use, filtered and
turned into features by the same streaming steps the PEs run. Inference needs only numpy:
the PE loads the weights once per query (``on_assign``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fogshift.ecg import beats, dsp
from fogshift.ecg.simulate import abnormal_rhythm, segment

#: The shipped model.
MODEL_PATH = Path(__file__).with_name("model.json")
#: The filter every Case 2 pipeline uses by default (and the training data went through).
BAND = (0.5, 40.0, 4)
#: Seeds of the training recordings: far from any patient's (``seed * 1000 + n * 7``).
TRAINING_SEED = 900_000


@dataclass(frozen=True)
class Model:
    """A trained multi-layer perceptron: ReLU hidden layers, a logistic output."""

    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]

    def abnormal(self, x: list[float]) -> float:
        """The probability that the features ``x`` come from an abnormal rhythm."""
        h = np.asarray(x, dtype=float)
        for w, b in zip(self.weights[:-1], self.biases[:-1], strict=True):
            h = np.maximum(h @ w + b, 0.0)
        z = float((h @ self.weights[-1] + self.biases[-1])[0])
        return float(1.0 / (1.0 + np.exp(-z)))

    def to_json(self) -> dict[str, Any]:
        return {
            "weights": [w.tolist() for w in self.weights],
            "biases": [b.tolist() for b in self.biases],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Model:
        return cls(
            tuple(np.asarray(w, dtype=float) for w in data["weights"]),
            tuple(np.asarray(b, dtype=float) for b in data["biases"]),
        )


def load(path: Path = MODEL_PATH) -> Model:
    """The model in ``path`` (default: the shipped one)."""
    return Model.from_json(json.loads(path.read_text()))


def window_features(signal: np.ndarray, fs: int, window: int) -> list[list[float]]:
    """The features after each window of a recording, streamed as the PEs stream it."""
    sos = dsp.design(float(fs), *BAND)
    state, zi, out = beats.fresh(), None, []
    for at in range(0, signal.size - window + 1, window):
        filtered, zi = dsp.filter_window(sos, signal[at : at + window], zi)
        state = beats.step(state, filtered, fs)
        found = beats.features(state, fs)
        if found is not None:
            out.append(found)
    return out


def training_set(fs: int = 250, seconds: float = 40.0) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels (1: abnormal) of simulated recordings of every rhythm."""
    rows, labels = [], []
    seed = TRAINING_SEED
    normal = [(rate, std) for rate in (55, 62, 70, 78, 86, 95) for std in (0.5, 2.0, 4.0)]
    abnormal = [(rate + d, std) for rhythm in ("tachycardia", "irregular")
                for rate, std in [abnormal_rhythm(rhythm)] for d in (-15, -5, 5, 15)]  # fmt: skip
    for label, kinds in ((0, normal), (1, abnormal * 2)):
        for rate, std in kinds:
            seed += 1
            signal = segment(seconds, fs, rate, std, seed) * (0.6 + (seed % 10) / 10)
            found = window_features(signal, fs, fs // 2)
            rows += found
            labels += [label] * len(found)
    return np.asarray(rows), np.asarray(labels)


def train() -> Model:
    """Train the classifier (deterministic: fixed seeds, one thread of arithmetic)."""
    from sklearn.neural_network import MLPClassifier

    x, y = training_set()
    net = MLPClassifier(hidden_layer_sizes=(8,), random_state=0, max_iter=3000, tol=1e-6)
    net.fit(x, y)
    return Model(
        tuple(np.asarray(w) for w in net.coefs_), tuple(np.asarray(b) for b in net.intercepts_)
    )


if __name__ == "__main__":  # pragma: no cover - a maintenance command
    model = train()
    x, y = training_set(seconds=20.0)
    accuracy = float(
        np.mean([(model.abnormal(list(r)) >= 0.5) == bool(t) for r, t in zip(x, y, strict=False)])
    )
    MODEL_PATH.write_text(json.dumps(model.to_json()) + "\n")
    sys.stdout.write(f"wrote {MODEL_PATH} (training-set accuracy {accuracy:.3f})\n")
