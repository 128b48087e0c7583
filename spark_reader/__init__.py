"""spark_reader package."""
