"""What every stage application shares: its arguments and Spark session, the files executors write, Spark metrics."""
