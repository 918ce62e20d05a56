#!/bin/sh
# Initialise the cluster once (the `tributary` database, the local stack's settings), then run
# postgres in the foreground as the postgres OS user. PGPORT chooses the port.
set -eu
mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA" && chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  runuser -u postgres -- initdb -D "$PGDATA" -U postgres --auth=trust --encoding=UTF8 --no-locale --no-instructions >/dev/null
  cat >> "$PGDATA/postgresql.conf" <<CONF
listen_addresses = '*'
unix_socket_directories = '/tmp'
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
max_connections = 200
shared_buffers = 256MB
wal_sender_timeout = 60s
max_slot_wal_keep_size = ${TRIBUTARY_WAL_BUDGET:-2048MB}
CONF
  echo "host all all all trust" >> "$PGDATA/pg_hba.conf"
  echo "host replication all all trust" >> "$PGDATA/pg_hba.conf"
  echo "CREATE DATABASE tributary" | runuser -u postgres -- postgres --single -D "$PGDATA" postgres >/dev/null
fi
# setpriv execs (runuser would stay the parent): postgres gets the stop signal itself
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" -p "$PGPORT"
