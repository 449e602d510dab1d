"""Text processing of the preprocessing stages: corpus pieces, the BPE tokenizer, sliding windows,
TFRecords, embedding tables."""
