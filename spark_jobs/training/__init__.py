"""One TensorFlow training worker: its input, backups, statistics, TensorBoard log and memory check."""
