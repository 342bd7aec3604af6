package dev.pgcdc.hadoop;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.local.LocalConfigKeys;

/**
 * Hadoop's {@code RawLocalFs} (whose constructors are its package's only) over
 * {@link ForklessRawLocalFileSystem}, answering as it does.
 */
public class ForklessRawLocalFs extends DelegateToFileSystem {
  public ForklessRawLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(uri, new ForklessRawLocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
  }

  @Override
  public int getUriDefaultPort() {
    return -1; // no default port for file:///
  }

  @Override
  @Deprecated
  public FsServerDefaults getServerDefaults() throws IOException {
    return LocalConfigKeys.getServerDefaults();
  }

  @Override
  public FsServerDefaults getServerDefaults(Path f) throws IOException {
    return LocalConfigKeys.getServerDefaults();
  }

  @Override
  public boolean isValidName(String src) {
    return true; // as RawLocalFs: any name the local file system takes
  }
}
