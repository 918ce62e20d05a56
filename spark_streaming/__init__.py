"""Spark Structured Streaming for Tributary: the Kafka source, view jobs, checkpoints, replay."""
