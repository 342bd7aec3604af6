package dev.pgcdc.hadoop;

import org.apache.hadoop.fs.LocalFileSystem;

/**
 * Hadoop's local file system ({@code fs.file.impl}): {@link LocalFileSystem}'s checksums over
 * {@link ForklessRawLocalFileSystem}. A {@link LocalFileSystem} still, as
 * {@code FileSystem.getLocal} callers (Hive, S3A's buffer folders) cast it.
 */
public class ForklessLocalFileSystem extends LocalFileSystem {
  public ForklessLocalFileSystem() {
    super(new ForklessRawLocalFileSystem());
  }
}
