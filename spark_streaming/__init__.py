"""spark_streaming package."""
