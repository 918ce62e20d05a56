package io.tributary.cdc;

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Publishes the change records of a Debezium batch to Kafka without a Python call per record.
 *
 * <p>The same routing as {@code cdc/routing.py} for table topics: each change keyed by its
 * primary key, with the {@code lsn} and {@code txId} of its envelope's {@code source} block as
 * headers; a delete's tombstone carries its delete's headers; heartbeats go out as they come,
 * without headers; internal topics are dropped. Records of the outbox topic (the event store's
 * table) are handed back to Python, which turns them into events. The producer is idempotent
 * with {@code acks=all}, and {@link #flush()} returns only when the broker acknowledged every
 * record sent, or throws; the caller marks the batch processed only after that.
 */
public final class ChangeProducer implements AutoCloseable {
  public static final String LSN_HEADER = "lsn";
  public static final String TXID_HEADER = "txId";
  private static final String SOURCE = "\"source\":{";

  private final KafkaProducer<byte[], byte[]> producer;
  private final Set<String> skip;
  private final Set<String> unpositioned;
  private final String outboxTopic;
  private final Map<String, List<Header>> lastDelete = new HashMap<>();
  private final Set<String> ready = new HashSet<>();
  private final AtomicInteger failures = new AtomicInteger();
  private final AtomicReference<String> firstFailure = new AtomicReference<>();
  private long pending;
  private long lastLsn = -1;
  private long sent;

  public ChangeProducer(
      Properties properties, String[] skipTopics, String[] unpositionedTopics, String outboxTopic) {
    Properties props = new Properties();
    props.putAll(properties);
    props.put("key.serializer", ByteArraySerializer.class.getName());
    props.put("value.serializer", ByteArraySerializer.class.getName());
    this.producer = new KafkaProducer<>(props);
    this.skip = Set.of(skipTopics);
    this.unpositioned = Set.of(unpositionedTopics);
    this.outboxTopic = outboxTopic;
  }

  /** The destinations of the batch not yet prepared (neither dropped nor the outbox's). */
  public String[] unreadyTopics(List<ChangeEvent<String, String>> records) {
    Set<String> topics = new LinkedHashSet<>();
    for (ChangeEvent<String, String> record : records) {
      String topic = record.destination();
      if (!ready.contains(topic) && !skip.contains(topic) && !topic.equals(outboxTopic)) {
        topics.add(topic);
      }
    }
    return topics.toArray(new String[0]);
  }

  /** The topic exists with its settings (Python's admin made sure of it). */
  public void markReady(String topic) {
    ready.add(topic);
  }

  /**
   * Sends every change of a table topic (asynchronously) and returns the records Python must
   * route: those of the outbox topic. Returns {@code null}, having sent nothing, when a table
   * change has no position this scan can read (Python then routes the whole batch).
   */
  public List<ChangeEvent<String, String>> send(List<ChangeEvent<String, String>> records) {
    List<ProducerRecord<byte[], byte[]>> outgoing = new ArrayList<>(records.size());
    List<ChangeEvent<String, String>> events = new ArrayList<>();
    Map<String, List<Header>> deletes = new HashMap<>();
    Set<String> tombstoned = new HashSet<>();
    long lsn = lastLsn;
    for (ChangeEvent<String, String> record : records) {
      String topic = record.destination();
      if (skip.contains(topic)) {
        continue;
      }
      if (topic.equals(outboxTopic)) {
        events.add(record);
        continue;
      }
      String key = record.key();
      String value = record.value();
      byte[] keyBytes = key == null ? null : key.getBytes(StandardCharsets.UTF_8);
      String slot = topic + '\u0000' + (key == null ? "" : key);
      if (value == null) {
        List<Header> headers = deletes.remove(slot);
        if (headers == null && !tombstoned.contains(slot)) {
          headers = lastDelete.get(slot);
        }
        tombstoned.add(slot);
        outgoing.add(new ProducerRecord<>(topic, null, keyBytes, null, headers));
        continue;
      }
      byte[] valueBytes = value.getBytes(StandardCharsets.UTF_8);
      if (unpositioned.contains(topic)) {
        outgoing.add(new ProducerRecord<>(topic, null, keyBytes, valueBytes, List.of()));
        continue;
      }
      int source = value.lastIndexOf(SOURCE);
      String lsnText = source < 0 ? null : numberAfter(value, "\"lsn\":", source);
      if (lsnText == null) {
        return null;
      }
      String tx = numberAfter(value, "\"txId\":", source);
      List<Header> headers = new ArrayList<>(2);
      headers.add(new RecordHeader(LSN_HEADER, lsnText.getBytes(StandardCharsets.US_ASCII)));
      if (tx != null) {
        headers.add(new RecordHeader(TXID_HEADER, tx.getBytes(StandardCharsets.US_ASCII)));
      }
      lsn = Long.parseLong(lsnText);
      if (value.indexOf("\"op\":\"d\"", source) >= 0) {
        deletes.put(slot, headers);
        tombstoned.remove(slot);
      }
      outgoing.add(new ProducerRecord<>(topic, null, keyBytes, valueBytes, headers));
    }
    for (String slot : tombstoned) {
      lastDelete.remove(slot);
    }
    lastDelete.putAll(deletes);
    lastLsn = lsn;
    for (ProducerRecord<byte[], byte[]> record : outgoing) {
      producer.send(
          record,
          (metadata, exception) -> {
            if (exception != null) {
              failures.incrementAndGet();
              firstFailure.compareAndSet(
                  null, record.topic() + ": " + exception.getClass().getSimpleName() + ": "
                      + exception.getMessage());
            }
          });
    }
    pending += outgoing.size();
    return events;
  }

  /**
   * Blocks until the broker acknowledged every record sent since the last flush; throws if it
   * rejected any (the batch must then not be committed).
   */
  public long flush() {
    producer.flush();
    long count = pending;
    pending = 0;
    int failed = failures.getAndSet(0);
    String first = firstFailure.getAndSet(null);
    if (failed > 0) {
      throw new IllegalStateException(
          "Kafka rejected " + failed + " change(s), first: " + first
              + "; the connector stops without committing them");
    }
    sent += count;
    return count;
  }

  /** Marks every record of the batch processed (the engine commits their offsets). */
  public void markProcessed(
      List<ChangeEvent<String, String>> records,
      DebeziumEngine.RecordCommitter<ChangeEvent<String, String>> committer)
      throws InterruptedException {
    for (ChangeEvent<String, String> record : records) {
      committer.markProcessed(record);
    }
  }

  /** The LSN of the last positioned change sent, or -1. */
  public long lastLsn() {
    return lastLsn;
  }

  /** Records acknowledged so far. */
  public long sent() {
    return sent;
  }

  @Override
  public void close() {
    producer.close();
  }

  private static String numberAfter(String text, String marker, int from) {
    int at = text.indexOf(marker, from);
    if (at < 0) {
      return null;
    }
    at += marker.length();
    int end = at;
    while (end < text.length() && Character.isDigit(text.charAt(end))) {
      end++;
    }
    return end > at ? text.substring(at, end) : null;
  }
}
