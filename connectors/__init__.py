"""Adapters to the outside world: Kafka, PostgreSQL, Redis, tantivy, Debezium properties."""
