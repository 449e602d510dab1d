"""The sampler draws each token as often as its probability says: the softmax of the logits divided
by the temperature, kept to the top_k most likely tokens or to the smallest most likely set whose
probabilities reach top_p, and renormalised over those.

Many draws with a fixed seed (rows of the same logits, each row its own sample's random stream, at
many step indices) give each token's frequency; the test compares them with that distribution,
worked out here with numpy. With N draws, a frequency's standard deviation is at most 0.5 / sqrt(N),
so TOLERANCE, five of them, holds for a right sampler. A sampler that ignored the probabilities
(drawing the kept tokens alike), the temperature, or the top-k/top-p cut draws from another
distribution, and each case checks first that every one of these is more than twice TOLERANCE away
from the right one in some token's probability, so such a sampler's frequencies would be more than
TOLERANCE away from it: the test fails for it. A draw outside the cut fails the test by itself."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config_files import load_config
from spark_jobs.model import sampler

LOGITS = np.array([2.0, 0.5, 1.5, -1.0, 1.0, 0.0, 2.5, -0.5])
ROWS, STEPS = 2000, 25  # samples drawn at once, and the step indices each draws at
TOLERANCE = 5 * 0.5 / np.sqrt(ROWS * STEPS)


def distribution(
    logits: np.ndarray, temperature: float, top_k: int | None = None, top_p: float | None = None, alike=False
) -> np.ndarray:
    """What each token's probability of being drawn should be; `alike`: the kept tokens' all the same."""
    scaled = logits / temperature
    probabilities = np.exp(scaled - scaled.max())
    probabilities /= probabilities.sum()
    likeliest_first = np.argsort(-probabilities, kind="stable")
    kept = likeliest_first
    if top_k is not None:
        kept = likeliest_first[:top_k]
    if top_p is not None:
        reached = np.searchsorted(np.cumsum(probabilities[likeliest_first]), top_p)
        kept = likeliest_first[: reached + 1]
    drawn = np.zeros_like(probabilities)
    drawn[kept] = 1.0 if alike else probabilities[kept]
    return drawn / drawn.sum()


def frequencies(logits: np.ndarray, settings) -> np.ndarray:
    """How often `sampler.pick` draws each token: ROWS samples (seeds seed + row, as the decode loop
    gives its samples) at step indices 0 .. STEPS - 1."""
    batch = np.tile(np.float32(logits), (ROWS, 1))
    seeds = [settings.seed + row for row in range(ROWS)]
    drawn = np.concatenate(
        [np.asarray(sampler.pick(batch, len(logits), settings, seeds, step)) for step in range(STEPS)]
    )
    return np.bincount(drawn, minlength=len(logits)) / drawn.size


@pytest.mark.parametrize(
    "cut",
    [
        {"strategy": "top_k", "temperature": 0.5, "top_k": 3},
        {"strategy": "top_p", "temperature": 2.0, "top_p": 0.8},
        {"strategy": "top_p", "temperature": 0.7, "top_p": 0.6},
    ],
    ids=["top_k 3 at 0.5", "top_p 0.8 at 2.0", "top_p 0.6 at 0.7"],
)
def test_tokens_are_drawn_as_often_as_the_tempered_softmax_within_the_cut_says(cut):
    strategy, temperature = cut["strategy"], cut["temperature"]
    limit = {name: value for name, value in cut.items() if name in ("top_k", "top_p")}
    expected = distribution(LOGITS, temperature, **limit)
    wrong = {
        "the probabilities": distribution(LOGITS, temperature, **limit, alike=True),
        "the temperature": distribution(LOGITS, 1.0, **limit),
        "the cut": distribution(LOGITS, temperature),
    }
    for ignored, other in wrong.items():
        assert np.abs(other - expected).max() > 2 * TOLERANCE, f"a sampler ignoring {ignored} would pass"

    settings = load_config().generate.model_copy(update={**cut, "seed": 1234})
    observed = frequencies(LOGITS, settings)
    assert observed[expected == 0].sum() == 0, f"drawn outside the {strategy} cut: {observed.round(4)}"
    assert np.abs(observed - expected).max() < TOLERANCE, (
        f"drawn {observed.round(4)}, expected {expected.round(4)} (tolerance {TOLERANCE:.4f})"
    )
