package dev.pgcdc.hadoop;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's raw local file system, setting a path's permissions and reading its link status
 * through java.nio instead of forking {@code chmod} and {@code readlink}, as
 * {@link RawLocalFileSystem} does without Hadoop's native library (which no Maven artifact
 * ships). Spark and Delta set the permissions of every file and folder they create, and
 * every rename through FileContext (Delta's log store) reads two link statuses: a Delta
 * commit on a local path forked eight processes.
 *
 * <p>What java.nio cannot do as the command does (a sticky or set-id bit, a symbolic link's
 * status, a file system without POSIX permissions) is left to {@link RawLocalFileSystem}.
 */
public class ForklessRawLocalFileSystem extends RawLocalFileSystem {
  /** The permission of each bit of a mode, lowest first. */
  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE,
    PosixFilePermission.OTHERS_WRITE,
    PosixFilePermission.OTHERS_READ,
    PosixFilePermission.GROUP_EXECUTE,
    PosixFilePermission.GROUP_WRITE,
    PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE,
    PosixFilePermission.OWNER_WRITE,
    PosixFilePermission.OWNER_READ,
  };

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    short mode = permission.toShort();
    if ((mode & ~0777) != 0) {
      super.setPermission(p, permission);
      return;
    }
    Set<PosixFilePermission> wanted = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < BITS.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        wanted.add(BITS[bit]);
      }
    }
    try {
      Files.setPosixFilePermissions(pathToFile(p).toPath(), wanted);
    } catch (NoSuchFileException e) {
      throw new FileNotFoundException("File " + p + " does not exist");
    } catch (UnsupportedOperationException e) {
      super.setPermission(p, permission);
    }
  }

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    // for a path that is not a link, RawLocalFileSystem's answer is getFileStatus's, after
    // forking readlink to find that out
    if (Files.isSymbolicLink(pathToFile(f).toPath())) {
      return super.getFileLinkStatus(f);
    }
    return getFileStatus(f);
  }
}
