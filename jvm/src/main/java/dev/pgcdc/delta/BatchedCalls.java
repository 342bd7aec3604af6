package dev.pgcdc.delta;

import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.List;

/**
 * What a Delta commit of pgcdc.lake.store.deltalog does once per action or per file marked,
 * done for all of them in one py4j round trip: a commit of a hundred-table batch marks rows of
 * thousands of files, and each gateway call is a socket round trip plus Python's GIL.
 *
 * <p>Delta's own classes do the work (its action parser, its deletion-vector store's writer);
 * they are called by reflection, so that this jar compiles against nothing but the JDK and
 * calls whichever connector the session loaded. They are found through the class loader of an
 * object Delta made: Spark loads its {@code spark.jars} in a loader of their own, which a class
 * of this jar on the driver's class path cannot see directly.
 */
public final class BatchedCalls {
  private static final String ACTION = "org.apache.spark.sql.delta.actions.Action";

  private BatchedCalls() {}

  /**
   * Delta's actions of {@code lines} (one JSON object a line, as a commit file holds them), in
   * order, each parsed by {@code Action.fromJson}; {@code delta}: any object of Delta's (its
   * class loader has the parser).
   */
  public static List<Object> actions(Object delta, String lines) throws Throwable {
    Method fromJson =
        Class.forName(ACTION, true, delta.getClass().getClassLoader())
            .getMethod("fromJson", String.class);
    List<Object> parsed = new ArrayList<>();
    for (String line : lines.split("\n")) {
      if (!line.isEmpty()) {
        parsed.add(call(fromJson, null, line));
      }
    }
    return parsed;
  }

  /**
   * Write deletion vectors one after another into one new file of the store: {@code data}
   * holds their bytes back to back, {@code lengths} each one's size ({@code "n,n,..."}); the
   * file is {@code path} (the store's {@code PathWithFileSystem}). Returns each vector's
   * {@code offset:length} in the file, comma-separated, once the file is closed (whole).
   */
  public static String writeVectors(Object store, Object path, byte[] data, String lengths)
      throws Throwable {
    Method create = null;
    for (Method m : store.getClass().getMethods()) {
      if (m.getName().equals("createWriter") && m.getParameterCount() == 1) {
        create = m;
      }
    }
    if (create == null) {
      throw new NoSuchMethodException(store.getClass().getName() + ".createWriter");
    }
    // the writer is an anonymous class: its methods are called through the interface that
    // createWriter declares
    Class<?> writerType = create.getReturnType();
    Method write = writerType.getMethod("write", byte[].class);
    Method close = writerType.getMethod("close");
    Object writer = call(create, store, path);
    StringBuilder ranges = new StringBuilder();
    try {
      int at = 0;
      Method offset = null;
      Method length = null;
      for (String size : lengths.split(",")) {
        if (size.isEmpty()) {
          continue;
        }
        int n = Integer.parseInt(size);
        byte[] vector = new byte[n];
        System.arraycopy(data, at, vector, 0, n);
        at += n;
        Object range = call(write, writer, (Object) vector);
        if (offset == null) {
          offset = range.getClass().getMethod("offset");
          length = range.getClass().getMethod("length");
        }
        if (ranges.length() > 0) {
          ranges.append(',');
        }
        ranges.append(call(offset, range)).append(':').append(call(length, range));
      }
      if (at != data.length) {
        throw new IllegalArgumentException(
            "the lengths of the deletion vectors add up to " + at + " bytes of " + data.length);
      }
    } finally {
      call(close, writer);
    }
    return ranges.toString();
  }

  /** {@code method} called, with the exception it threw (not reflection's wrapper). */
  private static Object call(Method method, Object target, Object... args) throws Throwable {
    try {
      return method.invoke(target, args);
    } catch (InvocationTargetException e) {
      throw e.getCause();
    }
  }
}
