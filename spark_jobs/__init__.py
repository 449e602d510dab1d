"""Spark applications, one per pipeline stage, and what they are made of: text/ (corpus, BPE,
windows, TFRecords, embedding tables), model/ (the decoder and its sampler), training/ (one
TensorFlow worker and its input, backups and statistics), spark/ (what every application shares)."""
