package fogshift.ops;

import com.fasterxml.jackson.core.io.schubfach.DoubleToDecimal;
import com.fasterxml.jackson.databind.JsonNode;
import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;

/**
 * Texts as CPython 3.11 writes them, for fogshift's JVM operators: their outputs and dead
 * letters are the Python processors' to the character ({@code tests/runtime/test_jvm_window.py}).
 */
public final class PyText {
  private PyText() {}

  /** {@code repr(float)}: the shortest digits that read back as {@code d} (the nearest of
   * them: Schubfach's, as Jackson carries it, and David Gay's in CPython agree), fixed
   * notation for decimal exponents -4 to 15, else {@code 1.5e+16}. */
  public static String floatRepr(double d) {
    if (Double.isNaN(d)) {
      return "nan";
    }
    if (Double.isInfinite(d)) {
      return d > 0 ? "inf" : "-inf";
    }
    if (d == 0.0) {
      return 1.0 / d < 0 ? "-0.0" : "0.0";
    }
    // Java's form: [-]D.DDD (10^-3 <= |d| < 10^7) or [-]D.DDDE[-]N.
    String java = DoubleToDecimal.toString(Math.abs(d));
    int e = java.indexOf('E');
    String mantissa = e < 0 ? java : java.substring(0, e);
    int point = mantissa.indexOf('.');
    String digits = mantissa.substring(0, point) + mantissa.substring(point + 1);
    int exponent = (e < 0 ? 0 : Integer.parseInt(java.substring(e + 1))) + point - 1;
    int lead = 0;
    while (lead < digits.length() - 1 && digits.charAt(lead) == '0') {
      lead++; // 0.001 is 0.001 in Java's form: its exponent is the first non-zero digit's
    }
    exponent -= lead;
    digits = digits.substring(lead);
    int end = digits.length();
    while (end > 1 && digits.charAt(end - 1) == '0') {
      end--;
    }
    digits = digits.substring(0, end);
    if (digits.length() == 2) {
      // Java's form has two digits at least (4.9E-324 for the smallest double), where one
      // may do (CPython: 5e-324): the nearer one-digit decimal that reads back, if any.
      BigDecimal exact = new BigDecimal(Math.abs(d));
      BigDecimal best = null;
      int bestExponent = exponent;
      int first = digits.charAt(0) - '0';
      for (int candidate : new int[] {first, first + 1}) {
        int shown = candidate == 10 ? 1 : candidate;
        int power = candidate == 10 ? exponent + 1 : exponent;
        BigDecimal value = BigDecimal.valueOf(shown).scaleByPowerOfTen(power);
        if (Double.parseDouble(shown + "E" + power) == Math.abs(d)
            && (best == null
                || value.subtract(exact).abs().compareTo(best.subtract(exact).abs()) < 0)) {
          best = value;
          bestExponent = power;
          digits = Integer.toString(shown);
        }
      }
      exponent = bestExponent;
    }
    return (d < 0 ? "-" : "") + pythonForm(digits, exponent);
  }

  /** CPython's {@code repr} layout of {@code 0.<digits> * 10^(exponent + 1)}. */
  private static String pythonForm(String digits, int exponent) {
    StringBuilder out = new StringBuilder();
    int point = exponent + 1;
    if (exponent >= -4 && exponent <= 15) {
      if (point <= 0) {
        out.append("0.").append("0".repeat(-point)).append(digits);
      } else if (point < digits.length()) {
        out.append(digits, 0, point).append('.').append(digits, point, digits.length());
      } else {
        out.append(digits).append("0".repeat(point - digits.length())).append(".0");
      }
    } else {
      out.append(digits.charAt(0));
      if (digits.length() > 1) {
        out.append('.').append(digits, 1, digits.length());
      }
      out.append('e').append(exponent < 0 ? '-' : '+');
      String magnitude = Integer.toString(Math.abs(exponent));
      out.append(magnitude.length() < 2 ? "0" : "").append(magnitude);
    }
    return out.toString();
  }

  /** {@code repr(str)}: quoted with ' (with " when only ' occurs), the non-printable escaped. */
  public static String strRepr(String s) {
    char quote = s.indexOf('\'') >= 0 && s.indexOf('"') < 0 ? '"' : '\'';
    StringBuilder out = new StringBuilder(s.length() + 2).append(quote);
    for (int i = 0; i < s.length(); ) {
      int cp = s.codePointAt(i);
      i += Character.charCount(cp);
      if (cp == quote || cp == '\\') {
        out.append('\\').appendCodePoint(cp);
      } else if (cp == '\t') {
        out.append("\\t");
      } else if (cp == '\n') {
        out.append("\\n");
      } else if (cp == '\r') {
        out.append("\\r");
      } else if (cp < 0x20 || cp == 0x7f) {
        out.append(String.format("\\x%02x", cp));
      } else if (cp < 0x7f) {
        out.append((char) cp);
      } else if (!printable(cp)) {
        out.append(
            cp < 0x100
                ? String.format("\\x%02x", cp)
                : cp < 0x10000 ? String.format("\\u%04x", cp) : String.format("\\U%08x", cp));
      } else {
        out.appendCodePoint(cp);
      }
    }
    return out.append(quote).toString();
  }

  /** The code points Python's {@code str.isprintable} refuses, as sorted inclusive ranges
   * (starts, then ends), from the Python that runs fogshift (its Unicode version, not the
   * JVM's: Java 17 knows Unicode 13, Python 3.11 Unicode 14); {@code null}: not given. */
  private static volatile int[][] notPrintable;

  /** Takes Python's non-printable code points: {@code "a-b,c-d,..."} in hex. */
  public static void useNotPrintable(String ranges) {
    if (notPrintable != null || ranges == null || ranges.isEmpty()) {
      return;
    }
    String[] parts = ranges.split(",");
    int[] starts = new int[parts.length];
    int[] ends = new int[parts.length];
    for (int i = 0; i < parts.length; i++) {
      int dash = parts[i].indexOf('-');
      starts[i] = Integer.parseInt(parts[i].substring(0, dash), 16);
      ends[i] = Integer.parseInt(parts[i].substring(dash + 1), 16);
    }
    notPrintable = new int[][] {starts, ends};
  }

  /** Python's {@code str.isprintable} of one code point: by Python's own table when given,
   * else by Java's categories (Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs but the space are not). */
  private static boolean printable(int cp) {
    int[][] table = notPrintable;
    if (table != null) {
      int at = java.util.Arrays.binarySearch(table[0], cp);
      int range = at >= 0 ? at : -at - 2;
      return range < 0 || cp > table[1][range];
    }
    switch (Character.getType(cp)) {
      case Character.CONTROL:
      case Character.FORMAT:
      case Character.SURROGATE:
      case Character.PRIVATE_USE:
      case Character.UNASSIGNED:
      case Character.LINE_SEPARATOR:
      case Character.PARAGRAPH_SEPARATOR:
        return false;
      case Character.SPACE_SEPARATOR:
        return cp == ' ';
      default:
        return true;
    }
  }

  /** {@code repr()} of the Python value {@code json.loads} makes of a JSON value. */
  static String repr(JsonNode node) {
    if (node.isNull()) {
      return "None";
    }
    if (node.isBoolean()) {
      return node.booleanValue() ? "True" : "False";
    }
    if (node.isIntegralNumber()) {
      return node.bigIntegerValue().toString();
    }
    if (node.isNumber()) {
      return floatRepr(node.doubleValue());
    }
    if (node.isTextual()) {
      return strRepr(node.textValue());
    }
    List<String> parts = new ArrayList<>();
    if (node.isArray()) {
      for (JsonNode item : node) {
        parts.add(repr(item));
      }
      return "[" + String.join(", ", parts) + "]";
    }
    Iterator<Map.Entry<String, JsonNode>> fields = node.fields();
    while (fields.hasNext()) {
      Map.Entry<String, JsonNode> field = fields.next();
      parts.add(strRepr(field.getKey()) + ": " + repr(field.getValue()));
    }
    return "{" + String.join(", ", parts) + "}";
  }

  /** {@code json.dumps(str)} (ASCII only: the rest as {@code \\u} escapes, as Python's). */
  static String jsonString(String s) {
    StringBuilder out = new StringBuilder(s.length() + 2).append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"':
          out.append("\\\"");
          break;
        case '\\':
          out.append("\\\\");
          break;
        case '\n':
          out.append("\\n");
          break;
        case '\r':
          out.append("\\r");
          break;
        case '\t':
          out.append("\\t");
          break;
        case '\b':
          out.append("\\b");
          break;
        case '\f':
          out.append("\\f");
          break;
        default:
          if (c < 0x20 || c > 0x7e) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
      }
    }
    return out.append('"').toString();
  }

  /** The length of {@code fogshift.events.record_payload} for a record without a reason. */
  static long recordBytes(long seq, double timestamp, String creator, String body) {
    return "{\"seq\": ".length() + Long.toString(seq).length()
        + ", \"timestamp\": ".length() + floatRepr(timestamp).length()
        + ", \"creator\": ".length() + jsonString(creator).length()
        + ", \"body\": ".length() + jsonString(body).length() + 1;
  }
}
