package dev.pgcdc.hadoop;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;

/**
 * FileContext's local file system ({@code fs.AbstractFileSystem.file.impl}), as Hadoop's
 * {@code LocalFs}: checksums over {@link ForklessRawLocalFs}. Delta's log store for local
 * paths and Spark's streaming checkpoints go through it.
 */
public class ForklessLocalFs extends ChecksumFs {
  public ForklessLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(new ForklessRawLocalFs(uri, conf));
  }
}
