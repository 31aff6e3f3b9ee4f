package fogshift.ops;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadConstraints;
import com.fasterxml.jackson.core.json.JsonReadFeature;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.json.JsonMapper;
import java.io.IOError;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.math.MathContext;
import java.math.RoundingMode;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.TreeSet;
import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import scala.jdk.javaapi.CollectionConverters;

/**
 * fogshift's built-in {@code window-aggregate} as a JVM operator: the same outputs and dead
 * letters as the Python processor ({@code fogshift/runtime/operators/window.py}) and, keyed
 * ({@link #keyedBy}), as the Python engine's keyed PE ({@code engine._stateful_processor}: a
 * window per key, events without one key dead letters, each key's stored state noted for the
 * key index), without a Python worker, the state server or pandas on the batch's path.
 *
 * <p>Contract (checked against the Python processor by {@code tests/runtime/test_jvm_window.py}):
 * the input rows ({@code origin, seq, timestamp, creator, body}) of a batch are taken in input
 * order ({@code origin}); each event whose body is a JSON object with a finite number in
 * {@code field} appends it to the window (the last {@code window} values) and emits
 * {@code {field: aggregate}} with the input's seq and timestamp; any other event is a dead letter
 * (body as received, the reason) and leaves the window as before it. Aggregates are computed as
 * Python computes them: {@code sum} and {@code avg} with {@code math.fsum}'s correctly rounded
 * sum (an intermediate overflow is an error: a dead letter for {@code sum}, {@code avg} then
 * averages the quotients), {@code min} and {@code max} by exact comparison keeping the first of
 * equals and its type (an int stays an int), {@code count} an int. The window is kept as text in
 * one {@code ValueState}, written once per batch.
 */
public final class WindowAggregate extends StatefulProcessor<String, Row, Row> {
  private static final long serialVersionUID = 1L;

  /** Rows of fogshift's writer: {@code fogshift.broker.datasource.RECORD_SCHEMA}. */
  public static final StructType RECORD_SCHEMA =
      new StructType()
          .add("origin", DataTypes.LongType)
          .add("idx", DataTypes.IntegerType)
          .add("seq", DataTypes.LongType)
          .add("timestamp", DataTypes.DoubleType)
          .add("creator", DataTypes.StringType)
          .add("body", DataTypes.StringType)
          .add("dead", DataTypes.StringType);

  /** The creator of a row whose message is no event (fogshift.events.NOT_AN_EVENT). */
  private final String notAnEvent;
  private final String notAnEventWhy;
  private final String pe;
  private final String field;
  private final int window;
  private final String function;
  private final long maxRecordBytes;
  private final String notPrintable;
  /** Keyed ({@link #keyedBy}): the body field keyed by, else {@code null}. */
  private String keyBy;
  /** The longest key processed (fogshift.events.MAX_KEY_CHARS). */
  static final int MAX_KEY_CHARS = 1024;
  /** The grouping key of events without a key, and the prefix of the others'. */
  private String noKey;
  private String keyPrefix;
  /** The creator of a key index note (fogshift.broker.keys.KEY_INDEX). */
  private String noteCreator;
  private transient ValueState<String> values;
  /** The field as Python's repr and json.dumps write it (once, not per event). */
  private transient String fieldRepr;
  private transient String fieldJson;
  private transient String keyByRepr;
  private transient String keyByJson;
  private transient String peRepr;
  /** avg's and sum's values, reused from event to event. */
  private transient double[] reals;
  private transient ObjectMapper json;

  public WindowAggregate(
      String pe,
      String field,
      int window,
      String function,
      String notAnEvent,
      String why,
      long maxRecordBytes,
      String notPrintable) {
    this.maxRecordBytes = maxRecordBytes;
    this.notPrintable = notPrintable;
    this.pe = pe;
    this.field = field;
    this.window = window;
    this.function = function;
    this.notAnEvent = notAnEvent;
    this.notAnEventWhy = why;
  }

  /**
   * This processor keyed by body field {@code keyBy}, as the Python engine keys a PE: its
   * input's grouping keys (column 5, see {@link #applyKeyed}) are {@code noKey} for events
   * without a key and {@code keyPrefix} + the key's text for the others; key index notes
   * are records of creator {@code noteCreator}, which the writer keeps and never appends.
   *
   * @return this processor
   */
  public WindowAggregate keyedBy(
      String keyBy, String noKey, String keyPrefix, String noteCreator) {
    this.keyBy = keyBy;
    this.noKey = noKey;
    this.keyPrefix = keyPrefix;
    this.noteCreator = noteCreator;
    return this;
  }

  /**
   * A keyed {@code processor} ({@link #keyedBy}) over {@code events}: rows of {@code
   * EVENT_SCHEMA} and their grouping key as a sixth column; the dataset of its output records
   * (and key index notes). One window per key.
   */
  public static Dataset<Row> applyKeyed(Dataset<Row> events, WindowAggregate processor) {
    MapFunction<Row, String> group = row -> row.getString(5);
    return events
        .groupByKey(group, Encoders.STRING())
        .transformWithState(
            processor, TimeMode.None(), OutputMode.Append(), Encoders.row(RECORD_SCHEMA));
  }

  /**
   * {@code processor} over {@code events} (rows of {@code EVENT_SCHEMA}): the dataset of its
   * output records. One group (the PE's id): an unkeyed PE's state is one window.
   */
  public static Dataset<Row> apply(Dataset<Row> events, WindowAggregate processor) {
    String key = processor.pe;
    MapFunction<Row, String> group = row -> key;
    return events
        .groupByKey(group, Encoders.STRING())
        .transformWithState(
            processor, TimeMode.None(), OutputMode.Append(), Encoders.row(RECORD_SCHEMA));
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    values = getHandle().getValueState("window", Encoders.STRING(), TTLConfig.NONE());
    json = mapper();
    PyText.useNotPrintable(notPrintable);
    fieldRepr = PyText.strRepr(field);
    fieldJson = PyText.jsonString(field);
    peRepr = PyText.strRepr(pe);
    keyByRepr = keyBy != null ? PyText.strRepr(keyBy) : null;
    keyByJson = keyBy != null ? PyText.jsonString(keyBy) : null;
    reals = new double[16];
  }

  static ObjectMapper mapper() {
    // As Python's json.loads: NaN, Infinity and -Infinity are read (then refused as not
    // finite; Jackson's other spellings are refused by checkJson), trailing text is an error,
    // the last of repeated names wins, no limit on the length of names, strings and numbers
    // (checkJson applies Python's 4300 digits to integers). Nesting is limited to 1000 levels
    // (Python's recursion limit, less the stack already in use: a body nested 990-1000 deep
    // may be an event here and a dead letter there).
    JsonFactory factory =
        JsonFactory.builder()
            .enable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS)
            .streamReadConstraints(
                StreamReadConstraints.builder()
                    .maxNumberLength(Integer.MAX_VALUE)
                    .maxStringLength(Integer.MAX_VALUE)
                    .maxNameLength(Integer.MAX_VALUE)
                    .build())
            .build();
    return JsonMapper.builder(factory)
        .enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS)
        .build();
  }

  /** One value of the window: an integer (exact) or a float. */
  static final class Num {
    final BigInteger integer;
    final double real;

    Num(BigInteger integer) {
      this.integer = integer;
      this.real = integer.doubleValue();
    }

    Num(double real) {
      this.integer = null;
      this.real = real;
    }

    String text() {
      return integer != null ? integer.toString() : Double.toString(real);
    }

    static Num parse(String text) {
      return text.indexOf('.') >= 0 || text.indexOf('E') >= 0
          ? new Num(Double.parseDouble(text))
          : new Num(new BigInteger(text));
    }

    /** Exact comparison, as Python compares ints and floats. */
    int compare(Num other) {
      if (integer == null && other.integer == null) {
        return real < other.real ? -1 : (real > other.real ? 1 : 0);
      }
      if (integer != null && other.integer != null) {
        return integer.compareTo(other.integer);
      }
      Num whole = integer != null ? this : other;
      if (whole.integer.bitLength() <= 53) { // exactly a double: compared as doubles
        return real < other.real ? -1 : (real > other.real ? 1 : 0);
      }
      return exact().compareTo(other.exact());
    }

    BigDecimal exact() {
      return integer != null ? new BigDecimal(integer) : new BigDecimal(real);
    }
  }

  /** fsum's intermediate overflow (Python's OverflowError). */
  static final class Overflow extends Exception {
    private static final long serialVersionUID = 1L;

    Overflow() {
      super("intermediate overflow in fsum", null, false, false);
    }
  }

  /**
   * The precision of an int's quotient in avg's fallback before it is rounded to a double,
   * when it has no exact decimal: then the reduced p/q is no double's midpoint (q has a prime
   * factor other than 2 and 5), and at least 1/q away from one above 2^53 (midpoints are
   * integers there: 1/q of ~1e308, 10^-315 of it for any window), at least 1/(q 2^54) of it
   * below. 400 digits round between the same two doubles as the exact quotient, so rounding
   * twice gives Python's one rounding.
   */
  private static final MathContext QUOTIENT = new MathContext(400, RoundingMode.HALF_EVEN);

  /** Python's {@code int / int}: the double nearest to p/q (ties to even). */
  static double quotient(BigInteger p, BigDecimal q) {
    // A terminating decimal (the reduced q has no prime factor but 2 and 5) is exact, and
    // rounded once, below.
    BigInteger d = q.toBigIntegerExact();
    d = d.divide(d.gcd(p));
    for (BigInteger f : new BigInteger[] {BigInteger.TWO, BigInteger.valueOf(5)}) {
      while (d.mod(f).signum() == 0) {
        d = d.divide(f);
      }
    }
    BigDecimal exact =
        d.equals(BigInteger.ONE) ? new BigDecimal(p).divide(q) : new BigDecimal(p).divide(q, QUOTIENT);
    return Double.parseDouble(exact.toString());
  }

  /** An aggregate that is an error (Python raised): the event is a dead letter. */
  static final class Refused extends Exception {
    private static final long serialVersionUID = 1L;

    Refused(String reason) {
      super(reason, null, false, false);
    }
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(
      String key, scala.collection.Iterator<Row> rows, TimerValues timerValues) {
    List<Row> input = new ArrayList<>();
    Iterator<Row> it = CollectionConverters.asJava(rows);
    while (it.hasNext()) {
      input.add(it.next());
    }
    input.sort((a, b) -> Long.compare(a.getLong(0), b.getLong(0)));
    List<Row> out = new ArrayList<>(input.size());
    if (keyBy != null && key.equals(noKey)) {
      // No key: each a dead letter, no state (batch.unkeyed_dead_letters).
      for (Row row : input) {
        String reason;
        try {
          JsonNode value = eventNode(row.getString(3), read(row.getString(4))).get(keyBy);
          reason = noKeyReason(value == null || value.isNull());
        } catch (Refused refused) {
          reason = refused.getMessage();
        }
        out.add(dead(row, reason));
      }
      return CollectionConverters.asScala(out.iterator());
    }
    String grouped = keyBy != null ? key.substring(keyPrefix.length()) : null;
    String before = values.exists() ? values.get() : null;
    ArrayDeque<Num> kept = load(before);
    boolean changed = false;
    for (Row row : input) {
      long origin = row.getLong(0);
      long seq = row.getLong(1);
      double timestamp = row.getDouble(2);
      String body = row.getString(4);
      Read read = read(body); // once, for its key and its value
      if (grouped != null) {
        String refusal = keyRefusal(read, grouped);
        if (refusal != null) { // before it meets the key's state: it changes none
          out.add(dead(row, refusal));
          continue;
        }
      }
      boolean added = false;
      ArrayDeque<Num> dropped = null;
      try {
        JsonNode node = eventNode(row.getString(3), read);
        Num value = fieldValue(node);
        kept.addLast(value);
        added = true;
        while (kept.size() > window) { // (as Python's del values[: len - window])
          if (dropped == null) {
            dropped = new ArrayDeque<>();
          }
          dropped.addLast(kept.removeFirst());
        }
        String text = encode(aggregate(kept), seq, timestamp, keyed(node));
        out.add(RowFactory.create(origin, 0, seq, timestamp, pe, text, null));
        changed = true;
      } catch (Refused | RuntimeException | StackOverflowError | IOError exc) {
        // Nothing an event does stops the PE: it is a dead letter, and the window is as
        // before it.
        if (added) {
          kept.removeLast();
          while (dropped != null && !dropped.isEmpty()) {
            kept.addFirst(dropped.removeLast());
          }
        }
        String reason = exc instanceof Refused
            ? exc.getMessage()
            : "processor '" + pe + "' raised " + exc.getClass().getSimpleName() + ": "
                + exc.getMessage();
        out.add(RowFactory.create(origin, 0, seq, timestamp, pe, body, reason));
      }
    }
    // (Python's engine stores an unkeyed window after a batch of dead letters too: the window
    // then reads as empty, not as absent. A key whose events were all dead letters stores
    // nothing: bad events of random keys would grow the store and list keys never processed.)
    if (changed || (before == null && grouped == null)) {
      StringBuilder text = new StringBuilder(kept.size() * 8);
      for (Num n : kept) {
        if (text.length() > 0) {
          text.append(',');
        }
        text.append(n.text());
      }
      if (text.toString().equals(before)) { // (as Python's engine: a text unchanged is not
        // written again, nor noted)
        return CollectionConverters.asScala(out.iterator());
      }
      values.update(text.toString());
      if (grouped != null) {
        // What the key's stored state is now, for the key listing (checkpoint.key_index).
        String note = "{\"key\": " + PyText.jsonString(grouped) + ", \"vars\": {\"window\": "
            + text.length() + "}}";
        out.add(RowFactory.create(0L, 0, 0L, 0.0, noteCreator, note, null));
      }
    }
    return CollectionConverters.asScala(out.iterator());
  }

  private Row dead(Row row, String reason) {
    return RowFactory.create(
        row.getLong(0), 0, row.getLong(1), row.getDouble(2), pe, row.getString(4), reason);
  }

  /**
   * Why an event Spark grouped under key text {@code grouped} may not be processed under it,
   * {@code null} if it may or its body is not JSON (processing dead-letters it as such): as
   * fogshift.broker.keys.key_refusal. A key must be a string, an integer or a boolean, whose
   * text is the same wherever it is read.
   */
  String keyRefusal(Read read, String grouped) {
    // fogshift.events.MAX_KEY_CHARS, counted in code points as Python's len() counts.
    int chars = grouped.codePointCount(0, grouped.length());
    if (chars > MAX_KEY_CHARS) {
      return "field " + keyByRepr + " (key_by of " + peRepr + ") is "
          + String.format(java.util.Locale.ROOT, "%,d", chars) + " characters long: a key is at"
          + " most " + String.format(java.util.Locale.ROOT, "%,d", MAX_KEY_CHARS)
          + " (to be asked for and moved by name)";
    }
    JsonNode node = read.node;
    if (read.error != null || node == null || node.isMissingNode()) {
      // json.loads raised, or no value: not refused here
      return null;
    }
    JsonNode value = node.isObject() ? node.get(keyBy) : null;
    String hint = "key by a string or an integer field";
    if (value != null && (value.isFloatingPointNumber() || value.isObject() || value.isArray())) {
      String kind = value.isObject() ? "an object" : value.isArray() ? "an array" : "a float";
      return "field " + keyByRepr + " (key_by of " + peRepr + ") is " + kind + ": a key must be "
          + "a string, an integer or a boolean, whose text is the same wherever it is read ("
          + hint + ")";
    }
    String text = keyText(value);
    if (!grouped.equals(text)) {
      return "field " + keyByRepr + " (key_by of " + peRepr + ") reads as "
          + (text == null ? "None" : PyText.strRepr(text)) + " here and as "
          + PyText.strRepr(grouped) + " to Spark (is the field repeated in the body?): the "
          + "event has no one key (" + hint + ")";
    }
    return null;
  }

  /** A key field's text (fogshift.broker.keys.key_text), {@code null} for none. */
  private static String keyText(JsonNode value) {
    if (value == null) {
      return null;
    }
    if (value.isTextual()) {
      String text = value.textValue();
      for (int i = 0; i < text.length(); i++) { // a lone surrogate: no UTF-8 to route by
        char c = text.charAt(i);
        if (Character.isHighSurrogate(c)
            && i + 1 < text.length()
            && Character.isLowSurrogate(text.charAt(i + 1))) {
          i++;
        } else if (Character.isSurrogate(c)) {
          return null;
        }
      }
      return text;
    }
    if (value.isIntegralNumber()) {
      return value.bigIntegerValue().toString();
    }
    if (value.isBoolean()) {
      return value.booleanValue() ? "true" : "false";
    }
    return null;
  }

  /** The output body of {@code aggregate}, or {@link Refused} as Python's encoding refuses. */
  /**
   * A keyed output's first member, {@code "key_by":key,} as Python writes the event's key
   * (a string, an integer or a boolean: others were refused); {@code ""} unkeyed, or keyed
   * by the aggregated field itself (Python's {key_by: ..., field: aggregate} is then one).
   */
  private String keyed(JsonNode node) {
    if (keyBy == null || keyBy.equals(field)) {
      return "";
    }
    JsonNode key = node.get(keyBy);
    String text;
    if (key.isTextual()) {
      text = PyText.jsonString(key.textValue());
    } else if (key.isIntegralNumber()) {
      text = key.bigIntegerValue().toString();
    } else {
      text = key.booleanValue() ? "true" : "false";
    }
    return keyByJson + ":" + text + ",";
  }

  private String encode(Object aggregate, long seq, double timestamp, String keyed)
      throws Refused {
    if (!(Double.isFinite(timestamp) && seq >= 0)) {
      throw new Refused(
          "processor '" + pe + "' returned output 0 that cannot be encoded (ValueError: seq "
              + seq + " or timestamp " + PyText.floatRepr(timestamp) + " is out of range); "
              + "bodies hold JSON values and finite numbers only");
    }
    // fogshift.events.dump_body: compact, ASCII, numbers as Python writes them.
    String number = aggregate instanceof Double
        ? PyText.floatRepr((Double) aggregate)
        : aggregate.toString();
    String text = "{" + keyed + fieldJson + ":" + number + "}";
    long bound = (text.length() + pe.length()) * 12L + 128;
    if (bound > maxRecordBytes) {
      long size = PyText.recordBytes(seq, timestamp, pe, text);
      if (size > maxRecordBytes) {
        throw new Refused("processor '" + pe + "' returned output 0 of " + size + " bytes "
            + "encoded, over the limit of " + maxRecordBytes + " bytes (max_record_bytes)");
      }
    }
    return text;
  }

  /** The window stored as {@code text} ({@code null}: none stored). */
  private static ArrayDeque<Num> load(String text) {
    ArrayDeque<Num> kept = new ArrayDeque<>();
    if (text != null && !text.isEmpty()) {
      for (String part : text.split(",")) {
        kept.addLast(Num.parse(part));
      }
    }
    return kept;
  }

  /**
   * The value of an event's body (an object, see {@link #eventNode}), or {@link Refused} with
   * the reason process() refuses it: the event is a dead letter.
   */
  Num fieldValue(JsonNode node) throws Refused {
    JsonNode value = node.get(field);
    String name = fieldRepr;
    if (value == null) {
      // sorted(body): by code point
      TreeSet<String> names = new TreeSet<>(WindowAggregate::byCodePoint);
      node.fieldNames().forEachRemaining(names::add);
      List<String> shown = new ArrayList<>();
      for (String n : names) {
        shown.add(PyText.strRepr(n));
      }
      throw new Refused(
          "field " + name + " is missing (fields: [" + String.join(", ", shown) + "])");
    }
    if (value.isIntegralNumber()) {
      BigInteger integer = value.bigIntegerValue();
      if (new BigDecimal(integer.abs()).compareTo(new BigDecimal(Double.MAX_VALUE)) > 0) {
        throw new Refused("field " + name + " is an integer of "
            + integer.abs().toString().length() + " digits, beyond a float's range");
      }
      return new Num(integer);
    }
    if (value.isFloatingPointNumber() && Double.isFinite(value.doubleValue())) {
      return new Num(value.doubleValue());
    }
    throw new Refused("field " + name + " is " + PyText.repr(value) + ", not a finite number");
  }

  /**
   * The event's body, a JSON object, or {@link Refused} with the reason the input row is no
   * event (batch._event: a foreign message, a body that is not JSON or not an object).
   */
  /** batch.no_key_reason's text, to the character: the field missing or null, or not. */
  String noKeyReason(boolean missing) {
    String field = "field " + keyByRepr + " (key_by of " + peRepr + ") ";
    if (missing) {
      return field + "is missing or null: the event has no key";
    }
    return field + "is in the event, but Spark's JSON reader, which finds the keys, does not "
        + "read its body as JSON does (NaN, a lone surrogate, a number of over 1,000 digits "
        + "or a name of over 50,000 characters in it, or the field repeated): the event has "
        + "no key";
  }

  JsonNode eventNode(String creator, Read read) throws Refused {
    if (notAnEvent.equals(creator)) {
      throw new Refused("input of '" + pe + "' is not an event: " + notAnEventWhy);
    }
    if (read.error instanceof Refused refused) {
      throw refused;
    }
    if (read.error instanceof Exception exc) {
      throw new Refused("input of '" + pe + "' is not an event: JSONDecodeError: "
          + firstLine(exc.getMessage()));
    }
    if (read.error instanceof StackOverflowError deep) {
      throw deep; // (as when read here: the PE raised it, see handleInputRows)
    }
    JsonNode node = read.node;
    if (node == null || node.isMissingNode()) {
      throw new Refused("input of '" + pe + "' is not an event: JSONDecodeError: Expecting "
          + "value: line 1 column 1 (char 0)");
    }
    if (!node.isObject()) {
      throw new Refused("input of '" + pe + "' is not an event: ValueError: an event body must "
          + "be a JSON object, got " + kind(node));
    }
    return node;
  }

  /** A body read once: its JSON, or what reading it raised (thrown where the event is read). */
  static final class Read {
    final JsonNode node;
    final Throwable error;

    Read(JsonNode node, Throwable error) {
      this.node = node;
      this.error = error;
    }
  }

  /**
   * A body read as Python's json.loads reads it: Jackson, after {@link #checkJson} where Jackson
   * would read what Python refuses. A keyed event's key and value come from this one read.
   */
  Read read(String body) {
    try {
      if (pythonMayRefuse(body)) {
        checkJson(body);
      }
      return new Read(json.readTree(body), null);
    } catch (Exception | StackOverflowError exc) {
      return new Read(null, exc);
    }
  }

  /**
   * Whether a body may hold what Jackson reads and Python does not (then it is read twice):
   * Jackson's non-numbers all hold "NaN", "Inf" or "INF", and 4301 digits are long.
   */
  private static boolean pythonMayRefuse(String body) {
    return body.length() > 4300
        || body.contains("NaN")
        || body.contains("Inf")
        || body.contains("INF");
  }

  private static int byCodePoint(String a, String b) {
    int i = 0;
    int j = 0;
    while (i < a.length() && j < b.length()) {
      int x = a.codePointAt(i);
      int y = b.codePointAt(j);
      if (x != y) {
        return Integer.compare(x, y);
      }
      i += Character.charCount(x);
      j += Character.charCount(y);
    }
    return Integer.compare(a.length() - i, b.length() - j);
  }

  /**
   * What Python's json.loads refuses and Jackson reads: non-numbers spelt otherwise than
   * {@code NaN}, {@code Infinity} and {@code -Infinity}, and integers of more than 4300 digits.
   */
  private void checkJson(String body) throws Refused, java.io.IOException {
    try (JsonParser parser = json.getFactory().createParser(body)) {
      JsonToken token;
      while ((token = parser.nextToken()) != null) {
        if (token == JsonToken.VALUE_NUMBER_FLOAT) {
          String text = parser.getText();
          char first = text.charAt(text.charAt(0) == '-' || text.charAt(0) == '+' ? 1 : 0);
          if (Character.isLetter(first)
              && !(text.equals("NaN") || text.equals("Infinity") || text.equals("-Infinity"))) {
            throw new Refused("input of '" + pe + "' is not an event: JSONDecodeError: Expecting "
                + "value (" + text + ")");
          }
        } else if (token == JsonToken.VALUE_NUMBER_INT) {
          String text = parser.getText();
          int digits = text.length() - (text.charAt(0) == '-' ? 1 : 0);
          if (digits > 4300) {
            throw new Refused("input of '" + pe + "' is not an event: ValueError: Exceeds the "
                + "limit (4300 digits) for integer string conversion: value has " + digits
                + " digits; use sys.set_int_max_str_digits() to increase the limit");
          }
        }
      }
    }
  }

  private static String kind(JsonNode node) {
    if (node == null || node.isNull()) {
      return "NoneType";
    }
    if (node.isArray()) {
      return "list";
    }
    if (node.isTextual()) {
      return "str";
    }
    if (node.isBoolean()) {
      return "bool";
    }
    return node.isIntegralNumber() ? "int" : "float";
  }

  private static String firstLine(String message) {
    if (message == null) {
      return "";
    }
    int end = message.indexOf('\n');
    return end < 0 ? message : message.substring(0, end);
  }

  /** The window's values as doubles (as Python's fsum takes them), in a reused buffer. */
  private double[] realsOf(ArrayDeque<Num> kept) {
    if (reals.length < kept.size()) {
      reals = new double[Math.max(kept.size(), reals.length * 2)];
    }
    int i = 0;
    for (Num n : kept) {
      reals[i++] = n.real;
    }
    return reals;
  }

  private Refused raised(Overflow overflow) {
    return new Refused("processor '" + pe + "' raised OverflowError: " + overflow.getMessage());
  }

  Object aggregate(ArrayDeque<Num> kept) throws Refused {
    switch (function) {
      case "count":
        return kept.size();
      case "min":
      case "max":
        {
          boolean min = function.equals("min");
          Num best = null;
          for (Num n : kept) {
            if (best == null || (min ? n.compare(best) < 0 : n.compare(best) > 0)) {
              best = n;
            }
          }
          return best.integer != null ? (Object) best.integer : (Object) best.real;
        }
      case "sum":
        try {
          return fsum(realsOf(kept), kept.size());
        } catch (Overflow overflow) {
          throw raised(overflow);
        }
      case "avg":
        {
          double[] reals = realsOf(kept);
          try {
            return fsum(reals, kept.size()) / kept.size();
          } catch (Overflow overflow) {
            // Python: fsum(v / len(values) for v in values); an int's quotient is the
            // correctly rounded one of the exact division.
            int i = 0;
            BigDecimal count = BigDecimal.valueOf(kept.size());
            for (Num n : kept) {
              reals[i++] = n.integer != null
                  ? quotient(n.integer, count)
                  : n.real / kept.size();
            }
            try {
              return fsum(reals, kept.size());
            } catch (Overflow again) {
              throw raised(again);
            }
          }
        }
      default:
        throw new Refused("unknown aggregate " + function);
    }
  }

  /**
   * CPython's {@code math.fsum} (Shewchuk's partials, half-even across partials), for finite
   * inputs: an intermediate overflow is {@link Refused}, as Python raises OverflowError.
   */
  static double fsum(double[] values, int count) throws Overflow {
    double[] partials = new double[32];
    int n = 0;
    for (int k = 0; k < count; k++) {
      double value = values[k];
      double x = value;
      int i = 0;
      for (int j = 0; j < n; j++) {
        double y = partials[j];
        if (Math.abs(x) < Math.abs(y)) {
          double t = x;
          x = y;
          y = t;
        }
        double hi = x + y;
        double lo = y - (hi - x);
        if (lo != 0.0) {
          partials[i++] = lo;
        }
        x = hi;
      }
      n = i;
      if (x != 0.0) {
        if (!Double.isFinite(x)) {
          throw new Overflow();
        }
        if (n == partials.length) {
          partials = java.util.Arrays.copyOf(partials, n * 2);
        }
        partials[n++] = x;
      }
    }
    double hi = 0.0;
    if (n > 0) {
      hi = partials[--n];
      double lo = 0.0;
      while (n > 0) {
        double x = hi;
        double y = partials[--n];
        hi = x + y;
        double yr = hi - x;
        lo = y - yr;
        if (lo != 0.0) {
          break;
        }
      }
      if (n > 0 && ((lo < 0.0 && partials[n - 1] < 0.0) || (lo > 0.0 && partials[n - 1] > 0.0))) {
        double y = lo * 2.0;
        double x = hi + y;
        double yr = x - hi;
        if (y == yr) {
          hi = x;
        }
      }
    }
    return hi;
  }
}
