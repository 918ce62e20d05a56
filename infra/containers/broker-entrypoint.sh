#!/bin/sh
# Tansu on memory:// or on s3:// (SeaweedFS started here first, the bucket created), as
# infra/stack/broker.py and objectstore.py run them. SIGTERM reaches Tansu, which keeps every
# acknowledged record; SeaweedFS is stopped after it.
set -eu
LISTEN="tcp://0.0.0.0:$BROKER_PORT"
ADVERTISED="tcp://$BROKER_ADVERTISED_HOST:$BROKER_PORT"
if [ "$BROKER_STORAGE" = "memory" ]; then
  exec tansu broker --listener-url "$LISTEN" --advertised-listener-url "$ADVERTISED" --storage-engine memory://tansu/
fi
mkdir -p /data/volumes
cat > /data/s3-identities.json <<JSON
{"identities": [{"name": "tributary", "credentials": [{"accessKey": "tributary", "secretKey": "tributary-local-secret"}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
P=$S3_INTERNAL_PORT
weed -logtostderr server -dir=/data/volumes -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.telemetry=false \
  -master.volumeSizeLimitMB=256 -volume.max=0 -volume.preStopSeconds=1 -s3 -s3.port="$S3_PORT" \
  -s3.port.iceberg=0 -s3.port.lance=0 -s3.config=/data/s3-identities.json \
  -master.port=$P -master.port.grpc=$((P+1)) -volume.port=$((P+2)) -volume.port.grpc=$((P+3)) \
  -filer.port=$((P+4)) -filer.port.grpc=$((P+5)) -s3.port.grpc=$((P+6)) >/data/weed.log 2>&1 &
WEED=$!
i=0
until curl -sf -o /dev/null "http://127.0.0.1:$((P+4))/" && curl -s -o /dev/null "http://127.0.0.1:$S3_PORT/"; do
  i=$((i+1)); [ $i -lt 600 ] || { echo "SeaweedFS did not start"; tail -20 /data/weed.log; exit 1; }
  kill -0 $WEED || { echo "SeaweedFS exited"; tail -20 /data/weed.log; exit 1; }
  sleep 0.1
done
curl -sf -o /dev/null -X POST "http://127.0.0.1:$((P+4))/buckets/tansu/?op=mkdir" || true
export AWS_ACCESS_KEY_ID=tributary AWS_SECRET_ACCESS_KEY=tributary-local-secret \
  AWS_DEFAULT_REGION=us-east-1 AWS_ENDPOINT="http://127.0.0.1:$S3_PORT" AWS_ALLOW_HTTP=true
tansu broker --listener-url "$LISTEN" --advertised-listener-url "$ADVERTISED" --storage-engine s3://tansu/ &
TANSU=$!
trap 'kill -TERM $TANSU 2>/dev/null' TERM INT
wait $TANSU || true
wait $TANSU 2>/dev/null || true
kill -TERM $WEED 2>/dev/null || true
wait $WEED 2>/dev/null || true
