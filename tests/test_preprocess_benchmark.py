"""benchmarks/preprocess.py's bare-tokenizer baseline encodes a few MB at a time: the same tokens as
one call on the whole text, without holding every Encoding of a large corpus."""

from __future__ import annotations

from tokenizers import ByteLevelBPETokenizer

from benchmarks import preprocess


def test_the_baseline_counts_the_tokens_of_one_whole_encode_batch_by_batch(shakespeare, monkeypatch):
    text = shakespeare.read_text(encoding="utf-8")[:50_000]
    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator([text], vocab_size=400, show_progress=False)
    whole = sum(len(encoding.ids) for encoding in trained.encode_batch(text.splitlines(keepends=True)))
    monkeypatch.setattr(preprocess, "BARE_BATCH_CHARS", 3_000)  # many batches
    results = preprocess.bare_tokenizer(trained._tokenizer.to_str(), text, cores=1, repeats=1)
    assert {figures["tokens"] for name, figures in results.items() if name.endswith("lines")} == {whole}
    assert all(figures["tokens_per_s"] > 0 for figures in results.values())
